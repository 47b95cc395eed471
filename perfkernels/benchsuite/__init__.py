"""The built-in benchmark suite behind ``python -m perfkernels bench`` (and reused by asv).

Each kernel family has one module in its folder, ``perfkernels/families/<family>/bench.py``
(the families and their order come from ``perfkernels/_registry.py``); the parts that are not
a family (``cuda``: the CUDA variant, ``dlrm``: the DLRM example) are modules here.  Each defines

    def cases(quick: bool) -> list[Case]

Every :class:`Case` names the bytes its kernel must touch (for GB/s), our call, and the calls a user
would otherwise make (NumPy, PyTorch when installed), all on the same inputs.  The runner times our
call once per available ISA level, side by side with the baselines, single-threaded, median of
several repetitions after a warm-up (docs/benchmarking.md).  Cases marked ``scaling`` are also
timed at 1, 2, ... threads beside PyTorch at one thread and at its default (``bench --scaling``).  The shapes and dtypes come from
``perfkernels._variants``, which the tests and the asv suite read too.
"""
from __future__ import annotations

import importlib
import pkgutil
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .. import _registry


@dataclass
class Case:
    family: str
    name: str
    nbytes: int                                   # bytes the kernel must read + write
    ours: Callable[[], object]                    # timed under use_isa(level) for each level
    baselines: dict[str, Callable[[], object]] = field(default_factory=dict)  # "numpy", "torch", ...
    ours_gpu: bool = False                        # True: `ours` runs on the GPU (no ISA loop)
    scaling: bool = False                         # also timed in the thread-scaling view




def families() -> list[str]:
    """Names of the benchmark parts: the kernel families in registry order, then this folder's
    own modules (``cuda``, ``dlrm``) by name."""
    here = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    return list(_registry.FAMILY_NAMES) + here


def _module(family: str):
    if family in _registry.FAMILY_BY_NAME:
        return importlib.import_module(f"perfkernels.families.{family}.bench")
    return importlib.import_module(f"{__name__}.{family}")


def load_cases(family: str, quick: bool) -> list[Case]:
    return _module(family).cases(quick)


def load_scaling_cases(family: str, quick: bool) -> list[Case]:
    """The family's cases of the thread-scaling view: its ``scaling_cases(quick)`` when it builds
    them apart (to avoid building every input of ``cases``), else its cases marked ``scaling``."""
    module = _module(family)
    if hasattr(module, "scaling_cases"):
        return module.scaling_cases(quick)
    return [c for c in module.cases(quick) if c.scaling]


def torch_or_none():
    """PyTorch, single-threaded (the thread-scaling view sets its threads per sample), or None
    when it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    return torch


def median_time(fn: Callable[[], object], *, repeat: int = 7, min_time: float = 0.02) -> float:
    """Median seconds per call: one warm-up, then `repeat` samples of >= `min_time` each."""
    fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-9)
    number = max(1, int(min_time / once))
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
    return float(np.median(samples))


def interleaved_times(fns: dict[str, Callable[[], object]], *, repeat: int = 7,
                      min_time: float = 0.02,
                      context: Callable[[str], object] | None = None) -> dict[str, float]:
    """Median seconds per call of each function, measured side by side.

    Each function is warmed up and gets its own calls-per-sample count (>= `min_time` a sample);
    then `repeat` rounds each take one sample of every function in turn, so a machine that speeds
    up or slows down during the run (turbo, a noisy neighbour, the allocator's state) moves all of
    them alike.  ``context(name)``, when given, returns a context manager entered around each
    sample of ``fns[name]`` (e.g. ``perfkernels.use_isa``).
    """
    from contextlib import nullcontext

    def ctx(name):
        return context(name) if context is not None else nullcontext()

    number = {}
    for name, fn in fns.items():
        with ctx(name):
            fn()
            t0 = time.perf_counter()
            fn()
            once = max(time.perf_counter() - t0, 1e-9)
        number[name] = max(1, int(min_time / once))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            with ctx(name):
                t0 = time.perf_counter()
                for _ in range(number[name]):
                    fn()
                samples[name].append((time.perf_counter() - t0) / number[name])
    return {name: float(np.median(v)) for name, v in samples.items()}


def copy_bandwidth(nbytes: int = 64 << 20, repeat: int = 5) -> float:
    """The machine's streaming limit: GB/s (bytes read + written) of ``np.copyto`` on 64 MiB."""
    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    t = median_time(lambda: np.copyto(dst, src), repeat=repeat, min_time=0.05)
    return 2 * nbytes / t / 1e9


def zipf_indices(rng: np.random.Generator, rows: int, n: int, a: float = 1.1,
                 dtype=np.int64) -> np.ndarray:
    """Power-law indices in [0, rows): a few hot rows, a long cold tail, hot rows scattered."""
    ranks = rng.zipf(a, size=n) - 1
    ranks = ranks[ranks < rows] if rows > 0 else ranks[:0]
    while ranks.size < n:
        more = rng.zipf(a, size=n) - 1
        ranks = np.concatenate([ranks, more[more < rows]])
    perm_seed = rng.integers(1 << 31)
    hot = np.random.default_rng(perm_seed).permutation(min(rows, 1 << 20))
    out = np.where(ranks[:n] < hot.size, hot[np.minimum(ranks[:n], hot.size - 1)], ranks[:n])
    return out.astype(dtype)
