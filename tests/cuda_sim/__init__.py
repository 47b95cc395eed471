"""Run perfkernels.cuda on the CPU: the warp simulator (cuda_sim.h), its g++ build (build.py) and a
NumPy-backed stand-in for CuPy (fake_cupy.py).  Test code only; see docs/cuda-simulator.md.

    libs = cuda_sim.prebuild()            # once per session (cached on disk)
    with cuda_sim.installed(libs, seed=3) as cp:
        perfkernels.cuda.embedding_bag(cp.asarray(table), cp.asarray(idx), cp.asarray(offsets))
"""
from __future__ import annotations

import contextlib
import functools
import sys

from . import build, fake_cupy


def kernel_names(file: str) -> list[str]:
    """The instantiations of ``file`` the runtime can launch.  For the bag kernels: the prepare
    kernels plus every (format, width, LANES, VPL) ``launch_config`` returns for any D and row
    alignment (D up to 2048 reaches every LANES and VPL); the other files: all of them."""
    from perfkernels.cuda import _compile_check
    from perfkernels.families.embedding import _cuda as _bags
    if file != _bags.FILE:
        return _compile_check.instantiations(file, full=True)
    names = [_bags.prepare_kernel_name(i, o) for i in _bags.INDEX_TYPES for o in _bags.INDEX_TYPES]
    names += [_bags.bag_kernel_name(fmt, w, it, lanes, vpl)
              for fmt, w, lanes, vpl in reachable_configs() for it in _bags.INDEX_TYPES]
    return names


def prebuild(sanitize: bool = False, bag_kernels=None) -> dict[str, build.Library]:
    """Build every kernel source for the simulator (cached across sessions); {source text: lib}.
    ``bag_kernels``: only these bag-kernel names (with the prepare kernels), else all of them."""
    from perfkernels.cuda import _runtime
    sources = []
    for f in _runtime.SOURCES:
        names = kernel_names(f)
        if bag_kernels is not None and f == "embedding_bag.cu":
            names = [n for n in names if n.startswith("pk_bags_prepare") or n in bag_kernels]
        sources.append((_runtime.source(f), names, f))
    paths = build.build_many(sources, sanitize=sanitize)
    return {text: build.Library(p) for (text, _, _), p in zip(sources, paths)}


def _reset_runtime():
    """Make perfkernels.cuda probe for CuPy again (if it is imported)."""
    _runtime = sys.modules.get("perfkernels.cuda._runtime")
    if _runtime is None:
        return
    with _runtime._lock:
        _runtime._state.clear()
        _runtime._modules.clear()


@contextlib.contextmanager
def installed(libraries: dict[str, build.Library], *, seed: int = 0, sm_count: int = 2,
              bfloat16: bool = True, sanitize: bool = False):
    """``sys.modules["cupy"]`` is the stand-in inside the block (perfkernels.cuda re-probes)."""
    st = fake_cupy.state
    saved = sys.modules.get("cupy", None)
    had = "cupy" in sys.modules
    st.seed, st.sm_count, st.bfloat16, st.sanitize = seed, sm_count, bfloat16, sanitize
    st.libraries = dict(libraries)
    st.launches = []
    st.current_stream = fake_cupy.Stream(null=True)
    module = fake_cupy.module()
    sys.modules["cupy"] = module
    _reset_runtime()
    try:
        yield module
    finally:
        if had:
            sys.modules["cupy"] = saved
        else:
            sys.modules.pop("cupy", None)
        _reset_runtime()


@functools.lru_cache(maxsize=None)
def reachable_configs() -> list[tuple[int, int, int, int]]:
    """Every (format, load width, LANES, VPL) the bag runtime can launch."""
    from perfkernels.families.embedding import _cuda as _bags
    return sorted({(fmt,) + _bags.launch_config(fmt, d, align)[:3]
                   for fmt in _bags.FORMATS for d in range(1, 2049) for align in (1, 2, 4, 8, 16)})


@functools.lru_cache(maxsize=None)
def layout_for(fmt: int, width: int, lanes: int, vpl: int, min_chunks: int = 1):
    """(D, column offset in elements, row length of the parent array in elements) of the smallest
    table that is a column slice ``parent[:, offset:offset + row]`` of a 256-byte aligned parent and
    makes the runtime launch (width, lanes, vpl) with at least ``min_chunks`` column chunks."""
    import math
    from perfkernels.families.embedding import _cuda as _bags
    from perfkernels.families.quantized.layout import packed_row_bytes
    bits = _bags.FORMATS[fmt][0]
    itemsize = {32: 4, 16: 2}.get(bits, 1)
    for d in range(1, 4097):
        row = d if fmt <= _bags.BF16 else packed_row_bytes(d, bits)
        row_bytes = row * itemsize if fmt <= _bags.BF16 else row
        for off in range(0, 16):
            parent = -(-(off + row) * itemsize // 16) * 16 // itemsize
            align = math.gcd((off * itemsize) % 16 or 16, row_bytes or 16)
            align = math.gcd(align, parent * itemsize)
            config = _bags.launch_config(fmt, d, align)
            if config[:3] == (width, lanes, vpl) and config[3] >= min_chunks:
                return d, off, parent
    raise ValueError(f"no table layout launches {(fmt, width, lanes, vpl)}")
