"""The float64 NumPy reference of the lstm family (caffe2 LSTMUnit / LSTMUnitGradient).  See
perfkernels/reference.py."""
from __future__ import annotations

import numpy as np

__all__ = ["GATE_ORDERS", "lstm_unit", "lstm_unit_backward"]


GATE_ORDERS = ("ifog", "ifgo")


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _activations(gates, forget_bias, gate_order):
    """(i, f, o, g) in float64: sigmoid of the input/forget/output blocks, tanh of the candidate."""
    if gate_order not in GATE_ORDERS:
        raise ValueError(f"gate_order must be one of {GATE_ORDERS}; got {gate_order!r}")
    gates = np.asarray(gates, dtype=np.float64)
    d = gates.shape[1] // 4
    block = {name: gates[:, k * d:(k + 1) * d] for k, name in enumerate(gate_order)}
    fb = float(np.float32(forget_bias))           # the kernels take forget_bias as float32
    return (_sigmoid(block["i"]), _sigmoid(block["f"] + fb), _sigmoid(block["o"]),
            np.tanh(block["g"]))


def _valid_rows(n: int, seq_lengths, t: int) -> np.ndarray:
    if seq_lengths is None:
        return np.ones((n, 1), bool)
    return (int(t) < np.asarray(seq_lengths, dtype=np.int64).reshape(-1))[:, None]


def lstm_unit(h_prev, c_prev, gates, *, seq_lengths=None, t: int = 0, forget_bias: float = 0.0,
              drop_states: bool = False, gate_order: str = "ifog") -> tuple[np.ndarray, np.ndarray]:
    """``(h, c)`` in float64.

    Gate blocks of ``gates [N, 4D]`` in ``gate_order`` (caffe2 ``"ifog"``, PyTorch LSTMCell
    ``"ifgo"``): ``i, f, o = sigmoid(X_i), sigmoid(X_f + forget_bias), sigmoid(X_o)``,
    ``g = tanh(X_g)``, ``c = f * c_prev + i * g``, ``h = o * tanh(c)`` for valid rows (``t <
    seq_lengths[n]``, or every row without ``seq_lengths``); invalid rows carry ``h_prev, c_prev``
    through, or are zeros with ``drop_states``.
    """
    h_prev, c_prev = (np.asarray(a, dtype=np.float64) for a in (h_prev, c_prev))
    i, f, o, g = _activations(gates, forget_bias, gate_order)
    c = f * c_prev + i * g
    h = o * np.tanh(c)
    valid = _valid_rows(len(h_prev), seq_lengths, t)
    keep_h, keep_c = (np.zeros_like(h), np.zeros_like(c)) if drop_states else (h_prev, c_prev)
    return np.where(valid, h, keep_h), np.where(valid, c, keep_c)


def lstm_unit_backward(c_prev, gates, c, dh, dc, *, seq_lengths=None, t: int = 0,
                       forget_bias: float = 0.0, drop_states: bool = False,
                       gate_order: str = "ifog") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dh_prev, dc_prev, dgates)`` in float64, caffe2's LSTMUnitGradient.

    Valid rows: ``tc = tanh(c)``, ``dct = dc + dh * o * (1 - tc^2)``, ``dc_prev = dct * f``,
    ``dh_prev = 0`` (h_prev's gradient flows through the gates' FC layer), and ``dgates`` in
    ``gate_order``: ``di = dct * g * i(1-i)``, ``df = dct * c_prev * f(1-f)``,
    ``do = dh * tc * o(1-o)``, ``dg = dct * i * (1-g^2)``.  Invalid rows: ``dgates = 0`` and
    ``(dh_prev, dc_prev) = (dh, dc)``, or zeros with ``drop_states``.
    """
    c_prev, c, dh, dc = (np.asarray(a, dtype=np.float64) for a in (c_prev, c, dh, dc))
    i, f, o, g = _activations(gates, forget_bias, gate_order)
    tc = np.tanh(c)
    dct = dc + dh * o * (1 - tc * tc)
    grads = {"i": dct * g * i * (1 - i), "f": dct * c_prev * f * (1 - f),
             "o": dh * tc * o * (1 - o), "g": dct * i * (1 - g * g)}
    dgates = np.concatenate([grads[name] for name in gate_order], axis=1)
    valid = _valid_rows(len(c_prev), seq_lengths, t)
    zeros = np.zeros_like(dh)
    keep_dh, keep_dc = (zeros, zeros) if drop_states else (dh, dc)
    return (np.where(valid, zeros, keep_dh), np.where(valid, dct * f, keep_dc),
            np.where(valid, dgates, 0.0))
