"""embedding / embedding_quantized (unpooled lookups): every ISA path against NumPy's ``W[indices]``
(float tables, bit for bit) and the float64 dequantisation reference (packed rows), and against
torch.nn.functional.embedding where torch is installed."""
import threading

import numpy as np
import pytest

import perfkernels
from perfkernels import _variants, embedding, embedding_quantized, reference

from conftest import AWKWARD_DIMS, readonly, unaligned

BF16 = _variants.BFLOAT16
TABLE_DTYPES = tuple(_variants.TABLE_DTYPES.values())
INDEX_DTYPES = _variants.INDEX_DTYPES
DIMS = AWKWARD_DIMS + (256, 512)
SHAPES = ((), (0,), (5,), (3, 4), (2, 3, 5), (0, 3))


def table(rng, rows, D, dtype):
    return rng.standard_normal((rows, D)).astype(np.float32).astype(dtype)


def same_bits(got, want):
    reference.assert_same_bits(got, want)


@pytest.mark.parametrize("dtype", TABLE_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("D", DIMS)
def test_float_tables_every_dim(isa, rng, D, dtype):
    w = table(rng, 37, D, dtype)
    for shape in SHAPES:
        for idt in INDEX_DTYPES:
            ix = rng.integers(0, 37, shape).astype(idt)
            got = embedding(w, ix)
            assert got.shape == ix.shape + (D,) and got.dtype == w.dtype
            same_bits(got, w[ix])          # NumPy's own indexing, an independent oracle
            same_bits(got, reference.embedding(w, ix))


@pytest.mark.parametrize("dtype", TABLE_DTYPES, ids=lambda d: np.dtype(d).name)
def test_no_write_past_the_last_row(isa, rng, dtype):
    """out= the leading rows of a larger buffer: the bytes after the last output row (where a
    partial vector's move ends) keep their sentinel, for every D."""
    for D in DIMS:
        w = table(rng, 11, D, dtype)
        ix = rng.integers(0, 11, 5)
        buf = np.full(5 * D + 64, 3.0, np.float32).astype(dtype)
        out = buf[:5 * D].reshape(5, D)
        assert embedding(w, ix, out=out) is out
        same_bits(out, w[ix])
        assert (buf[5 * D:].astype(np.float32) == 3.0).all(), D


@pytest.mark.parametrize("dtype", TABLE_DTYPES, ids=lambda d: np.dtype(d).name)
def test_long_runs_and_prefetch_distance(isa, rng, dtype):
    """More indices than any prefetch distance, repeated indices, both table sizes of the
    prefetch modes (near and far: a table of 16 MiB and more)."""
    for rows, D in ((1000, 64), (70_000, 64)):   # 70K x 64 float32 = 17.9 MB (far mode)
        w = table(rng, rows, D, dtype)
        ix = rng.integers(0, rows, 3000)
        ix[100:150] = 5
        same_bits(embedding(w, ix), w[ix])


def test_special_values_kept_bit_for_bit(isa):
    """No conversion: NaN payloads (signalling ones too), infinities and -0.0 come back as
    stored."""
    bits16 = np.array([0x7C01, 0xFC00, 0x8000, 0x7E00, 0x0001, 0x7BFF, 0xFFFF], np.uint16)
    for dtype in (np.float16, BF16):
        w = np.tile(bits16, (3, 3)).view(dtype)
        same_bits(embedding(w, np.array([2, 0, 1])), w[[2, 0, 1]])
    bits32 = np.array([0x7F800001, 0xFF800000, 0x80000000, 0x7FC00123, 1], np.uint32)
    w = np.tile(bits32, (4, 5)).view(np.float32)
    same_bits(embedding(w, np.array([3, 3, 0])), w[[3, 3, 0]])


def test_layouts(isa, rng):
    """Unaligned, read-only, column-sliced, non-contiguous tables and indices."""
    w = table(rng, 50, 33, np.float32)
    ix = rng.integers(0, 50, (4, 6))
    want = w[ix]
    same_bits(embedding(unaligned(w), ix), want)
    same_bits(embedding(readonly(w), readonly(ix)), want)
    same_bits(embedding(w, unaligned(ix)), want)
    wide = table(rng, 50, 40, np.float32)
    same_bits(embedding(wide[:, 3:20], ix), wide[:, 3:20][ix])     # rows spaced wider, in place
    same_bits(embedding(np.asfortranarray(w), ix), want)
    same_bits(embedding(w, ix.T), w[ix.T])                          # non-contiguous indices
    same_bits(embedding(w, [[1, 2], [3, 4]]), w[[[1, 2], [3, 4]]])  # a list
    same_bits(embedding(w, 7), w[7])                                # a Python int: 0-d
    for dtype in (np.float16, BF16):
        w16 = table(rng, 50, 9, dtype)
        same_bits(embedding(unaligned(w16), ix), w16[ix])


def test_out(isa, rng):
    w = table(rng, 20, 17, np.float16)
    ix = rng.integers(0, 20, (3, 5))
    out = np.full((3, 5, 17), 7, np.float16)
    assert embedding(w, ix, out=out) is out
    same_bits(out, w[ix])
    # a non-contiguous out= goes through a temporary
    big = np.zeros((3, 5, 34), np.float16)
    res = embedding(w, ix, out=big[:, :, ::2])
    same_bits(big[:, :, ::2], w[ix])
    assert res.base is big or res is not None


@pytest.mark.parametrize("n", [7, 5000, 200_000])
def test_bad_index_leaves_out_untouched(isa, rng, n):
    w = table(rng, 100, 64, np.float32)
    for bad in (100, -1, 2**40):
        ix = rng.integers(0, 100, n).astype(np.int64)
        pos = n * 3 // 4
        ix[pos] = bad
        out = np.full((n, 64), 3.0, np.float32)
        with pytest.raises(IndexError, match=rf"indices\[{pos}\] = {bad} is out of range for "
                                             r"a table of 100 rows"):
            embedding(w, ix, out=out)
        assert (out == 3.0).all()
        with pytest.raises(IndexError, match=rf"indices\[{pos}\]"):
            embedding(w, ix, num_threads=2)
    ix32 = np.array([[0, 1], [2, -5]], np.int32)
    with pytest.raises(IndexError, match=r"indices\[3\] = -5 is out of range"):
        embedding(w, ix32)


def test_bad_arguments(rng):
    w = table(rng, 10, 4, np.float32)
    with pytest.raises(TypeError, match="weight must have dtype"):
        embedding(w.astype(np.float64), np.array([1]))
    with pytest.raises(ValueError, match="weight must be 2-D"):
        embedding(w[0], np.array([1]))
    with pytest.raises(TypeError, match="indices must have dtype int32 or int64"):
        embedding(w, np.array([1.0]))
    with pytest.raises(TypeError, match="indices must have dtype"):
        embedding(w, np.array([1], np.uint64))
    with pytest.raises(ValueError, match="padding_idx = 10 is out of range"):
        embedding(w, np.array([1]), padding_idx=10)
    with pytest.raises(TypeError, match="padding_idx must be an integer"):
        embedding(w, np.array([1]), padding_idx=1.5)
    with pytest.raises(TypeError, match="out must have dtype float32"):
        embedding(w, np.array([1]), out=np.zeros((1, 4), np.float16))
    with pytest.raises(ValueError, match="out has shape"):
        embedding(w, np.array([1]), out=np.zeros((2, 4), np.float32))
    ro = np.zeros((1, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        embedding(w, np.array([1]), out=ro)
    with pytest.raises(ValueError):
        embedding(w, np.array([1]), num_threads=0)


def test_padding_idx_rows_returned_as_stored(rng):
    w = table(rng, 10, 8, np.float32)
    ix = np.array([3, 0, 3, 9])
    same_bits(embedding(w, ix, padding_idx=3), w[ix])
    same_bits(embedding(w, ix, padding_idx=-1), w[ix])


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", TABLE_DTYPES, ids=lambda d: np.dtype(d).name)
def test_threads_bit_identical(rng, threads, dtype):
    w = table(rng, 5000, 24, dtype)     # a 48-byte row: ranges start on whole lines of out
    ix = rng.integers(0, 5000, (300, 50))
    same_bits(embedding(w, ix, num_threads=threads), w[ix])
    out = np.empty(ix.shape + (24,), dtype)
    embedding(w, ix, out=out, num_threads=threads)
    same_bits(out, w[ix])


def test_concurrent_callers(rng):
    w = table(rng, 3000, 40, np.float32)
    ixs = [rng.integers(0, 3000, 20_000) for _ in range(4)]
    results = [None] * 4

    def work(k):
        for _ in range(5):
            results[k] = embedding(w, ixs[k])

    ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for k in range(4):
        same_bits(results[k], w[ixs[k]])


# --- packed rows -------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", _variants.BITS)
@pytest.mark.parametrize("D", DIMS)
def test_quantized_every_dim(isa, rng, bits, D):
    w = rng.standard_normal((41, D)).astype(np.float32)
    packed = perfkernels.quantize_rowwise(w, bits=bits)
    for shape in SHAPES:
        for idt in INDEX_DTYPES:
            ix = rng.integers(0, 41, shape).astype(idt)
            got = embedding_quantized(packed, ix, bits=bits, dim=D)
            assert got.shape == ix.shape + (D,) and got.dtype == np.float32
            want = reference.embedding_quantized(packed, ix, bits, D)
            reference.assert_close(got, want, rtol=1e-6)
            # the same values as dequantising the whole table, then indexing it
            deq = reference.dequantize_rowwise(packed, bits, D)
            reference.assert_close(got, deq[ix], want.magnitude, rtol=1e-6)


@pytest.mark.parametrize("bits", _variants.BITS)
def test_quantized_long_runs_far_and_threads(isa, rng, bits):
    for rows, D in ((500, 64), (300_000, 64)):     # 300K x 72 B = 21.6 MB: far mode
        w = rng.standard_normal((min(rows, 2000), D)).astype(np.float32)
        small = perfkernels.quantize_rowwise(w, bits=bits)
        packed = np.resize(small, (rows, small.shape[1]))
        ix = rng.integers(0, rows, 40_000)
        want = reference.embedding_quantized(packed, ix, bits, D)
        one = embedding_quantized(packed, ix, bits=bits, num_threads=1)
        reference.assert_close(one, want, rtol=1e-6)
        same_bits(embedding_quantized(packed, ix, bits=bits, num_threads=3), one)


def test_quantized_layouts_and_errors(isa, rng):
    w = rng.standard_normal((30, 13)).astype(np.float32)
    packed = perfkernels.quantize_rowwise(w, bits=4)
    ix = rng.integers(0, 30, (2, 9))
    want = reference.embedding_quantized(packed, ix, 4, 13)
    for p in (unaligned(packed), readonly(packed)):
        reference.assert_close(embedding_quantized(p, ix, bits=4, dim=13), want, rtol=1e-6)
    out = np.full((2, 9, 13), 5.0, np.float32)
    ix_bad = ix.copy()
    ix_bad[1, 2] = 30
    with pytest.raises(IndexError, match=r"indices\[11\] = 30 is out of range for a table of 30"):
        embedding_quantized(packed, ix_bad, bits=4, dim=13, out=out)
    assert (out == 5.0).all()
    assert embedding_quantized(packed, ix, bits=4, dim=13, out=out) is out
    reference.assert_close(out, want, rtol=1e-6)
    with pytest.raises(ValueError, match="bits must be 8, 4 or 2"):
        embedding_quantized(packed, ix, bits=3)
    with pytest.raises(ValueError, match="do not hold dim=12"):
        embedding_quantized(packed, ix, bits=4, dim=12)
    with pytest.raises(TypeError, match="packed must have dtype uint8"):
        embedding_quantized(packed.astype(np.int8), ix, bits=4)
    with pytest.raises(TypeError, match="out must have dtype float32"):
        embedding_quantized(packed, ix, bits=4, dim=13, out=np.zeros((2, 9, 13), np.float64))


def test_against_torch(rng):
    torch = pytest.importorskip("torch")
    for dtype, tdtype in ((np.float32, torch.float32), (np.float16, torch.float16)):
        w = table(rng, 100, 33, dtype)
        ix = rng.integers(0, 100, (4, 7, 3))
        want = torch.nn.functional.embedding(torch.from_numpy(ix), torch.from_numpy(w)).numpy()
        same_bits(embedding(w, ix), want)
    w = rng.standard_normal((100, 64)).astype(np.float32)
    packed = perfkernels.quantize_rowwise(w, bits=8)
    ix = rng.integers(0, 100, 500)
    want = torch.ops.quantized.embedding_bag_byte_rowwise_offsets(
        torch.from_numpy(packed), torch.from_numpy(ix), torch.arange(500), mode=0).numpy()
    np.testing.assert_allclose(embedding_quantized(packed, ix), want, rtol=1e-6, atol=1e-6)


def test_out_never_half_written_while_indices_change(rng):
    """Another thread writes a bad index into the caller's array during calls with out=: each
    call either succeeds or raises IndexError with out= untouched (the kernels read a checked
    private copy of the indices)."""
    w = table(rng, 1000, 32, np.float32)
    ix = rng.integers(0, 1000, 60_000)
    stop = threading.Event()

    def flip():
        while not stop.is_set():
            ix[30_000] = 5000
            ix[30_000] = 7

    t = threading.Thread(target=flip)
    t.start()
    try:
        for _ in range(40):
            out = np.full((ix.size, 32), -1.0, np.float32)
            try:
                embedding(w, ix, out=out, num_threads=2)
            except IndexError:
                assert (out == -1.0).all()
            else:
                assert (out != -1.0).all()
    finally:
        stop.set()
        t.join()
