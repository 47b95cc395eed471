"""The NumPy reference of the convert family: fp16 / bf16 conversion, bit-exact with NumPy's and
ml_dtypes' casts.  See perfkernels/reference.py."""
from __future__ import annotations

import numpy as np

from perfkernels._reference_base import BFLOAT16

__all__ = ["float_to_half", "half_to_float", "float_to_bfloat16", "bfloat16_to_float"]


def float_to_half(x, clip: bool = False) -> np.ndarray:
    """float32 -> float16 as NumPy's ``astype`` (NaN payloads as NumPy keeps them); ``clip=True``
    saturates finite overflow and infinities to +-65504 instead of +-inf."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(all="ignore"):
        if clip:
            x = np.where(np.isnan(x), x, np.clip(x, np.float32(-65504), np.float32(65504)))
        return x.astype(np.float16)


def half_to_float(h) -> np.ndarray:
    """float16 -> float32, exact for every bit pattern."""
    return np.asarray(h, dtype=np.float16).astype(np.float32)


def float_to_bfloat16(x) -> np.ndarray:
    """float32 -> ``ml_dtypes.bfloat16``, round to nearest even on the upper 16 bits."""
    with np.errstate(all="ignore"):
        return np.asarray(x, dtype=np.float32).astype(BFLOAT16)


def bfloat16_to_float(b) -> np.ndarray:
    """``ml_dtypes.bfloat16`` -> float32, exact."""
    return np.asarray(b, dtype=BFLOAT16).astype(np.float32)
