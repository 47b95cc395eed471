"""The NumPy reference of the convert family: fp16 / bf16 conversion, bit-exact with NumPy's and
ml_dtypes' casts.  See perfkernels/reference.py.

float16 NaNs follow NumPy's own conversion (npy_floatbits_to_halfbits / npy_halfbits_to_floatbits,
what ``astype`` does on x86-64): the payload is truncated or extended and a signalling NaN stays
signalling.  On aarch64 NumPy's ``astype`` uses the FCVT instruction instead, which quiets a
signalling NaN; the kernels keep it on every architecture, so the NaN bits are computed here
rather than taken from ``astype``."""
from __future__ import annotations

import numpy as np

from perfkernels._reference_base import BFLOAT16

__all__ = ["float_to_half", "half_to_float", "float_to_bfloat16", "bfloat16_to_float"]


def float_to_half(x, clip: bool = False) -> np.ndarray:
    """float32 -> float16 as NumPy's ``astype`` (NaN payloads as NumPy's own conversion keeps
    them: the top 10 bits of the payload, a signalling NaN stays signalling); ``clip=True``
    saturates finite overflow and infinities to +-65504 instead of +-inf."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(all="ignore"):
        if clip:
            x = np.where(np.isnan(x), x, np.clip(x, np.float32(-65504), np.float32(65504)))
        h = x.astype(np.float16)
    nan = np.isnan(x)
    if nan.any():
        bits = x.view(np.uint32)[nan]
        payload = ((bits & 0x007FFFFF) >> 13).astype(np.uint16)
        payload[payload == 0] = 1                        # a payload truncated to 0 stays a NaN
        h.view(np.uint16)[nan] = ((bits >> 16) & 0x8000).astype(np.uint16) | 0x7C00 | payload
    return h


def half_to_float(h) -> np.ndarray:
    """float16 -> float32, exact for every bit pattern (a NaN's payload extended, a signalling NaN
    kept signalling)."""
    h = np.asarray(h, dtype=np.float16)
    with np.errstate(all="ignore"):
        f = h.astype(np.float32)
    nan = np.isnan(h)
    if nan.any():
        bits = h.view(np.uint16)[nan].astype(np.uint32)
        f.view(np.uint32)[nan] = ((bits & 0x8000) << 16) | 0x7F800000 | ((bits & 0x03FF) << 13)
    return f


def float_to_bfloat16(x) -> np.ndarray:
    """float32 -> ``ml_dtypes.bfloat16``, round to nearest even on the upper 16 bits."""
    with np.errstate(all="ignore"):
        return np.asarray(x, dtype=np.float32).astype(BFLOAT16)


def bfloat16_to_float(b) -> np.ndarray:
    """``ml_dtypes.bfloat16`` -> float32, exact."""
    return np.asarray(b, dtype=BFLOAT16).astype(np.float32)
