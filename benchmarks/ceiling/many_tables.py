"""A model's worth of tables: lookups over many large tables in turn, beside the touch-only loop.

One table queried again and again (``gather_ceiling.py``) keeps its pages and some of its lines
warm between calls; a model's embedding stage walks many tables, each one cold when its turn comes.
This times an RM2-class stage (32 tables x ``--rows`` x 64, batch 256, 120 uniform lookups per bag
and table, as DeepRecSys's RM2): PyTorch on tables torch allocated (its default placement), and
perfkernels and the touch-only loop of ``gather_touch.c`` (its best prefetch setting) on tables
perfkernels placed (2 MiB-aligned, huge pages), for float32, float16 and 8-bit tables.  Rounds
are interleaved (direction reversed every other round), one process, medians of per-round ratios.

    python benchmarks/ceiling/many_tables.py [--threads 2] [--rows 250000] [--rounds 11]

Needs a C compiler, PyTorch and an installed perfkernels; about 6 GiB of memory at 250K rows.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import gather_ceiling as gc  # noqa: E402

TABLES, DIM, BATCH, BAG = 32, 64, 256, 120


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None,
                        help="threads of both sides (default: PyTorch's default)")
    parser.add_argument("--rows", type=int, default=250_000)
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args(argv)

    import torch

    import perfkernels as pk
    import perfkernels.torch  # noqa: F401  (our jobs on PyTorch's OpenMP threads, as in a model)
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    pk.set_num_threads(threads)
    rng = np.random.default_rng(0)
    team = gc.torch_openmp_team()
    dll = gc.build_library(pathlib.Path(tempfile.mkdtemp()))
    idx = [rng.integers(0, args.rows, BATCH * BAG, dtype=np.int64) for _ in range(TABLES)]
    offsets = np.arange(BATCH, dtype=np.int64) * BAG
    t_idx = [torch.from_numpy(i) for i in idx]
    t_offsets = torch.from_numpy(offsets)
    print(f"{TABLES} tables x {args.rows} x {DIM}, batch {BATCH}, {BAG} uniform lookups, "
          f"{threads} thread(s); ms per stage; ratios of times")
    for kind in ("float32", "float16", "8-bit"):
        ours, theirs = [], []
        for _ in range(TABLES):
            base = rng.standard_normal((args.rows, DIM), dtype=np.float32)
            base = (pk.quantize_rowwise(base, bits=8) if kind == "8-bit"
                    else base.astype(np.float16) if kind == "float16" else base)
            ours.append(pk.as_table(base, placement="hugepage"))
            copy = torch.empty(base.shape, dtype=torch.from_numpy(base[:0]).dtype)
            copy.numpy()[:] = base
            theirs.append(copy)
        if kind == "8-bit":
            def torch_fn():
                for t, i in zip(theirs, t_idx):
                    torch.ops.quantized.embedding_bag_byte_rowwise_offsets(t, i, t_offsets, mode=0)

            def ours_fn():
                for t, i in zip(ours, idx):
                    pk.embedding_bag_quantized(t, i, offsets, bits=8)
        else:
            def torch_fn():
                for t, i in zip(theirs, t_idx):
                    torch.nn.functional.embedding_bag(i, t, t_offsets, mode="sum")

            def ours_fn():
                for t, i in zip(ours, idx):
                    pk.embedding_bag(t, i, offsets)

        def touch(setting):
            def fn():
                for t, i in zip(ours, idx):
                    dll.gather_touch(t.ctypes.data, t.strides[0], i.ctypes.data, i.size, threads,
                                     *setting, *team)
            return fn
        best = min(gc.SETTINGS, key=lambda s: statistics.median(_timed(touch(s)) for _ in range(3)))
        fns = {"torch": torch_fn, "ours": ours_fn, "touch": touch(best)}
        samples = {k: [] for k in fns}
        for r in range(args.rounds):
            for key, fn in (list(fns.items()) if r % 2 == 0 else list(fns.items())[::-1]):
                samples[key].append(_timed(fn))

        def ratio(a, b):
            return statistics.median(x / y for x, y in zip(samples[a], samples[b]))
        med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
        print(f"  {kind:8s} torch (own pages) {med['torch']:7.2f}  ours (huge) {med['ours']:7.2f}"
              f"  loop (huge) {med['touch']:7.2f}   torch/ours {ratio('torch', 'ours'):.2f}"
              f"  loop/ours {ratio('touch', 'ours'):.2f}  (loop: distance {best[0]},"
              f" {'L2' if best[1] else 'L1'})", flush=True)
        ours.clear()   # (not del: the closures above refer to these names)
        theirs.clear()


if __name__ == "__main__":
    main()
