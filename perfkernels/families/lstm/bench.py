"""Benchmark cases for the LSTM unit (N 256 x D 1024 and N 64 x D 256), forward and
backward, beside the same pointwise math written with NumPy and with PyTorch eager ops.

The baselines are what a user would otherwise write: one array operation per term (caffe2 gate
order i, f, o, g; every row valid).  ``ours`` returns h (forward) or dgates (backward) first so that
``python -m perfkernels check`` compares the interesting output with the NumPy baseline's.
"""
from __future__ import annotations

import numpy as np

import perfkernels as pk

from ..._variants import LSTM_SHAPES, QUICK_LSTM_SHAPES
from ...benchsuite import Case, torch_or_none


def make_inputs(n: int, d: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 inputs (never zeros); c is the forward output, as backward needs it."""
    rng = np.random.default_rng(seed)
    x = {
        "h_prev": rng.standard_normal((n, d), dtype=np.float32),
        "c_prev": rng.standard_normal((n, d), dtype=np.float32),
        "gates": rng.standard_normal((n, 4 * d), dtype=np.float32) * 2,
        "dh": rng.standard_normal((n, d), dtype=np.float32),
        "dc": rng.standard_normal((n, d), dtype=np.float32),
    }
    x["c"] = pk.lstm_unit(x["h_prev"], x["c_prev"], x["gates"])[1]
    return x


def numpy_forward(c_prev, gates):
    d = c_prev.shape[1]
    i = 1 / (1 + np.exp(-gates[:, :d]))
    f = 1 / (1 + np.exp(-gates[:, d:2 * d]))
    o = 1 / (1 + np.exp(-gates[:, 2 * d:3 * d]))
    g = np.tanh(gates[:, 3 * d:])
    c = f * c_prev + i * g
    return o * np.tanh(c), c


def numpy_backward(c_prev, gates, c, dh, dc):
    d = c_prev.shape[1]
    i = 1 / (1 + np.exp(-gates[:, :d]))
    f = 1 / (1 + np.exp(-gates[:, d:2 * d]))
    o = 1 / (1 + np.exp(-gates[:, 2 * d:3 * d]))
    g = np.tanh(gates[:, 3 * d:])
    tc = np.tanh(c)
    dct = dc + dh * o * (1 - tc * tc)
    dgates = np.concatenate([dct * g * i * (1 - i), dct * c_prev * f * (1 - f),
                             dh * tc * o * (1 - o), dct * i * (1 - g * g)], axis=1)
    return dgates, np.zeros_like(dh), dct * f


def torch_forward(torch, c_prev, gates):
    xi, xf, xo, xg = gates.chunk(4, 1)
    c = torch.sigmoid(xf) * c_prev + torch.sigmoid(xi) * torch.tanh(xg)
    return torch.sigmoid(xo) * torch.tanh(c), c


def torch_backward(torch, c_prev, gates, c, dh, dc):
    xi, xf, xo, xg = gates.chunk(4, 1)
    i, f, o, g = torch.sigmoid(xi), torch.sigmoid(xf), torch.sigmoid(xo), torch.tanh(xg)
    tc = torch.tanh(c)
    dct = dc + dh * o * (1 - tc * tc)
    dgates = torch.cat([dct * g * i * (1 - i), dct * c_prev * f * (1 - f),
                        dh * tc * o * (1 - o), dct * i * (1 - g * g)], 1)
    return dgates, torch.zeros_like(dh), dct * f


def cases(quick: bool) -> list[Case]:
    torch = torch_or_none()
    out = []
    for label, (n, d) in (QUICK_LSTM_SHAPES if quick else LSTM_SHAPES).items():
        x = make_inputs(n, d)
        cp, gx, c, dh, dc = x["c_prev"], x["gates"], x["c"], x["dh"], x["dc"]
        fwd_base = {"numpy": lambda cp=cp, gx=gx: numpy_forward(cp, gx)[0]}
        bwd_base = {"numpy": lambda a=(cp, gx, c, dh, dc): numpy_backward(*a)[0]}
        if torch is not None:
            t = {k: torch.from_numpy(v) for k, v in x.items()}
            fwd_base["torch"] = lambda t=t: torch_forward(torch, t["c_prev"], t["gates"])
            bwd_base["torch"] = lambda t=t: torch_backward(torch, t["c_prev"], t["gates"], t["c"],
                                                           t["dh"], t["dc"])
        out.append(Case("lstm", f"lstm_unit {label}", 7 * n * d * 4,
                        lambda x=x: pk.lstm_unit(x["h_prev"], x["c_prev"], x["gates"]), fwd_base,
                        scaling=n * d >= 1 << 18))

        def ours_backward(cp=cp, gx=gx, c=c, dh=dh, dc=dc):
            dh_prev, dc_prev, dgates = pk.lstm_unit_backward(cp, gx, c, dh, dc)
            return dgates, dh_prev, dc_prev

        out.append(Case("lstm", f"lstm_unit_backward {label}", 14 * n * d * 4, ours_backward,
                        bwd_base))
    return out
