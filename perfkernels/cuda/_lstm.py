"""Host side of the LSTM unit kernels."""
from __future__ import annotations

import numpy as np

from . import _runtime as rt

FILE = "lstm.cu"
GATE_ORDERS = {"ifog": 0, "ifgo": 1}


def instantiations(full: bool = True) -> list[str]:
    return ["pk_lstm_forward", "pk_lstm_backward"]


def _f32(x, name: str, shape=None):
    g = rt.as_gpu(x, name)
    rt.check_dtype(g, name, ("float32",), "float32")
    if g.a.ndim != 2:
        raise ValueError(f"{name} must be 2-D; got shape {tuple(g.a.shape)}")
    if shape is not None and tuple(g.a.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(g.a.shape)}; expected {shape}")
    return rt.contiguous(g.a)


def _common(gates, n_rows_from, seq_lengths, t, gate_order):
    if gate_order not in GATE_ORDERS:
        raise ValueError(f"gate_order must be 'ifog' (caffe2) or 'ifgo' (PyTorch); got {gate_order!r}")
    n, d = (int(s) for s in n_rows_from.shape)
    g = _f32(gates, "gates")
    if tuple(g.shape) != (n, 4 * d):
        raise ValueError(f"gates has shape {tuple(g.shape)}; expected (N, 4*D) = {(n, 4 * d)}")
    seq = None
    if seq_lengths is not None:
        sg = rt.as_gpu(seq_lengths, "seq_lengths")
        rt.check_dtype(sg, "seq_lengths", ("int32", "int64"), "int32 or int64")
        if tuple(sg.a.shape) != (n,):
            raise ValueError(f"seq_lengths has shape {tuple(sg.a.shape)}; expected ({n},)")
        seq = rt.contiguous(sg.a.astype(np.int64, copy=False))
    return n, d, g, seq, np.int64(int(t)), np.int32(GATE_ORDERS[gate_order])


def forward(h_prev, c_prev, gates, seq_lengths, t, forget_bias, drop_states, gate_order):
    cp = rt.cupy_or_raise()
    hp = _f32(h_prev, "h_prev")
    cpv = _f32(c_prev, "c_prev", tuple(hp.shape))
    n, d, g, seq, t64, order = _common(gates, hp, seq_lengths, t, gate_order)
    h = cp.empty((n, d), dtype=cp.float32)
    c = cp.empty((n, d), dtype=cp.float32)
    if n * d:
        fn = rt.kernel(FILE, "pk_lstm_forward")
        fn((rt.grid_for(n * d),), (256,),
           (hp, cpv, g, seq if seq is not None else np.uint64(0), t64, np.float32(forget_bias),
            np.int32(bool(drop_states)), order, np.int64(n), np.int64(d), h, c))
    return h, c


def backward(c_prev, gates, c, dh, dc, seq_lengths, t, forget_bias, drop_states, gate_order):
    cp = rt.cupy_or_raise()
    cpv = _f32(c_prev, "c_prev")
    shape = tuple(cpv.shape)
    cc, dhh, dcc = _f32(c, "c", shape), _f32(dh, "dh", shape), _f32(dc, "dc", shape)
    n, d, g, seq, t64, order = _common(gates, cpv, seq_lengths, t, gate_order)
    dh_prev = cp.empty((n, d), dtype=cp.float32)
    dc_prev = cp.empty((n, d), dtype=cp.float32)
    dgates = cp.empty((n, 4 * d), dtype=cp.float32)
    if n * d:
        fn = rt.kernel(FILE, "pk_lstm_backward")
        fn((rt.grid_for(n * d),), (256,),
           (cpv, g, cc, dhh, dcc, seq if seq is not None else np.uint64(0), t64,
            np.float32(forget_bias), np.int32(bool(drop_states)), order, np.int64(n), np.int64(d),
            dh_prev, dc_prev, dgates))
    return dh_prev, dc_prev, dgates
