"""Unpooled lookups (torch.nn.Embedding) beside PyTorch: 12,800 IDs (256 sequences of 50).

    python benchmarks/sequence_lookup.py                 # 1 and 2 threads, every table
    python benchmarks/sequence_lookup.py --rounds 5 --threads 1
    python benchmarks/sequence_lookup.py --isa avx2 avx512   # also ours held to each level

Each side in its default placement: ``torch`` is ``torch.nn.functional.embedding`` on a table
torch allocated (``torch.nn.Embedding``'s weight), ``ours`` is ``perfkernels.torch.Embedding`` with
its default placement (tables of 2 MiB and more moved to 2 MiB-aligned memory, huge pages
requested); ``torch-placed`` is torch's function on our placed table (the same memory as ours).
8-bit rows: ``perfkernels.torch.QuantizedEmbedding`` against ``torch.ao.nn.quantized.Embedding``
(its ``embedding_byte`` op), each on its own copy of the same rows.  Both sides run under
``torch.no_grad()`` and return a new tensor.

Interleaved: every round times each side once (the median of ``--reps`` calls), in turn; the
reported ratio is the median over rounds of torch's time / ours, so drifts of a busy machine hit
both sides alike.  ``--isa`` adds ours held to each named level (``perfkernels.use_isa``) as more
sides of the same rounds: two levels' kernels compared in one process.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import warnings

import torch

import perfkernels
import perfkernels.torch as pkt

SHAPES = (("1M x 64", 1_000_000, 64), ("100K x 128", 100_000, 128))
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _time(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(sides: dict, rounds: int, reps: int) -> dict:
    """{side: median seconds}, {side: median ratio torch / side} over interleaved rounds."""
    per_round = {name: [] for name in sides}
    for _ in range(rounds):
        for name, fn in sides.items():
            level = getattr(fn, "isa", None)
            with perfkernels.use_isa(level) if level else contextlib.nullcontext():
                per_round[name].append(_time(fn, reps))
    med = {name: statistics.median(v) for name, v in per_round.items()}
    ratio = {name: statistics.median(t / s for t, s in zip(per_round["torch"], v))
             for name, v in per_round.items() if name != "torch"}
    return med, ratio


def quantized_pair(rows: int, dim: int):
    """torch.ao's 8-bit ``Embedding`` of a random table and our ``QuantizedEmbedding`` of it."""
    from torch.ao.nn.quantized import Embedding as QEmbedding
    float_mod = torch.nn.Embedding(rows, dim)
    float_mod.qconfig = torch.ao.quantization.float_qparams_weight_only_qconfig
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # torch's deprecation notice for quantized tensors
        q = QEmbedding.from_float(float_mod)
    return q, pkt.QuantizedEmbedding.from_torch_ao(q)


def cases(batch: int, seq: int, items: int | None):
    gen = torch.Generator().manual_seed(0)
    for label, rows, dim in SHAPES:
        rows = min(rows, items) if items else rows
        ids = torch.randint(0, rows, (batch, seq), generator=gen)
        for dname, dtype in DTYPES.items():
            ref = torch.nn.Embedding(rows, dim, dtype=dtype)
            ours = pkt.Embedding.from_pretrained(ref.weight.detach().clone())
            placed = ours.weight.detach()
            yield (f"{label} {dname}", {
                "torch": lambda r=ref, i=ids: torch.nn.functional.embedding(i, r.weight),
                "ours": lambda m=ours, i=ids: m(i),
                "torch-placed": lambda w=placed, i=ids: torch.nn.functional.embedding(i, w)})
        q, ours_q = quantized_pair(rows, dim)
        yield (f"{label} 8-bit", {"torch": lambda m=q, i=ids: m(i),
                                  "ours": lambda m=ours_q, i=ids: m(i)})


def at_isa(fn, level: str):
    """fn, to be timed with every kernel held to ``level`` (``measure`` enters the level around
    a side's calls, not each call: entering it costs more than a small lookup)."""
    def run():
        return fn()
    run.isa = level
    return run


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seq", type=int, default=50)
    ap.add_argument("--items", type=int, default=None, help="cap the table rows (CI runs)")
    ap.add_argument("--isa", nargs="+", default=[], metavar="LEVEL",
                    help="also time ours held to each of these ISA levels (e.g. avx2 avx512)")
    args = ap.parse_args(argv)
    print(f"{args.batch * args.seq} IDs per call; times are medians (us); ratio = torch / side, "
          f"median of {args.rounds} interleaved rounds")
    with torch.no_grad():
        for name, sides in cases(args.batch, args.seq, args.items):
            sides.update({f"ours@{lv}": at_isa(sides["ours"], lv) for lv in args.isa})
            for threads in args.threads:
                torch.set_num_threads(threads)
                med, ratio = measure(sides, args.rounds, args.reps)
                cols = "  ".join(f"{k} {v * 1e6:7.1f}" for k, v in med.items())
                rats = "  ".join(f"{k} {v:.2f}x" for k, v in ratio.items())
                print(f"{name:22s} {threads} thr  {cols}   {rats}", flush=True)


if __name__ == "__main__":
    main()
