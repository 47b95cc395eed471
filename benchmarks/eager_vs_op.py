"""The eager routes against the native op on one unpooled lookup, measured side by side.

Unpooled lookups of 256 x 50 IDs from a 1M x 64 table (float16, bfloat16, float32), no gradient:
``perfkernels.torch.Embedding`` (the module's compiled fast path), the NumPy API
``perfkernels.embedding`` (float16 / float32) and ``torch.ops.perfkernels.embedding_inference``
on the same table: the module's own, which it places on huge pages, read by every route.  Each
round times every route over the same number of calls, in a shuffled order, in one process; the
report is the median per-call time of each route and the median of the per-round speed ratios
(op time / route time: below 1.0 the route is slower than the op), with the minor page faults
per call of each route (``resource.getrusage``).  ``--keep N`` holds the last N results alive,
as a caller that keeps its outputs does.  Run:
``python benchmarks/eager_vs_op.py [--rounds N] [--calls C] [--threads T] [--keep N]``.
"""
import argparse
import collections
import random
import resource
import statistics
import time

import numpy as np
import torch

import perfkernels as pk
import perfkernels.torch as pkt
from perfkernels.torch._placement import huge_page_share


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _time(fn, calls: int, keep: int) -> tuple[float, float]:
    held = collections.deque(maxlen=keep) if keep else None
    f0 = _faults()
    t0 = time.perf_counter()
    if held is None:
        for _ in range(calls):
            fn()
    else:
        for _ in range(calls):
            held.append(fn())
    t = time.perf_counter() - t0
    f = _faults() - f0
    if held is not None:
        held.clear()
    return t / calls, f / calls


def routes(dtype: torch.dtype, rows: int, dim: int, batch: int, length: int) -> dict:
    """The callables of one table format: name -> no-argument lookup."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(rows, dim, generator=g).to(dtype)
    ids = torch.randint(0, rows, (batch, length), generator=g)
    module = pkt.Embedding(rows, dim, _weight=weight)
    module.weight.requires_grad_(False)
    # every route reads the module's own table (the module may copy its _weight: a second copy
    # of 128-256 MB placed elsewhere in memory measured up to 1.3x apart on its own)
    weight = module.weight.detach()
    op = torch.ops.perfkernels.embedding_inference.default
    r = {"op": lambda: op(weight, ids, -1), "module": lambda: module(ids)}
    huge, total = huge_page_share([weight])
    print(f"{dtype}: the table has {huge / total:.0%} of its bytes on huge pages")
    if dtype is not torch.bfloat16:
        w_np, ids_np = weight.numpy(), ids.numpy()
        r["numpy"] = lambda: pk.embedding(w_np, ids_np)
    # the same results, bit for bit
    ref = r["op"]().view(torch.int16 if dtype is not torch.float32 else torch.int32)
    for name, fn in r.items():
        out = fn()
        out = torch.as_tensor(out) if isinstance(out, np.ndarray) else out
        assert torch.equal(out.view(ref.dtype), ref), name
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=41)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtypes", default="float16,bfloat16,float32")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--keep", type=int, default=0,
                   help="keep the last N results alive (a caller that holds its outputs)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    pk.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {a.rows} x 64 table, 256 x 50 IDs, {a.threads} thread(s), "
          f"{a.rounds} rounds x {a.calls} calls, keeping {a.keep} results")
    for name in a.dtypes.split(","):
        r = routes(getattr(torch, name), a.rows, 64, 256, 50)
        times = {k: [] for k in r}
        faults = {k: [] for k in r}
        for fn in r.values():
            _time(fn, a.calls, a.keep)              # warm-up
        rng = random.Random(0)
        for _ in range(a.rounds):
            order = list(r)
            rng.shuffle(order)                      # no route holds one place in the rounds
            for k in order:
                t, f = _time(r[k], a.calls, a.keep)
                times[k].append(t)
                faults[k].append(f)
        line = [f"{name:9s} op {statistics.median(times['op']) * 1e6:7.1f} us"
                f" ({statistics.median(faults['op']):.1f} faults/call)"]
        for k in r:
            if k == "op":
                continue
            speed = statistics.median(o / t for o, t in zip(times["op"], times[k]))
            line.append(f"{k} {statistics.median(times[k]) * 1e6:.1f} us, {speed:.3f}x the op's speed"
                        f" ({statistics.median(faults[k]):.1f} faults/call)")
        print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main()
