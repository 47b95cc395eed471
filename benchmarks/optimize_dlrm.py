"""Whole-model latency of the reference DLRM (facebookresearch ``DLRM_Net``'s operations, Criteo
Kaggle shape: 26 tables x 16 dims, bottom MLP 13-512-256-64-16, top MLP 512-256-1, one-hot lookups,
inference) for stock eager, ``torch.compile(stock)``, ``convert()``, ``optimize()`` and
``torch.compile(optimize())``, and the 26-table embedding stage alone (stock's loop of
``nn.EmbeddingBag``, convert()'s loop of ours, and one fused lookup writing ``[B, 16 + 26 * 16]``,
called as optimize()'s eager graph calls it and as the registered op).

Every variant runs in one process (on one thread, or ``--threads N``; 0: each side's default),
interleaved round by round (each round times
every variant on the same batch, in a rotated order); printed: p50 and p99 per variant and the
median of the per-round ratios stock eager / variant.

    python benchmarks/optimize_dlrm.py [--batch 1 128 2048] [--rounds 200] [--max-rows 100000]

The tables' rows are Criteo Kaggle's cardinalities capped at ``--max-rows`` (memory on a small
machine).  The DLRM model is examples/dlrm_reference.py (facebookresearch's architecture and torch
operations, written here; built by tests/dlrm_models.py).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

KAGGLE_ROWS = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
               27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 128, 2048])
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--max-rows", type=int, default=100_000)
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants")
    p.add_argument("--threads", type=int, default=1,
                   help="threads of both sides (0: each side's default, torch's intra-op count)")
    return p.parse_args(argv)


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    import perfkernels
    import perfkernels.torch as pkt
    from perfkernels.torch import _fused_ops
    from dlrm_models import dlrm_inputs, dlrm_net
    if args.threads:
        perfkernels.set_num_threads(args.threads)

    rows = [min(r, args.max_rows) for r in KAGGLE_ROWS]
    stock = dlrm_net(rows, 16, [13, 512, 256, 64, 16], [512, 256, 1], "dot", False).eval()
    converted = pkt.convert(stock)
    optimized = pkt.optimize(stock)
    threads = (f"{args.threads} thread(s)" if args.threads else
               f"default threads (torch {torch.get_num_threads()}, perfkernels "
               f"{perfkernels.get_num_threads()})")
    print(f"# torch {torch.__version__}, perfkernels ISA {perfkernels.active_isa()}, {threads}, "
          f"rows capped at {args.max_rows}")
    for batch in args.batch:
        inputs = [dlrm_inputs(rows, batch, 13, seed=s) for s in range(8)]
        variants = {"stock eager": stock, "convert()": converted, "optimize()": optimized}
        with torch.no_grad():
            optimized(*inputs[0])           # capture
            if not args.no_compile:
                variants["compile(stock)"] = torch.compile(stock, dynamic=False)
                variants["compile(optimize())"] = torch.compile(optimized, dynamic=False)
                for m in variants.values():
                    m(*inputs[0])
                    m(*inputs[0])
            # the embedding stage alone
            dense0 = torch.rand(batch, 16)
            emb_stock = lambda x: [e(i, o) for e, i, o in zip(stock.emb_l, x[2], x[1])]  # noqa
            emb_conv = lambda x: [e(i, o) for e, i, o in zip(converted.emb_l, x[2], x[1])]  # noqa
            weights = [e.weight for e in converted.emb_l]
            # what a compiled no-grad graph calls: the native op, no autograd kernel
            op = torch.ops.perfkernels.embedding_bags_interaction_inference
            eager = _fused_ops.embedding_bags_interaction

            def emb_fused(x):       # what optimize()'s eager graph calls
                return eager(dense0, weights, x[2], x[1], False, "cat", "dlrm", False,
                             [0] * 26, [-1] * 26, [0] * 26, [16] * 26, 0)

            def emb_op(x):          # the registered op (what a compiled graph calls)
                return op(dense0, weights, x[2], x[1], False, "cat", "dlrm", False,
                          [0] * 26, [-1] * 26, [0] * 26, [16] * 26, 0)
            stages = {"emb: stock loop": emb_stock, "emb: convert() loop": emb_conv,
                      "emb: fused (eager)": emb_fused, "emb: fused op": emb_op}
            times = {k: [] for k in list(variants) + list(stages)}
            calls = [(k, (lambda m=m: (lambda x: m(*x)))()) for k, m in variants.items()]
            calls += list(stages.items())
            for _ in range(10):
                for _, fn in calls:
                    fn(inputs[0])
            for r in range(args.rounds):
                x = inputs[r % len(inputs)]
                shift = r % len(calls)
                for k, fn in calls[shift:] + calls[:shift]:
                    t0 = time.perf_counter()
                    fn(x)
                    times[k].append(time.perf_counter() - t0)
        print(f"\nbatch {batch}: p50 / p99 in microseconds; ratio = median over rounds of "
              f"stock's time / the variant's")
        for group, base in ((list(variants), "stock eager"), (list(stages), "emb: stock loop")):
            for k in group:
                ratio = statistics.median(a / b for a, b in zip(times[base], times[k]))
                print(f"  {k:22s} {pct(times[k], .5) * 1e6:9.1f} {pct(times[k], .99) * 1e6:9.1f}"
                      f"   {ratio:5.2f}x")


if __name__ == "__main__":
    main()
