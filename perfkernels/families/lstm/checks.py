"""The argument checks of the LSTM unit that do not depend on the array library: written once for
the NumPy frontend (``_lstm.pyx``) and the CUDA frontend (``_cuda.py``), so both raise the same
exception with the same message."""
from __future__ import annotations

import operator

from ..._variants import GATE_ORDERS

#: the largest t passed on: every int64 length is below it, so "t >= length" stays exact
T_MAX = (1 << 63) - 1


def keywords(t, forget_bias, gate_order) -> tuple[int, float]:
    """``(t, forget_bias)`` checked, ``t`` clamped to int64 (every int64 length is below
    ``2**63 - 1``, so ``t >= length`` stays exact); ValueError / TypeError naming the argument."""
    if not isinstance(gate_order, str) or gate_order not in GATE_ORDERS:
        raise ValueError(f"gate_order must be 'ifog' (caffe2) or 'ifgo' (PyTorch LSTMCell); "
                         f"got {gate_order!r}")
    if type(t) is int:  # the common case, without the general checks' cost
        t_ = t
    elif isinstance(t, bool):
        raise TypeError("t must be an integer; got bool")
    else:
        try:
            t_ = operator.index(t)
        except TypeError:
            raise TypeError(f"t must be an integer; got {type(t).__name__}") from None
    if t_ < 0:
        raise ValueError(f"t must be >= 0; got {t_}")
    if type(forget_bias) is float:
        fb = forget_bias
    else:
        if isinstance(forget_bias, (str, bytes)):
            raise TypeError(f"forget_bias must be a real number; got {type(forget_bias).__name__}")
        try:
            fb = float(forget_bias)
        except OverflowError:   # an int past double's range (10**400)
            raise ValueError(f"forget_bias = {forget_bias} is out of float32's range") from None
        except (TypeError, ValueError):
            raise TypeError(f"forget_bias must be a real number; got {type(forget_bias).__name__}") from None
    return min(t_, T_MAX), fb


def state_shape(name: str, shape: tuple, expected: tuple | None) -> None:
    """A float32 state's shape: 2-D ``[N, D]`` when it defines N and D (``expected`` None), else
    exactly ``expected``."""
    if expected is None:
        if len(shape) != 2:
            raise ValueError(f"{name} must be 2-D [N, D]; got shape {shape}")
    elif shape != expected:
        raise ValueError(f"{name} has shape {shape}; expected {expected}")


def seq_lengths_shape(shape: tuple, n: int) -> None:
    if len(shape) != 1 or shape[0] != n:
        raise ValueError(f"seq_lengths must have shape ({n},) (one length per row); got {shape}")
