"""Unpooled lookups (``torch.nn.Embedding``) beside a copy-only loop, one thread.

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
- ``write``: the same loop with every index 0 of a one-row table of the output's row size (the row
  stays in L1): only the output is written;
- ``read``: the same loop reading one byte of every line of every row and writing nothing (the
  best prefetch setting again).

Every lookup reads its rows and writes its output, so none takes less than the longer of
``read`` and ``write``: ``torch / max(read, write)`` is the most any implementation could gain
over PyTorch on this machine (the ``bound`` column).

    python benchmarks/ceiling/lookup_ceiling.py [--rounds 9] [--reps 20]

Needs a C compiler (``cc``), PyTorch and an installed perfkernels.  Not an asv benchmark.
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
SETTINGS = [(d, l2) for d in (0, 4, 8, 16, 32, 64) for l2 in (0, 1)]  # prefetch distance, hint
sys.path.insert(0, str(HERE.parent))
from sequence_lookup import SHAPES, _time, quantized_pair  # noqa: E402  (the plain run's)


def build_library(workdir: pathlib.Path) -> ctypes.CDLL:
    """Compile row_copy.c (baseline flags) into a shared library and load it."""
    lib = workdir / "row_copy.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", str(HERE / "row_copy.c"), "-o", str(lib)],
                   check=True)
    dll = ctypes.CDLL(str(lib))
    dll.row_copy.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                             ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int]
    dll.row_copy.restype = ctypes.c_int
    return dll


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
        zeros = torch.zeros(n, dtype=torch.int64)
        hot = torch.zeros(dim, dtype=torch.float32)

        def write(dt):
            def run():
                out = torch.empty((batch, seq, dim), dtype=dt)
                rb = dim * out.element_size()
                dll.row_copy(hot.data_ptr(), rb, zeros.data_ptr(), n, out.data_ptr(), rb, 0, 0)
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
    args = ap.parse_args(argv)
    import torch

    import perfkernels as pk
    torch.set_num_threads(1)
    pk.set_num_threads(1)
    print(f"{args.batch * args.seq} IDs per call, 1 thread; times are medians (us); ratios of "
          f"times, median of {args.rounds} interleaved rounds")
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        dll = build_library(pathlib.Path(tmp))
        for name, loop, read, sides in cases(dll, args.batch, args.seq):
            best = min(SETTINGS, key=lambda s: statistics.median(
                _time(loop(s), 10) for _ in range(5)))
            best_read = min(SETTINGS, key=lambda s: statistics.median(
                _time(read(s), 10) for _ in range(5)))
            sides = {**sides, "loop": loop(best), "read": read(best_read)}
            per_round = {k: [] for k in sides}
            for _ in range(args.rounds):
                for k, fn in sides.items():
                    per_round[k].append(_time(fn, args.reps))
            med = {k: statistics.median(v) * 1e6 for k, v in per_round.items()}

            per_round["bound"] = [max(r, w) for r, w in zip(per_round["read"], per_round["write"])]

            def ratio(a, b):
                return statistics.median(x / y for x, y in zip(per_round[a], per_round[b]))
            cols = "  ".join(f"{k} {v:6.1f}" for k, v in med.items() if k != "bound")
            print(f"{name:20s} {cols}   torch/ours {ratio('torch', 'ours'):.2f}x  "
                  f"torch/loop {ratio('torch', 'loop'):.2f}x  ours/loop "
                  f"{ratio('ours', 'loop'):.2f}x  torch/bound {ratio('torch', 'bound'):.2f}x  "
                  f"ours/bound {ratio('ours', 'bound'):.2f}x  (loop: distance {best[0]}, "
                  f"{'L2' if best[1] else 'L1'})", flush=True)


if __name__ == "__main__":
    main()
