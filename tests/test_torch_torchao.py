"""torchao's weight-only quantized embeddings read into QuantizedEmbedding / QuantizedEmbeddingBag.

torchao is optional (never a dependency): the tests that quantize with it skip where it is
missing, with the reason; CI's interop step installs it and sets PERFKERNELS_REQUIRE_TORCHAO=1,
under which a failed import fails.  The references are torchao's own forward (its dequantized
weight) and a float64 NumPy dequantization written from torchao's formula,
``(qdata - zero_point) * scale`` per row.
"""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import perfkernels  # noqa: E402
import perfkernels.torch as pt  # noqa: E402
from perfkernels.torch._torchao import is_torchao_weight  # noqa: E402

# D = 1 is left out: torchao 0.18 cannot quantize a one-column table (its per-row reduction
# of a [rows, 1] weight collapses to one scale and fails to reshape)
DIMS = [2, 7, 8, 9, 16, 17, 64, 129]


@pytest.fixture(scope="module")
def ao():
    """torchao.quantization, or a skip naming why it is unusable here."""
    try:
        import torchao.quantization as module
        from torchao.quantization import granularity  # noqa: F401
    except Exception as exc:   # ImportError, or a torchao built for another torch
        if os.environ.get("PERFKERNELS_REQUIRE_TORCHAO") == "1":
            raise
        pytest.skip(f"torchao is not usable here (optional): {type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}")
    return module


def _table(rng, rows, dim, dtype=torch.float32):
    w = rng.standard_normal((rows, dim)).astype(np.float32) * rng.uniform(0.01, 3, (rows, 1))
    w += rng.uniform(-1, 1, (rows, 1))     # rows off zero, so the zero points vary
    return torch.from_numpy(w.astype(np.float32)).to(dtype)


def _quantized(ao, module, config):
    model = torch.nn.Sequential(module)
    ao.quantize_(model, config,
                 filter_fn=lambda m, fqn: isinstance(m, (torch.nn.Embedding,
                                                         torch.nn.EmbeddingBag)))
    assert is_torchao_weight(model[0].weight), type(model[0].weight)
    return model[0]


def _embedding(ao, rng, rows, dim, config, dtype=torch.float32, **kwargs):
    emb = torch.nn.Embedding(rows, dim, **kwargs)
    with torch.no_grad():
        emb.weight.copy_(_table(rng, rows, dim, dtype))
    return _quantized(ao, emb.to(dtype), config)


def _plain(weight):
    """(codes, scale, zero point) of torchao's tensor through its public attributes: qdata /
    scale / zero_point, or an AffineQuantizedTensor's tensor_impl.get_plain() (torchao <= 0.17)."""
    if hasattr(weight, "tensor_impl"):
        return weight.tensor_impl.get_plain()
    return weight.qdata, weight.scale, weight.zero_point


def _reference64(weight):
    """torchao's dequantization in float64 from its attributes: ``(q - zp) * scale`` per row."""
    q, scale, zp = _plain(weight)
    q = q.numpy().astype(np.float64)
    rows = q.shape[0]
    scale = scale.float().numpy().astype(np.float64).reshape(-1, 1)
    scale = np.broadcast_to(scale, (rows, 1)) if scale.size == 1 else scale
    zp = 0.0 if zp is None else zp.numpy().astype(np.float64).reshape(-1, 1)
    return (q - zp) * scale, scale


def _indices(rng, rows, index_dtype, shape=(5, 3)):
    return torch.from_numpy(rng.integers(0, rows, shape).astype(index_dtype))


def _intx(ao, width, symmetric):
    from torchao.quantization.granularity import PerAxis
    mapping = ao.MappingType.SYMMETRIC if symmetric else ao.MappingType.ASYMMETRIC
    return ao.IntxWeightOnlyConfig(weight_dtype=getattr(torch, f"int{width}"),
                                   granularity=PerAxis(0), mapping_type=mapping)


# --------------------------------------------------------------------------- without torchao

def test_not_a_torchao_weight_is_a_type_error():
    """Needs no torchao: a float table is not read as torchao's."""
    emb = torch.nn.Embedding(4, 8)
    assert not is_torchao_weight(emb.weight)
    with pytest.raises(TypeError, match="quantized by torchao"):
        pt.QuantizedEmbedding.from_torchao(emb)
    with pytest.raises(TypeError, match="quantized by torchao"):
        pt.QuantizedEmbeddingBag.from_torchao(torch.nn.EmbeddingBag(4, 8))


# --------------------------------------------------------------------------- 8-bit rows, exact

@pytest.mark.parametrize("width", [8, 7, 4, 3, 2, 1])
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("dim", DIMS)
def test_intx_per_axis_reads_bit_for_bit(ao, isa, rng, width, symmetric, dim):
    """IntxWeightOnlyConfig(int1..int8, PerAxis(0)) -> 8-bit rows: our lookups are torchao's
    forward bit for bit on the FMA levels, wherever the bias is exact (all but asymmetric int8);
    otherwise within the documented rounding of the bias / of the product (portable level)."""
    rows = 37
    qemb = _embedding(ao, rng, rows, dim, _intx(ao, width, symmetric))
    ours = pt.QuantizedEmbedding.from_torchao(qemb)
    assert ours.bits == 8 and ours.embedding_dim == dim and ours.num_embeddings == rows
    for index_dtype in (np.int64, np.int32):
        idx = _indices(rng, rows, index_dtype)
        got = ours(idx)
        expected = qemb(idx.long())
        ref64, scale = _reference64(qemb.weight)
        assert got.dtype == torch.float32 and got.shape == (5, 3, dim)
        # torchao's (q - zp) * scale is exact in float64, so torchao is its float32 rounding
        assert torch.equal(expected, torch.from_numpy(ref64.astype(np.float32))[idx.long()])
        exact = isa != "scalar" and (width < 8 or symmetric)
        if exact:
            assert torch.equal(got, expected)
        else:
            # the bias -(zp + 128) * scale rounded to float32 (asymmetric int8), and / or the
            # product rounded before the sum (portable level): within ulp(256 * scale) each
            tol = 2 * np.spacing(np.float32(256) * scale.astype(np.float32))
            err = np.abs(got.numpy().astype(np.float64) - ref64[idx.long().numpy()])
            assert (err <= tol[idx.long().numpy()]).all(), err.max()
    assert torch.equal(ours.dequantize(), qemb.weight.dequantize()) or not exact


@pytest.mark.parametrize("granularity", ["PerRow", "PerTensor"])
@pytest.mark.parametrize("dim", [2, 9, 64, 127])
def test_int8_weight_only_reads_bit_for_bit(ao, isa, rng, granularity, dim):
    """Int8WeightOnlyConfig (Int8Tensor, symmetric): one scale per row or per table."""
    from torchao.quantization import granularity as g
    rows = 29
    qemb = _embedding(ao, rng, rows, dim,
                      ao.Int8WeightOnlyConfig(granularity=getattr(g, granularity)()))
    ours = pt.QuantizedEmbedding.from_torchao(qemb)
    idx = _indices(rng, rows, np.int64, (40,))
    ref64, _ = _reference64(qemb.weight)
    if isa != "scalar":
        assert torch.equal(ours(idx), qemb(idx))
        assert torch.equal(ours(idx), torch.from_numpy(ref64.astype(np.float32))[idx])
    else:
        np.testing.assert_allclose(ours(idx).numpy(), ref64[idx.numpy()], rtol=1e-6, atol=1e-6)


def test_bfloat16_table_rounds_to_torchao_output(ao, isa, rng):
    """A bfloat16 table: torchao dequantizes in bfloat16; our float32 rows rounded to bfloat16
    are its output (the float32 product of a bfloat16 scale and a code is exact)."""
    qemb = _embedding(ao, rng, 23, 33, _intx(ao, 4, True), dtype=torch.bfloat16)
    ours = pt.QuantizedEmbedding.from_torchao(qemb)
    idx = _indices(rng, 23, np.int64, (50,))
    expected = qemb(idx)
    assert expected.dtype == torch.bfloat16
    assert torch.equal(ours(idx).to(torch.bfloat16), expected)


def test_padding_idx_and_empty_indices(ao, rng):
    qemb = _embedding(ao, rng, 10, 16, _intx(ao, 8, True), padding_idx=3)
    ours = pt.QuantizedEmbedding.from_torchao(qemb)
    assert ours.padding_idx == 3
    empty = torch.zeros((0,), dtype=torch.int64)
    assert ours(empty).shape == (0, 16) == qemb(empty).shape
    with pytest.raises(IndexError):
        ours(torch.tensor([10]))


# --------------------------------------------------------------------------- compact rows

@pytest.mark.parametrize("width,bits", [(4, 4), (3, 4), (2, 2), (1, 2), (2, 4)])
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("dim", [2, 7, 8, 17, 64])
def test_compact_rows_round_scale_and_bias_to_float16(ao, isa, rng, width, bits, symmetric,
                                                      dim):
    """bits=4/2: codes q - qmin exactly, scale and (qmin - zp) * scale rounded to float16: our
    lookups are the float32 rounding of the float64 dequantization with those float16 values
    (bit for bit, every level), and within float16's rounding of them of torchao's."""
    rows = 31
    qemb = _embedding(ao, rng, rows, dim, _intx(ao, width, symmetric))
    ours = pt.QuantizedEmbedding.from_torchao(qemb, bits=bits)
    assert ours.bits == bits
    w = qemb.weight
    qmin = -(1 << (width - 1))
    codes = w.qdata.numpy().astype(np.float64) - qmin
    s64 = w.scale.numpy().astype(np.float64).reshape(rows, 1)
    zp = w.zero_point.numpy().astype(np.float64).reshape(rows, 1)
    s16 = s64.astype(np.float16).astype(np.float64)
    b16 = ((qmin - zp) * s64).astype(np.float16).astype(np.float64)
    ref = (codes * s16 + b16).astype(np.float32)
    idx = _indices(rng, rows, np.int32, (60,))
    got = ours(idx).numpy()
    np.testing.assert_array_equal(got, ref[idx.numpy()])
    # against torchao: the codes' share of the float16 scale's rounding plus the bias's
    expected = qemb(idx.long()).numpy().astype(np.float64)
    bound = ((1 << width) * np.abs(s16 - s64) + np.abs(b16 - (qmin - zp) * s64)
             + np.spacing(np.float32(np.abs(ref).max())))
    assert (np.abs(got - expected) <= bound[idx.numpy()]).all()


def test_compact_rows_refuse_wider_codes(ao, rng):
    qemb = _embedding(ao, rng, 5, 8, _intx(ao, 8, True))
    with pytest.raises(ValueError, match=r"8-bit codes.*bits=4"):
        pt.QuantizedEmbedding.from_torchao(qemb, bits=4)
    qemb = _embedding(ao, rng, 5, 8, _intx(ao, 3, True))
    with pytest.raises(ValueError, match=r"3-bit codes.*bits=2"):
        pt.QuantizedEmbedding.from_torchao(qemb, bits=2)
    with pytest.raises(ValueError, match="bits must be 8, 4 or 2"):
        pt.QuantizedEmbedding.from_torchao(qemb, bits=3)


# --------------------------------------------------------------------------- refused

@pytest.mark.parametrize("config", ["intx_group", "int8_group"])
def test_per_group_is_refused_naming_the_granularity(ao, rng, config):
    from torchao.quantization.granularity import PerGroup
    if config == "intx_group":
        cfg = ao.IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))
    elif ao.Int8WeightOnlyConfig().version == 1:     # torchao <= 0.17: AffineQuantizedTensor
        cfg = ao.Int8WeightOnlyConfig(group_size=32)
    else:
        cfg = ao.Int8WeightOnlyConfig(granularity=PerGroup(32))
    qemb = _embedding(ao, rng, 6, 64, cfg)
    with pytest.raises(ValueError, match=r"granularity PerGroup\(32\).*one scale and bias per "
                                         r"row.*PerAxis\(0\)"):
        pt.QuantizedEmbedding.from_torchao(qemb)
    # a group as wide as the row is one scale per row
    qemb = _embedding(ao, rng, 6, 32, cfg)
    ours = pt.QuantizedEmbedding.from_torchao(qemb)
    ref64, _ = _reference64(qemb.weight)
    np.testing.assert_allclose(ours.dequantize().numpy(), ref64, rtol=0, atol=1e-5)


# --------------------------------------------------------------------------- bags

@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("width", [8, 4, 2])
def test_embedding_bag(ao, isa, rng, mode, width):
    """torchao quantizes an EmbeddingBag's weight but cannot run its forward; ours sums (or, as
    the float module did, averages) torchao's dequantized rows."""
    rows, dim = 41, 24
    bag = torch.nn.EmbeddingBag(rows, dim, mode=mode)
    with torch.no_grad():
        bag.weight.copy_(_table(rng, rows, dim))
    qbag = _quantized(ao, bag, _intx(ao, width, True))
    ours = pt.QuantizedEmbeddingBag.from_torchao(qbag)
    assert ours.bits == 8 and ours.mode == mode
    deq = qbag.weight.dequantize()
    ref64, _ = _reference64(qbag.weight)
    idx = _indices(rng, rows, np.int64, (30,))
    offsets = torch.tensor([0, 0, 4, 5, 17, 30], dtype=torch.int64)
    got = ours(idx, offsets)
    np.testing.assert_allclose(got.numpy(), F.embedding_bag(idx, deq, offsets, mode=mode).numpy(),
                               rtol=1e-5, atol=1e-5)
    # float64 reference from the formula
    bounds = list(offsets.numpy()) + [len(idx)]
    for b in range(len(offsets)):
        sel = ref64[idx.numpy()[bounds[b]:bounds[b + 1]]]
        want = sel.sum(0) if mode == "sum" or len(sel) == 0 else sel.mean(0)
        np.testing.assert_allclose(got[b].numpy(), want, rtol=1e-5, atol=1e-5)
    # one row a bag: torchao's rows, to the bag kernels' rounding of code * scale before the
    # bias is added (within ulp(256 * scale) of the row)
    single = ours(idx, torch.arange(len(idx), dtype=torch.int64)).numpy()
    scale = _plain(qbag.weight)[1].numpy().reshape(-1, 1)[idx.numpy()]
    err = np.abs(single - ref64[idx.numpy()]) if mode == "sum" else 0
    assert (err <= 2 * np.spacing(np.float32(256) * scale)).all()


def test_max_norm_is_refused(ao, rng):
    qemb = _embedding(ao, rng, 8, 8, _intx(ao, 8, True), max_norm=1.0)
    with pytest.raises(ValueError, match="max_norm=1.0"):
        pt.QuantizedEmbedding.from_torchao(qemb)


def test_embedding_bag_max_is_refused(ao, rng):
    qbag = _quantized(ao, torch.nn.EmbeddingBag(8, 8, mode="max"), _intx(ao, 8, True))
    with pytest.raises(ValueError, match="mode must be 'sum' or 'mean'"):
        pt.QuantizedEmbeddingBag.from_torchao(qbag)


# --------------------------------------------------------------------------- convert()

def test_convert_swaps_torchao_modules(ao, rng):
    from torchao.quantization.granularity import PerGroup

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(30, 16)
            self.bag = torch.nn.EmbeddingBag(20, 16, mode="sum")
            self.grouped = torch.nn.Embedding(10, 64)
            self.plain = torch.nn.Embedding(10, 16)

        def forward(self, i):
            return self.emb(i)

    model = Model()
    torch.nn.init.normal_(model.emb.weight)
    torch.nn.init.normal_(model.bag.weight)
    ao.quantize_(model, _intx(ao, 4, False),
                 filter_fn=lambda m, fqn: fqn in ("emb", "bag"))
    ao.quantize_(model, ao.IntxWeightOnlyConfig(weight_dtype=torch.int4,
                                                granularity=PerGroup(32)),
                 filter_fn=lambda m, fqn: fqn == "grouped")
    idx = torch.tensor([[0, 29, 5], [7, 7, 1]])
    expected = model(idx)
    deq_bag = model.bag.weight.dequantize()
    new = pt.convert(model)
    assert type(new.emb) is pt.QuantizedEmbedding and new.emb.bits == 8
    assert type(new.bag) is pt.QuantizedEmbeddingBag
    assert type(new.grouped) is torch.nn.Embedding        # left to torchao, with the reason
    assert type(new.plain) is pt.Embedding
    report = pt.last_report()
    assert any(n == "grouped" and "PerGroup(32)" in why for n, _, why in report.skipped)
    assert any(n == "emb" and "torchao" in note for n, _, _, note in report.swapped)
    got = new(idx)
    if perfkernels.active_isa() != "scalar":
        assert torch.equal(got, expected)
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-6, atol=1e-6)
    bag_idx = torch.tensor([1, 2, 3, 19])
    np.testing.assert_allclose(new.bag(bag_idx, torch.tensor([0, 2])).numpy(),
                               F.embedding_bag(bag_idx, deq_bag, torch.tensor([0, 2]),
                                               mode="sum").numpy(), rtol=1e-6, atol=1e-6)
    # bits= asks for compact rows
    new4 = pt.convert(model, bits=4)
    assert new4.emb.bits == 4 and new4.bag.bits == 4


def test_from_float_reads_a_torchao_module(ao, rng):
    """from_float of a torchao-quantized module reads its codes (not quantizing them again)."""
    qemb = _embedding(ao, rng, 12, 16, _intx(ao, 4, False))
    a = pt.QuantizedEmbedding.from_float(qemb, bits=4)
    b = pt.QuantizedEmbedding.from_torchao(qemb, bits=4)
    assert torch.equal(a.packed_weight, b.packed_weight)
    assert torch.equal(pt.QuantizedEmbedding.from_float(qemb, bits=8).packed_weight,
                       pt.QuantizedEmbedding.from_torchao(qemb).packed_weight)
    bag = torch.nn.EmbeddingBag(12, 16)
    qbag = _quantized(ao, bag, _intx(ao, 8, True))
    assert torch.equal(pt.QuantizedEmbeddingBag.from_float(qbag).packed_weight,
                       pt.QuantizedEmbeddingBag.from_torchao(qbag).packed_weight)


def test_large_lookup_any_thread_count(ao, rng):
    """A lookup big enough to go parallel: the same bits for 1, 2 and 3 threads, and torchao's."""
    qemb = _embedding(ao, rng, 3000, 64, _intx(ao, 8, True))
    ours = pt.QuantizedEmbedding.from_torchao(qemb)
    idx = _indices(rng, 3000, np.int64, (200, 50))
    before = perfkernels.get_num_threads()
    try:
        outs = []
        for n in (1, 2, 3):
            perfkernels.set_num_threads(n)
            outs.append(ours(idx))
    finally:
        perfkernels.set_num_threads(before)
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    if perfkernels.active_isa() != "scalar":
        assert torch.equal(outs[0], qemb(idx))


def test_float_zero_points(ao, isa, rng):
    """Float zero points holding integers are read as those integers (bit for bit); others are
    refused, since they are no offset of the codes."""
    from torchao.quantization import IntxUnpackedToInt8Tensor
    rows, dim = 9, 16
    qdata = torch.from_numpy(rng.integers(-8, 8, (rows, dim)).astype(np.int8))
    scale = torch.from_numpy(rng.uniform(0.01, 1, (rows, 1)).astype(np.float32))

    def module(zero_point):
        w = IntxUnpackedToInt8Tensor(qdata, scale, zero_point, torch.int4, (1, dim),
                                     torch.float32, None)
        emb = torch.nn.Embedding(rows, dim)
        emb.weight = torch.nn.Parameter(w, requires_grad=False)
        return emb

    whole = module(torch.from_numpy(rng.integers(-8, 8, (rows, 1)).astype(np.float32)))
    ours = pt.QuantizedEmbedding.from_torchao(whole)
    idx = torch.arange(rows)
    ref64, _ = _reference64(whole.weight)
    if isa != "scalar":
        np.testing.assert_array_equal(ours(idx).numpy(), ref64.astype(np.float32))
        assert torch.equal(ours(idx), whole(idx))
    np.testing.assert_allclose(ours(idx).numpy(), ref64, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="non-integer float zero points"):
        pt.QuantizedEmbedding.from_torchao(module(torch.full((rows, 1), 0.5)))
