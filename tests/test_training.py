"""embedding_bag_backward_update: every optimizer, table dtype and ISA path against a float64 NumPy
reference written from the formulas, and the element-wise optimizers against PyTorch's
nn.EmbeddingBag(sparse=True) + torch.optim.SGD / Adagrad."""
import ml_dtypes
import numpy as np
import pytest

import perfkernels
from perfkernels import embedding_bag_backward_update as update

from conftest import AWKWARD_DIMS, TABLE_DTYPES, readonly, unaligned
from sparse_training import bags_of, torch_sparse_bag, torch_sparse_step
from perfkernels.reference import assert_update_close
from perfkernels.reference import embedding_bag_backward_update as reference

BF16 = np.dtype(ml_dtypes.bfloat16)
OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad")


def new_state(optimizer, rows, D, rng, zeros=False):
    if optimizer == "sgd":
        return None
    shape = (rows, D) if optimizer == "adagrad" else (rows,)
    if zeros:
        return np.zeros(shape, np.float32)
    return rng.uniform(0.1, 1.0, shape).astype(np.float32)


def check_update(weight, state, optimizer, lr, eps, weight_decay, grad_output, indices,
                 offsets=None, *, rtol=2e-5, **bags):
    """Run the kernel on copies and compare with the reference within a tolerance derived from the
    float32 error of the gradient sum and the table's rounding."""
    w = weight.copy()
    h = None if state is None else state.copy()
    update(w, indices, offsets, grad_output=grad_output, optimizer=optimizer, state=h, lr=lr,
           eps=eps, weight_decay=weight_decay, **bags)
    bags.pop("num_threads", None)
    expected = reference(weight, indices, offsets, grad_output=grad_output, optimizer=optimizer,
                         state=state, lr=lr, eps=eps, weight_decay=weight_decay, **bags)
    assert_update_close(w, h, weight, state, expected, optimizer=optimizer, lr=lr, eps=eps,
                        weight_decay=weight_decay, rtol=rtol)
    return w, h


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("dtype", TABLE_DTYPES.values(), ids=list(TABLE_DTYPES))
@pytest.mark.parametrize("D", AWKWARD_DIMS)
def test_matches_reference(isa, rng, optimizer, dtype, D):
    rows = 40
    weight = rng.standard_normal((rows, D)).astype(dtype)
    indices, offsets = bags_of(rng, rows, 12, 9)   # many duplicates, some empty bags
    grad = rng.standard_normal((12, D)).astype(np.float32)
    state = new_state(optimizer, rows, D, rng)
    check_update(weight, state, optimizer, 0.05, 1e-8, 0.0, grad, indices, offsets)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("case", ["mean", "weighted", "positional", "padding", "padding_neg",
                                  "lengths", "2d", "include_last", "int32", "weight_decay",
                                  "mean_weighted_padding"])
def test_bag_options(isa, rng, optimizer, case):
    rows, D, B = 30, 17, 9
    weight = rng.standard_normal((rows, D)).astype(np.float32)
    indices, offsets = bags_of(rng, rows, B, 7)
    grad = rng.standard_normal((B, D)).astype(np.float32)
    kw = {}
    args = (indices, offsets)
    if case in ("mean", "mean_weighted_padding"):
        kw["mode"] = "mean"
    if case in ("weighted", "mean_weighted_padding"):
        kw["per_sample_weights"] = rng.standard_normal(indices.size).astype(np.float32)
    if case == "positional":
        kw.update(per_sample_weights=rng.standard_normal(7).astype(np.float32),
                  positional_weights=True)
    if case in ("padding", "mean_weighted_padding"):
        kw["padding_idx"] = int(indices[0]) if indices.size else 0
    if case == "padding_neg":
        kw["padding_idx"] = -3
        indices[::3] = rows - 3
    if case == "lengths":
        lengths = np.diff(np.concatenate([offsets, [indices.size]]))
        args = (indices, None)
        kw["lengths"] = lengths
    if case == "2d":
        args = (rng.integers(0, rows, (B, 5)), None)
    if case == "include_last":
        args = (indices, np.concatenate([offsets, [indices.size]]))
        kw["include_last_offset"] = True
    if case == "int32":
        args = (indices.astype(np.int32), offsets.astype(np.int32))
    wd = 0.01 if case == "weight_decay" else 0.0
    state = new_state(optimizer, rows, D, rng)
    check_update(weight, state, optimizer, 0.1, 1e-6, wd, grad, *args, **kw)


def test_duplicates_summed_before_one_update(isa):
    """Row 3 three times: one update with g = the sum (not three successive updates)."""
    D = 8
    weight = np.ones((5, D), np.float32)
    state = np.zeros(5, np.float32)
    grad = np.full((3, D), 2.0, np.float32)
    update(weight, np.array([3, 3, 3]), np.array([0, 1, 2]), grad_output=grad,
           optimizer="rowwise_adagrad", state=state, lr=0.5, eps=0.0)
    # g = 6 everywhere: h = 36, w = 1 - 0.5 * 6 / 6 = 0.5 (three updates would give less)
    assert state[3] == 36.0 and np.all(weight[3] == 0.5)
    assert np.all(weight[[0, 1, 2, 4]] == 1.0) and np.all(state[[0, 1, 2, 4]] == 0.0)


def test_empty_inputs(isa):
    weight = np.ones((4, 3), np.float32)
    state = np.zeros((4, 3), np.float32)
    update(weight, np.array([], np.int64), np.array([0, 0]), grad_output=np.ones((2, 3), np.float32),
           optimizer="adagrad", state=state, lr=1.0)
    update(weight, np.zeros((0, 5), np.int64), grad_output=np.ones((0, 3), np.float32),
           optimizer="adagrad", state=state, lr=1.0)
    assert np.all(weight == 1.0) and np.all(state == 0.0)
    update(np.ones((4, 0), np.float32), np.array([1, 2]), np.array([0]),
           grad_output=np.ones((1, 0), np.float32), optimizer="sgd", lr=1.0)


@pytest.mark.parametrize("rows", [1, 2, 3000, 70_000, (1 << 21) + 3])
def test_radix_passes(isa, rng, rows):
    """Tables needing 0, 1, 2 radix passes and a 21-bit row number (two 11-bit digits)."""
    D = 4
    weight = rng.standard_normal((rows, D)).astype(np.float32)
    hot = rng.integers(0, rows, 64)
    indices = np.concatenate([hot[rng.integers(0, 64, 2000)], rng.integers(0, rows, 500)])
    offsets = np.arange(0, indices.size, 10)
    grad = rng.standard_normal((offsets.size, D)).astype(np.float32)
    state = np.zeros(rows, np.float32)
    check_update(weight, state, "rowwise_adagrad", 0.1, 1e-8, 0.0, grad, indices, offsets)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("dtype", TABLE_DTYPES.values(), ids=list(TABLE_DTYPES))
def test_thread_counts_bit_identical(isa, rng, optimizer, dtype):
    rows, D = 500, 33
    weight = rng.standard_normal((rows, D)).astype(dtype)
    from perfkernels.benchsuite import zipf_indices
    indices = zipf_indices(rng, rows, 3000)
    offsets = np.arange(0, 3000, 30)
    grad = rng.standard_normal((offsets.size, D)).astype(np.float32)
    state = new_state(optimizer, rows, D, rng)
    results = []
    for threads in (1, 2, 3, 8):
        w = weight.copy()
        h = None if state is None else state.copy()
        update(w, indices, offsets, grad_output=grad, optimizer=optimizer, state=h, lr=0.1,
               num_threads=threads)
        results.append((w.view(np.uint8), None if h is None else h.view(np.uint8)))
    for w, h in results[1:]:
        assert np.array_equal(w, results[0][0])
        assert h is None or np.array_equal(h, results[0][1])


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("threads", (2, 8))
def test_split_across_threads_matches_reference(isa, rng, optimizer, threads):
    """A batch large enough for the pool to split (sort slices and update tasks): against the
    reference at each thread count, with weights, mean mode, padding and a Zipf-hot row, and bit for
    bit equal to one thread (16-bit table, stochastic rounding with a fixed seed included)."""
    rows, D = 20000, 64
    from perfkernels.benchsuite import zipf_indices
    indices = zipf_indices(rng, rows, 30000)
    indices[::97] = 7                                      # padding entries
    offsets = np.concatenate([[0], np.sort(rng.integers(0, indices.size, 999))]).astype(np.int64)
    weights = rng.uniform(0.5, 1.5, indices.size).astype(np.float32)
    grad = rng.standard_normal((offsets.size, D)).astype(np.float32)
    weight = rng.standard_normal((rows, D)).astype(np.float32)
    state = new_state(optimizer, rows, D, rng)
    kw = dict(per_sample_weights=weights, mode="sum", padding_idx=7, num_threads=threads)
    check_update(weight, state, optimizer, 0.05, 1e-8, 0.01, grad, indices, offsets, **kw)
    for extra in (dict(mode="mean", per_sample_weights=None),):
        check_update(weight, state, optimizer, 0.05, 1e-8, 0.0, grad, indices, offsets,
                     **{**kw, **extra})
    half = rng.standard_normal((rows, D)).astype(np.float16)
    got = []
    for nt in (1, threads):
        w = half.copy()
        h = None if state is None else state.copy()
        update(w, indices, offsets, grad_output=grad, optimizer=optimizer, state=h, lr=0.05,
               stochastic_rounding=True, seed=11, num_threads=nt)
        got.append((w.view(np.uint16), h))
    assert np.array_equal(got[0][0], got[1][0])
    assert state is None or np.array_equal(got[0][1], got[1][1])


def test_isas_agree(rng):
    """Different ISA levels compute the same update to float32 rounding (the vector paths use fma)."""
    rows, D = 300, 65
    weight = rng.standard_normal((rows, D)).astype(np.float32)
    indices, offsets = bags_of(rng, rows, 50, 20)
    grad = rng.standard_normal((50, D)).astype(np.float32)
    out = []
    for isa in perfkernels.available_isas():
        with perfkernels.use_isa(isa):
            w = weight.copy()
            h = np.full(rows, 0.5, np.float32)
            update(w, indices, offsets, grad_output=grad, optimizer="rowwise_adagrad", state=h,
                   lr=0.1)
            out.append(w)
    for w in out[1:]:
        np.testing.assert_allclose(w, out[0], rtol=1e-5, atol=1e-6)


def test_readonly_unaligned_inputs(isa, rng):
    rows, D = 20, 9
    weight = rng.standard_normal((rows, D)).astype(np.float32)
    indices, offsets = bags_of(rng, rows, 6, 5)
    grad = rng.standard_normal((6, D)).astype(np.float32)
    state = np.zeros((rows, D), np.float32)
    psw = rng.standard_normal(indices.size).astype(np.float32)
    w1, h1 = weight.copy(), state.copy()
    update(w1, indices, offsets, grad_output=grad, optimizer="adagrad", state=h1, lr=0.1,
           per_sample_weights=psw)
    w2, h2 = weight.copy(), state.copy()
    update(w2, readonly(indices), unaligned(offsets), grad_output=unaligned(grad),
           optimizer="adagrad", state=h2, lr=0.1, per_sample_weights=readonly(psw))
    assert np.array_equal(w1, w2) and np.array_equal(h1, h2)
    # a column slice of a wider table is updated in place
    wide = np.zeros((rows, D + 5), np.float32)
    wide[:, 2:2 + D] = weight
    h3 = state.copy()
    update(wide[:, 2:2 + D], indices, offsets, grad_output=grad, optimizer="adagrad", state=h3,
           lr=0.1, per_sample_weights=psw)
    assert np.array_equal(wide[:, 2:2 + D], w1) and np.all(wide[:, :2] == 0)
    assert np.all(wide[:, 2 + D:] == 0)


def test_grad_output_sharing_memory_with_weight(isa):
    """grad_output may alias the table: it is read as it was before the update."""
    weight = np.arange(12, dtype=np.float32).reshape(6, 2)
    expected = weight.copy()
    grad_copy = weight[:2].copy()
    update(expected, np.array([0, 1, 5]), np.array([0, 2]), grad_output=grad_copy, lr=0.5)
    update(weight, np.array([0, 1, 5]), np.array([0, 2]), grad_output=weight[:2], lr=0.5)
    assert np.array_equal(weight, expected)


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=str)
def test_stochastic_rounding(isa, dtype):
    D = 4000
    weight = np.ones((2, D), dtype)
    grad = np.full((1, D), 1.0, np.float32)
    lr = 2e-4   # 1 - 2e-4 rounds back to 1.0 to nearest in both 16-bit formats
    w_rne = weight.copy()
    update(w_rne, np.array([1]), np.array([0]), grad_output=grad, lr=lr)
    assert np.all(w_rne[1].astype(np.float32) == 1.0)
    w1, w2, w3 = weight.copy(), weight.copy(), weight.copy()
    for w, seed in ((w1, 7), (w2, 7), (w3, 8)):
        update(w, np.array([1]), np.array([0]), grad_output=grad, lr=lr,
               stochastic_rounding=True, seed=seed)
    assert np.array_equal(w1.view(np.uint16), w2.view(np.uint16))   # same seed, same bits
    assert not np.array_equal(w1.view(np.uint16), w3.view(np.uint16))
    assert np.all(w1[0].astype(np.float32) == 1.0)                   # untouched row
    below = np.nextafter(np.array(1.0, dtype), np.array(0.0, dtype))
    vals = w1[1].astype(np.float64)
    assert set(np.unique(vals)) <= {1.0, float(below)}
    # unbiased: the mean of the rounded values is the exact result, within sampling error
    p = (1.0 - (1.0 - lr)) / (1.0 - float(below))
    assert abs(np.mean(vals == float(below)) - p) < 5 * np.sqrt(p * (1 - p) / D)


def test_stochastic_rounding_ignored_for_float32(isa, rng):
    weight = rng.standard_normal((5, 7)).astype(np.float32)
    grad = rng.standard_normal((2, 7)).astype(np.float32)
    w1, w2 = weight.copy(), weight.copy()
    update(w1, np.array([1, 2, 1]), np.array([0, 1]), grad_output=grad, lr=0.1)
    update(w2, np.array([1, 2, 1]), np.array([0, 1]), grad_output=grad, lr=0.1,
           stochastic_rounding=True, seed=3)
    assert np.array_equal(w1, w2)


# ---------------------------------------------------------------------------------------------
# against PyTorch: nn.EmbeddingBag(sparse=True) + torch.optim.SGD / Adagrad, several steps
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
@pytest.mark.parametrize("case", ["sum", "mean", "weighted", "padding", "mean_padding"])
@pytest.mark.parametrize("D", [1, 16, 63])
def test_matches_torch(isa, rng, optimizer, case, D):
    torch = pytest.importorskip("torch")
    rows, B, steps, lr, eps = 50, 16, 4, 0.05, 1e-10
    weight = rng.standard_normal((rows, D)).astype(np.float32)
    mode = "mean" if case in ("mean", "mean_padding") else "sum"
    padding_idx = 7 if "padding" in case else None
    bag = torch_sparse_bag(weight, mode, padding_idx)
    topt = (torch.optim.SGD(bag.parameters(), lr=lr) if optimizer == "sgd"
            else torch.optim.Adagrad(bag.parameters(), lr=lr, eps=eps))
    ours = weight.copy()
    state = None if optimizer == "sgd" else np.zeros((rows, D), np.float32)
    for _ in range(steps):   # a 12-row hot set: duplicates across steps
        indices, offsets, psw, grad = torch_sparse_step(rng, bag, topt, B, padding_idx,
                                                        case == "weighted")
        update(ours, indices, offsets, grad_output=grad, optimizer=optimizer, state=state, lr=lr,
               eps=eps, mode=mode, padding_idx=padding_idx, per_sample_weights=psw)
    np.testing.assert_allclose(ours, bag.weight.detach().numpy(), rtol=2e-5, atol=2e-6)
    if optimizer == "adagrad":
        torch_state = topt.state[bag.weight]["sum"].numpy()
        np.testing.assert_allclose(state, torch_state, rtol=2e-5, atol=1e-7)


def test_rowwise_several_steps(isa, rng):
    """Row-wise Adagrad over several steps against the reference applied step by step."""
    rows, D, B = 64, 24, 20
    weight = rng.standard_normal((rows, D)).astype(np.float32)
    state = np.zeros(rows, np.float32)
    exp_w, exp_h = weight.astype(np.float64), state.astype(np.float64)
    for _ in range(5):
        indices, offsets = bags_of(rng, rows, B, 8)
        grad = rng.standard_normal((B, D)).astype(np.float32)
        update(weight, indices, offsets, grad_output=grad, optimizer="rowwise_adagrad",
               state=state, lr=0.02, eps=1e-8)
        exp_w, exp_h, _, _ = reference(exp_w, indices, offsets, grad_output=grad,
                                       optimizer="rowwise_adagrad", state=exp_h, lr=0.02,
                                       eps=1e-8)
    np.testing.assert_allclose(weight, exp_w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state, exp_h, rtol=1e-4, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# bad input: the documented exception, and nothing written
# ---------------------------------------------------------------------------------------------

def _bad_cases():
    rows, D = 10, 4
    g2 = np.ones((2, D), np.float32)
    ok = dict(indices=np.array([1, 2, 3]), offsets=np.array([0, 1]), grad_output=g2,
              optimizer="adagrad", lr=0.1)
    return [
        ("index_high", dict(indices=np.array([1, 10, 3])), IndexError, r"indices\[1\] = 10"),
        ("index_neg", dict(indices=np.array([1, 2, -1])), IndexError, r"indices\[2\] = -1"),
        ("index_last", dict(indices=np.array([1, 2, 3, 99]), offsets=np.array([0, 2])),
         IndexError, r"indices\[3\] = 99"),
        ("grad_shape", dict(grad_output=np.ones((3, D), np.float32)), ValueError, "grad_output"),
        ("grad_dtype", dict(grad_output=np.ones((2, D), np.float64)), TypeError, "grad_output"),
        ("state_shape", dict(state=np.zeros((rows, D + 1), np.float32)), ValueError, "state"),
        ("state_rowwise_shape", dict(optimizer="rowwise_adagrad",
                                     state=np.zeros((rows, D), np.float32)), ValueError, "state"),
        ("state_dtype", dict(state=np.zeros((rows, D), np.float64)), TypeError, "state"),
        ("state_missing", dict(state=None), ValueError, "needs state"),
        ("state_for_sgd", dict(optimizer="sgd", state=np.zeros((rows, D), np.float32)),
         ValueError, "sgd"),
        ("state_readonly", dict(state=readonly(np.zeros((rows, D), np.float32))), ValueError,
         "read-only"),
        ("lr_nan", dict(lr=float("nan")), ValueError, "lr = nan"),
        ("lr_inf", dict(lr=float("inf")), ValueError, "lr = inf"),
        ("lr_negative", dict(lr=-0.1), ValueError, "lr = -0.1"),
        ("eps_nan", dict(eps=float("nan")), ValueError, "eps"),
        ("wd_negative", dict(weight_decay=-1.0), ValueError, "weight_decay"),
        ("optimizer", dict(optimizer="nadam"), ValueError, "optimizer"),
        ("mode", dict(mode="max"), ValueError, "mode"),
        ("offsets", dict(offsets=np.array([1, 2])), ValueError, "offsets"),
        ("threads", dict(num_threads=0), ValueError, "num_threads"),
        # refused as by every other kernel (a bool and a huge count were once accepted here)
        ("threads_bool", dict(num_threads=True), TypeError, "num_threads"),
        ("threads_huge", dict(num_threads=2 ** 40), ValueError, "num_threads"),
        ("threads_float", dict(num_threads=1.5), TypeError, "num_threads"),
        # finite as a double but inf in the float32 arithmetic
        ("lr_past_float32", dict(lr=1e39), ValueError, "lr = 1e\\+39 is too large for float32"),
        ("wd_past_float32", dict(weight_decay=3.5e38), ValueError, "weight_decay"),
        ("weights_shape", dict(per_sample_weights=np.ones(2, np.float32)), ValueError,
         "per_sample_weights"),
    ], ok, rows, D


@pytest.mark.parametrize("name,change,exc,match", _bad_cases()[0], ids=[c[0] for c in _bad_cases()[0]])
def test_bad_input_writes_nothing(isa, name, change, exc, match):
    _, ok, rows, D = _bad_cases()
    weight = np.arange(rows * D, dtype=np.float32).reshape(rows, D)
    state = np.full((rows, D), 0.25, np.float32)
    kw = dict(ok, state=state)
    kw.update(change)
    w0 = weight.copy()
    s = kw["state"]
    s0 = None if s is None else s.copy()
    with pytest.raises(exc, match=match):
        update(weight, kw.pop("indices"), kw.pop("offsets"), **kw)
    assert np.array_equal(weight, w0)
    if s is not None:
        assert np.array_equal(s, s0)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_empty_table_with_any_strides(optimizer):
    # found by the fuzz harness: NumPy's copy of a [0, D] array has strides (0, 0), which the
    # stride check refused although nothing is read or written through them
    weight = np.zeros((0, 5), np.float32).copy()
    state = new_state(optimizer, 0, 5, None, zeros=True)
    state = None if state is None else state.copy()
    assert weight.strides == (0, 0)
    update(weight, np.zeros(0, np.int64), np.zeros(2, np.int64), grad_output=np.ones((2, 5), np.float32),
           optimizer=optimizer, state=state, lr=0.1)
    with pytest.raises(IndexError, match="indices"):
        update(weight, np.array([0]), np.array([0]), grad_output=np.ones((1, 5), np.float32),
               optimizer=optimizer, state=state, lr=0.1)


def test_bad_weight():
    g = np.ones((1, 3), np.float32)
    with pytest.raises(TypeError, match="weight"):
        update([[1.0, 2.0, 3.0]], np.array([0]), np.array([0]), grad_output=g, lr=0.1)
    with pytest.raises(TypeError, match="weight"):
        update(np.ones((2, 3), np.float64), np.array([0]), np.array([0]), grad_output=g, lr=0.1)
    with pytest.raises(ValueError, match="read-only"):
        update(readonly(np.ones((2, 3), np.float32)), np.array([0]), np.array([0]),
               grad_output=g, lr=0.1)
    with pytest.raises(ValueError, match="unit stride"):
        update(np.ones((2, 6), np.float32)[:, ::2], np.array([0]), np.array([0]), grad_output=g,
               lr=0.1)
    w = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="shares memory"):
        update(w, np.array([0]), np.array([0]), grad_output=g, optimizer="adagrad", state=w,
               lr=0.1)
