"""The native fused and unpooled ops (perfkernels::embedding_bags_interaction, its _inference
twin, collection_interaction, embedding, embedding_quantized), called as a compiled or exported
graph calls them: through torch.ops, straight to the kernel of perfkernels' native library.
Results against the float64 references of perfkernels.reference (written from the formulas) and
torch's own ops, on every ISA level; errors; threads; and that they run with no perfkernels
Python loaded."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import perfkernels.torch as pt  # noqa: E402
from perfkernels import reference  # noqa: E402

from conftest import run_with_torch_only  # noqa: E402

ops = torch.ops.perfkernels

SCHEMAS = {
    "embedding_bags_interaction": (
        "perfkernels::embedding_bags_interaction(Tensor dense, Tensor[] weights, Tensor[] indices, "
        "Tensor[] offsets, bool include_last_offset, str interaction, str pairs, "
        "bool self_interaction, SymInt[] mean, SymInt[] padding_idx, SymInt[] bits, "
        "SymInt[] dims, SymInt group) -> Tensor"),
    "collection_interaction": (
        "perfkernels::collection_interaction(Tensor dense, Tensor[] weights, Tensor values, "
        "Tensor offsets, SymInt num_keys, SymInt[] features, SymInt[] tables, str interaction, "
        "str pairs, bool self_interaction, SymInt[] mean, SymInt[] padding_idx, SymInt group) "
        "-> Tensor"),
    "embedding": "perfkernels::embedding(Tensor weight, Tensor indices, SymInt padding_idx) "
                 "-> Tensor",
    "embedding_quantized": "perfkernels::embedding_quantized(Tensor packed, Tensor indices, "
                           "SymInt bits, SymInt dim) -> Tensor",
}


def test_schemas_and_native_kernels():
    for name, schema in SCHEMAS.items():
        assert str(getattr(ops, name).default._schema) == schema
    inference = str(ops.embedding_bags_interaction_inference.default._schema)
    assert inference == SCHEMAS["embedding_bags_interaction"].replace(
        "embedding_bags_interaction(", "embedding_bags_interaction_inference(")
    for name in list(SCHEMAS) + ["embedding_bags_interaction_inference"]:
        dump = torch._C._dispatch_dump(f"perfkernels::{name}")
        cpu = [line for line in dump.splitlines() if line.startswith("CPU:")]
        assert cpu and "native/ops.cpp" in cpu[0], dump
    # the inference op has no autograd kernel: a no-grad graph never enters Python
    dump = torch._C._dispatch_dump("perfkernels::embedding_bags_interaction_inference")
    assert "Autograd" not in dump, dump


def _to_numpy_table(w):
    if w.dtype is torch.bfloat16:
        return w.view(torch.int16).numpy().view(reference.BFLOAT16)
    return w.numpy()


def _lookups(rng, F, B, dims, dtype, index_dtype, last, bits=None):
    rows = [13 + 5 * f for f in range(F)]
    floats = [rng.standard_normal((r, d)).astype(np.float32) for r, d in zip(rows, dims)]
    weights, tables = [], []
    for f, t in enumerate(floats):
        b = bits[f] if bits else 0
        if b:
            packed = reference.quantize_rowwise(t, b)
            weights.append(torch.from_numpy(packed))
            tables.append(packed)
        else:
            w = torch.from_numpy(t).to(dtype)
            weights.append(w)
            tables.append(_to_numpy_table(w))
    indices, offsets = [], []
    for f in range(F):
        lens = rng.integers(0, 4, B)
        lens[0] = 0                                       # an empty bag
        o = np.concatenate([[0], np.cumsum(lens)])
        indices.append(torch.from_numpy(rng.integers(0, rows[f], o[-1])).to(index_dtype))
        offsets.append(torch.from_numpy(o if last else o[:-1]).to(index_dtype))
    return weights, tables, indices, offsets


FORMS = [("dot", "dlrm", False), ("dot", "dlrm", True), ("dot", "torchrec", False),
         ("dot", "torchrec", True), ("cat", "dlrm", False)]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_interaction_matches_reference(isa, rng, form, dtype, index_dtype):
    interaction, pairs, itself = form
    for dim, last in ((1, False), (7, True), (16, False), (17, True), (65, False)):
        F, B = 4, 9
        dims = [dim] * F if interaction == "dot" else [dim, 1, 8, 129]
        weights, tables, indices, offsets = _lookups(rng, F, B, dims, dtype, index_dtype, last)
        dense = torch.from_numpy(rng.standard_normal((B, dim)).astype(np.float32))
        mean, pads = [0, 1, 0, 1], [-1, 2, 0, -1]
        args = (dense, weights, indices, offsets, last, interaction, pairs, itself, mean, pads,
                [0] * F, [0] * F, 0)
        want = reference.embedding_bags_interaction(
            dense.numpy(), tables, [i.numpy() for i in indices], [o.numpy() for o in offsets],
            interaction=interaction, pairs=pairs, self_interaction=itself,
            include_last_offset=last, modes=["mean" if m else "sum" for m in mean],
            padding_idx=[None if p < 0 else p for p in pads])
        for op in (ops.embedding_bags_interaction, ops.embedding_bags_interaction_inference):
            got = op(*args)
            assert got.dtype == torch.float32 and got.shape == want.value.shape
            reference.assert_close(got.numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_interaction_with_packed_tables(isa, rng, bits):
    F, B, D = 3, 11, 16
    for form in (("dot", "dlrm", False), ("cat", "dlrm", False)):
        weights, tables, indices, offsets = _lookups(rng, F, B, [D] * F, torch.float32,
                                                     torch.int64, False, bits=[bits, 0, bits])
        dense = torch.from_numpy(rng.standard_normal((B, D)).astype(np.float32))
        got = ops.embedding_bags_interaction(dense, weights, indices, offsets, False, form[0],
                                             form[1], form[2], [0, 0, 1], [-1, -1, -1],
                                             [bits, 0, bits], [D, 0, D], 0)
        want = reference.embedding_bags_interaction(
            dense.numpy(), tables, [i.numpy() for i in indices], [o.numpy() for o in offsets],
            interaction=form[0], pairs=form[1], modes=["sum", "sum", "mean"],
            bits=[bits, None, bits], dims=[D, None, D])
        reference.assert_close(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_interaction_matches_torchs_unfused_ops(rng):
    """The DLRM dot interaction written with torch's own ops (an oracle beside the reference)."""
    F, B, D = 5, 17, 8
    weights, _, indices, offsets = _lookups(rng, F, B, [D] * F, torch.float32, torch.int64, False)
    dense = torch.from_numpy(rng.standard_normal((B, D)).astype(np.float32))
    got = ops.embedding_bags_interaction_inference(dense, weights, indices, offsets, False, "dot",
                                                   "dlrm", False, [0] * F, [-1] * F, [0] * F,
                                                   [0] * F, 0)
    ly = [torch.nn.functional.embedding_bag(i, w, o, mode="sum")
          for w, i, o in zip(weights, indices, offsets)]
    T = torch.stack([dense] + ly, 1)
    Z = torch.bmm(T, T.transpose(1, 2))
    li, lj = torch.tril_indices(F + 1, F + 1, offset=-1)
    torch.testing.assert_close(got, torch.cat([dense, Z[:, li, lj]], 1), rtol=1e-5, atol=1e-5)


def test_collection_interaction_matches_reference(isa, rng):
    keys, batch, D = 4, 6, 8
    tables = [torch.from_numpy(rng.standard_normal((r, D)).astype(np.float32))
              for r in (20, 7, 30)]
    rows_of_key = [20, 7, 30, 20]
    lengths = rng.integers(0, 4, keys * batch)
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]))
    values = torch.from_numpy(np.concatenate([
        rng.integers(0, rows_of_key[k], lengths[k * batch:(k + 1) * batch].sum())
        for k in range(keys)]).astype(np.int64))
    features, table_of, mean, padding = [0, 1, 2, 3], [0, 1, 2, 0], [0, 1, 0], [-1, 2, -1]
    dense = torch.from_numpy(rng.standard_normal((batch, D)).astype(np.float32))
    for interaction, pairs in (("dot", "torchrec"), ("cat", "dlrm")):
        got = ops.collection_interaction(dense, tables, values, offsets, keys, features,
                                         table_of, interaction, pairs, False, mean, padding, 0)
        idx, offs = [], []
        for f in features:
            o = offsets[f * batch:(f + 1) * batch + 1].numpy()
            idx.append(values.numpy()[o[0]:o[-1]])
            offs.append(o - o[0])
        want = reference.embedding_bags_interaction(
            dense.numpy(), [tables[t].numpy() for t in table_of], idx, offs,
            interaction=interaction, pairs=pairs, include_last_offset=True,
            modes=["mean" if mean[t] else "sum" for t in table_of],
            padding_idx=[None if padding[t] < 0 else padding[t] for t in table_of])
        reference.assert_close(got.numpy(), want, rtol=1e-5, atol=1e-6)
    bad = values.clone()
    bad[-1] = 20
    with pytest.raises(RuntimeError, match="not in the valid range \\[0, 20\\)"):
        ops.collection_interaction(dense, tables, bad, offsets, keys, features, table_of, "dot",
                                   "torchrec", False, mean, padding, 0)
    with pytest.raises(RuntimeError, match="samples but dense has"):
        ops.collection_interaction(dense[:2], tables, values, offsets, keys, features, table_of,
                                   "dot", "torchrec", False, mean, padding, 0)


def _plain_args(rng, F=3, B=5, D=4):
    weights, _, indices, offsets = _lookups(rng, F, B, [D] * F, torch.float32, torch.int64, False)
    dense = torch.from_numpy(rng.standard_normal((B, D)).astype(np.float32))
    return [dense, weights, indices, offsets, False, "dot", "dlrm", False, [0] * F, [-1] * F,
            [0] * F, [0] * F, 0]


@pytest.mark.parametrize("change, message", [
    (lambda a: a[2][1].__setitem__(0, 100), r"Index 0 of input takes value 100 which is not in "
                                            r"the valid range \[0, 18\)"),
    (lambda a: a[3][2].__setitem__(0, 1), r"feature 2: offsets\[0\] = 1: the first offset"),
    (lambda a: a.__setitem__(3, a[3][:2]), r"offsets needs one entry per table \(3\); got 2"),
    (lambda a: a[1].__setitem__(0, torch.zeros(13, 5)), r"every table as wide as dense \(4\)"),
    (lambda a: a.__setitem__(0, a[0].int()), r"dense must be float32 or float64; got torch.int32"),
    (lambda a: a.__setitem__(6, "upper"), r"pairs must be 'dlrm' or 'torchrec'; got 'upper'"),
    (lambda a: a.__setitem__(5, "sum"), r"interaction must be 'dot' or 'cat'; got 'sum'"),
    (lambda a: a.__setitem__(10, [0, 3, 0]), r"bits of weights\[1\] must be 0 .* got 3"),
    (lambda a: a[1].__setitem__(2, a[1][2].double()), r"weights\[2\] must be float32, float16 "
                                                      r"or bfloat16; got torch.float64"),
    (lambda a: a.__setitem__(9, [-1, -1, 40]), r"padding_idx\[2\] = 40 is out of range"),
])
def test_interaction_errors(rng, change, message):
    args = _plain_args(rng)
    change(args)
    with pytest.raises(RuntimeError, match=message):
        ops.embedding_bags_interaction_inference(*args)


def test_interaction_threads_bit_identical(rng):
    F, B, D = 6, 4000, 16
    weights, _, indices, offsets = _lookups(rng, F, B, [D] * F, torch.float32, torch.int64, False)
    dense = torch.from_numpy(rng.standard_normal((B, D)).astype(np.float32))
    old = torch.get_num_threads()
    outs = []
    try:
        for nt in (1, 2, 3):
            torch.set_num_threads(nt)
            for kind in ("dot", "cat"):
                outs.append((kind, ops.embedding_bags_interaction_inference(
                    dense, weights, indices, offsets, False, kind, "dlrm", False, [0] * F,
                    [-1] * F, [0] * F, [0] * F, 0).numpy().tobytes()))
    finally:
        torch.set_num_threads(old)
    for kind in ("dot", "cat"):
        got = [o for k, o in outs if k == kind]
        assert got[0] == got[1] == got[2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dim", [1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000])
def test_embedding_matches_torch_bit_for_bit(isa, rng, dtype, dim):
    rows = 40
    weight = torch.from_numpy(rng.standard_normal((rows, dim)).astype(np.float32)).to(dtype)
    for index_dtype in (torch.int32, torch.int64):
        for shape in ((), (0,), (5,), (3, 4), (2, 0, 3), (2, 3, 2)):
            ix = torch.from_numpy(rng.integers(0, rows, shape)).to(index_dtype)
            got = ops.embedding(weight, ix, -1)
            want = torch.embedding(weight, ix.long())
            assert got.dtype == dtype and got.shape == want.shape
            assert torch.equal(got, want)
            np.testing.assert_array_equal(got.float().numpy(),
                                          reference.embedding(weight.float().numpy(), ix.numpy()))


def test_embedding_strided_inputs_and_errors(rng):
    base = torch.from_numpy(rng.standard_normal((30, 20)).astype(np.float32))
    ix = torch.from_numpy(rng.integers(0, 30, (6, 4)))
    for weight in (base[:, ::2], base[:, 3:11], base[::2]):       # copied / in place / row stride
        for indices in (ix, ix.t(), ix[:, ::2]):                    # transposed, strided indices
            indices = indices.clamp_max(weight.shape[0] - 1)
            assert torch.equal(ops.embedding(weight, indices, -1), torch.embedding(weight, indices))
    with pytest.raises(RuntimeError, match=r"index out of range in self: .*\[5\] = 30 is not in "
                                           r"the valid range \[0, 30\)"):
        ops.embedding(base, torch.tensor([0, 1, 2, 3, 4, 30]), -1)
    with pytest.raises(RuntimeError, match=r"\[0\] = -1 is not in"):
        ops.embedding(base, torch.tensor([-1]), -1)
    with pytest.raises(RuntimeError, match="indices must be int32 or int64; got torch.float32"):
        ops.embedding(base, torch.tensor([0.0]), -1)
    with pytest.raises(RuntimeError, match="weight must be float32, float16 or bfloat16"):
        ops.embedding(base.double(), torch.tensor([0]), -1)


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("dim", [1, 7, 16, 17, 64, 129])
def test_embedding_quantized_matches_reference(isa, rng, bits, dim):
    table = rng.standard_normal((25, dim)).astype(np.float32)
    packed = reference.quantize_rowwise(table, bits)
    for index_dtype in (torch.int32, torch.int64):
        for shape in ((0,), (6,), (2, 3)):
            ix = torch.from_numpy(rng.integers(0, 25, shape)).to(index_dtype)
            got = ops.embedding_quantized(torch.from_numpy(packed), ix, bits, dim)
            want = reference.embedding_quantized(packed, ix.numpy(), bits, dim)
            assert got.dtype == torch.float32 and got.shape == want.value.shape
            reference.assert_close(got.numpy(), want, rtol=1e-6, atol=1e-6)
    if bits == 8:                  # and torch's own quantized op, bags of one row
        ix = torch.from_numpy(rng.integers(0, 25, 10))
        t = torch.ops.quantized.embedding_bag_byte_rowwise_offsets(
            torch.from_numpy(packed), ix, torch.arange(10), False, 0, False, None, None, False)
        torch.testing.assert_close(ops.embedding_quantized(torch.from_numpy(packed), ix, 8, dim),
                                   t, rtol=1e-6, atol=1e-6)
    with pytest.raises(RuntimeError, match=r"\[1\] = 25 is not in the valid range \[0, 25\)"):
        ops.embedding_quantized(torch.from_numpy(packed), torch.tensor([0, 25]), bits, dim)
    with pytest.raises(RuntimeError, match="do not hold dim"):
        ops.embedding_quantized(torch.from_numpy(packed), torch.tensor([0]), bits, dim + 8)
    with pytest.raises(RuntimeError, match="bits must be 8, 4 or 2; got 3"):
        ops.embedding_quantized(torch.from_numpy(packed), torch.tensor([0]), 3, dim)


def test_embedding_threads_bit_identical(rng):
    weight = torch.from_numpy(rng.standard_normal((5000, 64)).astype(np.float32))
    ix = torch.from_numpy(rng.integers(0, 5000, (400, 500)))
    old = torch.get_num_threads()
    try:
        outs = []
        for nt in (1, 2, 3):
            torch.set_num_threads(nt)
            outs.append(ops.embedding(weight, ix, -1))
    finally:
        torch.set_num_threads(old)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    assert torch.equal(outs[0], torch.embedding(weight, ix))


def test_new_ops_run_without_perfkernels_python():
    """Only torch and the library: the fused op and the unpooled lookup answer."""
    run_with_torch_only(
        "ops = torch.ops.perfkernels\n"
        "w = [torch.arange(12.).reshape(4, 3), torch.ones(2, 3)]\n"
        "dense = torch.tensor([[1., 0., 0.]])\n"
        "ix = [torch.tensor([1, 3]), torch.tensor([0])]\n"
        "off = [torch.tensor([0]), torch.tensor([0])]\n"
        "out = ops.embedding_bags_interaction_inference(dense, w, ix, off, False, 'cat', 'dlrm',"
        " False, [0, 0], [-1, -1], [0, 0], [0, 0], 0)\n"
        "assert out.tolist() == [[1., 0., 0., 12., 14., 16., 1., 1., 1.]], out\n"
        "dot = ops.embedding_bags_interaction_inference(dense, w, ix, off, False, 'dot', 'dlrm',"
        " False, [0, 0], [-1, -1], [0, 0], [0, 0], 0)\n"
        "assert dot.tolist() == [[1., 0., 0., 12., 1., 42.]], dot\n"
        "assert ops.embedding(w[0], torch.tensor([[3], [0]]), -1).tolist() == "
        "[[[9., 10., 11.]], [[0., 1., 2.]]]", pt.native_library_path())


@pytest.mark.parametrize("name", ["embedding_bag", "embedding_bag_collection", "embedding",
                                  "embedding_bags_interaction"])
def test_inference_twins(name):
    """Each op with autograd has a twin without it (same schema, same native kernel)."""
    base = getattr(ops, name).default._schema
    twin = getattr(ops, f"{name}_inference").default._schema
    assert str(twin) == str(base).replace(f"perfkernels::{name}(",
                                          f"perfkernels::{name}_inference(")
    assert "Autograd" in torch._C._dispatch_dump(f"perfkernels::{name}")
    assert "Autograd" not in torch._C._dispatch_dump(f"perfkernels::{name}_inference")


def _exported_targets(module, args):
    program = torch.export.export(module, args)
    return {str(n.target) for n in program.graph.nodes if "perfkernels" in str(n.target)}


def test_graphs_without_gradients_call_the_twins(rng):
    bag = pt.EmbeddingBag(30, 8, mode="sum")
    seq = pt.Embedding(30, 8)
    ix, off = torch.tensor([1, 2, 29, 4]), torch.tensor([0, 3])
    with torch.no_grad():
        assert _exported_targets(bag, (ix, off)) == {"perfkernels.embedding_bag_inference.default"}
        assert _exported_targets(seq, (ix,)) == {"perfkernels.embedding_inference.default"}
        want = torch.nn.functional.embedding_bag(ix, bag.weight, off, mode="sum")
        compiled = torch.compile(bag, backend="aot_eager", fullgraph=True)
        torch.testing.assert_close(compiled(ix, off), want)
    assert _exported_targets(bag, (ix, off)) == {"perfkernels.embedding_bag.default"}
    assert _exported_targets(seq, (ix,)) == {"perfkernels.embedding.default"}


PREPACK = {8: "embedding_bag_byte_prepack", 4: "embedding_bag_4bit_prepack",
           2: "embedding_bag_2bit_prepack"}


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("dim", [1, 7, 8, 16, 17, 64, 129])
def test_quantize_and_dequantize_rowwise(isa, rng, bits, dim):
    table = rng.standard_normal((23, dim)).astype(np.float32)
    table[3] = 0.5                                     # a constant row (scale 0)
    for src in (table, table.astype(np.float16)):
        got = pt.quantize_rowwise(torch.from_numpy(src), bits)
        assert got.dtype == torch.uint8
        assert got.numpy().tobytes() == reference.quantize_rowwise(src, bits).tobytes()
    if dim % (8 // bits) == 0 and bits != 2:            # and torch's own packing, bit for bit
        torch_packed = getattr(torch.ops.quantized, PREPACK[bits])(torch.from_numpy(table))
        assert torch.equal(pt.quantize_rowwise(torch.from_numpy(table), bits), torch_packed)
    packed = pt.quantize_rowwise(torch.from_numpy(table), bits)
    want = reference.embedding_quantized(packed.numpy(), np.arange(23), bits, dim)
    reference.assert_close(pt.dequantize_rowwise(packed, bits, dim).numpy(), want, rtol=1e-6,
                           atol=1e-6)
    strided = torch.from_numpy(np.ascontiguousarray(np.repeat(table, 2, axis=1)))[:, ::2]
    assert torch.equal(pt.quantize_rowwise(strided, bits), packed)   # a strided table is copied


def test_conversion_errors_and_tracing():
    w = torch.randn(5, 8)
    bad = w.clone()
    bad[2, 3] = float("nan")
    with pytest.raises(RuntimeError, match="weight row 2 holds NaN or inf"):
        pt.quantize_rowwise(bad, 8)
    with pytest.raises(RuntimeError, match="bits must be 8, 4 or 2; got 3"):
        pt.quantize_rowwise(w, 3)
    with pytest.raises(RuntimeError, match="weight must be float32 or float16; got torch.float64"):
        pt.quantize_rowwise(w.double(), 8)
    with pytest.raises(RuntimeError, match="do not hold dim"):
        pt.dequantize_rowwise(pt.quantize_rowwise(w, 4), 4, 9)
    assert pt.dequantize_rowwise(pt.quantize_rowwise(w, 4), 4).shape == (5, 8)

    class RoundTrip(torch.nn.Module):
        def forward(self, x):
            return pt.dequantize_rowwise(pt.quantize_rowwise(x, 8), 8, x.shape[1])

    targets = _exported_targets(RoundTrip(), (w,))
    assert targets == {"perfkernels.quantize_rowwise.default",
                       "perfkernels.dequantize_rowwise.default"}
    compiled = torch.compile(RoundTrip(), backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(w), RoundTrip()(w))
