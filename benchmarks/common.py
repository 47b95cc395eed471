"""Helpers shared by the asv benchmark modules.  Import this before perfkernels.

asv runs one build under every PERFKERNELS_ISA in the matrix.  On a CPU that lacks a level,
`import perfkernels` refuses it (by design); here that refusal becomes a skip of the perfkernels
benchmarks instead of a broken benchmark module, so one asv.conf.json serves every machine.

It also records PyTorch's default thread count before any benchmark changes it, and measures our
time relative to PyTorch's the way the project states its claims (``measure``): ours and theirs
sampled in turn, in one process, on the same inputs, the median of the per-round ratios, with
their spread; a measurement that does not settle is refused (``Unreliable``), never published.
"""
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace

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


#: The most a headline point's per-round ratios may spread: (q75 - q25) / median.  A point whose
#: rounds disagree more than this is measured again, and refused when it never settles.  At 9
#: rounds the median's standard error is about a third of this spread (~5%), half the 10% step
#: asv.conf.json's regression detection flags.
SPREAD_LIMIT = 0.15
#: PyTorch at its default threads may be at most this much slower than on one thread: slower than
#: that, its threads did not get the cores (see ``measure``) and the point measures the scheduler.
OVERSUBSCRIBED = 1.5


class Unreliable(RuntimeError):
    """A measurement that did not settle: published as a failed point, never as a value."""


@dataclass(frozen=True)
class Measurement:
    """One headline point: ``ratio`` = ours' time / PyTorch's (below 1 we are faster), the median
    of the per-round ratios, with their ``spread`` ((q75 - q25) / median) and the median seconds
    per call of each side."""
    ratio: float
    spread: float
    ours: float
    theirs: float
    rounds: int
    attempts: int


def _calls_per_sample(fn, min_time: float) -> int:
    fn()                                       # warm-up: page faults, lazy init, caches
    t0 = time.perf_counter()
    fn()
    return max(1, int(min_time / max(time.perf_counter() - t0, 1e-9)))


def _sample(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def _attempt(ours, theirs, one_thread: bool, rounds: int, min_time: float) -> Measurement:
    """Interleaved rounds: each round times a sample of ours, then one of theirs (and, at the
    default threads, one of theirs on a single thread, the oversubscription probe)."""
    probe = not one_thread and TORCH_DEFAULT_THREADS > 1
    with thread_counts(one_thread):
        n_ours, n_theirs = (_calls_per_sample(fn, min_time) for fn in (ours, theirs))
        times = []
        for _ in range(rounds):
            row = [_sample(ours, n_ours), _sample(theirs, n_theirs)]
            if probe:
                torch.set_num_threads(1)
                row.append(_sample(theirs, n_theirs))
                torch.set_num_threads(TORCH_DEFAULT_THREADS)
            times.append(row)
    times = np.array(times)
    ratios = times[:, 0] / times[:, 1]
    q25, median, q75 = np.percentile(ratios, [25, 50, 75])
    if probe:
        slowdown = float(np.median(times[:, 1]) / np.median(times[:, 2]))
        if slowdown > OVERSUBSCRIBED:
            raise Unreliable(f"PyTorch at {TORCH_DEFAULT_THREADS} threads took {slowdown:.1f}x its "
                             "1-thread time: its threads did not get the cores (machine busy)")
    return Measurement(float(median), float((q75 - q25) / median), float(np.median(times[:, 0])),
                       float(np.median(times[:, 1])), rounds, 1)


def measure(ours, theirs, *, one_thread: bool, rounds: int = 9, attempts: int = 3,
            min_time: float = 0.1, spread_limit: float = SPREAD_LIMIT) -> Measurement:
    """Time ``ours()`` against ``theirs()`` the way the project states speed claims: in one process,
    on the same inputs, in ``rounds`` interleaved rounds (each sample >= ``min_time`` s), the
    median of the per-round ratios ours / theirs, with their spread.

    PyTorch and perfkernels run at their default thread counts, or both at one thread with
    ``one_thread``.  A measurement whose spread exceeds ``spread_limit``, or (default threads)
    whose PyTorch ran more than ``OVERSUBSCRIBED`` times slower than on one thread, is taken again,
    up to ``attempts`` times in all; then it raises :class:`Unreliable` with the reasons."""
    if torch is None:
        raise NotImplementedError("PyTorch is not installed")
    reasons = []
    for attempt in range(1, attempts + 1):
        try:
            m = _attempt(ours, theirs, one_thread, rounds, min_time)
        except Unreliable as exc:
            reasons.append(str(exc))
            continue
        if m.spread <= spread_limit:
            return replace(m, attempts=attempt)
        reasons.append(f"ratio {m.ratio:.3g}, spread {m.spread:.0%} > {spread_limit:.0%}")
    raise Unreliable(f"refused after {attempts} attempts: " + "; ".join(reasons))
