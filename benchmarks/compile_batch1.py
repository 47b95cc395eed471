"""A converted DLRM under torch.compile against the compiled stock model, batch 1 (the serving
case), interleaved rounds, median of per-round ratios.

    python benchmarks/compile_batch1.py [--max-rows 1000] [--rounds 5] [--threads 1]

The model is examples/deploy/export.py's: the Criteo Kaggle DLRM of examples/dlrm.py, tables
capped at --max-rows rows (batch 1 reads 26 rows: the MLPs and the per-call overheads dominate).
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                                "deploy"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import export  # noqa: E402

import perfkernels.torch as pt  # noqa: E402


def p50_us(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-rows", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    stock = export.build(args.max_rows)
    converted = pt.convert(copy.deepcopy(stock))
    inputs = export.example_inputs(stock, 1)
    models = {"stock": torch.compile(export.Flat(stock)),
              "converted": torch.compile(export.Flat(converted))}
    with torch.no_grad():
        want = export.Flat(stock)(*inputs)
        for name, m in models.items():
            got = m(*inputs)                          # compile
            assert torch.allclose(got, want, atol=1e-5), name
        ratios = []
        for r in range(args.rounds):
            t = {name: p50_us(lambda m=m: m(*inputs), args.calls) for name, m in models.items()}
            ratios.append(t["stock"] / t["converted"])
            print(f"round {r}: stock {t['stock']:.1f} us, converted {t['converted']:.1f} us, "
                  f"converted is {ratios[-1]:.2f}x stock")
    print(f"median of per-round ratios: converted runs at {statistics.median(ratios):.2f}x "
          f"compiled stock ({args.threads} thread(s), batch 1)")


if __name__ == "__main__":
    main()
