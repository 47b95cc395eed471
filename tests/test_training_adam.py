"""embedding_bag_backward_update with the Adam family ("adam", "rowwise_adam", "adamw") and sgd
with momentum / nesterov: every ISA path and table dtype against a float64 NumPy reference
written from the formulas, "adam" against torch.optim.SparseAdam over 12 steps, "adamw" against
torch.optim.AdamW and momentum against torch.optim.SGD where every row is touched every step (lazy
and dense updates then agree), determinism for any thread count, and bad input that writes
nothing."""
import ml_dtypes
import numpy as np
import pytest

import perfkernels
from perfkernels import embedding_bag_backward_update as update

from conftest import AWKWARD_DIMS, TABLE_DTYPES, readonly, unaligned
from sparse_training import bags_of, torch_sparse_bag, torch_sparse_step
from perfkernels.reference import embedding_bag_backward_adam as reference

BF16 = np.dtype(ml_dtypes.bfloat16)
#: (name, optimizer, extra options)
CASES = {
    "adam": ("adam", {}),
    "adam_l2": ("adam", {"weight_decay": 0.1}),
    "adamw": ("adamw", {"weight_decay": 0.1}),
    "rowwise_adam": ("rowwise_adam", {}),
    "rowwise_adam_wd": ("rowwise_adam", {"weight_decay": 0.1}),
    "momentum": ("sgd", {"momentum": 0.9}),
    "nesterov": ("sgd", {"momentum": 0.9, "nesterov": True, "weight_decay": 0.05}),
}
#: half an ulp, relative, of each table dtype; half its subnormal spacing
HALF_ULP = {np.dtype(np.float32): 0.0, np.dtype(np.float16): 2.0 ** -11, BF16: 2.0 ** -8}
TINY = {np.dtype(np.float32): 2.0 ** -150, np.dtype(np.float16): 2.0 ** -25, BF16: 2.0 ** -134}


def new_state(optimizer, rows, D, rng, zeros=False):
    """(m, v) for the Adam family, the momentum buffer for sgd."""
    def make(shape, lo, hi):
        return np.zeros(shape, np.float32) if zeros else rng.uniform(lo, hi, shape).astype(np.float32)
    if optimizer == "sgd":
        return make((rows, D), -0.5, 0.5)
    v_shape = (rows,) if optimizer == "rowwise_adam" else (rows, D)
    return make((rows, D), -0.5, 0.5), make(v_shape, 0.05, 1.0)


def copy_state(state):
    return tuple(s.copy() for s in state) if isinstance(state, tuple) else state.copy()


def state_parts(state):
    return state if isinstance(state, tuple) else (state,)


def check_step(weight, state, optimizer, opts, grad, indices, offsets=None, *, step=3, lr=0.05,
               eps=1e-8, rtol=2e-5, **bags):
    """One kernel step on copies against the float64 reference: the error allowed is ``rtol`` of
    the terms (old value and the step) plus the table's rounding; untouched rows and their state
    unchanged bit for bit."""
    w = weight.copy()
    s = copy_state(state)
    kw = dict(opts)
    if optimizer != "sgd":
        kw["step"] = step
    update(w, indices, offsets, grad_output=grad, optimizer=optimizer, state=s, lr=lr, eps=eps,
           **kw, **bags)
    bags.pop("num_threads", None)
    exp = reference(weight, indices, offsets, grad_output=grad, optimizer=optimizer,
                    state=state, lr=lr, eps=eps, **kw, **bags)
    w0 = weight.astype(np.float64)
    tol = (rtol * (np.abs(w0) + np.abs(exp.weight - w0) + lr)
           + HALF_ULP[weight.dtype] * np.abs(exp.weight) * 1.001 + TINY[weight.dtype])
    err = np.abs(w.astype(np.float64) - exp.weight)
    assert np.all(err <= tol), f"weight: max error {err.max()}"
    for got, want, old in zip(state_parts(s), exp.state, state_parts(state)):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * (np.abs(old).max() + 1))
        assert np.array_equal(got[~exp.touched], old[~exp.touched]), "untouched state changed"
    assert np.array_equal(w[~exp.touched].view(np.uint8), weight[~exp.touched].view(np.uint8))
    return w, s


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", TABLE_DTYPES.values(), ids=list(TABLE_DTYPES))
@pytest.mark.parametrize("D", AWKWARD_DIMS)
def test_matches_reference(isa, rng, case, dtype, D):
    optimizer, opts = CASES[case]
    rows = 40
    weight = rng.standard_normal((rows, D)).astype(dtype)
    indices, offsets = bags_of(rng, rows, 12, 9)   # many duplicates, some empty bags
    grad = rng.standard_normal((12, D)).astype(np.float32)
    check_step(weight, new_state(optimizer, rows, D, rng), optimizer, opts, grad, indices,
               offsets)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("bags", ["mean", "weighted", "positional", "padding", "lengths", "2d",
                                  "include_last", "int32", "mean_weighted_padding"])
def test_bag_options(isa, rng, case, bags):
    optimizer, opts = CASES[case]
    rows, D, B = 30, 17, 9
    weight = rng.standard_normal((rows, D)).astype(np.float32)
    indices, offsets = bags_of(rng, rows, B, 7)
    grad = rng.standard_normal((B, D)).astype(np.float32)
    kw = {}
    if "mean" in bags:
        kw["mode"] = "mean"
    if "weighted" in bags:
        kw["per_sample_weights"] = rng.standard_normal(indices.size).astype(np.float32)
    if bags == "positional":
        kw.update(per_sample_weights=rng.standard_normal(7).astype(np.float32),
                  positional_weights=True)
    if "padding" in bags:
        indices[::3] = 4
        kw["padding_idx"] = 4
    if bags == "lengths":
        kw["lengths"] = np.diff(np.concatenate([offsets, [indices.size]]))
        offsets = None
    if bags == "2d":
        indices, offsets = rng.integers(0, rows, (B, 5)), None
    if bags == "include_last":
        offsets = np.concatenate([offsets, [indices.size]])
        kw["include_last_offset"] = True
    if bags == "int32":
        indices, offsets = indices.astype(np.int32), offsets.astype(np.int32)
    check_step(weight, new_state(optimizer, rows, D, rng), optimizer, opts, grad, indices,
               offsets, **kw)


@pytest.mark.parametrize("case", CASES)
def test_readonly_unaligned_inputs(isa, rng, case):
    optimizer, opts = CASES[case]
    rows, D, B = 25, 9, 6
    weight = rng.standard_normal((rows, D)).astype(np.float32)
    indices, offsets = bags_of(rng, rows, B, 5)
    grad = rng.standard_normal((B, D)).astype(np.float32)
    psw = rng.standard_normal(indices.size).astype(np.float32)
    check_step(weight, new_state(optimizer, rows, D, rng), optimizer, opts, unaligned(grad),
               readonly(indices), readonly(offsets), per_sample_weights=unaligned(psw))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", TABLE_DTYPES.values(), ids=list(TABLE_DTYPES))
def test_thread_counts_bit_identical(isa, rng, case, dtype):
    """Any thread count, the same bits (16-bit tables with stochastic rounding included)."""
    optimizer, opts = CASES[case]
    rows, D = 20000, 64
    from perfkernels.benchsuite import zipf_indices
    indices = zipf_indices(rng, rows, 30000)
    offsets = np.concatenate([[0], np.sort(rng.integers(0, indices.size, 999))]).astype(np.int64)
    grad = rng.standard_normal((offsets.size, D)).astype(np.float32)
    weight = rng.standard_normal((rows, D)).astype(dtype)
    state = new_state(optimizer, rows, D, rng)
    kw = dict(opts, step=5) if optimizer != "sgd" else dict(opts)
    results = []
    for threads in (1, 2, 3, 8):
        w = weight.copy()
        s = copy_state(state)
        update(w, indices, offsets, grad_output=grad, optimizer=optimizer, state=s, lr=0.01,
               stochastic_rounding=dtype != np.float32, seed=3, num_threads=threads, **kw)
        results.append((w.view(np.uint8), [p.view(np.uint8) for p in state_parts(s)]))
    for w, s in results[1:]:
        assert np.array_equal(w, results[0][0])
        assert all(np.array_equal(a, b) for a, b in zip(s, results[0][1]))


def test_isas_agree(rng):
    """Every ISA level computes the same update to float32 rounding (vector paths use fma)."""
    rows, D = 300, 65
    weight = rng.standard_normal((rows, D)).astype(np.float32)
    indices, offsets = bags_of(rng, rows, 50, 20)
    grad = rng.standard_normal((50, D)).astype(np.float32)
    for optimizer, opts in CASES.values():
        state = new_state(optimizer, rows, D, rng)
        kw = dict(opts, step=2) if optimizer != "sgd" else dict(opts)
        out = []
        for isa in perfkernels.available_isas():
            with perfkernels.use_isa(isa):
                w, s = weight.copy(), copy_state(state)
                update(w, indices, offsets, grad_output=grad, optimizer=optimizer, state=s,
                       lr=0.05, **kw)
                out.append(w)
        for w in out[1:]:
            np.testing.assert_allclose(w, out[0], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# several steps: against PyTorch and the float64 reference
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["sum", "mean", "weighted", "padding", "mean_padding"])
@pytest.mark.parametrize("D", [1, 16, 63])
def test_adam_matches_sparse_adam(isa, rng, case, D):
    """12 steps of nn.EmbeddingBag(sparse=True) + torch.optim.SparseAdam (a 12-row hot set, so
    duplicates within and across steps, and rows skipped by some steps): weights and both moments
    within 1e-5."""
    torch = pytest.importorskip("torch")
    rows, B, steps, lr, betas, eps = 50, 16, 12, 0.01, (0.8, 0.95), 1e-8
    weight = rng.standard_normal((rows, D)).astype(np.float32)
    mode = "mean" if "mean" in case else "sum"
    padding_idx = 7 if "padding" in case else None
    bag = torch_sparse_bag(weight, mode, padding_idx)
    topt = torch.optim.SparseAdam(bag.parameters(), lr=lr, betas=betas, eps=eps)
    ours = weight.copy()
    m, v = np.zeros((rows, D), np.float32), np.zeros((rows, D), np.float32)
    for step in range(1, steps + 1):
        indices, offsets, psw, grad = torch_sparse_step(rng, bag, topt, B, padding_idx,
                                                        case == "weighted")
        update(ours, indices, offsets, grad_output=grad, optimizer="adam", state=(m, v), lr=lr,
               eps=eps, betas=betas, step=step, mode=mode, padding_idx=padding_idx,
               per_sample_weights=psw)
    st = topt.state[bag.weight]
    assert int(st["step"]) == steps
    np.testing.assert_allclose(ours, bag.weight.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m, st["exp_avg"].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v, st["exp_avg_sq"].numpy(), rtol=1e-5, atol=1e-7)


def _every_row_batches(rng, rows, B, steps):
    """Batches whose bags name every row at least once (lazy and dense updates then agree)."""
    for _ in range(steps):
        extra = rng.integers(0, rows, 2 * rows)
        indices = rng.permutation(np.concatenate([np.arange(rows), extra]))
        cuts = np.sort(rng.choice(np.arange(1, indices.size), B - 1, replace=False))
        yield indices, np.concatenate([[0], cuts]).astype(np.int64)


@pytest.mark.parametrize("name", ["adamw", "adam", "momentum", "nesterov"])
@pytest.mark.parametrize("D", [1, 17, 64])
def test_dense_equivalent_matches_torch(isa, rng, name, D):
    """Every row touched every step: 12 steps of torch.optim.AdamW / Adam / SGD(momentum) on the
    dense gradient equal the lazy fused update (Adam's eps sits on sqrt(v) as in SparseAdam,
    torch's dense Adam on sqrt(v / (1 - b2^t)): with eps = 1e-12 the difference is far below the
    tolerance)."""
    torch = pytest.importorskip("torch")
    rows, B, steps, lr = 30, 8, 12, 0.01
    weight = rng.standard_normal((rows, D)).astype(np.float32)
    param = torch.nn.Parameter(torch.from_numpy(weight.copy()))
    if name == "adamw":
        topt = torch.optim.AdamW([param], lr=lr, betas=(0.9, 0.99), eps=1e-12, weight_decay=0.1)
        optimizer, kw = "adamw", dict(betas=(0.9, 0.99), eps=1e-12, weight_decay=0.1)
    elif name == "adam":
        topt = torch.optim.Adam([param], lr=lr, betas=(0.9, 0.99), eps=1e-12, weight_decay=0.05)
        optimizer, kw = "adam", dict(betas=(0.9, 0.99), eps=1e-12, weight_decay=0.05)
    else:
        nesterov = name == "nesterov"
        topt = torch.optim.SGD([param], lr=lr, momentum=0.9, nesterov=nesterov, weight_decay=0.01)
        optimizer, kw = "sgd", dict(momentum=0.9, nesterov=nesterov, weight_decay=0.01)
    ours = weight.copy()
    state = (new_state(optimizer, rows, D, rng, zeros=True))
    for step, (indices, offsets) in enumerate(_every_row_batches(rng, rows, B, steps), 1):
        grad = rng.standard_normal((B, D)).astype(np.float32)
        topt.zero_grad()
        out = torch.nn.functional.embedding_bag(torch.from_numpy(indices), param,
                                                torch.from_numpy(offsets), mode="mean")
        (out * torch.from_numpy(grad)).sum().backward()
        topt.step()
        extra = {} if optimizer == "sgd" else {"step": step}
        update(ours, indices, offsets, grad_output=grad, optimizer=optimizer, state=state, lr=lr,
               mode="mean", **kw, **extra)
    np.testing.assert_allclose(ours, param.detach().numpy(), rtol=1e-5, atol=1e-5)
    if optimizer == "sgd":
        np.testing.assert_allclose(state, topt.state[param]["momentum_buffer"].numpy(),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", CASES)
def test_twelve_steps_match_reference(isa, rng, case):
    """12 lazy steps against the float64 reference applied step by step (rowwise_adam within
    1e-4), rows skipped by some steps keeping their state."""
    optimizer, opts = CASES[case]
    rows, D, B = 64, 24, 20
    weight = rng.standard_normal((rows, D)).astype(np.float32)
    state = new_state(optimizer, rows, D, rng, zeros=True)
    exp_w = weight.astype(np.float64)
    exp_s = tuple(p.astype(np.float64) for p in state_parts(state))
    for step in range(1, 13):
        indices, offsets = bags_of(rng, rows // 2, B, 8)
        grad = rng.standard_normal((B, D)).astype(np.float32)
        extra = {} if optimizer == "sgd" else {"step": step}
        update(weight, indices, offsets, grad_output=grad, optimizer=optimizer, state=state,
               lr=0.02, **opts, **extra)
        exp_w, exp_s, _ = reference(exp_w, indices, offsets, grad_output=grad,
                                    optimizer=optimizer,
                                    state=exp_s if optimizer != "sgd" else exp_s[0], lr=0.02,
                                    **opts, **extra)
    np.testing.assert_allclose(weight, exp_w, rtol=1e-4, atol=1e-4)
    for got, want in zip(state_parts(state), exp_s):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert np.array_equal(weight[rows // 2:], weight[rows // 2:])


def test_adam_hand_computed(isa):
    """One step by hand: row 1 named twice (g = 2 + 2 = 4), betas (0.5, 0.75), step 1:
    m = 0.5 * 4 = 2, v = 0.25 * 16 = 4, w -= 1 * sqrt(0.25) / 0.5 * 2 / (2 + 0) ... eps tiny."""
    weight = np.ones((3, 2), np.float32)
    m, v = np.zeros((3, 2), np.float32), np.zeros((3, 2), np.float32)
    update(weight, np.array([1, 1]), np.array([0]), grad_output=np.full((1, 2), 2.0, np.float32),
           optimizer="adam", state=(m, v), lr=1.0, eps=1e-30, betas=(0.5, 0.75), step=1)
    assert np.all(m[1] == 2.0) and np.all(v[1] == 4.0)
    assert np.allclose(weight[1], 1.0 - 1.0 * 0.5 / 0.5 * 2.0 / 2.0)
    assert np.all(weight[[0, 2]] == 1.0) and np.all(m[[0, 2]] == 0) and np.all(v[[0, 2]] == 0)


# ---------------------------------------------------------------------------------------------
# bad input: the documented exception, and nothing written
# ---------------------------------------------------------------------------------------------

ROWS, D = 10, 4


def _bad_cases():
    z = lambda *shape: np.zeros(shape, np.float32)   # noqa: E731
    return [
        ("index_high", dict(indices=np.array([1, 10, 3])), IndexError, r"indices\[1\] = 10"),
        ("index_neg", dict(indices=np.array([1, 2, -1])), IndexError, r"indices\[2\] = -1"),
        ("no_step", dict(step=None), ValueError, "needs step"),
        ("step_zero", dict(step=0), ValueError, "step = 0"),
        ("step_float", dict(step=1.5), TypeError, "step"),
        ("step_bool", dict(step=True), TypeError, "step"),
        ("beta1_one", dict(betas=(1.0, 0.9)), ValueError, r"betas\[0\] = 1.0"),
        ("beta2_neg", dict(betas=(0.9, -0.1)), ValueError, r"betas\[1\] = -0.1"),
        ("betas_shape", dict(betas=(0.9,)), TypeError, "betas"),
        ("beta_nan", dict(betas=(float("nan"), 0.9)), ValueError, "betas"),
        ("beta_huge_int", dict(betas=(0.9, 10 ** 400)), ValueError, r"betas\[1\]"),
        ("eps_zero", dict(eps=0.0), ValueError, "eps = 0"),
        ("lr_nan", dict(lr=float("nan")), ValueError, "lr = nan"),
        ("wd_negative", dict(weight_decay=-1.0), ValueError, "weight_decay"),
        ("momentum_on_adam", dict(momentum=0.9), ValueError, "momentum"),
        ("state_missing", dict(state=None), ValueError, "needs state"),
        ("state_single", dict(state=z(ROWS, D)), TypeError, "pair"),
        ("m_shape", dict(state=(z(ROWS, D + 1), z(ROWS, D))), ValueError, r"state\[0\]"),
        ("v_shape", dict(state=(z(ROWS, D), z(ROWS))), ValueError, r"state\[1\]"),
        ("rowwise_v_shape", dict(optimizer="rowwise_adam", state=(z(ROWS, D), z(ROWS, D))),
         ValueError, r"state\[1\]"),
        ("m_dtype", dict(state=(np.zeros((ROWS, D)), z(ROWS, D))), TypeError, r"state\[0\]"),
        ("v_readonly", dict(state=(z(ROWS, D), readonly(z(ROWS, D)))), ValueError, "read-only"),
        ("m_is_v", "same", ValueError, "share memory"),
        ("step_for_adagrad", dict(optimizer="adagrad", state=z(ROWS, D)), ValueError, "step"),
        ("sgd_momentum_no_state", dict(optimizer="sgd", momentum=0.9, state=None, step=None),
         ValueError, "needs state"),
        ("sgd_momentum_state_shape", dict(optimizer="sgd", momentum=0.9, state=z(ROWS), step=None),
         ValueError, "state"),
        ("nesterov_no_momentum", dict(optimizer="sgd", nesterov=True, state=None, step=None),
         ValueError, "nesterov"),
        ("momentum_negative", dict(optimizer="sgd", momentum=-0.5, state=z(ROWS, D), step=None),
         ValueError, "momentum"),
        ("optimizer", dict(optimizer="nadam"), ValueError, "optimizer"),
    ]


@pytest.mark.parametrize("name,change,exc,match", _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_bad_input_writes_nothing(isa, name, change, exc, match):
    weight = np.arange(ROWS * D, dtype=np.float32).reshape(ROWS, D)
    m, v = np.full((ROWS, D), 0.25, np.float32), np.full((ROWS, D), 0.5, np.float32)
    kw = dict(indices=np.array([1, 2, 3]), offsets=np.array([0, 1]),
              grad_output=np.ones((2, D), np.float32), optimizer="adam", lr=0.1, step=1,
              state=(m, v))
    if change == "same":
        kw["state"] = (m, m)
    else:
        kw.update(change)
    if kw.get("step") is None:
        kw.pop("step", None)
    arrays = [weight, m, v] + [a for a in state_parts(kw["state"]) if a is not None] \
        if kw["state"] is not None else [weight, m, v]
    before = [a.copy() for a in arrays]
    with pytest.raises(exc, match=match):
        update(weight, kw.pop("indices"), kw.pop("offsets"), **kw)
    for a, b in zip(arrays, before):
        assert np.array_equal(a, b)
