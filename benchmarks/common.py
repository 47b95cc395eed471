"""Helpers shared by the asv benchmark modules.  Import this before perfkernels.

asv runs one build under every PERFKERNELS_ISA in the matrix.  On a CPU that lacks a level,
`import perfkernels` refuses it (by design); here that refusal becomes a skip of the perfkernels
benchmarks instead of a broken benchmark module, so one asv.conf.json serves every machine.

It also records PyTorch's default thread count before any benchmark changes it, and measures the
speed-up over PyTorch the way the project states its claims: ours and theirs sampled in turn, in
one process, on the same inputs, the median of the per-round ratios.
"""
import os
import time
from contextlib import contextmanager

import numpy as np

try:
    import perfkernels
    UNAVAILABLE = None
except RuntimeError as exc:           # a forced level this CPU or build cannot run
    UNAVAILABLE = str(exc)
    os.environ.pop("PERFKERNELS_ISA", None)
    import perfkernels  # noqa: F811  (the default level; only the baselines will run)

try:
    import torch
    #: PyTorch's own thread count in a fresh process (all cores of the process): the user's view.
    TORCH_DEFAULT_THREADS = torch.get_num_threads()
except ImportError:
    torch = None
    TORCH_DEFAULT_THREADS = None


def isa_or_skip():
    """perfkernels, or NotImplementedError (asv's skip) when this run's ISA level cannot run here."""
    if UNAVAILABLE:
        raise NotImplementedError(UNAVAILABLE)
    return perfkernels


def torch_or_skip():
    """PyTorch on one thread; NotImplementedError (asv's skip) when it is not installed."""
    if torch is None:
        raise NotImplementedError("PyTorch is not installed")
    torch.set_num_threads(1)
    return torch


@contextmanager
def thread_counts(one_thread: bool):
    """PyTorch and perfkernels at their defaults, or both at one thread, for the body.

    perfkernels' own thread setting is used where the build has one (``set_num_threads``)."""
    pk_get = getattr(perfkernels, "get_num_threads", None)
    pk_set = getattr(perfkernels, "set_num_threads", None)
    pk_before = pk_get() if pk_get and pk_set else None
    torch_before = torch.get_num_threads()
    torch.set_num_threads(1 if one_thread else TORCH_DEFAULT_THREADS)
    if pk_before is not None and one_thread:
        pk_set(1)
    try:
        yield
    finally:
        torch.set_num_threads(torch_before)
        if pk_before is not None:
            pk_set(pk_before)


def speedup(ours, theirs, *, one_thread: bool, rounds: int = 9, min_time: float = 0.02) -> float:
    """How many times faster ``ours()`` is than ``theirs()``: the median over ``rounds`` rounds of
    theirs' time / ours', each round timing one sample of each in turn (>= ``min_time`` a sample),
    so a machine that speeds up or slows down moves both alike.  PyTorch and perfkernels run at
    their default thread counts, or both at one thread with ``one_thread``."""
    if torch is None:
        raise NotImplementedError("PyTorch is not installed")
    fns = (ours, theirs)
    with thread_counts(one_thread):
        number = []
        for fn in fns:
            fn()                                   # warm-up: page faults, lazy init, caches
            t0 = time.perf_counter()
            fn()
            number.append(max(1, int(min_time / max(time.perf_counter() - t0, 1e-9))))
        ratios = []
        for _ in range(rounds):
            times = []
            for fn, n in zip(fns, number):
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                times.append((time.perf_counter() - t0) / n)
            ratios.append(times[1] / times[0])
    return float(np.median(ratios))
