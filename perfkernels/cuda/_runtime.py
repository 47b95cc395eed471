"""CuPy loading, device detection, NVRTC compilation of the .cu sources, and GPU array intake.

Nothing here imports CuPy at module import: :func:`cupy_or_raise` does, once, and remembers why it
could not (no CuPy, CuPy failing to import, no CUDA driver, no device).
"""
from __future__ import annotations

import math
import re
import threading
from pathlib import Path

import numpy as np

from .. import _registry

#: The folder of the shared CUDA headers (pk_common.cuh); each family keeps its .cu files in its own
SOURCE_DIR = Path(__file__).resolve().parent
#: Every kernel file (from the family registry); the nvcc compile test and the loader read the same list.
SOURCES: tuple[str, ...] = tuple(_registry.CUDA_SOURCES)
NVRTC_OPTIONS = ("-std=c++17",)

_lock = threading.RLock()
_state: dict = {}          # "cupy": module or None, "reason": str
_modules: dict = {}        # (device id, file, name expression) -> cupy.RawKernel
_PK_NONE = (1 << 64) - 1   # an error slot nobody wrote (PK_NO_ERROR in pk_common.cuh)


def _probe() -> None:
    if "reason" in _state:
        return
    with _lock:
        if "reason" in _state:
            return
        cp, reason = None, ""
        try:
            import cupy
        except Exception as exc:  # ImportError, or a CuPy wheel that does not match the CUDA libraries
            reason = f"CuPy is not usable ({type(exc).__name__}: {exc}); install perfkernels[cuda]"
        else:
            try:
                count = cupy.cuda.runtime.getDeviceCount()
            except Exception as exc:  # CUDARuntimeError: no driver, insufficient driver, ...
                reason = f"CuPy sees no CUDA device ({type(exc).__name__}: {exc})"
            else:
                if count > 0:
                    cp = cupy
                else:
                    reason = "CuPy sees no CUDA device (device count is 0)"
        _state["cupy"], _state["reason"] = cp, reason


def is_available() -> bool:
    _probe()
    return _state["cupy"] is not None


def unavailable_reason() -> str:
    """Why the CUDA variant cannot run here ("" when it can)."""
    _probe()
    return _state["reason"]


def cupy_or_raise():
    _probe()
    cp = _state["cupy"]
    if cp is None:
        raise RuntimeError(f"perfkernels.cuda cannot run: {_state['reason']}")
    return cp


# ---- sources and kernels ------------------------------------------------------------------------

_INCLUDE = re.compile(r'^#include "([A-Za-z0-9_]+\.cuh)"\s*$', re.M)


def source(name: str) -> str:
    """The text of a .cu file with its local headers pasted in (each once), so that CuPy's binary
    cache, keyed on the source text, sees every byte that was compiled."""
    seen: set[str] = set()

    def expand(text: str) -> str:
        def sub(m: re.Match) -> str:
            header = m.group(1)
            if header in seen:
                return ""
            seen.add(header)
            return expand((SOURCE_DIR / header).read_text())
        return _INCLUDE.sub(sub, text)

    return expand(path(name).read_text())


def path(name: str) -> Path:
    """Where the kernel file ``name`` (one of :data:`SOURCES`) lies: in its family's folder."""
    return SOURCE_DIR.parent / _registry.CUDA_SOURCES[name]


def kernel(file: str, name_expression: str):
    """The compiled kernel ``name_expression`` (a template instantiation) of ``file``; compiled with
    NVRTC on first use for the current device and kept for the process (CuPy keeps the binary on
    disk too)."""
    cp = cupy_or_raise()
    key = (cp.cuda.runtime.getDevice(), file, name_expression)
    fn = _modules.get(key)
    if fn is None:
        with _lock:
            fn = _modules.get(key)
            if fn is None:
                module = cp.RawModule(code=source(file), options=NVRTC_OPTIONS,
                                      name_expressions=(name_expression,))
                fn = module.get_function(name_expression)
                _modules[key] = fn
    return fn


def grid_for(n: int, threads: int = 256, per_thread: int = 1) -> int:
    """Blocks for a grid-stride loop over n items: enough to fill the device, never 0."""
    cp = cupy_or_raise()
    sms = _sm_count(cp)
    want = max(1, math.ceil(n / (threads * per_thread)))
    return min(want, sms * 16)


def _sm_count(cp) -> int:
    dev = cp.cuda.runtime.getDevice()
    key = ("sms", dev)
    if key not in _state:
        _state[key] = cp.cuda.runtime.getDeviceProperties(dev)["multiProcessorCount"]
    return _state[key]


def error_slots(cp, n: int = 3):
    """A fresh device array of n error slots, all 'nothing found' (on the current stream)."""
    return cp.full(n, np.uint64(_PK_NONE), dtype=cp.uint64)


def found(slot) -> bool:
    return int(slot) != _PK_NONE


# ---- GPU array intake ---------------------------------------------------------------------------

try:
    import ml_dtypes as _ml_dtypes
    BFLOAT16 = np.dtype(_ml_dtypes.bfloat16)
except Exception:  # pragma: no cover - ml_dtypes is a dependency of the CPU package
    BFLOAT16 = None


def cupy_bfloat16_dtype():
    """``ml_dtypes.bfloat16`` when this CuPy can hold arrays of it, else None (then bfloat16 data
    is given and returned as uint16 arrays of the bits)."""
    if "bf16" not in _state:
        cp = cupy_or_raise()
        try:
            cp.empty(1, dtype=BFLOAT16).view(cp.uint16)
            _state["bf16"] = BFLOAT16
        except Exception:
            _state["bf16"] = None
    return _state["bf16"]


class GpuArray:
    """A CuPy array plus whether its 16-bit payload is bfloat16 (CuPy may lack that dtype)."""
    __slots__ = ("a", "bf16")

    def __init__(self, a, bf16: bool = False):
        self.a, self.bf16 = a, bf16

    @property
    def dtype_name(self) -> str:
        return "bfloat16" if self.bf16 else str(self.a.dtype)


def as_gpu(x, name: str) -> GpuArray:
    """``x`` as a CuPy array on the current device without a copy: CuPy arrays as they are,
    ``__cuda_array_interface__`` through ``cupy.asarray``, ``__dlpack__`` through
    ``cupy.from_dlpack``.  PyTorch bfloat16 tensors (which neither protocol carries) are read
    through an int16 view.  Host arrays are refused with a TypeError."""
    cp = cupy_or_raise()
    if isinstance(x, cp.ndarray):
        if BFLOAT16 is not None and x.dtype == BFLOAT16:
            return GpuArray(x.view(cp.uint16), bf16=True)
        return GpuArray(x)
    if type(x).__module__.startswith("torch") and hasattr(x, "detach"):
        x = x.detach()       # a tensor that requires grad refuses __cuda_array_interface__
    if type(x).__module__.startswith("torch") and str(getattr(x, "dtype", "")) == "torch.bfloat16":
        if not getattr(x, "is_cuda", False):
            raise TypeError(f"{name} is a PyTorch CPU tensor; perfkernels.cuda takes GPU arrays "
                            f"(use perfkernels.* for host arrays)")
        import torch
        return GpuArray(cp.asarray(x.detach().view(torch.int16)).view(cp.uint16), bf16=True)
    if isinstance(x, np.ndarray) or np.isscalar(x) or isinstance(x, (list, tuple)):
        raise TypeError(f"{name} is a host {type(x).__name__}; perfkernels.cuda takes GPU arrays "
                        f"(CuPy, __cuda_array_interface__ or __dlpack__): copy it with cupy.asarray, "
                        f"or call the CPU function perfkernels.* instead")
    try:
        if hasattr(x, "__cuda_array_interface__"):
            a = cp.asarray(x)
        elif hasattr(x, "__dlpack__"):
            a = cp.from_dlpack(x)
        else:
            raise TypeError("neither __cuda_array_interface__ nor __dlpack__")
    except Exception as exc:
        raise TypeError(f"{name} must be a GPU array (CuPy, __cuda_array_interface__ or __dlpack__ "
                        f"on a CUDA device); got {type(x).__name__} ({exc})") from exc
    return GpuArray(a)


def check_dtype(g: GpuArray, name: str, accepted: tuple[str, ...], accepted_text: str) -> None:
    if g.dtype_name not in accepted:
        raise TypeError(f"{name} must have dtype {accepted_text}; got {g.dtype_name}")


def contiguous(a):
    """C-contiguous (a copy only when needed)."""
    cp = cupy_or_raise()
    return a if a.flags.c_contiguous else cp.ascontiguousarray(a)


def check_out(out, shape: tuple, dtype, dtype_text: str, inputs=()):
    """Validate ``out=``; return (the array the kernel writes, the caller's array).  The kernel
    writes ``out`` itself when it is C-contiguous and overlaps no input, else a temporary that
    :func:`finish_out` copies into ``out`` after the kernel succeeded."""
    cp = cupy_or_raise()
    if out is None:
        return cp.empty(shape, dtype=dtype), None
    if not isinstance(out, cp.ndarray):
        if hasattr(out, "__cuda_array_interface__") or hasattr(out, "__dlpack__"):
            out = as_gpu(out, "out").a
        else:
            raise TypeError(f"out must be a GPU array (CuPy, __cuda_array_interface__ or "
                            f"__dlpack__); got {type(out).__name__}")
    if out.dtype != np.dtype(dtype):
        raise TypeError(f"out must have dtype {dtype_text}; got {out.dtype}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out has shape {tuple(out.shape)}; expected {tuple(shape)}")
    if not out.flags.c_contiguous or any(
            i is not None and cp.may_share_memory(out, i) for i in inputs):
        return cp.empty(shape, dtype=dtype), out
    return out, out


def finish_out(dst, out):
    if out is None:
        return dst
    if dst is not out:
        out[...] = dst
    return out


def largest_alignment(*values: int, choices=(16, 8, 4, 2, 1)) -> int:
    """The largest width in ``choices`` that divides every value (pointers, strides, sizes)."""
    for w in choices:
        if all(v % w == 0 for v in values):
            return w
    return choices[-1]
