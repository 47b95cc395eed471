"""Host side of the fp16 / bf16 conversion kernels."""
from __future__ import annotations

import numpy as np

from ...cuda import _runtime as rt

FILE = "convert.cu"
FLOAT_TO_HALF, HALF_TO_FLOAT, FLOAT_TO_BF16, BF16_TO_FLOAT = range(4)
THREADS = 256


def kernel_name(op: int, vec: bool) -> str:
    fn = "pk_convert_narrow" if op in (FLOAT_TO_HALF, FLOAT_TO_BF16) else "pk_convert_widen"
    return f"{fn}<{op}, {'true' if vec else 'false'}>"


def instantiations(full: bool = True) -> list[str]:
    return [kernel_name(op, vec) for op in range(4) for vec in (False, True)]


def _launch(op: int, src, dst, *extra):
    n = int(src.size)
    if n == 0:
        return
    vec = src.data.ptr % 16 == 0 and dst.data.ptr % 16 == 0
    fn = rt.kernel(FILE, kernel_name(op, vec))
    fn((rt.grid_for(n, THREADS, 8 if vec else 1),), (THREADS,), (src, dst, np.int64(n), *extra))


def narrow(x, out, op: int, clip: bool = False):
    cp = rt.cupy_or_raise()
    g = rt.as_gpu(x, "x")
    rt.check_dtype(g, "x", ("float32",), "float32")
    src = rt.contiguous(g.a)
    if op == FLOAT_TO_HALF:
        dtype, text = np.float16, "float16"
    else:
        dtype = rt.cupy_bfloat16_dtype() or np.uint16
        text = "bfloat16 (ml_dtypes.bfloat16)" if dtype is not np.uint16 else "uint16 (bfloat16 bits)"
    returned = out
    if out is not None and op == FLOAT_TO_BF16:
        og = rt.as_gpu(out, "out")
        if og.bf16 or og.a.dtype == np.uint16:   # either spelling of bfloat16 is accepted
            out = og.a
            dtype, text = np.uint16, "bfloat16"
    dst, user = rt.check_out(out, tuple(src.shape), dtype, text, (src,))
    _launch(op, src, dst.view(cp.uint16), np.int32(1 if clip else 0))
    result = rt.finish_out(dst, user)
    return returned if isinstance(returned, cp.ndarray) else result


def widen(h, out, op: int):
    g = rt.as_gpu(h, "h" if op == HALF_TO_FLOAT else "b")
    name = "h" if op == HALF_TO_FLOAT else "b"
    if op == HALF_TO_FLOAT:
        rt.check_dtype(g, name, ("float16",), "float16")
    else:
        rt.check_dtype(g, name, ("bfloat16", "uint16"),
                       "bfloat16 (ml_dtypes.bfloat16; uint16 bits where CuPy lacks that dtype)")
    cp = rt.cupy_or_raise()
    src = rt.contiguous(g.a).view(cp.uint16)
    dst, user = rt.check_out(out, tuple(src.shape), np.float32, "float32", (src,))
    _launch(op, src, dst)
    return rt.finish_out(dst, user)
