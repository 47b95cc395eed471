"""Unpooled lookups (``torch.nn.Embedding``) beside a copy-only loop, at 1 or more threads.

``row_copy.c`` copies each index's row to the next output row and does nothing else, with the best
of several prefetch settings, on the same table, indices and output allocation as the kernels (a
new tensor per call, as ``F.embedding`` and ``perfkernels.torch.Embedding`` return).  A lookup of
a float table is exactly that copy, so no lookup kernel can be much faster than the loop: if
perfkernels is level with it, ``loop / torch`` is about the most any implementation could gain
over PyTorch there.  For an 8-bit table the loop reads each packed row once and writes its
float32-sized output row (the bytes a dequantizing lookup must move), against
``torch.ao.nn.quantized.Embedding``.

Sides, timed in turn in one process (median of ``--reps`` calls per round, ratios the median over
``--rounds`` rounds of per-round ratios):

- ``torch``: ``torch.nn.functional.embedding`` on a table torch allocated (its default placement);
- ``torch-placed``: the same function on perfkernels' placed table (2 MiB-aligned, huge pages);
- ``ours``: ``perfkernels.torch.Embedding`` (its default placement: the placed table);
- ``loop``: ``row_copy`` on the placed table, into a new tensor per call;
- ``write``: only the output written, into a new tensor per call: 32-byte stores of a register,
  no loads (``fill_rows``; a copy from a row that stays in L1, the measure before, took 2.5x as
  long on an AMD EPYC Zen 3 as our own kernel writing the same output, so it was no bound);
- ``read``: the same loop reading one byte of every line of every row and writing nothing (the
  best prefetch setting again).

Every lookup reads its rows and writes its output, so none takes less than the longer of
``read`` and ``write``: ``torch / max(read, write)`` is the most any implementation could gain
over PyTorch on this machine (the ``bound`` column).

With ``--threads 2`` (or several counts), torch and perfkernels run at that many threads and the
three loops split the indices into that many contiguous shares on persistent OpenMP threads
(``row_copy_threads``; built with ``-fopenmp``), so the bound is that of the same thread count.

    python benchmarks/ceiling/lookup_ceiling.py [--rounds 9] [--reps 20] [--threads 1 2]

Needs a C compiler (``cc``, with OpenMP for more than one thread), PyTorch and an installed
perfkernels.  Not an asv benchmark.
"""
from __future__ import annotations

import argparse
import ctypes
import pathlib
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
LOOP_AVX2 = False
SETTINGS = [(d, l2) for d in (0, 4, 8, 16, 32, 64) for l2 in (0, 1)]  # prefetch distance, hint
sys.path.insert(0, str(HERE.parent))
from sequence_lookup import SHAPES, _time, quantized_pair  # noqa: E402  (the plain run's)


def build_library(workdir: pathlib.Path, openmp: bool) -> ctypes.CDLL:
    """Compile row_copy.c (baseline flags, OpenMP where asked) into a shared library, load it."""
    lib = workdir / "row_copy.so"
    flags = ["-fopenmp"] if openmp else []
    # 32-byte moves where this CPU has AVX2 (the loops are built here, for this machine only)
    if "avx2" in pathlib.Path("/proc/cpuinfo").read_text().split():
        flags.append("-mavx2")
    subprocess.run(["cc", "-O2", *flags, "-shared", "-fPIC", str(HERE / "row_copy.c"), "-o",
                    str(lib)], check=True)
    dll = ctypes.CDLL(str(lib))
    dll.row_copy_threads.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                     ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int,
                                     ctypes.c_int, ctypes.c_int]
    dll.row_copy_threads.restype = ctypes.c_int
    dll.fill_rows_threads.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
    dll.fill_rows_threads.restype = ctypes.c_int
    return dll


class Loops:
    """The copy loop at the thread count of the moment (``threads``, set between measurements)."""

    def __init__(self, dll: ctypes.CDLL) -> None:
        self.dll, self.threads = dll, 1

    def row_copy(self, *args) -> int:
        if self.dll.row_copy_threads(*args, self.threads) != 0:
            raise RuntimeError("row_copy refused its arguments")
        return 0

    def fill_rows(self, out: int, row_bytes: int, n_rows: int) -> int:
        if self.dll.fill_rows_threads(out, row_bytes, n_rows, self.threads) != 0:
            raise RuntimeError("fill_rows refused its arguments")
        return 0


def cases(dll, batch: int, seq: int):
    """(name, {side: fn}) for every table shape and format."""
    import torch

    import perfkernels.torch as pkt
    gen = torch.Generator().manual_seed(0)
    def read(table, row_bytes):
        def make(setting):
            return lambda: dll.row_copy(table.data_ptr(), row_bytes, flat.data_ptr(), n, None, 0,
                                        *setting)
        return make

    for label, rows, dim in SHAPES:
        ids = torch.randint(0, rows, (batch, seq), generator=gen)
        flat = ids.reshape(-1).contiguous()
        n = flat.numel()

        def write(dt):
            def run():
                out = torch.empty((batch, seq, dim), dtype=dt)
                dll.fill_rows(out.data_ptr(), dim * out.element_size(), n)
                return out
            return run
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            ref = torch.nn.Embedding(rows, dim, dtype=dtype)
            ours = pkt.Embedding.from_pretrained(ref.weight.detach().clone())
            placed = ours.weight.detach()
            row_bytes = placed.stride(0) * placed.element_size()

            def loop(setting, w=placed, rb=row_bytes, dt=dtype):
                def run():
                    out = torch.empty((batch, seq, dim), dtype=dt)
                    dll.row_copy(w.data_ptr(), rb, flat.data_ptr(), n, out.data_ptr(), rb,
                                 *setting)
                    return out
                return run
            yield (f"{label} {str(dtype).split('.')[-1]}", loop, read(placed, row_bytes), {
                "torch": lambda r=ref: torch.nn.functional.embedding(ids, r.weight),
                "torch-placed": lambda w=placed: torch.nn.functional.embedding(ids, w),
                "ours": lambda m=ours: m(ids), "write": write(dtype)})
        q, ours_q = quantized_pair(rows, dim)
        packed = ours_q.packed_weight
        row_bytes = packed.stride(0)

        def qloop(setting, p=packed, rb=row_bytes):
            def run():
                out = torch.empty((batch, seq, dim), dtype=torch.float32)
                dll.row_copy(p.data_ptr(), rb, flat.data_ptr(), n, out.data_ptr(), dim * 4,
                             *setting)
                return out
            return run
        yield (f"{label} 8-bit", qloop, read(packed, row_bytes), {"torch": lambda m=q: m(ids),
                                          "ours": lambda m=ours_q: m(ids),
                                          "write": write(torch.float32)})


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seq", type=int, default=50)
    ap.add_argument("--threads", type=int, nargs="+", default=[1],
                    help="thread counts of torch, perfkernels and the loops (default 1)")
    ap.add_argument("--only", default=None,
                    help="run only the cases whose name contains this (e.g. '100K x 128 float32')")
    args = ap.parse_args(argv)
    if min(args.threads) < 1:
        ap.error(f"--threads must be positive, got {args.threads}")
    import torch

    import perfkernels as pk
    print(f"{args.batch * args.seq} IDs per call; times are medians (us); ratios of times, median "
          f"of {args.rounds} interleaved rounds")
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        loops = Loops(build_library(pathlib.Path(tmp), openmp=max(args.threads) > 1))
        for name, loop, read, sides in cases(loops, args.batch, args.seq):
            if args.only and args.only not in name:
                continue
            for threads in args.threads:
                torch.set_num_threads(threads)
                pk.set_num_threads(threads)
                loops.threads = threads
                measure_case(f"{name} {threads} thr", loop, read, sides, args.rounds, args.reps)


def measure_case(name: str, loop, read, sides: dict, rounds: int, reps: int) -> None:
    """Pick the loops' best prefetch settings, time every side in interleaved rounds, print."""
    best = min(SETTINGS, key=lambda s: statistics.median(_time(loop(s), 10) for _ in range(5)))
    best_read = min(SETTINGS, key=lambda s: statistics.median(
        _time(read(s), 10) for _ in range(5)))
    sides = {**sides, "loop": loop(best), "read": read(best_read)}
    per_round = {k: [] for k in sides}
    for _ in range(rounds):
        for k, fn in sides.items():
            per_round[k].append(_time(fn, reps))
    med = {k: statistics.median(v) * 1e6 for k, v in per_round.items()}
    per_round["bound"] = [max(r, w) for r, w in zip(per_round["read"], per_round["write"])]

    def ratio(a, b):
        return statistics.median(x / y for x, y in zip(per_round[a], per_round[b]))
    cols = "  ".join(f"{k} {v:6.1f}" for k, v in med.items())
    print(f"{name:26s} {cols}   torch/ours {ratio('torch', 'ours'):.2f}x  "
          f"torch/loop {ratio('torch', 'loop'):.2f}x  ours/loop {ratio('ours', 'loop'):.2f}x  "
          f"torch/bound {ratio('torch', 'bound'):.2f}x  ours/bound {ratio('ours', 'bound'):.2f}x  "
          f"(loop: distance {best[0]}, {'L2' if best[1] else 'L1'})", flush=True)


if __name__ == "__main__":
    main()
