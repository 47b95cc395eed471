"""One embedding-bag shape, ours against PyTorch's, interleaved in one process, one thread each.

The bench's cache-resident case by default (20,000 x 128, B 512, L 40: a 10 MB float32 table read
from L3): the probe behind the "below 1.0x" rows of docs/benchmarking.md, meant for comparing a
kernel change against the one before it (run it before and after, alternating builds).  Both
sides read the same table, placed by ``perfkernels.empty_table`` (rows on 64-byte lines, huge
pages where the size allows).  ``--cap-isa avx2`` holds both sides to AVX2, as ``python -m
perfkernels bench --cap-isa avx2`` does.  ``--loop`` adds the touch-only loop of
``gather_touch.c`` (one byte of every line of every row the bags name, at its best prefetch
setting; needs ``cc``) to the rounds, on the same table and thread.  Each side returns a new
output array, as ``torch.nn.functional.embedding_bag`` does; ``--out`` times ours writing a
preallocated ``out=`` instead (which first takes a checked copy of the indices, so that ``out=``
is never half-written: see docs/benchmarking.md).

    python benchmarks/ceiling/cache_bag.py --dtype float16 [--dim 128] [--rows 20000] [--cap-isa avx2]

Prints the medians of the times and the median (and quartiles) of the per-round ratios
PyTorch's time / ours (above 1 ours is faster), and with --loop the loop's time / ours.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--bags", type=int, default=512)
    p.add_argument("--bag-len", type=int, default=40)
    p.add_argument("--rounds", type=int, default=25)
    p.add_argument("--calls", type=int, default=40, help="calls per timed sample")
    p.add_argument("--cap-isa", choices=["avx2"], help="hold both sides to this ISA level")
    p.add_argument("--loop", action="store_true", help="time the touch-only loop beside them")
    p.add_argument("--out", action="store_true",
                   help="time ours writing a preallocated out= (default: a new output, as torch)")
    args = p.parse_args(argv)
    for name in ("rows", "dim", "bags", "bag_len", "rounds", "calls"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import perfkernels as pk
    from perfkernels.__main__ import cap_isa
    if args.cap_isa:
        print(cap_isa(args.cap_isa))
    with pk.use_isa(args.cap_isa) if args.cap_isa else contextlib.nullcontext():
        return run(args)


def run(args) -> int:
    import numpy as np
    import torch

    import perfkernels as pk
    from perfkernels._placement import empty_table
    from perfkernels._variants import TABLE_DTYPES
    torch.set_num_threads(1)
    pk.set_num_threads(1)

    rng = np.random.default_rng(0)
    dtype = TABLE_DTYPES[args.dtype]
    table = empty_table(args.rows, args.dim, dtype)
    table[:] = rng.standard_normal((args.rows, args.dim), dtype=np.float32)
    indices = rng.integers(0, args.rows, args.bags * args.bag_len, dtype=np.int64)
    offsets = np.arange(args.bags, dtype=np.int64) * args.bag_len
    out = np.empty((args.bags, args.dim), np.float32)
    t_table = torch.from_numpy(table.view(np.int16)).view(torch.bfloat16) \
        if args.dtype == "bfloat16" else torch.from_numpy(table)
    t_idx, t_off = torch.from_numpy(indices), torch.from_numpy(offsets)

    def ours():
        if args.out:
            return pk.embedding_bag(table, indices, offsets, out=out)
        return pk.embedding_bag(table, indices, offsets)

    def theirs():
        torch.nn.functional.embedding_bag(t_idx, t_table, t_off, mode="sum")

    def sample(fn):
        fn()
        start = time.perf_counter()
        for _ in range(args.calls):
            fn()
        return (time.perf_counter() - start) / args.calls

    loop = touch_loop(table, indices) if args.loop else None
    ours_t, theirs_t, loop_t = [], [], []
    for _ in range(args.rounds):
        ours_t.append(sample(ours))
        theirs_t.append(sample(theirs))
        if loop:
            loop_t.append(sample(loop))
    ratios = [b / a for a, b in zip(ours_t, theirs_t)]
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    print(f"{args.dtype} {args.rows} x {args.dim}, B {args.bags}, L {args.bag_len}, 1 thread, "
          f"ours {'into out=' if args.out else 'to a new output'}, "
          f"perfkernels at {pk.active_isa()}, PyTorch at "
          f"{torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores")
    print(f"ours {statistics.median(ours_t) * 1e6:.1f} us, PyTorch "
          f"{statistics.median(theirs_t) * 1e6:.1f} us, PyTorch / ours "
          f"{statistics.median(ratios):.3f} (quartiles {q1:.3f}-{q3:.3f}, {args.rounds} rounds)")
    if loop:
        print(f"touch loop {statistics.median(loop_t) * 1e6:.1f} us ({loop.setting}), loop / ours "
              f"{statistics.median(c / a for a, c in zip(ours_t, loop_t)):.3f}")
    return 0


def touch_loop(table, indices):
    """gather_touch.c on one thread over the rows ``indices`` names, at the best of
    gather_ceiling's prefetch settings (chosen by three timings each); a callable with the
    setting in ``.setting``."""
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gather_ceiling import SETTINGS, build_library
    dll = build_library(Path(tempfile.mkdtemp(prefix="cache_bag_")))

    def make(setting):
        def run():
            dll.gather_touch(table.ctypes.data, table.strides[0], indices.ctypes.data,
                             indices.size, 1, *setting, None, None)
        run.setting = f"distance {setting[0]}, {'L2' if setting[1] else 'L1'}"
        return run

    def cost(fn):
        fn()
        start = time.perf_counter()
        for _ in range(3):
            fn()
        return time.perf_counter() - start
    return min((make(s) for s in SETTINGS), key=cost)


if __name__ == "__main__":
    sys.exit(main())
