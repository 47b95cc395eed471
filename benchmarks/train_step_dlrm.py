"""Small-batch training of the reference DLRM at Criteo Kaggle's shape (26 tables x 16, rows
capped at ``--max-rows``, bottom MLP 13-512-256-64-16, top MLP 367-512-256-1, one index per table
and sample): the latency of one training step (forward, binary cross-entropy, backward, optimizer
step) of stock PyTorch with torch's sparse SGD or Adagrad on the tables, against ``convert()`` and
``optimize()`` with the same optimizer fused into the tables (torch's for the MLPs).

Every column runs in one process (``--threads``, default 1), round by round in a rotated order;
printed per batch: p50 / p99 per step and the median over rounds of stock's time / the column's.

    python benchmarks/train_step_dlrm.py [--batches 1,8,32,128] [--optimizer sgd|adagrad]

The same measurement is ``examples/dlrm.py --latency --train-step``.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _latency_module():
    path = os.path.join(ROOT, "examples", "dlrm_latency.py")
    spec = importlib.util.spec_from_file_location("perfkernels_dlrm_latency", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", default="1,8,32,128")
    p.add_argument("--optimizer", dest="fused_optimizer", choices=["sgd", "adagrad"],
                   default="sgd")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--budget", type=float, default=60.0,
                   help="seconds per batch size after which the rounds stop early")
    p.add_argument("--distinct", type=int, default=4)
    p.add_argument("--max-rows", type=int, default=100_000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.dim = args.bag_size = None
    return _latency_module().run_step_latency(args)


if __name__ == "__main__":
    main()
