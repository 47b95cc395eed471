"""Sharing PyTorch's OpenMP threads.

PyTorch's CPU ops (Linux wheels) run on GNU OpenMP's team, whose threads spin for a while after
each parallel region before they sleep.  perfkernels' own pool beside them competes with those
spinning threads for the same cores: in a model that alternates PyTorch ops with ours (an MLP, then
the embedding lookups, then an MLP), our worker starts late and the calling thread does most of
each job alone.  So when ``perfkernels.torch`` is imported, perfkernels' parallel jobs run on
PyTorch's OpenMP team instead (through libgomp's ``GOMP_parallel``, what ``#pragma omp parallel``
compiles to).  Nothing else changes: the thread count is still ``perfkernels.set_num_threads``'s,
a job is cut into the same blocks (results do not depend on which threads run it), one job runs at
a time (a second caller runs alone), and a forked child goes back to perfkernels' own pool.

``PERFKERNELS_TORCH_THREADS=0`` in the environment, or ``use_torch_threads(False)``, keeps the own
pool.
"""
from __future__ import annotations

import ctypes
import os

import torch

from .. import _parallel

_ENV = "PERFKERNELS_TORCH_THREADS"
_libgomp: ctypes.CDLL | None = None    # kept alive while its entry point is in use


def _torch_libgomp() -> str | None:
    """The path of the GNU OpenMP runtime PyTorch runs on, or None (another backend or runtime)."""
    try:
        if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
            return None
        with open("/proc/self/maps") as maps:
            runtimes = {line.split()[-1] for line in maps
                        if any(f"/{name}" in line for name in ("libgomp", "libiomp", "libomp"))}
    except (OSError, RuntimeError):
        return None
    gomp = sorted(p for p in runtimes if "/libgomp" in p)
    torch_dir = os.path.dirname(torch.__file__) + os.sep
    own = [p for p in gomp if p.startswith(torch_dir)]
    if own:                      # the wheel's bundled copy
        return own[0]
    # a system libgomp (a distribution's torch) only when it is the one OpenMP runtime loaded
    return gomp[0] if len(runtimes) == 1 and len(gomp) == 1 else None


def use_torch_threads(enable: bool = True) -> bool:
    """Run perfkernels' parallel jobs on PyTorch's OpenMP threads (``enable=True``, the default
    once ``perfkernels.torch`` is imported), or on perfkernels' own pool (``False``).

    Returns whether jobs now run on PyTorch's threads: False where PyTorch does not run on GNU
    OpenMP (macOS, a native-threads build), where that always falls back to the own pool.

    Raises
    ------
    TypeError
        ``enable`` not a bool.

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> before = pkt.torch_threads_in_use()
    >>> pkt.use_torch_threads(False)       # perfkernels' own pool
    False
    >>> _ = pkt.use_torch_threads(before)
    """
    global _libgomp
    if not isinstance(enable, bool):
        raise TypeError(f"enable must be a bool, got {enable!r}")
    if not enable:
        _parallel._use_openmp(None)
        return False
    path = _torch_libgomp()
    if path is None:
        _parallel._use_openmp(None)
        return False
    try:
        lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0))   # the loaded copy, never a new one
        entry = ctypes.cast(lib.GOMP_parallel, ctypes.c_void_p).value
        max_threads = ctypes.cast(lib.omp_get_max_threads, ctypes.c_void_p).value
        thread_limit = int(lib.omp_get_thread_limit())
    except (OSError, AttributeError):
        _parallel._use_openmp(None)
        return False
    _libgomp = lib
    # a job asking for more threads than PyTorch's team (omp_get_max_threads of the calling
    # thread, torch.set_num_threads) runs on the own pool: libgomp ends the process when it
    # cannot create a team's threads, the own pool runs on those it could start
    _parallel._use_openmp(entry, max_threads, thread_limit)
    return True


def torch_threads_in_use() -> bool:
    """Whether perfkernels' parallel jobs run on PyTorch's OpenMP threads now.

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> isinstance(pkt.torch_threads_in_use(), bool)
    True
    """
    return _parallel._openmp_in_use() != 0


def _init_from_environment() -> None:
    value = os.environ.get(_ENV, "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"{_ENV} must be 0 (perfkernels' own thread pool) or 1 (PyTorch's "
                         f"OpenMP threads, the default), got {value!r}")
    use_torch_threads(value == "1")
