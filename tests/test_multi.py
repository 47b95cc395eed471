"""embedding_bags_multi: many tables in one call from TorchRec's KeyedJaggedTensor layout.

Checked against a loop of single-table embedding_bag / embedding_bag_quantized calls (bit for bit:
the same kernels on the same bags), against the float64 reference (perfkernels.reference) and
against torch.nn.functional.embedding_bag per feature.
"""
import ml_dtypes
import numpy as np
import pytest

import perfkernels as pk
from perfkernels import reference

from conftest import AWKWARD_DIMS, readonly, unaligned


def make_tables(rng, kinds, dims, rows):
    """(tables, bits) for per-feature kinds: a float dtype or 8/4/2 (packed)."""
    tables, bits = [], []
    for kind, D, R in zip(kinds, dims, rows):
        w = rng.standard_normal((R, D)).astype(np.float32)
        if kind in (8, 4, 2):
            p = pk.quantize_rowwise(w, kind)
            tables.append(p)
            bits.append(kind)
        else:
            tables.append(w.astype(kind))
            bits.append(None)
    return tables, bits


def make_kjt(rng, rows, B, max_len, index_dtype=np.int64, empty_features=()):
    """KJT values and lengths (F * B, feature-major) with some empty bags."""
    lengths, values = [], []
    for f, R in enumerate(rows):
        lens = rng.integers(0, max_len + 1, size=B)
        lens[rng.random(B) < 0.2] = 0
        if f in empty_features:
            lens[:] = 0
        lengths.append(lens)
        values.append(rng.integers(0, R, size=int(lens.sum())))
    return (np.concatenate(values).astype(index_dtype) if values else np.zeros(0, index_dtype),
            np.concatenate(lengths).astype(np.int64))


def loop_of_single_calls(tables, bits, dims, indices, lengths, weights=None, modes="sum",
                         padding_idx=None):
    F = len(tables)
    B = lengths.size // F
    modes = modes if isinstance(modes, list) else [modes] * F
    pads = padding_idx if isinstance(padding_idx, list) else [padding_idx] * F
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    outs = []
    for f in range(F):
        lo, hi = offsets[f * B], offsets[(f + 1) * B]
        ix = indices[lo:hi]
        lens = lengths[f * B:(f + 1) * B]
        w = None if weights is None else weights[lo:hi]
        if bits[f] is None:
            outs.append(pk.embedding_bag(tables[f], ix, lengths=lens, per_sample_weights=w,
                                         mode=modes[f], padding_idx=pads[f]))
        else:
            outs.append(pk.embedding_bag_quantized(tables[f], ix, lengths=lens, bits=bits[f],
                                                   dim=dims[f], per_sample_weights=w,
                                                   mode=modes[f], padding_idx=pads[f]))
    return np.concatenate(outs, axis=1) if outs else np.zeros((B, 0), np.float32)


def check_close(got, expected):
    reference.assert_close(got, expected.value, expected.magnitude + 1.0, rtol=1e-5)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_mixed_formats_equal_a_loop_of_single_calls(isa, rng, index_dtype):
    kinds = [np.float32, 8, np.float16, 4, ml_dtypes.bfloat16, 2, np.float32, 8]
    dims = [1, 7, 16, 17, 63, 64, 129, 128]
    rows = [50, 300, 1, 1000, 20, 77, 500, 5]
    tables, bits = make_tables(rng, kinds, dims, rows)
    indices, lengths = make_kjt(rng, rows, 37, 9, index_dtype, empty_features=(2,))
    weights = rng.standard_normal(indices.size).astype(np.float32)
    modes = ["sum", "mean"] * 4
    pads = [None, 3, None, -1, 0, None, 499, None]
    pdims = [None if b is None else d for b, d in zip(bits, dims)]
    got = pk.embedding_bags_multi(tables, indices, lengths=lengths, per_sample_weights=weights,
                                  modes=modes, padding_idx=pads, bits=bits, dims=pdims)
    expected = loop_of_single_calls(tables, bits, pdims, indices, lengths, weights, modes, pads)
    assert got.shape == (37, sum(dims)) and got.dtype == np.float32
    assert got.tobytes() == expected.tobytes()
    check_close(got, reference.embedding_bags_multi(
        tables, indices, lengths=lengths, per_sample_weights=weights, modes=modes, padding_idx=pads,
        bits=bits, dims=pdims))


@pytest.mark.parametrize("D", AWKWARD_DIMS)
def test_awkward_dims_with_offsets(isa, rng, D):
    kinds = [np.float32, 8, np.float16]
    tables, bits = make_tables(rng, kinds, [D] * 3, [40, 40, 40])
    indices, lengths = make_kjt(rng, [40] * 3, 5, 6)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    got = pk.embedding_bags_multi(tables, indices, offsets=offsets, bits=bits)
    assert got.tobytes() == loop_of_single_calls(tables, bits, [None] * 3, indices, lengths).tobytes()
    check_close(got, reference.embedding_bags_multi(tables, indices, lengths=lengths, bits=bits))


def test_one_feature_and_hundred_features(rng):
    tables, bits = make_tables(rng, [np.float32], [32], [100])
    indices, lengths = make_kjt(rng, [100], 10, 5)
    got = pk.embedding_bags_multi(tables, indices, lengths=lengths)
    np.testing.assert_array_equal(got, pk.embedding_bag(tables[0], indices, lengths=lengths))

    F = 100
    kinds = [(np.float32, 8, np.float16, 4)[f % 4] for f in range(F)]
    dims = [int(d) for d in rng.integers(1, 40, size=F) * 2]
    rows = [int(r) for r in rng.integers(1, 200, size=F)]
    tables, bits = make_tables(rng, kinds, dims, rows)
    indices, lengths = make_kjt(rng, rows, 16, 4)
    for nt in (1, 2, 3, 8):
        got = pk.embedding_bags_multi(tables, indices, lengths=lengths, bits=bits, num_threads=nt)
        assert got.tobytes() == loop_of_single_calls(tables, bits, [None] * F, indices,
                                                     lengths).tobytes()
    check_close(got, reference.embedding_bags_multi(tables, indices, lengths=lengths, bits=bits))


def test_empty_batch_and_empty_values(rng):
    tables, bits = make_tables(rng, [np.float32, 8], [8, 16], [10, 10])
    got = pk.embedding_bags_multi(tables, np.zeros(0, np.int64), lengths=np.zeros(0, np.int64),
                                  bits=bits)
    assert got.shape == (0, 24)
    got = pk.embedding_bags_multi(tables, np.zeros(0, np.int64), lengths=np.zeros(6, np.int64),
                                  bits=bits)
    np.testing.assert_array_equal(got, np.zeros((3, 24), np.float32))


def test_large_batch_same_for_any_thread_count_and_matches_torch(isa, rng):
    torch = pytest.importorskip("torch")
    F, B = 6, 512
    rows = [20000, 5000, 100, 20000, 3000, 1]
    tables, bits = make_tables(rng, [np.float32] * F, [64] * F, rows)
    indices, lengths = make_kjt(rng, rows, B, 40, empty_features=(4,))
    results = [pk.embedding_bags_multi(tables, indices, lengths=lengths, modes="mean",
                                       num_threads=nt) for nt in (1, 2, 3, 8)]
    assert all(r.tobytes() == results[0].tobytes() for r in results)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    expected = []
    for f in range(F):
        lo, hi = offsets[f * B], offsets[(f + 1) * B]
        expected.append(torch.nn.functional.embedding_bag(
            torch.from_numpy(indices[lo:hi]), torch.from_numpy(tables[f]),
            torch.from_numpy(offsets[f * B:(f + 1) * B] - lo), mode="mean").numpy())
    np.testing.assert_allclose(results[0], np.concatenate(expected, 1), rtol=1e-5, atol=1e-5)


def test_out_and_unusual_inputs(isa, rng):
    tables, bits = make_tables(rng, [np.float32, 4], [9, 8], [30, 30])
    indices, lengths = make_kjt(rng, [30, 30], 4, 5, np.int32)
    expected = pk.embedding_bags_multi(tables, indices, lengths=lengths, bits=bits)
    out = np.full((4, 17), 5.0, np.float32)
    assert pk.embedding_bags_multi(tables, indices, lengths=lengths, bits=bits, out=out) is out
    np.testing.assert_array_equal(out, expected)
    strided = np.zeros((4, 34), np.float32)[:, ::2]
    pk.embedding_bags_multi(tables, indices, lengths=lengths, bits=bits, out=strided)
    np.testing.assert_array_equal(strided, expected)
    got = pk.embedding_bags_multi([unaligned(tables[0]), readonly(tables[1])], unaligned(indices),
                                  lengths=readonly(lengths), bits=bits)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("with_out", [False, True])
def test_bad_index_names_feature_and_position(isa, rng, with_out):
    tables, bits = make_tables(rng, [np.float32, 8, np.float32], [8, 8, 8], [10, 20, 30])
    indices, lengths = make_kjt(rng, [10, 20, 30], 50, 30)
    B = 50
    start1 = int(lengths[:B].sum())
    start2 = int(lengths[:2 * B].sum())
    indices[start1 + 4] = 20          # feature 1 (20 rows): first bad
    indices[start2 + 1] = -1          # feature 2: later
    out = np.full((B, 24), 3.0, np.float32)
    for nt in (1, 2, 8):
        with pytest.raises(IndexError, match=rf"feature 1: indices\[{start1 + 4}\] = 20 \(entry 4 "
                                             rf"of feature 1\) is out of range for table 1 of 20 rows"):
            pk.embedding_bags_multi(tables, indices, lengths=lengths, bits=bits,
                                    out=out if with_out else None, num_threads=nt)
    assert np.all(out == 3.0)


@pytest.mark.parametrize("with_out", [False, True])
def test_zero_width_table_checks_only_its_own_indices(isa, with_out):
    # A D = 0 table reads no row but still checks its indices: only its own feature's, not the
    # values of the features before it (found by the fuzz harness).
    tables = [np.arange(16, dtype=np.float32).reshape(16, 1), np.ones((12, 0), np.float16),
              np.ones((3, 2), np.float32)]
    indices = np.array([13, 15, 0, 11, 2, 1])      # feature 0: 13, 15; 1: 0, 11; 2: 2, 1
    lengths = np.array([1, 1, 1, 1, 1, 1])
    expected = reference.embedding_bags_multi(tables, indices, lengths=lengths).value
    for nt in (1, 2, 8):
        out = np.full((2, 3), 7.0, np.float32) if with_out else None
        got = pk.embedding_bags_multi(tables, indices, lengths=lengths, out=out, num_threads=nt)
        np.testing.assert_array_equal(got, expected)
        bad = indices.copy()
        bad[3] = 12                                # feature 1's own index, out of its 12 rows
        with pytest.raises(IndexError, match=r"feature 1: indices\[3\] = 12 \(entry 1 of feature 1\)"):
            pk.embedding_bags_multi(tables, bad, lengths=lengths, num_threads=nt)


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(lengths=np.ones(5, np.int64)), ValueError, "lengths has 5 entries, not a multiple of the 2"),
    (dict(offsets=np.arange(4)), ValueError, "offsets has 4 entries; it needs F \\* B \\+ 1"),
    (dict(offsets=np.array([0, 2, 1, 4, 4])), ValueError, "non-decreasing"),
    (dict(offsets=np.array([0, 1, 2, 3, 3])), ValueError, "must equal len\\(indices\\)"),
    (dict(lengths=np.array([1, 1, 1, 2])), ValueError, "sum\\(lengths\\)"),
    (dict(), ValueError, "exactly one of lengths"),
    (dict(lengths=np.ones(4, np.int64), offsets=np.arange(5)), ValueError, "exactly one of lengths"),
    (dict(lengths=np.ones(4, np.float32)), TypeError, "lengths must have dtype int32 or int64"),
    (dict(lengths=np.ones(4, np.int64), modes=["sum", "max"]), ValueError, "modes\\[1\\]"),
    (dict(lengths=np.ones(4, np.int64), modes=["sum"]), ValueError, "modes has 1 entries"),
    (dict(lengths=np.ones(4, np.int64), padding_idx=[None, 9]), ValueError, "padding_idx\\[1\\] = 9"),
    (dict(lengths=np.ones(4, np.int64), bits=[None, 3]), ValueError, "tables\\[1\\]: bits must be"),
    (dict(lengths=np.ones(4, np.int64), bits=8), TypeError, "bits must be a list"),
    (dict(lengths=np.ones(4, np.int64), dims=[5, None]), ValueError, "dims\\[0\\] = 5"),
    (dict(lengths=np.ones(4, np.int64), per_sample_weights=np.ones(3, np.float32)), ValueError,
     "per_sample_weights has shape"),
])
def test_argument_errors(rng, kw, exc, msg):
    tables = [np.ones((4, 3), np.float32), np.ones((4, 2), np.float16)]
    with pytest.raises(exc, match=msg):
        pk.embedding_bags_multi(tables, np.array([0, 1, 2, 3]), **kw)


def test_table_errors_name_the_table():
    with pytest.raises(ValueError, match="tables is empty"):
        pk.embedding_bags_multi([], np.zeros(0, np.int64), lengths=np.zeros(0, np.int64))
    with pytest.raises(TypeError, match="tables\\[1\\]: weight must have dtype"):
        pk.embedding_bags_multi([np.ones((2, 2), np.float32), np.ones((2, 2), np.int32)],
                                np.array([0, 1]), lengths=np.array([1, 1]))
    with pytest.raises(TypeError, match="tables must be a list"):
        pk.embedding_bags_multi(np.ones((2, 2), np.float32), np.array([0]), lengths=np.array([1]))


# --------------------------------------------------------------------------- out= a column slice

@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_out_column_slice_of_a_wider_array_is_written_in_place(isa, rng, index_dtype):
    # the pooled features straight into their columns of a model's [B, dense + sum(D)] row
    kinds = [np.float32, 8, np.float16, 4]
    dims = [7, 16, 17, 8]
    rows = [50, 30, 20, 40]
    tables, bits = make_tables(rng, kinds, dims, rows)
    B = 33
    indices, lengths = make_kjt(rng, rows, B, 6, index_dtype)
    expected = loop_of_single_calls(tables, bits, [None] * 4, indices, lengths)
    for nt in (1, 2, 8):
        big = np.full((B, 5 + sum(dims) + 3), -7.0, np.float32)
        view = big[:, 5:5 + sum(dims)]
        assert not view.flags.c_contiguous
        assert pk.embedding_bags_multi(tables, indices, lengths=lengths, bits=bits, out=view,
                                       num_threads=nt) is view
        assert view.tobytes() == expected.tobytes()
        assert np.all(big[:, :5] == -7.0) and np.all(big[:, 5 + sum(dims):] == -7.0)


def test_out_column_slice_makes_no_output_sized_temporary(rng):
    import tracemalloc
    F, B, D = 4, 256, 128
    tables, bits = make_tables(rng, [np.float32] * F, [D] * F, [100] * F)
    lengths = np.ones(F * B, np.int64)
    indices = rng.integers(0, 100, F * B).astype(np.int32)
    big = np.zeros((B, 16 + F * D + 16), np.float32)
    view = big[:, 16:16 + F * D]
    pk.embedding_bags_multi(tables, indices, lengths=lengths, out=view)   # warm up
    tracemalloc.start()
    try:
        pk.embedding_bags_multi(tables, indices, lengths=lengths, out=view)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < B * F * D * 4 // 4, peak    # NumPy reports its buffers to tracemalloc
    np.testing.assert_array_equal(view, loop_of_single_calls(tables, bits, [None] * F, indices,
                                                             lengths))
    # a column slice with a bad index: nothing written, neither in it nor beside it
    before = big.copy()
    indices[B + 3] = 100
    with pytest.raises(IndexError, match=r"feature 1: indices\[259\] = 100"):
        pk.embedding_bags_multi(tables, indices, lengths=lengths, out=view)
    assert big.tobytes() == before.tobytes()


def test_out_column_slice_sharing_memory_with_an_input_goes_through_a_temporary(rng):
    tables, bits = make_tables(rng, [np.float32], [4], [10])
    lengths = np.ones(3, np.int64)
    big = np.zeros((3, 8), np.float32)
    idx_view = big[:, 0].view(np.int32)       # the indices live in column 0 of big
    idx_view[:] = [1, 2, 3]
    expected = pk.embedding_bags_multi(tables, idx_view.copy(), lengths=lengths)
    pk.embedding_bags_multi(tables, idx_view, lengths=lengths, out=big[:, 0:4])
    np.testing.assert_array_equal(big[:, 0:4], expected)


# --------------------------------------------------------------------------- fused interaction

def _per_table_inputs(rng, rows, B, max_len, index_dtype=np.int64, include_last=False):
    """DLRM's inputs: per table an index array and its offsets (B, or B + 1 entries)."""
    indices, offsets = [], []
    for R in rows:
        lens = rng.integers(0, max_len + 1, size=B)
        lens[rng.random(B) < 0.2] = 0
        o = np.concatenate([[0], np.cumsum(lens)])
        indices.append(rng.integers(0, R, size=int(o[-1])).astype(index_dtype))
        offsets.append(o if include_last else o[:-1])
    return indices, offsets


@pytest.mark.parametrize("D", [1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 128, 129])
@pytest.mark.parametrize("pairs,itself", [("dlrm", False), ("dlrm", True), ("torchrec", False)])
def test_interaction_dot_equals_lookups_then_dot_interaction(isa, rng, D, pairs, itself):
    F, B = 5, 11
    kinds = [np.float32, np.float16, 8, ml_dtypes.bfloat16, 4]
    rows = [30, 20, 40, 10, 25]
    tables, bits = make_tables(rng, kinds, [D] * F, rows)
    dims = [D if b else None for b in bits]
    indices, offsets = _per_table_inputs(rng, rows, B, 4, np.int32)
    dense = rng.standard_normal((B, D)).astype(np.float32)
    modes = ["sum", "mean", "sum", "mean", "sum"]
    got = pk.embedding_bags_interaction(dense, tables, indices, offsets, pairs=pairs,
                                        self_interaction=itself, modes=modes, bits=bits, dims=dims)
    pooled = []
    for f in range(F):
        if bits[f] is None:
            pooled.append(pk.embedding_bag(tables[f], indices[f], offsets[f], mode=modes[f]))
        else:
            pooled.append(pk.embedding_bag_quantized(tables[f], indices[f], offsets[f],
                                                     bits=bits[f], dim=D, mode=modes[f]))
    two_calls = pk.dot_interaction(dense, np.stack(pooled, 1), pairs=pairs,
                                   self_interaction=itself)
    assert got.tobytes() == two_calls.tobytes()
    check_close(got, reference.embedding_bags_interaction(
        dense, tables, indices, offsets, pairs=pairs, self_interaction=itself, modes=modes,
        bits=bits, dims=dims))


def test_interaction_cat_and_threads_and_torch(isa, rng):
    torch = pytest.importorskip("torch")
    F, B, D = 26, 300, 16
    rows = [int(r) for r in rng.integers(1, 500, F)]
    tables, bits = make_tables(rng, [np.float32] * F, [D] * F, rows)
    indices, offsets = _per_table_inputs(rng, rows, B, 3)
    dense = rng.standard_normal((B, D)).astype(np.float32)
    ti = [torch.from_numpy(i) for i in indices]
    to = [torch.from_numpy(o) for o in offsets]
    ly = [torch.nn.functional.embedding_bag(i, torch.from_numpy(t), o, mode="sum")
          for i, t, o in zip(ti, tables, to)]
    x = torch.from_numpy(dense)
    for itself in (False, True):
        results = [pk.embedding_bags_interaction(dense, tables, indices, offsets,
                                                 self_interaction=itself, num_threads=nt)
                   for nt in (1, 2, 3, 8)]
        assert all(r.tobytes() == results[0].tobytes() for r in results)
        # facebookresearch DLRM's "dot": the vectors' Gram matrix by bmm, its lower triangle
        # (with the diagonal under the self-interaction) row by row after the dense vector
        vectors = torch.cat([x] + ly, dim=1).view((B, -1, D))
        gram = torch.bmm(vectors, torch.transpose(vectors, 1, 2))
        below = torch.tril_indices(F + 1, F + 1, offset=0 if itself else -1)
        want = torch.cat([x, gram[:, below[0], below[1]]], dim=1)
        np.testing.assert_allclose(results[0], want.numpy(), rtol=1e-5, atol=1e-4)
    # TorchRec's InteractionArch
    combined = torch.cat((x.unsqueeze(1), torch.stack(ly, 1)), dim=1)
    inter = torch.bmm(combined, torch.transpose(combined, 1, 2))
    triu = torch.triu_indices(F + 1, F + 1, offset=1)
    want = torch.cat((x, inter[:, triu[0], triu[1]]), dim=1)
    got = pk.embedding_bags_interaction(dense, tables, indices, offsets, pairs="torchrec")
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-4)
    # "cat"
    cat = [pk.embedding_bags_interaction(dense, tables, indices, offsets, interaction="cat",
                                         num_threads=nt) for nt in (1, 2, 8)]
    assert all(c.tobytes() == cat[0].tobytes() for c in cat)
    np.testing.assert_array_equal(cat[0], np.concatenate(
        [dense] + [pk.embedding_bag(t, i, o) for t, i, o in zip(tables, indices, offsets)], 1))
    np.testing.assert_allclose(cat[0], torch.cat([x] + ly, dim=1).numpy(), rtol=1e-5, atol=1e-6)


def test_interaction_empty_batch_weights_padding_and_include_last(isa, rng):
    tables, bits = make_tables(rng, [np.float32, np.float32], [4, 4], [10, 10])
    got = pk.embedding_bags_interaction(np.zeros((0, 4), np.float32), tables,
                                        [np.zeros(0, np.int64)] * 2, [np.zeros(0, np.int64)] * 2)
    assert got.shape == (0, 4 + 3)
    indices, offsets = _per_table_inputs(rng, [10, 10], 6, 4, include_last=True)
    weights = [rng.standard_normal(i.size).astype(np.float32) for i in indices]
    dense = rng.standard_normal((6, 4)).astype(np.float32)
    kw = dict(include_last_offset=True, per_sample_weights=weights, padding_idx=[2, None])
    got = pk.embedding_bags_interaction(dense, tables, indices, offsets, **kw)
    check_close(got, reference.embedding_bags_interaction(dense, tables, indices, offsets, **kw))
    out = np.full(got.shape, 9.0, np.float32)
    assert pk.embedding_bags_interaction(dense, tables, indices, offsets, out=out, **kw) is out
    np.testing.assert_array_equal(out, got)


def test_interaction_bad_index_reports_the_first_feature_and_writes_nothing(isa, rng):
    tables, _ = make_tables(rng, [np.float32] * 3, [8] * 3, [10, 20, 30])
    indices, offsets = _per_table_inputs(rng, [10, 20, 30], 40, 5)
    indices[1][3] = 20
    indices[2][0] = -1
    dense = rng.standard_normal((40, 8)).astype(np.float32)
    out = np.full((40, 8 + 6), 3.0, np.float32)
    for interaction in ("dot", "cat"):
        for nt in (1, 2, 8):
            o = out if interaction == "dot" else None
            with pytest.raises(IndexError, match=r"feature 1: indices\[3\] = 20 is out of range "
                                                 r"for a table of 20 rows"):
                pk.embedding_bags_interaction(dense, tables, indices, offsets, out=o,
                                              interaction=interaction, num_threads=nt)
    assert np.all(out == 3.0)


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(interaction="sum"), ValueError, "interaction must be 'dot' or 'cat'"),
    (dict(pairs="upper"), ValueError, "pairs must be 'dlrm', 'torchrec'"),
    (dict(pairs=([0, 1], [0, 3])), IndexError, r"pairs lj\[1\] = 3 is out of range for 3 rows"),
    (dict(dense=np.ones((4, 3), np.float32)), ValueError, "needs every table's D equal"),
    (dict(dense=np.ones((5, 2), np.float32)), ValueError, r"offsets\[0\] has 4 entries: 5 bags"),
    (dict(offsets=[np.array([0, 1, 3, 2])] * 2), ValueError, "feature 0: offsets"),
    (dict(indices=[np.arange(4)]), ValueError, "indices must be a list of 2 arrays"),
    (dict(modes=["sum", "max"]), ValueError, r"modes\[1\]"),
])
def test_interaction_argument_errors(kw, exc, msg):
    args = dict(dense=np.ones((4, 2), np.float32),
                tables=[np.ones((4, 2), np.float32), np.ones((4, 2), np.float16)],
                indices=[np.arange(4)] * 2, offsets=[np.arange(4)] * 2)
    args.update(kw)
    with pytest.raises(exc, match=msg):
        pk.embedding_bags_interaction(args.pop("dense"), args.pop("tables"), args.pop("indices"),
                                      args.pop("offsets"), **args)
