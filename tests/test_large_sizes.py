"""64-bit sizes: tables with more than 2**31 rows and elements, more than 2**31 indices in one
call, bag offsets beyond int32, and outputs past 4 GiB, with the results checked.

Nothing here needs that much memory:

* big tables are memory-mapped sparse files: only the handful of rows the test writes (and the
  kernel reads) ever reach the disk or the page cache;
* big index / weight arrays come from ``np.zeros``, whose untouched pages are the kernel's shared
  zero page: a kernel can read all 8 GiB while the process's memory grows by a few pages.

Every call over more than 2**31 indices reads them all (a few seconds each), so the ordinary run
makes one such call per ISA level (offsets past int32, the mean's count of 2**31 + 1 entries and
padding); ``PERFKERNELS_TEST_LARGE=1`` adds the rest (lengths, include_last_offset, weights,
positional weights, 2-D indices, quantized tables, an error at position > 2**31) and the tests
with outputs past 4 GiB, which allocate that much for real (about 5 GiB free needed).  The
sanitizer run leaves out the 2**31-index scans (ASan makes each take minutes).
"""
import os

import ml_dtypes
import numpy as np
import pytest

import perfkernels as pk

TWO31 = 2 ** 31
BIG_ROWS = TWO31 + 64          # rows > 2**31: needs 64-bit row numbers and row offsets
D = 4                          # BIG_ROWS * D > 2**33 elements, row offsets well past 2**32 bytes

#: Rows of the big tables that hold data: both sides of 2**31 and the last row.
LIVE_ROWS = np.array([1, TWO31 - 1, TWO31, TWO31 + 5, BIG_ROWS - 1], dtype=np.int64)

large = pytest.mark.skipif(
    os.environ.get("PERFKERNELS_TEST_LARGE") != "1",
    reason="minutes of 2**31-entry scans or an output past 4 GiB; PERFKERNELS_TEST_LARGE=1 runs it")
no_sanitizer = pytest.mark.skipif(os.environ.get("PERFKERNELS_SANITIZE_RUN") == "1",
                                  reason="a 2**31-index scan takes minutes under ASan")


def _sparse_table(path, rows, row_shape, dtype, live):
    """A read-only memory-mapped table of `rows` rows, zero except the rows in `live` (a dict)."""
    table = np.memmap(path, mode="w+", dtype=dtype, shape=(rows,) + row_shape)   # sparse file
    for r, value in live.items():
        table[r] = value
    table.flush()
    del table
    return np.memmap(path, mode="r", dtype=dtype, shape=(rows,) + row_shape)


@pytest.fixture(scope="module")
def big_tables(tmp_path_factory):
    """{dtype name: (table, {row: float64 row})} for float32/float16/bfloat16 and 8/4-bit packed."""
    rng = np.random.default_rng(31)
    tmp = tmp_path_factory.mktemp("big")
    out = {}
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
        values = {int(r): rng.standard_normal(D).astype(dtype) for r in LIVE_ROWS}
        table = _sparse_table(tmp / f"{np.dtype(dtype).name}.bin", BIG_ROWS, (D,), dtype, values)
        out[np.dtype(dtype).name] = (table, {r: v.astype(np.float64) for r, v in values.items()})
    for bits in (8, 4):
        # Packed rows written from their definition (codes, scale, bias), not by quantize_rowwise.
        per = 8 // bits
        row_bytes = D + 8 if bits == 8 else -(-D // per) + 4
        packed_rows, decoded = {}, {}
        for r in LIVE_ROWS:
            codes = rng.integers(0, 2 ** bits, D)
            scale, bias = (np.float32, np.float32) if bits == 8 else (np.float16, np.float16)
            s, b = scale(rng.random() + 0.1), bias(rng.standard_normal())
            row = np.zeros(row_bytes, np.uint8)
            if bits == 8:
                row[:D] = codes
                row[D:D + 4] = np.frombuffer(s.tobytes(), np.uint8)
                row[D + 4:] = np.frombuffer(b.tobytes(), np.uint8)
            else:
                for c, q in enumerate(codes):
                    row[c // per] |= int(q) << ((c % per) * bits)
                row[-4:-2] = np.frombuffer(s.tobytes(), np.uint8)
                row[-2:] = np.frombuffer(b.tobytes(), np.uint8)
            packed_rows[int(r)] = row
            decoded[int(r)] = codes * np.float64(s) + np.float64(b)
        table = _sparse_table(tmp / f"packed{bits}.bin", BIG_ROWS, (row_bytes,), np.uint8, packed_rows)
        out[f"packed{bits}"] = (table, decoded)
    return out


def _lookup(kind, table, indices, offsets=None, **kw):
    if kind.startswith("packed"):
        return pk.embedding_bag_quantized(table, indices, offsets, bits=int(kind[6:]), dim=D, **kw)
    return pk.embedding_bag(table, indices, offsets, **kw)


def _tolerance(kind):
    return {"float32": 1e-6, "float16": 1e-3, "bfloat16": 1e-2}.get(kind, 1e-5)


KINDS = ["float32", "float16", "bfloat16", "packed8", "packed4"]


@pytest.mark.parametrize("kind", KINDS)
def test_table_with_more_than_2_31_rows(isa, big_tables, kind):
    table, rows = big_tables[kind]
    assert table.shape[0] > TWO31 and table.size > 2 ** 33
    indices = np.array([TWO31 + 5, 1, TWO31, TWO31 - 1, BIG_ROWS - 1, TWO31 + 5, 0], dtype=np.int64)
    offsets = np.array([0, 2, 2, 5])
    weights = np.linspace(0.5, 2.0, len(indices), dtype=np.float32)
    got = _lookup(kind, table, indices, offsets, per_sample_weights=weights)
    bounds = [0, 2, 2, 5, len(indices)]
    expected = np.zeros((4, D))
    for b in range(4):
        for j in range(bounds[b], bounds[b + 1]):
            expected[b] += weights[j] * rows.get(int(indices[j]), np.zeros(D))
    np.testing.assert_allclose(got, expected, rtol=_tolerance(kind), atol=_tolerance(kind))

    # padding_idx past 2**31 (and given from the end) and mode="mean" counting around it
    got = _lookup(kind, table, indices, offsets, mode="mean", padding_idx=TWO31 + 5 - BIG_ROWS)
    expected = np.stack([rows[1], np.zeros(D),
                         (rows[TWO31] + rows[TWO31 - 1] + rows[BIG_ROWS - 1]) / 3, np.zeros(D) / 1])
    np.testing.assert_allclose(got, expected, rtol=_tolerance(kind), atol=_tolerance(kind))


@pytest.mark.parametrize("kind", ["float32", "packed8"])
def test_int32_indices_reach_row_2_31_minus_1(isa, big_tables, kind):
    table, rows = big_tables[kind]
    got = _lookup(kind, table, np.array([[TWO31 - 1, 1]], dtype=np.int32))
    np.testing.assert_allclose(got[0], rows[TWO31 - 1] + rows[1], rtol=_tolerance(kind), atol=1e-5)


@pytest.mark.parametrize("kind", ["float32", "packed4"])
@pytest.mark.parametrize("bad", [BIG_ROWS, 2 ** 32 + 1, 2 ** 63 - 1, -1, -TWO31 - 7])
def test_big_table_index_errors(isa, big_tables, kind, bad):
    table, _ = big_tables[kind]
    out = np.full((2, D), 7.0, np.float32)
    indices = np.array([TWO31, 5, bad], dtype=np.int64)
    with pytest.raises(IndexError, match=rf"indices\[2\] = {bad} is out of range for a table of "
                                         rf"{BIG_ROWS} rows"):
        _lookup(kind, table, indices, np.array([0, 1]), out=out)
    assert np.all(out == 7.0)


# --- more than 2**31 indices in one call ---------------------------------------------------------

N_BIG = TWO31 + 16
#: Positions holding a non-zero index, and the rows they name; every other entry is index 0.
LIVE_POS = {5: 1, TWO31 - 3: 2, TWO31 + 3: 3, TWO31 + 10: 4}
BIG_OFFSETS = np.array([0, TWO31 + 1, TWO31 + 8], dtype=np.int64)   # bag 0 holds 2**31 + 1 entries


@pytest.fixture(scope="module")
def many_indices():
    """8 GiB of int32 indices backed by the zero page, a few of them non-zero."""
    indices = np.zeros(N_BIG, dtype=np.int32)
    for pos, row in LIVE_POS.items():
        indices[pos] = row
    return indices


def _small_table(dtype=np.float32):
    table = np.zeros((8, 3), dtype)
    table[1:5] = np.arange(1, 13).reshape(4, 3)   # row 0 (the bulk of the indices) is zeros
    return table


def _expected_bag_sums(table):
    t = table.astype(np.float64)
    return np.stack([t[1] + t[2], t[3], t[4]])


@no_sanitizer
def test_more_than_2_31_indices_mean_over_offsets_beyond_int32(isa, many_indices):
    """One call: a bag of 2**31 + 1 entries, bags starting past int32, the mean's count (only the
    live entries count, padding_idx=0 being the bulk)."""
    table = _small_table()
    got = pk.embedding_bag(table, many_indices, BIG_OFFSETS, mode="mean", padding_idx=0)
    np.testing.assert_allclose(got, _expected_bag_sums(table) / np.array([2.0, 1.0, 1.0])[:, None],
                               rtol=1e-6)


@large
@pytest.mark.parametrize("quantized", [False, True], ids=["float", "packed8"])
def test_more_than_2_31_indices_and_offsets_beyond_int32(isa, many_indices, quantized):
    table = _small_table()
    lookup = pk.embedding_bag
    if quantized:
        table_arg = pk.quantize_rowwise(table, bits=8)
        lookup = pk.embedding_bag_quantized
        table = pk.dequantize_rowwise(table_arg)   # rows as stored (0..12 are exact in 8 bits anyway)
    else:
        table_arg = table
    expected = _expected_bag_sums(table)
    got = lookup(table_arg, many_indices, BIG_OFFSETS)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # the same bags as caffe2 lengths (int64, the first one past int32) and with include_last_offset
    lengths = np.diff(np.append(BIG_OFFSETS, N_BIG))
    np.testing.assert_allclose(lookup(table_arg, many_indices, lengths=lengths), expected, rtol=1e-6)
    np.testing.assert_allclose(lookup(table_arg, many_indices, np.append(BIG_OFFSETS, N_BIG),
                                      include_last_offset=True), expected, rtol=1e-6)
    # mean over a bag of 2**31 + 1 entries; with padding_idx=0 only the two live entries count
    counts = np.diff(np.append(BIG_OFFSETS, N_BIG)).astype(np.float64)
    np.testing.assert_allclose(lookup(table_arg, many_indices, BIG_OFFSETS, mode="mean"),
                               expected / counts[:, None], rtol=1e-5)
    np.testing.assert_allclose(lookup(table_arg, many_indices, BIG_OFFSETS, mode="mean", padding_idx=0),
                               expected / np.array([2.0, 1.0, 1.0])[:, None], rtol=1e-6)


@large
def test_more_than_2_31_weighted_and_positional(isa, many_indices):
    table = _small_table()
    t = table.astype(np.float64)
    weights = np.zeros(N_BIG, dtype=np.float32)      # zero page too
    for k, pos in enumerate(LIVE_POS):
        weights[pos] = k + 2.0
    got = pk.embedding_bag(table, many_indices, BIG_OFFSETS, per_sample_weights=weights)
    expected = np.stack([2 * t[1] + 3 * t[2], 4 * t[3], 5 * t[4]])
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # positional: entry j of a bag takes weights[j - bag start]; bag 0 spans 2**31 + 1 positions
    got = pk.embedding_bag(table, many_indices, BIG_OFFSETS, per_sample_weights=weights,
                           positional_weights=True)
    pos_w = lambda j, start: np.float64(weights[j - start])   # noqa: E731
    expected = np.stack([pos_w(5, 0) * t[1] + pos_w(TWO31 - 3, 0) * t[2],
                         pos_w(TWO31 + 3, TWO31 + 1) * t[3], pos_w(TWO31 + 10, TWO31 + 8) * t[4]])
    np.testing.assert_allclose(got, expected, rtol=1e-6)


@large
def test_bad_index_past_position_2_31_is_reported_with_its_position(isa, many_indices):
    table = _small_table()
    pos = TWO31 + 12
    many_indices[pos] = 99
    try:
        out = np.full((3, 3), -1.0, np.float32)
        for kwargs in ({}, {"out": out}):
            with pytest.raises(IndexError, match=rf"indices\[{pos}\] = 99 is out of range for a "
                                                 r"table of 8 rows"):
                pk.embedding_bag(table, many_indices, BIG_OFFSETS, **kwargs)
        assert np.all(out == -1.0)
    finally:
        many_indices[pos] = 0


@large
def test_2d_indices_with_more_than_2_31_entries(isa, many_indices):
    table = _small_table()
    two_d = many_indices[:TWO31 + 2].reshape(2, TWO31 // 2 + 1)   # bag 1 starts at 2**30 + 1
    got = pk.embedding_bag(table, two_d)
    t = table.astype(np.float64)
    np.testing.assert_allclose(got, np.stack([t[1], t[2]]), rtol=1e-6)


# --- outputs past 4 GiB (real memory: opt-in) ----------------------------------------------------

@large
def test_embedding_output_past_4_gib():
    bags, dim = 2 ** 26 + 8, 16                      # 2**30 + 128 floats: 4 GiB + 512 bytes
    table = np.arange(2 * dim, dtype=np.float32).reshape(2, dim)
    indices = np.zeros((bags, 1), dtype=np.int32)   # zero page but for the two rows set below
    live = [bags // 2, bags - 1]
    indices[live, 0] = 1
    out = pk.embedding_bag(table, indices)
    assert out.shape == (bags, dim)
    step = 2 ** 20                                  # compare in 64 MiB slices to keep the peak low
    for start in range(0, bags, step):
        stop = min(start + step, bags)
        want = np.broadcast_to(table[0], (stop - start, dim)).copy()
        for r in live:
            if start <= r < stop:
                want[r - start] = table[1]
        np.testing.assert_array_equal(out[start:stop], want)


@large
def test_conversion_output_past_4_gib():
    n = 2 ** 30 + 40                                 # float32 output: 4 GiB + 160 bytes
    h = np.zeros(n, dtype=np.float16)                # input: zero page
    h[-37:] = np.linspace(-3, 3, 37, dtype=np.float16)
    x = pk.half_to_float(h)
    np.testing.assert_array_equal(x[-37:], h[-37:].astype(np.float32))
    assert not x[:-37].any()
