"""The interleaved rounds of kernel_ab.py and lookup_ab.py: build A and build B timed in turn within
every round (B first in odd rounds), so that a slow period of a shared VM falls on both."""
import statistics
import time


def time_ab(call, a, b, rounds: int, reps: int):
    """``call(a)`` and ``call(b)``, ``reps`` calls each per round: the median microseconds per call
    of A and of B, and each round's B/A."""
    ta, tb, ratios = [], [], []
    for r in range(rounds):
        order = ((a, ta), (b, tb)) if r % 2 == 0 else ((b, tb), (a, ta))
        for fns, acc in order:
            t0 = time.perf_counter_ns()
            for _ in range(reps):
                call(fns)
            acc.append((time.perf_counter_ns() - t0) / reps / 1e3)
        ratios.append(tb[-1] / ta[-1])
    return statistics.median(ta), statistics.median(tb), ratios
