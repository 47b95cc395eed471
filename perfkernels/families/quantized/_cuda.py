"""Host side of row-wise quantization and dequantization."""
from __future__ import annotations

import numpy as np

from ..embedding import _cuda as _bags
from .layout import check_bits, packed_row_bytes
from ...cuda import _runtime as rt

FILE = "quantize.cu"


def quantize_name(bits: int, half_in: bool) -> str:
    return f"pk_quantize_rowwise<{bits}, {'true' if half_in else 'false'}>"


def dequantize_name(bits: int) -> str:
    return f"pk_dequantize_rowwise<{bits}>"


def instantiations(full: bool = True) -> list[str]:
    return ([quantize_name(b, h) for b in (8, 4, 2) for h in (False, True)]
            + [dequantize_name(b) for b in (8, 4, 2)])


def quantize(weight, bits: int):
    cp = rt.cupy_or_raise()
    bits = check_bits(bits)
    g = rt.as_gpu(weight, "weight")
    rt.check_dtype(g, "weight", ("float32", "float16"), "float32 or float16")
    a = g.a
    if a.ndim != 2:
        raise ValueError(f"weight must be 2-D (rows x D); got {a.ndim}-D with shape {tuple(a.shape)}")
    if a.shape[1] == 0:
        raise ValueError(f"weight must have at least one column; got shape {tuple(a.shape)}")
    if a.shape[1] > 1 and a.strides[1] != a.itemsize or a.strides[0] < 0:
        a = rt.contiguous(a)
    rows, dim = (int(s) for s in a.shape)
    row_bytes = packed_row_bytes(dim, bits)
    dst = cp.empty((rows, row_bytes), dtype=cp.uint8)
    if rows:
        fn = rt.kernel(FILE, quantize_name(bits, a.dtype == np.float16))
        stride = int(a.strides[0]) // a.itemsize if rows > 1 else dim
        fn((rt.grid_for(rows * 32),), (256,),
           (a, np.int64(rows), np.int32(dim), np.int64(stride), dst, np.int64(row_bytes)))
    return dst


def dequantize(packed, bits: int, dim):
    cp = rt.cupy_or_raise()
    a, fmt, d, meta_off = _bags.quantized_table(packed, bits, dim)
    rows = int(a.shape[0])
    dst = cp.empty((rows, d), dtype=cp.float32)
    if rows and d:
        fn = rt.kernel(FILE, dequantize_name(bits))
        stride = int(a.strides[0]) if rows > 1 else int(a.shape[1])
        fn((rt.grid_for(rows * d),), (256,),
           (a, np.int64(rows), np.int32(d), np.int64(stride), np.int32(meta_off), dst))
    return dst
