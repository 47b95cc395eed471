"""Row-wise quantized tables: quantize_rowwise, dequantize_rowwise, embedding_bag_quantized on every
ISA path, against the references of perfkernels.reference (bit-exact prepack, float64 lookups) and
against PyTorch's quantized ops (bit-exact prepack, lookups to float32 rounding)."""
import numpy as np
import pytest

import perfkernels as pk
from perfkernels import reference
from conftest import (AWKWARD_DIMS, BITS, INDEX_DTYPES, MODES, QUANTIZE_DTYPES, SPECIALISED_DIMS,
                      readonly, unaligned, without_zero_bias_signs_off_x86)

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

PREPACK = {8: torch.ops.quantized.embedding_bag_byte_prepack,
           4: torch.ops.quantized.embedding_bag_4bit_prepack,
           2: torch.ops.quantized.embedding_bag_2bit_prepack}
LOOKUP = {8: torch.ops.quantized.embedding_bag_byte_rowwise_offsets,
          4: torch.ops.quantized.embedding_bag_4bit_rowwise_offsets,
          2: torch.ops.quantized.embedding_bag_2bit_rowwise_offsets}


def torch_defined(bits, dim):
    return bits == 8 or dim % (8 // bits) == 0



def assert_close_bags(got, expected):
    """float32 accumulation of dequantized rows: error within a multiple of the sum of |terms|."""
    assert got.dtype == np.float32
    reference.assert_close(got, expected, rtol=1e-5, atol=1.1e-5)


def random_table(rng, rows, dim, dtype=np.float32):
    return (rng.standard_normal((rows, dim)) * rng.uniform(0.01, 10.0, (rows, 1))).astype(dtype)


def adversarial_tables(rng, dim):
    """Rows that stress min/max (signed zeros), constant rows, tiny and huge values."""
    yield rng.choice(np.array([0.0, -0.0, 1.0, -1.0], np.float32), size=(64, dim))
    yield rng.choice(np.array([0.0, -0.0], np.float32), size=(32, dim))
    yield np.full((4, dim), 3.25, np.float32)
    yield (rng.standard_normal((32, dim)) * 10.0 ** rng.integers(-30, 30, (32, dim))).astype(np.float32)
    yield rng.uniform(-3e38, 3e38, (8, dim)).astype(np.float32)
    t = rng.uniform(-1e6, 1e6, (8, dim)).astype(np.float32)
    t[:, 0] = 1e-30
    yield t
    yield (rng.uniform(0, 1, (8, dim)) * 70000 + 65500).astype(np.float32)


# ---- quantize / dequantize --------------------------------------------------------------------

@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("dtype", QUANTIZE_DTYPES, ids=str)
def test_quantize_bit_exact_with_torch(isa, rng, bits, dtype):
    for dim in AWKWARD_DIMS + (32, 256):
        if not torch_defined(bits, dim):
            continue
        tables = [random_table(rng, 37, dim)] + list(adversarial_tables(rng, dim))
        for t in tables:
            with np.errstate(over="ignore"):
                t = t.astype(dtype)
            if not np.isfinite(t).all():
                continue
            expected = PREPACK[bits](torch.from_numpy(t)).numpy()
            got = pk.quantize_rowwise(t, bits=bits)
            assert got.dtype == np.uint8 and got.shape == expected.shape
            # (the sign of a zero min off x86-64: conftest; test_quantize_matches_scalar_for_any_dim
            # holds every level to the reference there)
            np.testing.assert_array_equal(*without_zero_bias_signs_off_x86(t, got, expected),
                                          err_msg=f"dim={dim}")


@pytest.mark.parametrize("bits", BITS)
def test_quantize_large_table_bit_exact_and_nonfinite(isa, rng, bits):
    """Tables beyond the kernels' cache-resident size (8 MiB of input) take another row loop."""
    t = random_table(rng, 17_000, 136)                    # 9.2 MB
    t[::7] = 0.0                                          # zero rows: the exact min/max redo
    np.testing.assert_array_equal(pk.quantize_rowwise(t, bits=bits), PREPACK[bits](torch.from_numpy(t)).numpy())
    t[16_998, 135] = np.nan
    with pytest.raises(ValueError, match="row 16998"):
        pk.quantize_rowwise(t, bits=bits)


@pytest.mark.parametrize("bits", BITS)
def test_quantize_matches_scalar_for_any_dim(isa, rng, bits):
    """Any D is accepted (zero-padded last byte, where PyTorch has no answer): every ISA writes
    the reference's bytes."""
    for dim in AWKWARD_DIMS:
        t = random_table(rng, 9, dim)
        got = pk.quantize_rowwise(t, bits=bits)
        np.testing.assert_array_equal(got, reference.quantize_rowwise(t, bits), err_msg=f"dim={dim}")
        if bits != 8 and dim % (8 // bits):
            per = 8 // bits
            last = got[:, dim // per]
            assert np.all(last >> ((dim % per) * bits) == 0)  # padding codes are zero


@pytest.mark.parametrize("bits", BITS)
def test_dequantize_reference(isa, rng, bits):
    for dim in AWKWARD_DIMS:
        t = random_table(rng, 11, dim)
        p = pk.quantize_rowwise(t, bits=bits)
        got = pk.dequantize_rowwise(p, bits=bits, dim=dim)
        assert got.dtype == np.float32 and got.shape == (11, dim)
        ref = reference.dequantize_rowwise(p, bits, dim)
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())
        # quantization error is at most half a step (plus fp16 rounding of scale/bias)
        step = (t.max(1) - t.min(1)) / ((1 << bits) - 1)
        err = np.abs(got - t).max(1)
        assert np.all(err <= step * (0.5 if bits == 8 else 1.0) + 1e-3 * np.abs(t).max(1) + 1e-6)


def test_dequantize_default_dim_and_checks(rng):
    t = random_table(rng, 3, 16)
    p4 = pk.quantize_rowwise(t, bits=4)
    assert pk.dequantize_rowwise(p4, bits=4).shape == (3, 16)
    assert pk.dequantize_rowwise(pk.quantize_rowwise(t[:, :15], bits=4), bits=4, dim=15).shape == (3, 15)
    with pytest.raises(ValueError, match="dim=17"):
        pk.dequantize_rowwise(p4, bits=4, dim=17)
    with pytest.raises(ValueError, match="bits"):
        pk.dequantize_rowwise(p4, bits=3)
    with pytest.raises(TypeError, match="packed"):
        pk.dequantize_rowwise(p4.astype(np.int16), bits=4)
    with pytest.raises(ValueError, match="too short"):
        pk.dequantize_rowwise(np.zeros((2, 4), np.uint8), bits=4)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("bits", BITS)
def test_quantize_nonfinite_row(isa, rng, bad, bits):
    """Wherever the bad value sits (vector body, partial last block, scalar tail) and whatever the
    rest of the row holds (random, zeros: the exact min/max redo, constant, huge), it is found."""
    for dim in (1, 7, 16, 33, 64, 100, 128, 129, 256):
        positions = sorted({0, 1 % dim, dim // 2, dim - 1, dim // 16 * 16 % dim, dim // 64 * 64 % dim})
        for fill in ("random", "zeros", "constant", "huge"):
            t = random_table(rng, 6, dim)
            if fill == "zeros":
                t[4] = 0.0
            elif fill == "constant":
                t[4] = 2.5
            elif fill == "huge":
                t[4] = rng.uniform(-3e38, 3e38, dim)
            for pos in positions:
                row = t.copy()
                row[4, pos] = bad
                with pytest.raises(ValueError, match="row 4"):
                    pk.quantize_rowwise(row, bits=bits)
                if fill != "huge":
                    with pytest.raises(ValueError, match="row 4"):
                        pk.quantize_rowwise(row.astype(np.float16), bits=bits)
        t = random_table(rng, 6, dim)
        t[4] = bad
        with pytest.raises(ValueError, match="row 4"):
            pk.quantize_rowwise(t, bits=bits)


def test_quantize_argument_errors(rng):
    with pytest.raises(TypeError, match="weight"):
        pk.quantize_rowwise(np.zeros((2, 3), np.float64))
    with pytest.raises(ValueError, match="2-D"):
        pk.quantize_rowwise(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="bits"):
        pk.quantize_rowwise(np.zeros((2, 3), np.float32), bits=1)
    assert pk.quantize_rowwise(np.zeros((0, 5), np.float32)).shape == (0, 13)


def test_quantize_unaligned_readonly_noncontiguous(isa, rng):
    t = random_table(rng, 20, 33)
    ref = pk.quantize_rowwise(t)
    np.testing.assert_array_equal(pk.quantize_rowwise(unaligned(t)), ref)
    np.testing.assert_array_equal(pk.quantize_rowwise(readonly(t)), ref)
    wide = random_table(rng, 20, 66)
    np.testing.assert_array_equal(pk.quantize_rowwise(wide[:, ::2]),
                                  pk.quantize_rowwise(np.ascontiguousarray(wide[:, ::2])))
    p = pk.quantize_rowwise(t, bits=4)
    np.testing.assert_array_equal(pk.dequantize_rowwise(unaligned(p), bits=4, dim=33),
                                  pk.dequantize_rowwise(p, bits=4, dim=33))


# ---- lookups ----------------------------------------------------------------------------------

def random_bags(rng, rows, num_bags, max_len, dtype=np.int64):
    lengths = rng.integers(0, max_len + 1, num_bags)
    if num_bags > 2:
        lengths[1] = 0  # an empty bag
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(dtype)
    indices = rng.integers(0, rows, int(lengths.sum())).astype(dtype)
    return indices, offsets


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("mode", MODES)
def test_lookup_reference(isa, rng, bits, mode):
    rows = 50
    for dim in AWKWARD_DIMS:
        p = pk.quantize_rowwise(random_table(rng, rows, dim), bits=bits)
        for weighted in (False, True):
            indices, offsets = random_bags(rng, rows, 7, 30)
            w = rng.uniform(-2, 2, len(indices)).astype(np.float32) if weighted else None
            got = pk.embedding_bag_quantized(p, indices, offsets, bits=bits, dim=dim, mode=mode,
                                             per_sample_weights=w)
            assert got.shape == (7, dim) and got.dtype == np.float32
            assert_close_bags(got, reference.embedding_bag_quantized(
                p, indices, offsets, bits=bits, dim=dim, mode=mode, per_sample_weights=w))


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("dim", [64, 17])
@pytest.mark.parametrize("n", [0, 30, 49, 1000])
def test_lookup_tables_past_the_far_prefetch_size(isa, rng, bits, dim, n):
    """Tables of 16 MiB and more take the far-prefetch loops (L2 prefetches 48 rows ahead; the last
    rows of the call prefetch nothing): index lists shorter than, about, and longer than that."""
    small = pk.quantize_rowwise(random_table(rng, 97, dim), bits=bits)
    p = np.tile(small, ((16 << 20) // small.shape[1] // 97 + 1, 1))   # 97 distinct rows, repeated
    assert p.nbytes >= 16 << 20
    indices = rng.integers(0, len(p), n)
    offsets = np.unique(np.concatenate([[0], rng.integers(0, n + 1, 7)]))
    pad = int(indices[0]) if n else 3
    # the reference reads the 97 rows (plus the padding row's copy as row 97), not the whole table
    small_plus = np.concatenate([small, small[pad % 97:pad % 97 + 1]])
    small_indices = np.where(indices == pad, 97, indices % 97)
    for kw in ({}, {"mode": "mean", "padding_idx": pad},
               {"per_sample_weights": rng.uniform(-2, 2, n).astype(np.float32)}):
        got = pk.embedding_bag_quantized(p, indices, offsets, bits=bits, dim=dim, **kw)
        ref_kw = dict(kw, padding_idx=97) if "padding_idx" in kw else kw
        assert_close_bags(got, reference.embedding_bag_quantized(
            small_plus, small_indices, offsets, bits=bits, dim=dim, **ref_kw))


@pytest.mark.parametrize("bits", BITS)
def test_lookup_matches_torch(isa, rng, bits):
    rows = 200
    for dim in (8, 16, 32, 64, 128, 256, 1000):
        t = random_table(rng, rows, dim)
        p = PREPACK[bits](torch.from_numpy(t)).numpy()
        for index_dtype in INDEX_DTYPES:
            indices, offsets = random_bags(rng, rows, 13, 40, index_dtype)
            w = rng.uniform(0, 2, len(indices)).astype(np.float32)
            for weights in (None, w):
                expected = LOOKUP[bits](
                    torch.from_numpy(p), torch.from_numpy(indices), torch.from_numpy(offsets),
                    mode=0, per_sample_weights=None if weights is None else torch.from_numpy(weights),
                    include_last_offset=False).numpy()
                got = pk.embedding_bag_quantized(p, indices, offsets, bits=bits,
                                                 per_sample_weights=weights)
                want = reference.embedding_bag_quantized(p, indices, offsets, bits=bits,
                                                         per_sample_weights=weights)
                reference.assert_close(got, expected, want.magnitude, rtol=2e-5, atol=2e-5,
                                       err_msg=f"dim={dim}")


@pytest.mark.parametrize("bits", (8, 4))
def test_lookup_keywords(isa, rng, bits):
    rows, dim = 40, 24
    p = pk.quantize_rowwise(random_table(rng, rows, dim), bits=bits)
    indices, offsets = random_bags(rng, rows, 6, 10)
    n = len(indices)
    want = reference.embedding_bag_quantized(p, indices, offsets, bits=bits)
    # lengths, include_last_offset, 2-D indices
    lengths = np.diff(np.append(offsets, n))
    assert_close_bags(pk.embedding_bag_quantized(p, indices, lengths=lengths, bits=bits), want)
    assert_close_bags(pk.embedding_bag_quantized(p, indices, np.append(offsets, n), bits=bits,
                                                 include_last_offset=True), want)
    two_d = rng.integers(0, rows, (5, 3))
    assert_close_bags(pk.embedding_bag_quantized(p, two_d, bits=bits),
                      reference.embedding_bag_quantized(p, two_d.ravel(), np.arange(5) * 3, bits=bits))
    # padding_idx (skipped, not counted by mean)
    pad = int(indices[0]) if n else 0
    for mode in MODES:
        assert_close_bags(pk.embedding_bag_quantized(p, indices, offsets, bits=bits, mode=mode,
                                                     padding_idx=pad),
                          reference.embedding_bag_quantized(p, indices, offsets, bits=bits, mode=mode,
                                                            padding_idx=pad))
    # positional weights: w indexed by the position inside the bag (expanded here by hand)
    pw = rng.uniform(-1, 1, 10).astype(np.float32)
    bounds = np.append(offsets, n)
    per_sample = np.concatenate([pw[:bounds[b + 1] - bounds[b]] for b in range(6)]).astype(np.float32)
    assert_close_bags(pk.embedding_bag_quantized(p, indices, offsets, bits=bits,
                                                 per_sample_weights=pw, positional_weights=True),
                      reference.embedding_bag_quantized(p, indices, offsets, bits=bits,
                                                        per_sample_weights=per_sample))
    # out= written in place and returned
    out = np.full((6, dim), 7.0, np.float32)
    assert pk.embedding_bag_quantized(p, indices, offsets, bits=bits, out=out) is out
    assert_close_bags(out, want)


@pytest.mark.parametrize("bits", BITS)
def test_lookup_options_on_specialised_dims(isa, rng, bits):
    """The kernels specialise D = 32/64/128/256 and each option (index width, weights, positional,
    padding, mean): every combination against the reference, long bags so prefetching is exercised."""
    rows = 300
    for dim in (24,) + SPECIALISED_DIMS[1:]:
        p = pk.quantize_rowwise(random_table(rng, rows, dim), bits=bits)
        for index_dtype in INDEX_DTYPES:
            indices, offsets = random_bags(rng, rows, 9, 60, index_dtype)
            n = len(indices)
            bounds = np.append(offsets, n)
            pw = rng.uniform(-1, 1, 60).astype(np.float32)
            per_sample = np.concatenate([pw[:bounds[b + 1] - bounds[b]] for b in range(9)]).astype(np.float32)
            pad = int(indices[2]) if n > 2 else 0
            for mode in MODES:
                for padding_idx in (None, pad):
                    kw = dict(bits=bits, mode=mode, padding_idx=padding_idx)
                    assert_close_bags(pk.embedding_bag_quantized(p, indices, offsets, **kw),
                                      reference.embedding_bag_quantized(p, indices, offsets, **kw))
                    want = reference.embedding_bag_quantized(p, indices, offsets,
                                                             per_sample_weights=per_sample, **kw)
                    assert_close_bags(pk.embedding_bag_quantized(p, indices, offsets,
                                                                 per_sample_weights=per_sample, **kw),
                                      want)
                    assert_close_bags(pk.embedding_bag_quantized(p, indices, offsets, per_sample_weights=pw,
                                                                 positional_weights=True, **kw), want)
            if n > 40:
                bad = indices.copy()
                bad[40] = -1 if index_dtype == np.int32 else rows
                out = np.full((9, dim), 3.0, np.float32)
                with pytest.raises(IndexError, match=r"indices\[40\]"):
                    pk.embedding_bag_quantized(p, bad, offsets, bits=bits, out=out)
                assert np.all(out == 3.0)
                with pytest.raises(IndexError, match=r"indices\[40\]"):
                    pk.embedding_bag_quantized(p, bad, offsets, bits=bits)


def test_lookup_padded_dim_needs_dim(rng):
    t = random_table(rng, 10, 7)
    p = pk.quantize_rowwise(t, bits=4)
    got = pk.embedding_bag_quantized(p, np.array([1, 2]), np.array([0]), bits=4, dim=7)
    assert_close_bags(got, reference.embedding_bag_quantized(p, [1, 2], [0], bits=4, dim=7))
    assert pk.embedding_bag_quantized(p, np.array([1, 2]), np.array([0]), bits=4).shape == (1, 8)
    with pytest.raises(ValueError, match="dim=9"):
        pk.embedding_bag_quantized(p, np.array([1]), np.array([0]), bits=4, dim=9)


def test_lookup_empty(isa, rng):
    p = pk.quantize_rowwise(random_table(rng, 5, 16))
    out = pk.embedding_bag_quantized(p, np.array([], np.int64), np.array([0, 0, 0]))
    np.testing.assert_array_equal(out, np.zeros((3, 16), np.float32))
    assert pk.embedding_bag_quantized(p, np.array([], np.int32), np.array([], np.int64)).shape == (0, 16)
    for mode in MODES:
        out = pk.embedding_bag_quantized(p, np.array([1, 2], np.int32), np.array([0, 0, 2]), mode=mode)
        assert np.all(out[0] == 0) and np.all(out[2] == 0) and np.any(out[1] != 0)


@pytest.mark.parametrize("bits", BITS)
def test_lookup_bad_index_leaves_out_untouched(isa, rng, bits):
    rows = 30
    p = pk.quantize_rowwise(random_table(rng, rows, 40), bits=bits)
    for bad in (rows, -1, 10**12):
        indices = rng.integers(0, rows, 50)
        indices[17] = bad
        out = np.full((5, 40), 3.0, np.float32)
        with pytest.raises(IndexError, match=rf"indices\[17\] = {bad} is out of range for a table of {rows} rows"):
            pk.embedding_bag_quantized(p, indices, np.arange(5) * 10, bits=bits, out=out)
        assert np.all(out == 3.0)
        with pytest.raises(IndexError, match=r"indices\[17\]"):
            pk.embedding_bag_quantized(p, indices, np.arange(5) * 10, bits=bits)
        strided = np.full((5, 80), 3.0, np.float32)[:, ::2]   # out= through a temporary
        with pytest.raises(IndexError):
            pk.embedding_bag_quantized(p, indices, np.arange(5) * 10, bits=bits, out=strided)
        assert np.all(strided == 3.0)


def test_lookup_argument_errors_match_embedding_bag(rng):
    t = random_table(rng, 10, 8)
    p = pk.quantize_rowwise(t)
    cases = [
        dict(indices=np.array([1, 2]), offsets=np.array([1])),
        dict(indices=np.array([1, 2]), offsets=np.array([0, 3]), include_last_offset=True),
        dict(indices=np.array([1, 2]), lengths=np.array([1, 2])),
        dict(indices=np.array([1, 2]), offsets=np.array([0]), mode="max"),
        dict(indices=np.array([1, 2]), offsets=np.array([0]), per_sample_weights=np.ones(3, np.float32)),
        dict(indices=np.array([1.0, 2.0]), offsets=np.array([0])),
        dict(indices=np.array([1, 2]), offsets=np.array([0]), padding_idx=10),
    ]
    for kw in cases:
        with pytest.raises(Exception) as ours:
            pk.embedding_bag_quantized(p, **kw)
        with pytest.raises(Exception) as theirs:
            pk.embedding_bag(t, **kw)
        assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)
    with pytest.raises(ValueError, match="bits"):
        pk.embedding_bag_quantized(p, np.array([1]), np.array([0]), bits=5)


def test_lookup_unaligned_readonly_inputs(isa, rng):
    p = pk.quantize_rowwise(random_table(rng, 20, 33), bits=8)
    indices, offsets = random_bags(rng, 20, 4, 9)
    w = rng.random(len(indices)).astype(np.float32)
    ref = pk.embedding_bag_quantized(p, indices, offsets, per_sample_weights=w)
    got = pk.embedding_bag_quantized(unaligned(p), readonly(indices), unaligned(offsets),
                                     per_sample_weights=unaligned(w))
    np.testing.assert_array_equal(got, ref)
