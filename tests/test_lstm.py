"""lstm_unit / lstm_unit_backward on every ISA level, against the float64 reference
(perfkernels.reference), against torch.nn.LSTMCell and PyTorch autograd, and the accuracy of the
vectorised exp / sigmoid / tanh over a dense sweep."""
import threading

import numpy as np
import pytest

import perfkernels
from perfkernels import reference
from perfkernels.families.lstm import _lstm
from conftest import AWKWARD_DIMS, readonly, unaligned

ref_forward, ref_backward = reference.lstm_unit, reference.lstm_unit_backward


def _split(gates, gate_order):
    """The (i, f, o, g) blocks of `gates` in `gate_order` (for the PyTorch formulation below)."""
    d = gates.shape[1] // 4
    blocks = {name: gates[:, k * d:(k + 1) * d] for k, name in enumerate(gate_order)}
    return blocks["i"], blocks["f"], blocks["o"], blocks["g"]


def _valid(n, seq_lengths, t):
    if seq_lengths is None:
        return np.ones(n, bool)
    return t < np.asarray(seq_lengths, np.int64)


# ---------------------------------------------------------------------------------------------
# inputs

def make_inputs(rng, n, d, scale=3.0):
    """Gates spread over the whole useful range, with some saturating values mixed in."""
    h_prev = rng.standard_normal((n, d), dtype=np.float32)
    c_prev = (rng.standard_normal((n, d)) * 2).astype(np.float32)
    gates = (rng.standard_normal((n, 4 * d)) * scale).astype(np.float32)
    if gates.size:
        pick = rng.random(gates.shape) < 0.02
        gates[pick] = rng.choice(np.array([-100, -30, -12, 12, 30, 100], np.float32), pick.sum())
    dh = rng.standard_normal((n, d), dtype=np.float32)
    dc = rng.standard_normal((n, d), dtype=np.float32)
    return h_prev, c_prev, gates, dh, dc


def seq_for(rng, n, dtype):
    return rng.integers(0, 4, size=n).astype(dtype)


OPTION_SETS = [
    dict(),
    dict(gate_order="ifgo"),
    dict(forget_bias=1.0, gate_order="ifgo"),
    dict(seq="int32", t=1),
    dict(seq="int64", t=2, drop_states=True, forget_bias=-0.5),
    dict(seq="int64", t=0, drop_states=False, gate_order="ifgo"),
    dict(seq="int32", t=5, drop_states=True),     # t beyond every length: all rows invalid
]


def _kw(rng, n, opts):
    kw = {k: v for k, v in opts.items() if k != "seq"}
    if "seq" in opts:
        kw["seq_lengths"] = seq_for(rng, n, opts["seq"])
    return kw


def _close(actual, expected, rtol=1e-5, atol=2e-6):
    reference.assert_close(actual, expected, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------
# forward and backward against the reference

@pytest.mark.parametrize("d", AWKWARD_DIMS)
def test_forward_matches_reference(isa, rng, d):
    n = 3 if d < 1000 else 2
    h_prev, c_prev, gates, _, _ = make_inputs(rng, n, d)
    for opts in OPTION_SETS:
        kw = _kw(rng, n, opts)
        h, c = perfkernels.lstm_unit(h_prev, c_prev, gates, **kw)
        assert h.dtype == np.float32 and h.shape == (n, d) and c.shape == (n, d)
        rh, rc = ref_forward(h_prev, c_prev, gates, **kw)
        _close(c, rc), _close(h, rh)
        assert np.isfinite(h).all() and np.isfinite(c).all()


@pytest.mark.parametrize("d", AWKWARD_DIMS)
def test_backward_matches_reference(isa, rng, d):
    n = 3 if d < 1000 else 2
    h_prev, c_prev, gates, dh, dc = make_inputs(rng, n, d)
    for opts in OPTION_SETS:
        kw = _kw(rng, n, opts)
        _, c = perfkernels.lstm_unit(h_prev, c_prev, gates, **kw)
        dh_prev, dc_prev, dgates = perfkernels.lstm_unit_backward(c_prev, gates, c, dh, dc, **kw)
        assert dgates.shape == (n, 4 * d) and dh_prev.shape == dc_prev.shape == (n, d)
        r = ref_backward(c_prev, gates, c, dh, dc, **kw)
        for got, want in zip((dh_prev, dc_prev, dgates), r):
            _close(got, want)


@pytest.mark.parametrize("n", [0, 1])
def test_tiny_batches(isa, rng, n):
    for d in (1, 17):
        h_prev, c_prev, gates, dh, dc = make_inputs(rng, n, d)
        for kw in (dict(), dict(seq_lengths=np.ones(n, np.int32), t=0)):
            h, c = perfkernels.lstm_unit(h_prev, c_prev, gates, **kw)
            rh, rc = ref_forward(h_prev, c_prev, gates, **kw)
            _close(h, rh), _close(c, rc)
            out = perfkernels.lstm_unit_backward(c_prev, gates, c, dh, dc, **kw)
            for got, want in zip(out, ref_backward(c_prev, gates, c, dh, dc, **kw)):
                assert got.shape == want.shape
                _close(got, want)


def test_zero_width(isa):
    h, c = perfkernels.lstm_unit(np.zeros((4, 0), np.float32), np.zeros((4, 0), np.float32),
                                 np.zeros((4, 0), np.float32))
    assert h.shape == c.shape == (4, 0)


def test_invalid_rows_exact(isa, rng):
    """Invalid rows are copies (or zeros), bit for bit; valid rows get dh_prev exactly 0."""
    n, d = 6, 33
    h_prev, c_prev, gates, dh, dc = make_inputs(rng, n, d)
    lens = np.array([0, 1, 2, 3, 0, 5], np.int64)
    h, c = perfkernels.lstm_unit(h_prev, c_prev, gates, seq_lengths=lens, t=1)
    bad = lens <= 1
    assert np.array_equal(h[bad], h_prev[bad]) and np.array_equal(c[bad], c_prev[bad])
    dh_prev, dc_prev, dg = perfkernels.lstm_unit_backward(c_prev, gates, c, dh, dc, seq_lengths=lens, t=1)
    assert np.array_equal(dh_prev[bad], dh[bad]) and np.array_equal(dc_prev[bad], dc[bad])
    assert not dg[bad].any() and not dh_prev[~bad].any()
    h, c = perfkernels.lstm_unit(h_prev, c_prev, gates, seq_lengths=lens, t=1, drop_states=True)
    assert not h[bad].any() and not c[bad].any()


@pytest.mark.parametrize("dtype", [np.intc, np.int_, np.longlong, np.int32, np.int64])
def test_seq_lengths_of_every_4_and_8_byte_integer_type(isa, rng, dtype):
    """Regression (found by fuzzing): np.longlong arrays, int64 but a different NumPy type number
    than np.int64 on Linux, were refused with "must have dtype int32 or int64; got int64"."""
    n, d = 6, 9
    h_prev, c_prev, gates, dh, dc = make_inputs(rng, n, d)
    lens = np.array([0, 1, 2, 3, 0, 5], dtype)
    h, c = perfkernels.lstm_unit(h_prev, c_prev, gates, seq_lengths=lens, t=1)
    want_h, want_c = ref_forward(h_prev, c_prev, gates, seq_lengths=lens, t=1)
    reference.assert_close(h, want_h, atol=2e-6)
    reference.assert_close(c, want_c, atol=2e-6)


def test_isa_paths_agree(rng):
    h_prev, c_prev, gates, dh, dc = make_inputs(rng, 8, 129)
    results = {}
    for isa in perfkernels.available_isas():
        with perfkernels.use_isa(isa):
            h, c = perfkernels.lstm_unit(h_prev, c_prev, gates)
            results[isa] = (h, c) + perfkernels.lstm_unit_backward(c_prev, gates, c, dh, dc)
    base = results["scalar"]
    for isa, res in results.items():
        for a, b in zip(res, base):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=isa)


# ---------------------------------------------------------------------------------------------
# PyTorch: LSTMCell (gate_order="ifgo") and autograd through the same pointwise function

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")


def torch_pointwise(h_prev, c_prev, gates, valid, forget_bias, drop_states, gate_order):
    i, f, o, g = _split(gates, gate_order)
    i, f, o, g = torch.sigmoid(i), torch.sigmoid(f + forget_bias), torch.sigmoid(o), torch.tanh(g)
    c = f * c_prev + i * g
    h = o * torch.tanh(c)
    v = valid[:, None]
    if drop_states:
        return torch.where(v, h, torch.zeros_like(h)), torch.where(v, c, torch.zeros_like(c))
    return torch.where(v, h, h_prev), torch.where(v, c, c_prev)


@needs_torch
@pytest.mark.parametrize("d", [1, 16, 65, 1000])
def test_matches_torch_lstmcell(isa, rng, d):
    n = 5
    h_prev, c_prev, gates, _, _ = make_inputs(rng, n, d, scale=2.0)
    cell = torch.nn.LSTMCell(4 * d, d)
    with torch.no_grad():
        cell.weight_ih.copy_(torch.eye(4 * d))   # the cell's gates are exactly our `gates`
        cell.weight_hh.zero_(), cell.bias_ih.zero_(), cell.bias_hh.zero_()
        th, tc = cell(torch.from_numpy(gates), (torch.from_numpy(h_prev), torch.from_numpy(c_prev)))
    h, c = perfkernels.lstm_unit(h_prev, c_prev, gates, gate_order="ifgo")
    np.testing.assert_allclose(h, th.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c, tc.numpy(), rtol=1e-5, atol=1e-5)


@needs_torch
@pytest.mark.parametrize("d", [7, 64, 129])
@pytest.mark.parametrize("opts", OPTION_SETS[:6],
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_backward_matches_torch_autograd(isa, rng, d, opts):
    n = 6
    h_prev, c_prev, gates, dh, dc = make_inputs(rng, n, d, scale=2.0)
    kw = _kw(rng, n, opts)
    valid = torch.from_numpy(_valid(n, kw.get("seq_lengths"), kw.get("t", 0)))
    th, tc, tg = (torch.from_numpy(a.copy()).requires_grad_() for a in (h_prev, c_prev, gates))
    oh, oc = torch_pointwise(th, tc, tg, valid, np.float32(kw.get("forget_bias", 0.0)).item(),
                             kw.get("drop_states", False), kw.get("gate_order", "ifog"))
    torch.autograd.backward((oh, oc), (torch.from_numpy(dh), torch.from_numpy(dc)))
    _, c = perfkernels.lstm_unit(h_prev, c_prev, gates, **kw)
    np.testing.assert_allclose(c, oc.detach().numpy(), rtol=1e-5, atol=1e-6)
    dh_prev, dc_prev, dgates = perfkernels.lstm_unit_backward(c_prev, gates, c, dh, dc, **kw)
    # relative 1e-5; the absolute floor covers products with (1 - sigmoid) near saturation, where
    # one ulp of difference in sigmoid is a large relative change of a value below 1e-6
    for ours, theirs in ((dh_prev, th.grad), (dc_prev, tc.grad), (dgates, tg.grad)):
        theirs = np.zeros_like(ours) if theirs is None else theirs.numpy()  # unused: no gradient
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# the vectorised elementwise functions

#: Bounds on the relative errors against float64 documented for the vectorised functions (the
#: docstring of perfkernels.lstm_unit, docs/semantics.md), where the exact result is a normal float32.
MAX_REL = {"exp": 2.5e-7, "sigmoid": 3e-7, "tanh": 3e-7}

EXTREMES = np.array([0.0, -0.0, 1e-45, -1e-45, 1e-30, -1e-30, 1e-8, -1e-8, 0.625, -0.625,
                     9.0, -9.0, 17.0, -17.0, 87.0, -87.0, 88.0, -88.0, 88.72, 88.73, -103.0, -104.0,
                     -110.0, 1e30, -1e30, 3.4e38, -3.4e38, np.inf, -np.inf], np.float32)


def _sweep():
    dense = np.linspace(-30, 30, 2_000_001, dtype=np.float32)
    tiny = np.logspace(-40, 1.5, 20_001).astype(np.float32)
    return np.concatenate([dense, tiny, -tiny, EXTREMES])


REFERENCE = {"exp": np.exp, "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "tanh": np.tanh}


@pytest.mark.parametrize("fn", ["exp", "sigmoid", "tanh"])
def test_elementwise_accuracy(isa, fn):
    x = _sweep()
    with np.errstate(over="ignore"):
        want = REFERENCE[fn](x.astype(np.float64))
    got = _lstm._math(fn, x).astype(np.float64)
    assert not np.isnan(got).any(), "NaN for a non-NaN input"
    fi = np.finfo(np.float32)
    normal = (np.abs(want) >= fi.tiny) & (np.abs(want) <= fi.max)
    rel = np.abs(got[normal] - want[normal]) / np.abs(want[normal])
    worst = x[normal][rel.argmax()]
    assert rel.max() <= MAX_REL[fn], f"{fn} max relative error {rel.max():.3g} at x={worst}"
    # outside the normal range the error is absolute and below the smallest normal
    assert np.all(np.abs(got[~normal & (want < 1)] - want[~normal & (want < 1)]) < fi.tiny)


def test_elementwise_special_values(isa):
    x = np.array([np.inf, -np.inf, 100.0, -100.0, 1e30, -1e30, 30.0, -30.0, 10.0, -10.0, 0.0, -0.0,
                  np.nan], np.float32)
    e, s, t = (_lstm._math(fn, x) for fn in ("exp", "sigmoid", "tanh"))
    assert e[0] == np.inf and e[1] == 0 and e[2] == np.inf and 0 < e[3] < 1e-43 and e[10] == 1.0
    assert e[5] == 0 and e[4] == np.inf
    assert list(s[:7]) == [1, 0, 1, 0, 1, 0, 1] and s[10] == 0.5    # saturate exactly
    assert list(t[:10]) == [1, -1, 1, -1, 1, -1, 1, -1, 1, -1]
    assert t[10] == 0 and not np.signbit(t[10]) and t[11] == 0 and np.signbit(t[11])
    assert np.isnan(e[-1]) and np.isnan(s[-1]) and np.isnan(t[-1])
    tiny = np.array([1e-45, 1e-38, 1e-20, 1e-7], np.float32)
    np.testing.assert_allclose(_lstm._math("tanh", tiny), tiny, rtol=2e-7, atol=0)  # relative near 0


def test_elementwise_odd_and_monotone(isa):
    x = np.linspace(0, 20, 200_001, dtype=np.float32)
    t = _lstm._math("tanh", x)
    assert np.array_equal(_lstm._math("tanh", -x), -t)
    assert np.all(np.diff(t) >= 0) and np.all(np.diff(_lstm._math("sigmoid", x)) >= 0)


# ---------------------------------------------------------------------------------------------
# arguments, out=, awkward arrays, threads

def test_out_written_in_place(isa, rng):
    h_prev, c_prev, gates, dh, dc = make_inputs(rng, 4, 9)
    h_out, c_out = np.empty_like(h_prev), np.empty_like(c_prev)
    h, c = perfkernels.lstm_unit(h_prev, c_prev, gates, out=(h_out, c_out))
    assert h is h_out and c is c_out
    rh, rc = ref_forward(h_prev, c_prev, gates)
    _close(h_out, rh), _close(c_out, rc)
    h2, c2 = perfkernels.lstm_unit(h_prev, c_prev, gates, out=(None, c_out))
    assert c2 is c_out and np.array_equal(h2, h_out)
    outs = (np.empty_like(dh), np.empty_like(dc), np.empty_like(gates))
    res = perfkernels.lstm_unit_backward(c_prev, gates, c, dh, dc, out=outs)
    assert all(a is b for a, b in zip(res, outs))
    for got, want in zip(res, ref_backward(c_prev, gates, c, dh, dc)):
        _close(got, want)


def test_out_aliasing_inputs_and_noncontiguous(isa, rng):
    """out= may be an input (the state updated in place) or a strided view: same results."""
    h_prev, c_prev, gates, _, _ = make_inputs(rng, 5, 17)
    rh, rc = ref_forward(h_prev, c_prev, gates)
    h, c = h_prev.copy(), c_prev.copy()
    perfkernels.lstm_unit(h, c, gates, out=(h, c))
    _close(h, rh), _close(c, rc)
    big = np.zeros((5, 34), np.float32)
    hv = big[:, ::2]
    perfkernels.lstm_unit(h_prev, c_prev, gates, out=(hv, None))
    _close(hv, rh)
    assert not big[:, 1::2].any()


def test_awkward_inputs(isa, rng):
    h_prev, c_prev, gates, dh, dc = make_inputs(rng, 7, 65)
    rh, rc = ref_forward(h_prev, c_prev, gates)
    wide = np.zeros((7, 8 * 65), np.float32)
    wide[:, ::2] = gates
    for args in ((readonly(h_prev), readonly(c_prev), readonly(gates)),
                 (unaligned(h_prev), unaligned(c_prev), unaligned(gates)),
                 (np.asfortranarray(h_prev), c_prev.astype(">f4"), wide[:, ::2])):
        h, c = perfkernels.lstm_unit(*args)
        _close(h, rh), _close(c, rc)
    c32 = rc.astype(np.float32)
    res = perfkernels.lstm_unit_backward(unaligned(c_prev), readonly(gates), np.asfortranarray(c32),
                                         dh[::-1][::-1], readonly(dc))
    for got, want in zip(res, ref_backward(c_prev, gates, rc.astype(np.float32), dh, dc)):
        _close(got, want)


def test_errors_and_out_untouched(rng):
    h_prev, c_prev, gates, dh, dc = make_inputs(rng, 3, 4)
    h_out, c_out = np.full_like(h_prev, 7.0), np.full_like(c_prev, 7.0)
    bad_calls = [
        (TypeError, "h_prev must have dtype float32", dict(h_prev=h_prev.astype(np.float64))),
        (TypeError, "gates must have dtype float32", dict(gates=gates.astype(np.float16))),
        (ValueError, "h_prev must be 2-D", dict(h_prev=h_prev[0])),
        (ValueError, r"c_prev has shape \(3, 5\); expected \(3, 4\)",
         dict(c_prev=np.zeros((3, 5), np.float32))),
        (ValueError, r"gates has shape \(3, 12\); expected \(3, 16\)", dict(gates=gates[:, :12])),
        (TypeError, "seq_lengths must have dtype int32 or int64",
         dict(seq_lengths=np.ones(3, np.float32))),
        (ValueError, r"seq_lengths must have shape \(3,\)", dict(seq_lengths=np.ones(4, np.int32))),
        (ValueError, "t must be >= 0", dict(t=-1)),
        (TypeError, "t must be an integer", dict(t=1.5)),
        (TypeError, "forget_bias must be a real number", dict(forget_bias="x")),
        (ValueError, "gate_order must be 'ifog'", dict(gate_order="iofg")),
        (TypeError, r"out\[1\] \(c\) must have dtype float32",
         dict(out=(h_out, c_out.astype(np.float64)))),
        (ValueError, r"out\[0\] \(h\) has shape", dict(out=(h_out[:2], c_out))),
        (TypeError, "out must be a tuple of 2 arrays", dict(out=h_out)),
        (ValueError, "overlap", dict(out=(h_out, h_out))),
    ]
    for exc, msg, change in bad_calls:
        args = dict(h_prev=h_prev, c_prev=c_prev, gates=gates, out=(h_out, c_out))
        args.update(change)
        pos = [args.pop(k) for k in ("h_prev", "c_prev", "gates")]
        with pytest.raises(exc, match=msg):
            perfkernels.lstm_unit(*pos, **args)
        assert (h_out == 7).all() and (c_out == 7).all(), f"out written despite {msg}"
    with pytest.raises(ValueError, match=r"dh has shape"):
        perfkernels.lstm_unit_backward(c_prev, gates, c_prev, dh[:, :2], dc)
    with pytest.raises(TypeError, match="dc must have dtype float32"):
        perfkernels.lstm_unit_backward(c_prev, gates, c_prev, dh, dc.astype(np.int32))
    with pytest.raises(ValueError, match="gate_order"):
        perfkernels.lstm_unit_backward(c_prev, gates, c_prev, dh, dc, gate_order="IFOG")


def test_many_threads(isa, rng):
    h_prev, c_prev, gates, dh, dc = make_inputs(rng, 64, 257)
    rh, rc = ref_forward(h_prev, c_prev, gates, forget_bias=1.0)
    errors = []

    def work():
        try:
            for _ in range(5):
                h, c = perfkernels.lstm_unit(h_prev, c_prev, gates, forget_bias=1.0)
                _close(h, rh), _close(c, rc)
                perfkernels.lstm_unit_backward(c_prev, gates, c, dh, dc, forget_bias=1.0)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[0]


def test_backward_out_errors_leave_out_untouched(rng):
    h_prev, c_prev, gates, dh, dc = make_inputs(rng, 3, 5)
    outs = (np.full_like(dh, 7.0), np.full_like(dc, 7.0), np.full_like(gates, 7.0))
    for exc, msg, kw in [
        (ValueError, r"out\[2\] \(dgates\) has shape", dict(out=(outs[0], outs[1], outs[2][:, :4]))),
        (ValueError, r"seq_lengths must have shape", dict(out=outs, seq_lengths=[1, 2])),
        (ValueError, "t must be >= 0", dict(out=outs, t=-3)),
        (ValueError, r"out\[2\] \(dgates\) is read-only",
         dict(out=(outs[0], outs[1], readonly(outs[2])))),
        (TypeError, "out must be a tuple of 3 arrays", dict(out=outs[:2])),
    ]:
        with pytest.raises(exc, match=msg):
            perfkernels.lstm_unit_backward(c_prev, gates, c_prev, dh, dc, **kw)
        assert all((o == 7).all() for o in outs), msg


def test_seq_lengths_forms(isa, rng):
    """Lists, strided and read-only seq_lengths, and t far beyond int32, all mean the same rows."""
    n, d = 6, 9
    h_prev, c_prev, gates, _, _ = make_inputs(rng, n, d)
    lens = np.array([0, 3, 1, 5, 2, 4], np.int64)
    want = ref_forward(h_prev, c_prev, gates, seq_lengths=lens, t=2)
    strided = np.zeros(2 * n, np.int32)
    strided[::2] = lens
    for form in (lens.tolist(), strided[::2], readonly(lens.astype(np.int32)), unaligned(lens)):
        for got, ref in zip(perfkernels.lstm_unit(h_prev, c_prev, gates, seq_lengths=form, t=2), want):
            _close(got, ref)
    h, c = perfkernels.lstm_unit(h_prev, c_prev, gates, seq_lengths=lens, t=np.int64(1) << 40)
    assert np.array_equal(h, h_prev) and np.array_equal(c, c_prev)
