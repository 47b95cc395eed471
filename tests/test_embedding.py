"""embedding_bag: every ISA path against the float64 reference (perfkernels.reference), and against
torch.nn.functional.embedding_bag where PyTorch has the option."""
import threading

import numpy as np
import pytest

import perfkernels
from perfkernels import _variants, embedding_bag, reference
from perfkernels.benchsuite import zipf_indices

from conftest import AWKWARD_DIMS, readonly, unaligned

BF16 = _variants.BFLOAT16
TABLE_DTYPES = tuple(_variants.TABLE_DTYPES.values())
INDEX_DTYPES = _variants.INDEX_DTYPES


def run_both(weight, indices, offsets=None, rtol=1e-5, **kw):
    """Our result, checked against the float64 reference: float32 accumulation keeps the error
    within a multiple of the sum of |terms|."""
    got = embedding_bag(weight, indices, offsets, **kw)
    assert got.dtype == np.float32
    reference.assert_close(got, reference.embedding_bag(weight, indices, offsets, **kw), rtol=rtol)
    return got


def random_table(rng, rows, D, dtype):
    return rng.standard_normal((rows, D)).astype(np.float32).astype(dtype)


def random_case(rng, D, dtype=None):
    """One random call exercising a random choice of every option."""
    dtype = dtype if dtype is not None else TABLE_DTYPES[rng.integers(3)]
    rows = int(rng.integers(1, 60))
    weight = random_table(rng, rows, D, dtype)
    B = int(rng.integers(0, 8))
    lens = rng.integers(0, 7, size=B)
    n = int(lens.sum())
    index_dtype = INDEX_DTYPES[rng.integers(2)]
    indices = rng.integers(0, rows, size=n).astype(index_dtype)
    kw = {"mode": _variants.MODES[rng.integers(2)]}
    style = rng.integers(4)
    offsets = None
    off_dtype = INDEX_DTYPES[rng.integers(2)]
    if style == 0:
        offsets = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(off_dtype) if B else np.zeros(0, off_dtype)
        if B == 0:
            indices = indices[:0]
    elif style == 1:
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(off_dtype)
        kw["include_last_offset"] = True
    elif style == 2:
        kw["lengths"] = lens.astype(off_dtype)
    else:
        L = int(rng.integers(0, 6))
        indices = rng.integers(0, rows, size=(B, L)).astype(index_dtype)
        lens = np.full(B, L)
    if rng.random() < 0.3:
        kw["padding_idx"] = int(rng.integers(-rows, rows))
    wstyle = rng.integers(3)
    if wstyle == 1:
        kw["per_sample_weights"] = rng.standard_normal(indices.shape).astype(np.float32)
    elif wstyle == 2:
        kw["per_sample_weights"] = rng.standard_normal(int(lens.max(initial=0)) + int(rng.integers(0, 3))).astype(np.float32)
        kw["positional_weights"] = True
    return weight, indices, offsets, kw


# ---------------------------------------------------------------------------------------------
# correctness on every ISA path
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("D", AWKWARD_DIMS + (256,))
def test_random_cases_match_reference(isa, rng, D):
    for _ in range(12):
        weight, indices, offsets, kw = random_case(rng, D)
        run_both(weight, indices, offsets, **kw)


@pytest.mark.parametrize("dtype", TABLE_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("D", _variants.SPECIALISED_DIMS + (1000,))
def test_specialised_dims_long_bags(isa, rng, dtype, D):
    weight = random_table(rng, 300, D, dtype)
    indices = rng.integers(0, 300, size=400)
    offsets = np.array([0, 1, 1, 37, 200])
    run_both(weight, indices, offsets)
    run_both(weight, indices, offsets, per_sample_weights=rng.random(400, dtype=np.float32),
             mode="mean", padding_idx=5)


def lined_table(rows, D, dtype):
    """An uninitialised [rows, D] table whose rows start on 64-byte lines (a placed table's
    layout, built here with NumPy: a line-aligned start, the row stride padded to whole lines)."""
    itemsize = np.dtype(dtype).itemsize
    stride = -(-D * itemsize // 64) * 64
    raw = np.empty(rows * stride + 64, np.uint8)
    start = -raw.ctypes.data % 64
    table = raw[start:start + rows * stride].reshape(rows, stride)[:, :D * itemsize].view(dtype)
    assert table.ctypes.data % 64 == 0 and table.strides[0] % 64 == 0
    return table


@pytest.mark.parametrize("dtype", TABLE_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("D", [32, 96, 120, 128, 136, 160, 256, 288, 1000, 1024])
def test_placed_tables_several_passes(isa, rng, dtype, D):
    """Tables whose rows start on 64-byte lines (perfkernels.empty_table), so that a pass over a
    block that lies in lines an earlier pass of the bag prefetched prefetches nothing (AVX2's
    16-bit D = 128: 15 vectors, then 1), with bags near the end of the index list too (whose rows
    have no row to prefetch ahead of them), weights, padding and mean; and a placed table from
    perfkernels.empty_table."""
    rows = 400
    weight = lined_table(rows, D, dtype)
    weight[:] = random_table(rng, rows, D, dtype)
    indices = rng.integers(0, rows, size=300)
    offsets = np.array([0, 1, 1, 40, 250, 290, 299])
    run_both(weight, indices, offsets)
    run_both(weight, indices.astype(np.int32), offsets, mode="mean", padding_idx=int(indices[3]),
             per_sample_weights=rng.standard_normal(300).astype(np.float32))
    # a column slice: rows on lines, the block starts do not divide the row
    run_both(weight[:, 8:], indices, offsets)
    placed = perfkernels.empty_table(rows, D, dtype)
    placed[:] = weight
    run_both(placed, indices, offsets, mode="mean")


def test_empty_bags_and_no_indices(isa, rng):
    weight = random_table(rng, 10, 17, np.float32)
    got = run_both(weight, np.array([1, 2], np.int64), np.array([0, 0, 2, 2]), mode="mean")
    assert not got[0].any() and not got[2].any() and not got[3].any()
    # all bags empty, no indices at all
    got = run_both(weight, np.zeros(0, np.int64), np.zeros(5, np.int64))
    assert got.shape == (5, 17) and not got.any()
    got = run_both(weight, np.zeros(0, np.int32), np.zeros(1, np.int32), include_last_offset=True)
    assert got.shape == (0, 17)
    got = run_both(weight, np.zeros(0, np.int64), lengths=np.zeros(0, np.int64))
    assert got.shape == (0, 17)
    got = run_both(weight, np.zeros((3, 0), np.int64), mode="mean")
    assert got.shape == (3, 17) and not got.any()
    # bags made only of padding: zeros in mean mode too
    got = run_both(weight, np.array([4, 4]), np.array([0]), padding_idx=4, mode="mean")
    assert not got.any()
    # an empty table with no indices is fine
    got = embedding_bag(np.zeros((0, 8), np.float32), np.zeros(0, np.int64), np.zeros(2, np.int64))
    assert got.shape == (2, 8) and not got.any()


def test_one_huge_bag_and_zipf(isa, rng):
    rows = 5000
    weight = random_table(rng, rows, 64, np.float16)
    indices = zipf_indices(rng, rows, 60_000)
    run_both(weight, indices, np.array([0]), rtol=1e-4)  # 60k terms in one float32 sum
    run_both(weight, indices.astype(np.int32), np.arange(0, 60_000, 97), mode="mean")


@pytest.mark.parametrize("dtype, D", [(np.float32, 64), (np.float32, 17), (np.float16, 64),
                                      (BF16, 128)])
@pytest.mark.parametrize("n", [0, 30, 49, 1000])
def test_tables_past_the_far_prefetch_size(isa, rng, dtype, D, n):
    """Tables of 16 MiB and more take the kernels' far-prefetch loops (L2 prefetches 48 rows
    ahead; the last rows of the call prefetch nothing): index lists shorter than, about, and longer
    than that distance, with and without padding_idx, weights and mean."""
    itemsize = np.dtype(dtype).itemsize
    rows = (16 << 20) // (D * itemsize) + 7
    weight = np.empty((rows, D), dtype)
    weight[:] = rng.standard_normal((1, D)).astype(np.float32).astype(dtype)  # one row, cheaply
    weight[: rows // 64] = random_table(rng, rows // 64, D, dtype)
    indices = np.concatenate([rng.integers(0, rows // 64, n - n // 4), rng.integers(0, rows, n // 4)])
    offsets = np.unique(np.concatenate([[0], rng.integers(0, n + 1, 7)]))
    run_both(weight, indices, offsets, rtol=1e-4)
    pad = int(indices[0]) if n else 3
    run_both(weight, indices.astype(np.int32), offsets, mode="mean", padding_idx=pad, rtol=1e-4)
    run_both(weight, indices, offsets, per_sample_weights=rng.standard_normal(n).astype(np.float32),
             rtol=1e-4)


def test_zero_dim_table_still_checks_indices(isa):
    weight = np.zeros((4, 0), np.float32)
    assert embedding_bag(weight, np.array([1, 3]), np.array([0])).shape == (1, 0)
    with pytest.raises(IndexError, match=r"indices\[1\] = 4 is out of range"):
        embedding_bag(weight, np.array([1, 4]), np.array([0]))


@pytest.mark.parametrize("dtype", TABLE_DTYPES, ids=lambda d: d.name)
def test_unaligned_readonly_and_strided_inputs(isa, rng, dtype):
    weight = random_table(rng, 40, 33, dtype)
    indices = rng.integers(0, 40, size=30)
    offsets = np.array([0, 10, 25])
    psw = rng.standard_normal(30).astype(np.float32)
    expected = embedding_bag(weight, indices, offsets, per_sample_weights=psw)
    for w, i, o, p in [(unaligned(weight), unaligned(indices), unaligned(offsets), unaligned(psw)),
                       (readonly(weight), readonly(indices), readonly(offsets), readonly(psw)),
                       (weight.astype(weight.dtype.newbyteorder(">")) if dtype != BF16 else weight,
                        indices.astype(">i8"), offsets, psw.astype(">f4"))]:
        np.testing.assert_array_equal(embedding_bag(w, i, o, per_sample_weights=p), expected)
    # column slice of a wider table: used in place with its row stride
    wide = random_table(rng, 40, 50, dtype)
    run_both(wide[:, 3:36], indices, offsets, per_sample_weights=psw)
    run_both(wide[::2], indices % 20, offsets)
    run_both(np.asfortranarray(wide), indices, offsets)  # copied, not misread
    # python lists
    run_both(weight, list(indices), list(offsets))


def test_out_parameter(isa, rng):
    weight = random_table(rng, 20, 24, np.float32)
    indices, offsets = rng.integers(0, 20, size=12), np.array([0, 5, 5])
    expected = embedding_bag(weight, indices, offsets)
    out = np.full((3, 24), 7.0, np.float32)
    assert embedding_bag(weight, indices, offsets, out=out) is out
    np.testing.assert_array_equal(out, expected)
    big = np.zeros((3, 48), np.float32)
    res = embedding_bag(weight, indices, offsets, out=big[:, ::2])
    np.testing.assert_array_equal(res, expected)
    np.testing.assert_array_equal(big[:, ::2], expected)
    assert not big[:, 1::2].any()
    with pytest.raises(TypeError, match="out must have dtype float32"):
        embedding_bag(weight, indices, offsets, out=np.zeros((3, 24), np.float64))
    with pytest.raises(ValueError, match=r"out has shape \(3, 23\)"):
        embedding_bag(weight, indices, offsets, out=np.zeros((3, 23), np.float32))
    with pytest.raises(TypeError, match="out must be a numpy.ndarray"):
        embedding_bag(weight, indices, offsets, out=[[0.0] * 24] * 3)


# ---------------------------------------------------------------------------------------------
# PyTorch as the independent oracle
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", TABLE_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("mode", _variants.MODES)
def test_matches_torch(isa, rng, dtype, mode):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    for D in (1, 16, 17, 64, 128, 129):
        rows = 100
        weight = random_table(rng, rows, D, dtype)
        tw = torch.from_numpy(weight.astype(np.float32))  # exact upcast: same values, fp32 math
        indices = zipf_indices(rng, rows, 200)
        offsets = np.sort(rng.integers(0, 201, size=9))
        offsets[0] = 0
        index_dtype = np.int32 if D % 2 else np.int64
        ix, off = indices.astype(index_dtype), offsets.astype(index_dtype)
        kw = {}
        if mode == "sum" and D % 3 == 1:
            kw["per_sample_weights"] = rng.standard_normal(200).astype(np.float32)
        pad = 7 if D == 17 else None
        got = embedding_bag(weight, ix, off, mode=mode, padding_idx=pad, **kw)
        tkw = {k: torch.from_numpy(v) for k, v in kw.items()}
        want = F.embedding_bag(torch.from_numpy(ix), tw, torch.from_numpy(off), mode=mode,
                               padding_idx=pad, **tkw).numpy()
        abs_sum = reference.embedding_bag(weight, ix, off, mode=mode, padding_idx=pad, **kw).magnitude
        np.testing.assert_array_less(np.abs(got - want), 4e-6 * abs_sum + 1e-30)
        # include_last_offset and 2-D indices
        last = np.append(off, len(ix)).astype(index_dtype)
        got = embedding_bag(weight, ix, last, mode=mode, include_last_offset=True)
        want = F.embedding_bag(torch.from_numpy(ix), tw, torch.from_numpy(last), mode=mode,
                               include_last_offset=True).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * (1 + np.abs(want).max()))
        ix2 = ix[:200].reshape(20, 10)
        got = embedding_bag(weight, ix2, mode=mode)
        want = F.embedding_bag(torch.from_numpy(ix2), tw, mode=mode).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * (1 + np.abs(want).max()))


# ---------------------------------------------------------------------------------------------
# errors: the documented exception, out= untouched, nothing read out of bounds
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("bad", (1000, -1, 10**6, -(2**31)))
def test_out_of_range_index(isa, rng, index_dtype, bad):
    weight = random_table(rng, 1000, 64, np.float16)
    indices = rng.integers(0, 1000, size=40).astype(index_dtype)
    indices[17] = bad
    offsets = np.array([0, 10, 30])
    msg = rf"indices\[17\] = {bad} is out of range for a table of 1000 rows"
    with pytest.raises(IndexError, match=msg):
        embedding_bag(weight, indices, offsets)          # found by the kernel
    out = rng.standard_normal((3, 64)).astype(np.float32)
    before = out.copy()
    with pytest.raises(IndexError, match=msg):
        embedding_bag(weight, indices, offsets, out=out)  # found before the kernel writes out
    np.testing.assert_array_equal(out, before)
    strided = np.zeros((3, 128), np.float32)
    with pytest.raises(IndexError, match=msg):
        embedding_bag(weight, indices, offsets, out=strided[:, ::2])
    assert not strided.any()
    with pytest.raises(IndexError, match=r"indices\[12\]"):
        embedding_bag(weight, indices.reshape(4, 10)[:, ::-1], mode="mean")


def test_padding_index_is_still_range_checked(isa):
    weight = np.ones((5, 8), np.float32)
    with pytest.raises(IndexError, match=r"indices\[0\] = 5 is out"):
        embedding_bag(weight, np.array([5]), np.array([0]), padding_idx=4)


@pytest.mark.parametrize("kw, msg", [
    ({"offsets": np.array([1, 2])}, r"offsets\[0\] = 1: the first offset must be 0"),
    ({"offsets": np.array([0, 9, 7])}, r"offsets\[2\] = 7 < offsets\[1\] = 9: offsets must be non-decreasing"),
    ({"offsets": np.array([0, 2, 11])}, r"offsets\[2\] = 11 > len\(indices\) = 10"),
    ({"offsets": np.array([0, 2**62, 2**63 - 1])}, r"offsets\[2\] = 9223372036854775807 > len\(indices\) = 10"),
    ({"offsets": np.array([0, -5], np.int32)}, r"offsets\[1\] = -5 < offsets\[0\] = 0"),
    ({"offsets": np.array([0, 3]), "include_last_offset": True}, r"offsets\[1\] = 3 != len\(indices\) = 10"),
    ({"offsets": np.zeros(0, np.int64), "include_last_offset": True}, "offsets is empty"),
    ({"offsets": np.zeros(0, np.int64)}, "offsets is empty .no bags. but there are 10 indices"),
    ({"offsets": np.zeros((1, 1), np.int64)}, "offsets must be 1-D"),
    ({"lengths": np.array([4, -1, 7])}, r"lengths\[1\] = -1 is negative"),
    ({"lengths": np.array([4, 5])}, r"sum\(lengths\) = 9 != len\(indices\) = 10"),
    ({"lengths": np.array([2**62, 2**62, 2**62, 2**62])}, r"lengths\[:1\] sum to 4611686018427387904 > len\(indices\) = 10"),
    ({"lengths": np.array([5, 5]), "offsets": np.array([0, 5])}, "not both"),
    ({}, "need offsets or lengths"),
    ({"offsets": np.array([0]), "mode": "max"}, "mode must be 'sum' or 'mean'; got 'max'"),
    ({"offsets": np.array([0]), "padding_idx": 10}, "padding_idx = 10 is out of range for a table of 10 rows"),
    ({"offsets": np.array([0]), "padding_idx": -11}, "padding_idx = -11 is out of range"),
    ({"offsets": np.array([0]), "padding_idx": 2**70}, "padding_idx = 1180591620717411303424 is out"),
    ({"offsets": np.array([0]), "per_sample_weights": np.ones(9, np.float32)}, r"per_sample_weights has shape \(9,\)"),
    ({"offsets": np.array([0, 4]), "per_sample_weights": np.ones(5, np.float32), "positional_weights": True},
     "has 5 entries but the longest bag has 6"),
    ({"offsets": np.array([0]), "positional_weights": True}, "needs per_sample_weights"),
])
def test_bad_bags_raise_value_error(isa, kw, msg):
    weight = np.ones((10, 4), np.float32)
    indices = np.arange(10)
    kw = dict(kw)
    offsets = kw.pop("offsets", None)
    out = np.full((3, 4), 5.0, np.float32)
    with pytest.raises(ValueError, match=msg):
        embedding_bag(weight, indices, offsets, **kw)
    with pytest.raises(ValueError, match=msg):
        embedding_bag(weight, indices, offsets, out=out, **kw)
    assert (out == 5.0).all()


def test_bad_shapes_raise_value_error():
    weight = np.ones((10, 4), np.float32)
    with pytest.raises(ValueError, match="weight must be 2-D"):
        embedding_bag(np.ones(10, np.float32), np.arange(3), np.array([0]))
    with pytest.raises(ValueError, match="offsets and lengths must be None"):
        embedding_bag(weight, np.zeros((2, 3), np.int64), np.array([0]))
    with pytest.raises(ValueError, match="indices must be 1-D .* or 2-D"):
        embedding_bag(weight, np.zeros((2, 3, 1), np.int64))


@pytest.mark.parametrize("kw, msg", [
    ({"weight": np.ones((4, 4), np.float64)}, "weight must have dtype float32, float16 or bfloat16"),
    ({"weight": np.ones((4, 4), np.int32)}, "weight must have dtype"),
    ({"indices": np.zeros(3, np.float32)}, "indices must have dtype int32 or int64; got float32"),
    ({"indices": np.zeros(3, np.uint64)}, "indices must have dtype int32 or int64; got uint64"),
    ({"indices": np.zeros(3, np.int16)}, "indices must have dtype int32 or int64; got int16"),
    ({"offsets": np.zeros(1, np.float64)}, "offsets must have dtype int32 or int64"),
    ({"per_sample_weights": np.ones(3, np.float64)}, "per_sample_weights must have dtype float32"),
    ({"padding_idx": 1.5}, "padding_idx must be an integer"),
])
def test_bad_dtypes_raise_type_error(kw, msg):
    args = {"weight": np.ones((4, 4), np.float32), "indices": np.zeros(3, np.int64),
            "offsets": np.zeros(1, np.int64)}
    args.update(kw)
    with pytest.raises(TypeError, match=msg):
        embedding_bag(args.pop("weight"), args.pop("indices"), args.pop("offsets"), **args)


# ---------------------------------------------------------------------------------------------
# many threads at once (the kernel runs without the GIL)
# ---------------------------------------------------------------------------------------------

def test_threads(isa, rng):
    weight = random_table(rng, 5000, 64, np.float32)
    cases = []
    for _ in range(4):
        indices = rng.integers(0, 5000, size=20_000)
        offsets = np.arange(0, 20_000, 50)
        cases.append((indices, offsets, embedding_bag(weight, indices, offsets)))
    failures = []

    def work(k):
        indices, offsets, expected = cases[k]
        for _ in range(20):
            if not np.array_equal(embedding_bag(weight, indices, offsets), expected):
                failures.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_docstring_example():
    weight = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(
        embedding_bag(weight, np.array([[0, 2], [3, 3]]), mode="mean"),
        [[3, 4, 5], [9, 10, 11]])
    assert "embedding_bag" in perfkernels.__all__
