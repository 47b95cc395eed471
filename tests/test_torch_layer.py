"""perfkernels.torch against the torch modules it replaces: forward, backward, options, state_dict,
convert(), errors, torch.compile / torch.export."""
import copy
import io
import pickle
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import perfkernels.torch as pt  # noqa: E402
from conftest import AWKWARD_DIMS, run_python  # noqa: E402
from perfkernels import reference  # noqa: E402

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3),
       torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2)}


def _bags(gen, rows, num_bags, max_len, *, pad=None, dtype=torch.int64):
    """Random bags (some empty) as indices + offsets; a sprinkle of padding entries."""
    lengths = torch.randint(0, max_len + 1, (num_bags,), generator=gen)
    if num_bags:
        lengths[0] = 0                         # an empty bag in every case
    ix = torch.randint(0, rows, (int(lengths.sum()),), generator=gen)
    if pad is not None and ix.numel():
        ix[::5] = pad
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)[:-1]])
    return ix.to(dtype), offsets.to(dtype)


def _pair(rows, dim, gen, **kwargs):
    """A torch EmbeddingBag and ours, sharing nothing but the initial weight values."""
    ref = torch.nn.EmbeddingBag(rows, dim, **kwargs)
    with torch.no_grad():
        ref.weight.copy_(torch.randn(rows, dim, generator=gen).to(ref.weight.dtype))
    ours = pt.EmbeddingBag(rows, dim, **kwargs)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _assert_grads_equal(g_ref, g_ours, tol):
    if g_ref.is_sparse:
        assert g_ours.is_sparse
        a, b = g_ref.coalesce(), g_ours.coalesce()
        assert torch.equal(a.indices(), b.indices())
        torch.testing.assert_close(b.values(), a.values(), **tol)
    else:
        assert not g_ours.is_sparse
        torch.testing.assert_close(g_ours, g_ref, **tol)


OPTIONS = [  # (mode, per_sample_weights, padding_idx, include_last_offset, two_d)
    ("sum", False, None, False, False),
    ("mean", False, None, False, False),
    ("sum", True, None, False, False),
    ("sum", False, 3, False, False),
    ("mean", False, -2, True, False),
    ("sum", True, 5, True, False),
    ("mean", False, None, False, True),
    ("sum", True, 1, False, True),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(map(str, o)))
def test_embedding_bag_forward_backward_matches_torch(isa, dtype, sparse, opts):
    mode, weighted, pad, ilo, two_d = opts
    gen = torch.Generator().manual_seed(hash((str(dtype), sparse, opts)) % 2**31)
    rows, dim = 40, 17
    ref, ours = _pair(rows, dim, gen, mode=mode, sparse=sparse, padding_idx=pad,
                      include_last_offset=ilo, dtype=dtype)
    if two_d:
        ix, off = torch.randint(0, rows, (6, 4), generator=gen), None
        if pad is not None:
            ix[:, 1] = pad % rows
    else:
        ix, off = _bags(gen, rows, 7, 6, pad=None if pad is None else pad % rows)
        if ilo:
            off = torch.cat([off, torch.tensor([ix.numel()])])
    psw = (torch.rand(ix.shape, generator=gen).to(dtype).requires_grad_() if weighted else None)
    psw2 = None if psw is None else psw.detach().clone().requires_grad_()
    out_ref, out = ref(ix, off, psw), ours(ix, off, psw2)
    assert out.dtype == out_ref.dtype and out.shape == out_ref.shape
    torch.testing.assert_close(out, out_ref, **TOL[dtype])
    grad = torch.randn(out.shape, generator=gen).to(dtype)
    out_ref.backward(grad)
    out.backward(grad)
    _assert_grads_equal(ref.weight.grad, ours.weight.grad, TOL[dtype])
    if weighted:
        torch.testing.assert_close(psw2.grad, psw.grad, **TOL[dtype])
    with torch.no_grad():   # the no-grad fast path agrees with the autograd path (which may
        # be torch's kernel: float rounding apart)
        torch.testing.assert_close(ours(ix, off, psw2), out.detach(), **TOL[dtype])


@pytest.mark.parametrize("dim", AWKWARD_DIMS)
def test_embedding_bag_awkward_dims_float64_reference(isa, dim, rng):
    """Forward against a float64 NumPy reference on every awkward D (int32 indices/offsets)."""
    rows = 30
    weight = rng.standard_normal((rows, dim)).astype(np.float32)
    ix = rng.integers(0, rows, 23)
    offsets = np.array([0, 0, 5, 11, 11, 20])
    m = pt.EmbeddingBag.from_pretrained(torch.from_numpy(weight), mode="sum")
    with torch.no_grad():
        out = m(torch.from_numpy(ix).int(), torch.from_numpy(offsets).int()).numpy()
    reference.assert_close(out, reference.embedding_bag(weight, ix, offsets), rtol=1e-6, atol=1e-7)


def test_optimizers_train_sparse_and_dense_like_torch():
    gen = torch.Generator().manual_seed(0)
    for sparse, opt_cls in [(True, torch.optim.SGD), (True, torch.optim.SparseAdam),
                            (True, torch.optim.Adagrad), (False, torch.optim.Adam)]:
        ref, ours = _pair(50, 8, gen, mode="mean", sparse=sparse)
        opts = [opt_cls(m.parameters(), lr=0.05) for m in (ref, ours)]
        for _ in range(3):
            ix, off = _bags(gen, 50, 9, 5)
            for m, opt in zip((ref, ours), opts):
                opt.zero_grad()
                m(ix, off).square().sum().backward()
                opt.step()
        torch.testing.assert_close(ours.weight, ref.weight, rtol=1e-5, atol=1e-6)


def test_weight_gradient_formula_float64():
    """The weight and per-sample-weight gradients against the formula, in float64 NumPy."""
    gen = torch.Generator().manual_seed(1)
    m = pt.EmbeddingBag(12, 5, mode="sum", padding_idx=4)
    ix = torch.tensor([1, 4, 1, 7, 11, 4, 0])
    off = torch.tensor([0, 3, 3])
    psw = torch.rand(7, generator=gen, requires_grad=True)
    grad = torch.randn(3, 5, generator=gen)
    m(ix, off, psw).backward(grad)
    w, g, p = (m.weight.detach().double().numpy(), grad.double().numpy(),
               psw.detach().double().numpy())
    bag = [0, 0, 0, 2, 2, 2, 2]
    want_w = np.zeros_like(w)
    want_p = np.zeros(7)
    for j, r in enumerate(ix.tolist()):
        if r != 4:
            want_w[r] += p[j] * g[bag[j]]
            want_p[j] = g[bag[j]] @ w[r]
    np.testing.assert_allclose(m.weight.grad.numpy(), want_w, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(psw.grad.numpy(), want_p, rtol=1e-6, atol=1e-6)


def test_state_dict_and_from_pretrained_round_trip():
    ref = torch.nn.EmbeddingBag(20, 6, mode="sum", padding_idx=2)
    ours = pt.EmbeddingBag(20, 6, mode="sum", padding_idx=2)
    ours.load_state_dict(ref.state_dict())
    assert list(ours.state_dict()) == list(ref.state_dict())
    back = torch.nn.EmbeddingBag(20, 6, mode="sum", padding_idx=2)
    back.load_state_dict(ours.state_dict())
    assert torch.equal(back.weight, ref.weight)
    pre = pt.EmbeddingBag.from_pretrained(ref.weight.detach(), mode="sum", freeze=True)
    assert type(pre) is pt.EmbeddingBag and not pre.weight.requires_grad
    ix, off = torch.tensor([1, 2, 3, 19]), torch.tensor([0, 2])
    torch.testing.assert_close(pre(ix, off), torch.nn.EmbeddingBag.from_pretrained(
        ref.weight.detach(), mode="sum")(ix, off))
    # pickling and deep copies carry no stale NumPy view of the weight
    ours(ix, off)
    clone = pickle.loads(pickle.dumps(ours))
    assert "_np_view" not in clone.__dict__
    clone2 = copy.deepcopy(ours)
    with torch.no_grad():
        clone2.weight.add_(1.0)
    assert not torch.equal(clone2(ix, off), ours(ix, off))
    buf = io.BytesIO()
    torch.save(ours.state_dict(), buf)
    buf.seek(0)
    ours.load_state_dict(torch.load(buf))


def test_weight_replaced_or_modified_is_seen():
    m = pt.EmbeddingBag(10, 4, mode="sum")
    ix, off = torch.tensor([3]), torch.tensor([0])
    with torch.no_grad():
        m(ix, off)
        m.weight.fill_(2.0)
        assert torch.equal(m(ix, off), torch.full((1, 4), 2.0))
        m.weight = torch.nn.Parameter(torch.full((10, 4), 3.0))
        assert torch.equal(m(ix, off), torch.full((1, 4), 3.0))
        m.weight.data = torch.full((10, 4), 4.0)
        assert torch.equal(m(ix, off), torch.full((1, 4), 4.0))


@pytest.mark.parametrize("grad", [False, True])
def test_out_of_range_index_raises_index_and_runtime_error(grad):
    m = pt.EmbeddingBag(10, 4, mode="sum")
    with torch.set_grad_enabled(grad):
        for bad in (10, -1, 1_000_000):
            with pytest.raises(pt.IndexOutOfRangeError,
                               match=rf"Index 2 of input takes value {bad} which is not in the "
                                     rf"valid range \[0, 10\)"):
                m(torch.tensor([1, 2, bad, 3]), torch.tensor([0, 2]))
    assert issubclass(pt.IndexOutOfRangeError, IndexError)
    assert issubclass(pt.IndexOutOfRangeError, RuntimeError)
    q = pt.QuantizedEmbeddingBag(10, 4)
    with pytest.raises(RuntimeError, match=r"Index 0 is out of bounds: 12, range 0 to 10"):
        q(torch.tensor([12]), torch.tensor([0]))


def test_unsupported_options_fall_back_to_torch_with_one_warning():
    gen = torch.Generator().manual_seed(3)
    for kwargs in (dict(mode="max"), dict(max_norm=1.0), dict(scale_grad_by_freq=True)):
        ref, ours = _pair(30, 5, gen, **kwargs)
        ix, off = _bags(gen, 30, 4, 5)
        ix[0] = 1
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.testing.assert_close(ours(ix, off), ref(ix, off))
            ours(ix, off)
        msgs = [str(w.message) for w in caught if "perfkernels" in str(w.message)]
        assert len(msgs) <= 1     # once per reason per process
    pt._fallback._warned.clear()
    with pytest.warns(RuntimeWarning, match="mode='max'"):
        pt.EmbeddingBag(5, 2, mode="max")(torch.tensor([1]), torch.tensor([0]))


class _TorchRecLikeCollection(torch.nn.Module):
    """TorchRec's unsharded EmbeddingBagCollection calls its tables with keyword arguments."""

    def __init__(self):
        super().__init__()
        self.embedding_bags = torch.nn.ModuleDict({
            "t0": torch.nn.EmbeddingBag(30, 4, mode="sum", sparse=True),
            "t1": torch.nn.EmbeddingBag(20, 4, mode="mean"),
            "odd": torch.nn.EmbeddingBag(20, 4, mode="max"),
        })

    def forward(self, ix, off):
        return torch.cat([e(input=ix, offsets=off) for e in self.embedding_bags.values()], 1)


def test_convert_swaps_shares_parameters_and_reports():
    model = _TorchRecLikeCollection().eval()
    ix, off = torch.tensor([1, 2, 3, 4, 5]), torch.tensor([0, 2])
    want = model(ix, off)
    new = pt.convert(model)
    bags = new.embedding_bags
    assert type(bags["t0"]) is pt.EmbeddingBag and type(bags["t1"]) is pt.EmbeddingBag
    assert type(bags["odd"]) is torch.nn.EmbeddingBag
    assert bags["t0"].weight is model.embedding_bags["t0"].weight     # shared, not copied
    assert bags["t0"].sparse and not new.training and not bags["t1"].training
    assert type(model.embedding_bags["t0"]) is torch.nn.EmbeddingBag  # inplace=False
    torch.testing.assert_close(new(ix, off), want)
    report = pt.last_report()
    assert [s[0] for s in report.swapped] == ["embedding_bags.t0", "embedding_bags.t1"]
    assert report.skipped[0][0] == "embedding_bags.odd" and "max" in report.skipped[0][2]
    assert "skipped embedding_bags.odd" in str(report)
    same = pt.convert(model, inplace=True)
    assert same is model and type(model.embedding_bags["t1"]) is pt.EmbeddingBag


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_convert_to_half_tables_keeps_float32_outputs(dtype):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.EmbeddingBag(50, 8, mode="sum"))
    ix, off = torch.randint(0, 50, (30,)), torch.tensor([0, 10, 20])
    # the reference: float64 sums of the rows as the converted table stores them (rounded to
    # ``dtype``); the float32 table's own sums differ from those by the rows' rounding, which
    # over 10 rows can pass any tolerance fit for the sums themselves
    want = torch.nn.functional.embedding_bag(
        ix, model[0].weight.detach().to(dtype).double(), off, mode="sum").float()
    new = pt.convert(model, dtype=dtype)
    assert new[0].weight.dtype == dtype
    out = new[0](ix, off)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, want, **TOL[dtype])
    out.sum().backward()
    assert new[0].weight.grad.dtype == dtype


def test_route_functional():
    w = torch.randn(10, 3)
    with pt.route_functional():
        assert torch.nn.functional.embedding_bag is pt.embedding_bag
        with pytest.raises(pt.IndexOutOfRangeError):
            torch.nn.functional.embedding_bag(torch.tensor([11]), w, torch.tensor([0]))
        got = torch.nn.functional.embedding_bag(torch.tensor([1, 2, 9]), w, torch.tensor([0, 1]),
                                                mode="sum", padding_idx=-1)
    assert torch.nn.functional.embedding_bag is not pt.embedding_bag
    torch.testing.assert_close(got, torch.nn.functional.embedding_bag(
        torch.tensor([1, 2, 9]), w, torch.tensor([0, 1]), mode="sum", padding_idx=-1))


def test_import_perfkernels_does_not_import_torch():
    r = run_python(["-c", "import sys, perfkernels; assert 'torch' not in sys.modules, 'torch'"])
    assert r.returncode == 0, r.stderr


# --------------------------------------------------------------------------- quantized tables

def _ao_module(bits, rows, dim, mode="sum", seed=0):
    from torch.ao.nn.quantized import EmbeddingBag as QEmbeddingBag
    from torch.ao.quantization.qconfig import (float_qparams_weight_only_qconfig,
                                               float_qparams_weight_only_qconfig_4bit)
    torch.manual_seed(seed)
    f = torch.nn.EmbeddingBag(rows, dim, mode=mode)
    f.qconfig = float_qparams_weight_only_qconfig if bits == 8 else \
        float_qparams_weight_only_qconfig_4bit
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return f, QEmbeddingBag.from_float(f)


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_from_torch_ao_and_its_state_dict(isa, bits):
    _, ao = _ao_module(bits, 60, 16)
    gen = torch.Generator().manual_seed(bits)
    ix, off = _bags(gen, 60, 9, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = ao(ix, off)
        sd = ao.state_dict()
    ours = pt.QuantizedEmbeddingBag.from_torch_ao(ao)
    torch.testing.assert_close(ours(ix, off), want, rtol=1e-6, atol=1e-5)
    fresh = pt.QuantizedEmbeddingBag(60, 16, dtype=ao.dtype)
    fresh.load_state_dict(sd)                        # torch's checkpoint loads unchanged
    assert torch.equal(fresh.packed_weight, ours.packed_weight)
    again = pt.QuantizedEmbeddingBag(60, 16, dtype=bits)
    again.load_state_dict(ours.state_dict())         # ours round-trips
    assert torch.equal(again.packed_weight, ours.packed_weight)
    assert list(ours.state_dict()) == ["packed_weight"]
    model = torch.nn.Sequential(ao)
    new = pt.convert(model)
    assert type(new[0]) is pt.QuantizedEmbeddingBag


@pytest.mark.parametrize("bits,name", [(8, "byte"), (4, "4bit"), (2, "2bit")])
def test_quantized_from_packed_and_op_aliases_match_torch_ops(isa, bits, name):
    gen = torch.Generator().manual_seed(bits)
    weight = torch.randn(70, 32, generator=gen)
    prepack = getattr(torch.ops.quantized, f"embedding_bag_{name}_prepack")
    packed = prepack(weight)
    ix, off = _bags(gen, 70, 11, 6)
    psw = torch.rand(ix.shape, generator=gen)
    torch_op = getattr(torch.ops.quantized, f"embedding_bag_{name}_rowwise_offsets")
    ours_op = getattr(pt, f"embedding_bag_{name}_rowwise_offsets")
    for kwargs in (dict(), dict(per_sample_weights=psw)):
        want = torch_op(packed, ix, off, **kwargs)
        torch.testing.assert_close(ours_op(packed, ix, off, **kwargs), want,
                                   rtol=1e-5, atol=1e-5)
        m = pt.QuantizedEmbeddingBag.from_packed(packed, bits=bits)
        assert m.packed_weight.data_ptr() == packed.data_ptr()       # used in place
        torch.testing.assert_close(m(ix, off, **kwargs), want, rtol=1e-5, atol=1e-5)
    ilo = torch.cat([off, torch.tensor([ix.numel()])])
    torch.testing.assert_close(ours_op(packed, ix, ilo, include_last_offset=True),
                               torch_op(packed, ix, ilo, include_last_offset=True),
                               rtol=1e-5, atol=1e-5)
    # our quantizer is bit-exact with torch's prepack, so from_float == from_packed
    f = torch.nn.EmbeddingBag.from_pretrained(weight, mode="sum")
    assert torch.equal(pt.QuantizedEmbeddingBag.from_float(f, bits=bits).packed_weight, packed)


@pytest.mark.parametrize("bits", [8, 4])
def test_convert_quantizes_float_tables(bits):
    with torch.random.fork_rng():
        torch.manual_seed(1)
        model = torch.nn.ModuleList([torch.nn.EmbeddingBag(80, 16, mode="mean", padding_idx=0),
                                     torch.nn.EmbeddingBag(80, 16, mode="sum")])
    gen = torch.Generator().manual_seed(0)
    ix, off = _bags(gen, 80, 10, 6, pad=0)
    new = pt.convert(model, bits=bits)
    assert all(isinstance(m, pt.QuantizedEmbeddingBag) and m.bits == bits for m in new)
    for f, q in zip(model, new):
        # against the dequantized table looked up by torch: the same rows, float rounding apart
        deq = torch.nn.EmbeddingBag.from_pretrained(q.dequantize(), mode=f.mode,
                                                    padding_idx=f.padding_idx)
        torch.testing.assert_close(q(ix, off), deq(ix, off), rtol=1e-5, atol=1e-5)
        # against the float table: each row's codes are within half a step, (max - min) /
        # (2^bits - 1) / 2, of its values (plus the float16 scale and bias's rounding), so a bag
        # is within the sum (sum) or mean (mean) of its rows' half-steps
        w = f.weight.detach().double()
        half = (w.max(1).values - w.min(1).values) / (2 ** bits - 1) / 2
        bound = torch.zeros(off.numel(), 1, dtype=torch.float64)
        ends = torch.cat([off, torch.tensor([ix.numel()])])
        for b in range(off.numel()):
            rows = [int(r) for r in ix[ends[b]:ends[b + 1]] if int(r) != f.padding_idx]
            if rows:
                bound[b] = half[rows].sum() / (len(rows) if f.mode == "mean" else 1)
        err = (q(ix, off).double() - f(ix, off).detach().double()).abs()
        assert bool((err <= bound * 1.01 + 2e-3).all()), float((err - bound).max())


# --------------------------------------------------------------------------- compile / export

class _SmallRec(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.EmbeddingBag(40, 8, mode="sum")
        self.q = pt.QuantizedEmbeddingBag.from_float(torch.nn.EmbeddingBag(40, 8), bits=4)
        self.top = torch.nn.Linear(16, 1)

    def forward(self, ix, off, psw):
        return self.top(torch.cat([self.emb(ix, off, psw), self.q(ix, off)], 1))


def test_torch_compile_fullgraph_and_export_agree_with_eager():
    torch._dynamo.reset()
    model = pt.convert(_SmallRec())
    gen = torch.Generator().manual_seed(5)
    ix, off = _bags(gen, 40, 6, 5)
    psw = torch.rand(ix.shape, generator=gen)
    eager = model(ix, off, psw)
    eager.sum().backward()
    grad_eager = model.emb.weight.grad.clone()
    model.zero_grad()
    # aot_eager traces through dynamo and AOTAutograd (fake tensors, the registered autograd)
    # without inductor's C++ compile, which would add a minute to the suite
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    out = compiled(ix, off, psw)
    torch.testing.assert_close(out, eager)
    out.sum().backward()
    torch.testing.assert_close(model.emb.weight.grad, grad_eager)
    ep = torch.export.export(model, (ix, off, psw))
    torch.testing.assert_close(ep.module()(ix, off, psw), eager)
    assert "perfkernels.embedding_bag" in str(ep.graph)


@pytest.mark.parametrize("grad", [False, True])
def test_collection_empty_batch_with_a_shared_table(grad):
    """B = 0 with two features on one table (found by the fuzzer: the per-table lookup's result
    was split into zero chunks, losing the features)."""
    tables = [pt.EmbeddingBagConfig(10, 3, name="t0", feature_names=["a", "b"]),
              pt.EmbeddingBagConfig(5, 2, name="t1", feature_names=["c"])]
    ebc = pt.EmbeddingBagCollection(tables)
    kjt = pt.KeyedJaggedTensor(["a", "b", "c"], torch.zeros(0, dtype=torch.int64),
                               lengths=torch.zeros(0, dtype=torch.int64))
    with torch.set_grad_enabled(grad):
        out = ebc(kjt)
    assert out.values().shape == (0, 8) and out.keys() == ["a", "b", "c"]


class _CollectionModel(torch.nn.Module):
    """A collection fed from plain tensors (the KJT is built inside forward, so export needs no
    pytree registration of our KJT class)."""

    def __init__(self, weighted):
        super().__init__()
        tables = [pt.EmbeddingBagConfig(50, 8, name="t0", feature_names=["f0", "f2"],
                                        pooling="mean"),
                  pt.EmbeddingBagConfig(30, 5, name="t1", feature_names=["f1"])]
        self.ebc = pt.EmbeddingBagCollection(tables, is_weighted=weighted)
        self.ebc.embedding_bags["t1"].padding_idx = 3
        self.top = torch.nn.Linear(21, 1)

    def forward(self, values, lengths, weights):
        kjt = pt.KeyedJaggedTensor(["f0", "f1", "f2"], values, weights=weights, lengths=lengths)
        return self.top(self.ebc(kjt).values())


@pytest.mark.parametrize("weighted", [False, True])
def test_collection_compile_fullgraph_and_export_agree_with_eager(weighted):
    """The collection traces whole (one registered op, output shape independent of the data):
    forward and the dense table gradients agree with eager, per-sample-weight gradients too."""
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(7)
    model = _CollectionModel(weighted)
    batch = 4
    lengths = torch.randint(0, 4, (3 * batch,), generator=gen)
    lengths[2] = 0
    rows = [50, 30, 50]
    values = torch.cat([torch.randint(0, rows[i], (int(lengths[i * batch:(i + 1) * batch].sum()),),
                                      generator=gen) for i in range(3)])
    values[1] = 3
    weights = torch.rand(values.shape, generator=gen, requires_grad=True) if weighted else None
    eager = model(values, lengths, weights)
    eager.sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    want_psw = None if weights is None else weights.grad.clone()
    model.zero_grad()
    if weights is not None:
        weights.grad = None
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    out = compiled(values, lengths, weights)
    torch.testing.assert_close(out, eager)
    out.sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], rtol=1e-5, atol=1e-6, msg=n)
    if weights is not None:
        torch.testing.assert_close(weights.grad, want_psw, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        ep = torch.export.export(model, (values, lengths, weights))
        torch.testing.assert_close(ep.module()(values, lengths, weights), eager)
    assert "perfkernels.embedding_bag_collection" in str(ep.graph)


# --------------------------------------------------------------------------- collection

@pytest.mark.parametrize("weighted", [False, True])
def test_embedding_bag_collection_matches_per_feature_torch(isa, weighted):
    gen = torch.Generator().manual_seed(int(weighted))
    tables = [pt.EmbeddingBagConfig(50, 8, name="t0", feature_names=["f0", "f2"]),
              pt.EmbeddingBagConfig(30, 5, name="t1", feature_names=["f1"],
                                    pooling="sum" if weighted else "mean")]   # torch: no weighted mean
    ebc = pt.EmbeddingBagCollection(tables, is_weighted=weighted)
    keys, batch = ["f0", "f1", "f2"], 4
    lengths = torch.randint(0, 4, (len(keys) * batch,), generator=gen)
    lengths[0] = 0
    rows = {"f0": 50, "f1": 30, "f2": 50}
    values = torch.cat([torch.randint(0, rows[k], (int(lengths[i * batch:(i + 1) * batch].sum()),),
                                      generator=gen) for i, k in enumerate(keys)])
    weights = torch.rand(values.shape, generator=gen) if weighted else None
    kjt = pt.KeyedJaggedTensor(keys, values, weights=weights, lengths=lengths)
    out = ebc(kjt)
    assert out.keys() == ["f0", "f2", "f1"] and out.length_per_key() == [8, 8, 5]
    assert out.values().shape == (batch, 21)
    offsets = kjt.offsets()
    table_of = {"f0": "t0", "f2": "t0", "f1": "t1"}
    for k in out.keys():
        f = keys.index(k)
        off = offsets[f * batch:(f + 1) * batch + 1]
        seg = values[off[0]:off[-1]]
        w = None if weights is None else weights[off[0]:off[-1]]
        bag = ebc.embedding_bags[table_of[k]]
        want = torch.nn.functional.embedding_bag(seg, bag.weight, off - off[0], mode=bag.mode,
                                                 per_sample_weights=w, include_last_offset=True)
        torch.testing.assert_close(out[k], want, rtol=1e-5, atol=1e-6)
    out.values().sum().backward()
    assert ebc.embedding_bags["t0"].weight.grad is not None
    assert list(ebc.state_dict()) == ["embedding_bags.t0.weight", "embedding_bags.t1.weight"]
    with torch.no_grad():    # the one-call multi-table path (when this build has it)
        torch.testing.assert_close(ebc(kjt).values(), out.values(), rtol=0, atol=0)


def _multi_standin(tables, indices, *, offsets, per_sample_weights, modes, padding_idx):
    """A loop of single-table calls with embedding_bags_multi's signature and layout."""
    import perfkernels as pk
    batch = (len(offsets) - 1) // len(tables)
    cols = []
    for f, table in enumerate(tables):
        off = offsets[f * batch:(f + 1) * batch + 1]
        seg = slice(off[0], off[-1])
        cols.append(pk.embedding_bag(table, indices[seg], off - off[0], include_last_offset=True,
                                     mode=modes[f], padding_idx=padding_idx[f],
                                     per_sample_weights=None if per_sample_weights is None
                                     else per_sample_weights[seg]))
    return np.concatenate(cols, axis=1)


@pytest.mark.parametrize("impl", ["this build", "stand-in"])
def test_embedding_bag_collection_one_call_path_any_key_order(impl, monkeypatch):
    from perfkernels.torch import _collection
    if impl == "stand-in":
        monkeypatch.setattr(_collection, "_multi_lookup", _multi_standin)
    elif _collection._multi_lookup is None:
        pytest.skip("this build has no perfkernels.embedding_bags_multi")
    gen = torch.Generator().manual_seed(12)
    tables = [pt.EmbeddingBagConfig(50, 8, name="t0", feature_names=["a", "b"]),
              pt.EmbeddingBagConfig(30, 3, name="t1", feature_names=["c"], pooling="mean")]
    ebc = pt.EmbeddingBagCollection(tables)
    keys, batch = ["c", "a", "b"], 3                       # not the tables' feature order
    lengths = torch.randint(0, 4, (len(keys) * batch,), generator=gen)
    values = torch.randint(0, 30, (int(lengths.sum()),), generator=gen)
    kjt = pt.KeyedJaggedTensor(keys, values, lengths=lengths)
    want = ebc(kjt)                                        # grad enabled: one call per feature
    with torch.no_grad():
        got = ebc(kjt)
    assert got.keys() == want.keys() == ["a", "b", "c"]
    torch.testing.assert_close(got.values(), want.values(), rtol=0, atol=0)
    with torch.no_grad(), pytest.raises(pt.IndexOutOfRangeError):
        ebc(pt.KeyedJaggedTensor(keys, values + 40, lengths=lengths))


# --------------------------------------------------------------------------- LSTM unit

def test_lstm_cell_matches_torch_forward_backward(isa):
    gen = torch.Generator().manual_seed(7)
    ref = torch.nn.LSTMCell(9, 17)
    ours = pt.LSTMCell(9, 17)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(5, 9, generator=gen)
    h0, c0 = torch.randn(5, 17, generator=gen), torch.randn(5, 17, generator=gen)
    hs = [(h0.clone().requires_grad_(), c0.clone().requires_grad_()) for _ in range(2)]
    (h1, c1), (h2, c2) = ref(x, hs[0]), ours(x, hs[1])
    torch.testing.assert_close(h2, h1, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c2, c1, rtol=1e-5, atol=1e-6)
    g1, g2 = torch.randn(5, 17, generator=gen), torch.randn(5, 17, generator=gen)
    (h1 * g1 + c1 * g2).sum().backward()
    (h2 * g1 + c2 * g2).sum().backward()
    for a, b in [(ref.weight_ih.grad, ours.weight_ih.grad), (ref.bias_hh.grad, ours.bias_hh.grad),
                 (hs[0][0].grad, hs[1][0].grad), (hs[0][1].grad, hs[1][1].grad)]:
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    h, c = ours(x[0])                         # unbatched input, zero state
    torch.testing.assert_close(h, ref(x[0])[0], rtol=1e-5, atol=1e-6)


def test_lstm_unit_opcheck():
    """torch.library's own consistency checks of the op (schema, fake, autograd registration)."""
    gen = torch.Generator().manual_seed(8)
    c = torch.randn(3, 4, generator=gen, requires_grad=True)
    gates = torch.randn(3, 16, generator=gen, requires_grad=True)
    torch.library.opcheck(torch.ops.perfkernels.lstm_unit.default, (c, gates, 0.5))


def test_registered_ops_pass_opcheck():
    """torch.library's consistency checks (schema, fake vs real, autograd registration)."""
    gen = torch.Generator().manual_seed(9)
    weight = torch.randn(20, 6, generator=gen, requires_grad=True)
    ix, off = torch.tensor([1, 5, 5, 19, 0]), torch.tensor([0, 2, 2])
    psw = torch.rand(5, generator=gen, requires_grad=True)
    for args in [(weight, ix, off, None, "sum", False, None),
                 (weight, ix, off, psw, "mean", False, 5),
                 (weight, ix.reshape(1, 5), None, None, "sum", False, None)]:
        torch.library.opcheck(torch.ops.perfkernels.embedding_bag.default, args)
    packed = torch.ops.quantized.embedding_bag_4bit_prepack(weight.detach())
    torch.library.opcheck(torch.ops.perfkernels.embedding_bag_quantized.default,
                          (packed, ix, off, None, "sum", False, None, 4, 6))


def test_weight_backward_can_be_replaced():
    """The hook a fused optimizer uses: it sees each entry's gradient row and may consume it."""
    m = pt.EmbeddingBag(10, 3, mode="sum")
    seen = []

    def consume(b):
        seen.append((b.indices.clone(), b.entry_grads.clone()))
        return None

    m.weight_backward = consume
    m(torch.tensor([2, 7, 2]), torch.tensor([0, 1])).sum().backward()
    assert m.weight.grad is None
    assert torch.equal(seen[0][0], torch.tensor([2, 7, 2]))
    assert torch.equal(seen[0][1], torch.ones(3, 3))


def test_torchrec_collection_converts_and_our_collection_takes_its_inputs(torchrec):
    """With TorchRec installed: convert() swaps the tables inside its unsharded
    EmbeddingBagCollection (called with input=/offsets= keywords), and ours loads its state_dict,
    takes its KeyedJaggedTensor and gives the same values."""
    tables = [torchrec.EmbeddingBagConfig(name="t0", embedding_dim=8, num_embeddings=40,
                                          feature_names=["f0", "f1"]),
              torchrec.EmbeddingBagConfig(name="t1", embedding_dim=4, num_embeddings=30,
                                          feature_names=["f2"],
                                          pooling=torchrec.PoolingType.MEAN)]
    ebc = torchrec.EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    gen = torch.Generator().manual_seed(11)
    lengths = torch.randint(0, 4, (3 * 5,), generator=gen)
    values = torch.randint(0, 30, (int(lengths.sum()),), generator=gen)
    kjt = torchrec.KeyedJaggedTensor(keys=["f0", "f1", "f2"], values=values, lengths=lengths)
    want = ebc(kjt).values()
    converted = pt.convert(ebc)
    assert all(type(m) is pt.EmbeddingBag for m in converted.embedding_bags.values())
    torch.testing.assert_close(converted(kjt).values(), want)
    ours = pt.EmbeddingBagCollection(tables)
    ours.load_state_dict(ebc.state_dict())
    torch.testing.assert_close(ours(kjt).values(), want)


def test_arm_keeps_torch_kernels_unless_asked(monkeypatch):
    """On an Arm CPU a plain convert() leaves every embedding module to torch (no route of ours
    has been timed there), saying why; PERFKERNELS_ARM_CONVERT=1 swaps as on x86, and bits= /
    dtype= (storage only ours provides) convert as asked."""
    import platform

    from perfkernels.torch import _convert
    model = torch.nn.ModuleDict({"bag": torch.nn.EmbeddingBag(50, 4, mode="sum"),
                                 "emb": torch.nn.Embedding(50, 4),
                                 "lin": torch.nn.Linear(4, 1)})
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    monkeypatch.delenv("PERFKERNELS_ARM_CONVERT", raising=False)
    assert _convert.arm_unmeasured()
    kept = pt.convert(model)
    assert type(kept["bag"]) is torch.nn.EmbeddingBag and type(kept["emb"]) is torch.nn.Embedding
    report = pt.last_report()
    assert not report.swapped
    assert {name for name, *_ in report.skipped} == {"bag", "emb"}
    assert all("Arm" in reason for *_, reason in report.skipped)
    quantized = pt.convert(model, bits=8)
    assert isinstance(quantized["bag"], pt.QuantizedEmbeddingBag)
    half = pt.convert(model, dtype=torch.float16)
    assert isinstance(half["bag"], pt.EmbeddingBag)
    monkeypatch.setenv("PERFKERNELS_ARM_CONVERT", "1")
    assert not _convert.arm_unmeasured()
    swapped = pt.convert(model)
    assert isinstance(swapped["bag"], pt.EmbeddingBag) and isinstance(swapped["emb"], pt.Embedding)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.delenv("PERFKERNELS_ARM_CONVERT")
    assert not _convert.arm_unmeasured()
