"""Host side of the LSTM unit kernels."""
from __future__ import annotations

import numpy as np

from ...cuda import _runtime as rt
from . import checks

FILE = "lstm.cu"
GATE_ORDERS = {"ifog": 0, "ifgo": 1}


def instantiations(full: bool = True) -> list[str]:
    return ["pk_lstm_forward", "pk_lstm_backward"]


def _state(x, name: str, shape=None):
    """A float32 [N, D] GPU input; ``shape`` None means this one defines N and D (the CPU API's
    checks and messages)."""
    g = rt.as_gpu(x, name)
    rt.check_dtype(g, name, ("float32",), "float32")
    checks.state_shape(name, tuple(g.a.shape), shape)
    return rt.contiguous(g.a)


def _params(n: int, seq_lengths, t, forget_bias, gate_order):
    """Validate the keywords shared by forward and backward as the CPU API does; returns the
    kernel arguments (seq_lengths as int64 or a null pointer, t, forget_bias, gate order)."""
    t_, fb = checks.keywords(t, forget_bias, gate_order)
    seq = np.uint64(0)
    if seq_lengths is not None:
        sg = rt.as_gpu(seq_lengths, "seq_lengths")
        rt.check_dtype(sg, "seq_lengths", ("int32", "int64"), "int32 or int64")
        checks.seq_lengths_shape(tuple(sg.a.shape), n)
        seq = rt.contiguous(sg.a.astype(np.int64, copy=False))
    return seq, np.int64(t_), np.float32(fb), np.int32(GATE_ORDERS[gate_order])


def forward(h_prev, c_prev, gates, seq_lengths, t, forget_bias, drop_states, gate_order):
    cp = rt.cupy_or_raise()
    hp = _state(h_prev, "h_prev")
    n, d = (int(s) for s in hp.shape)
    cpv = _state(c_prev, "c_prev", (n, d))
    g = _state(gates, "gates", (n, 4 * d))
    seq, t64, fb, order = _params(n, seq_lengths, t, forget_bias, gate_order)
    h = cp.empty((n, d), dtype=cp.float32)
    c = cp.empty((n, d), dtype=cp.float32)
    if n * d:
        fn = rt.kernel(FILE, "pk_lstm_forward")
        fn((rt.grid_for(n * d),), (256,),
           (hp, cpv, g, seq, t64, fb, np.int32(bool(drop_states)), order, np.int64(n), np.int64(d),
            h, c))
    return h, c


def backward(c_prev, gates, c, dh, dc, seq_lengths, t, forget_bias, drop_states, gate_order):
    cp = rt.cupy_or_raise()
    cpv = _state(c_prev, "c_prev")
    n, d = (int(s) for s in cpv.shape)
    g = _state(gates, "gates", (n, 4 * d))
    cc, dhh, dcc = (_state(a, name, (n, d)) for a, name in ((c, "c"), (dh, "dh"), (dc, "dc")))
    seq, t64, fb, order = _params(n, seq_lengths, t, forget_bias, gate_order)
    dh_prev = cp.empty((n, d), dtype=cp.float32)
    dc_prev = cp.empty((n, d), dtype=cp.float32)
    dgates = cp.empty((n, 4 * d), dtype=cp.float32)
    if n * d:
        fn = rt.kernel(FILE, "pk_lstm_backward")
        fn((rt.grid_for(n * d),), (256,),
           (cpv, g, cc, dhh, dcc, seq, t64, fb, np.int32(bool(drop_states)), order, np.int64(n),
            np.int64(d), dh_prev, dc_prev, dgates))
    return dh_prev, dc_prev, dgates
