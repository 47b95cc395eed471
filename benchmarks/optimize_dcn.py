"""Inference latency of a DCN model (MLPerf DLRM-v2's shape: 26 tables of D = 128 with its multi-hot
bag sizes, bottom MLP 13-512-256-128, a low-rank cross network of 3 layers, rank 512, on the
[B, 27 * 128] concatenation of the bottom MLP's output and the pooled rows, top MLP
1024-1024-512-256-1) as stock eager (a list of ``nn.EmbeddingBag``), ``convert()`` and
``optimize()`` (the lookups and the cross network's input: one fused op), and optionally
``torch.compile(stock)``.

Every variant runs in one process on ``--threads`` threads, interleaved round by round (each round
times every variant on the same batch, in a rotated order); printed: p50 per variant and the median
of the per-round ratios stock / variant.  The tables' rows are DLRM-v2's capped at ``--max-rows``.

    python benchmarks/optimize_dcn.py [--batch 1 2048] [--rounds 40] [--max-rows 20000] [--bits 4]
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 2048])
    p.add_argument("--rounds", type=int, default=40, help="rounds at batch 1 (fewer when larger)")
    p.add_argument("--max-rows", type=int, default=20_000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--compile", action="store_true", help="also torch.compile(stock)")
    p.add_argument("--bits", type=int, choices=[8, 4, 2], default=None,
                   help="convert() and optimize() with row-wise quantized tables of these bits "
                        "(checked against each other; stock stays float32)")
    return p.parse_args(argv)


def build(max_rows: int):
    import torch
    from torch import nn
    from perfkernels.datasets import DLRM_V2_ROWS

    class Cross(nn.Module):
        def __init__(self, width, layers=3, rank=512):
            super().__init__()
            self.V = nn.ParameterList(nn.Parameter(nn.init.xavier_normal_(
                torch.empty(rank, width))) for _ in range(layers))
            self.W = nn.ParameterList(nn.Parameter(nn.init.xavier_normal_(
                torch.empty(width, rank))) for _ in range(layers))
            self.b = nn.ParameterList(nn.Parameter(torch.zeros(width)) for _ in range(layers))

        def forward(self, x0):
            x = x0
            for V, W, b in zip(self.V, self.W, self.b):
                x = x0 * (nn.functional.linear(nn.functional.linear(x, V), W) + b) + x
            return x

    def mlp(sizes, width, last_relu=True):
        layers = []
        for i, n in enumerate(sizes):
            layers.append(nn.Linear(width, n))
            if last_relu or i < len(sizes) - 1:
                layers.append(nn.ReLU())
            width = n
        return nn.Sequential(*layers)

    class DCN(nn.Module):
        def __init__(self):
            super().__init__()
            rows = [min(r, max_rows) for r in DLRM_V2_ROWS]
            self.rows = rows
            self.emb = nn.ModuleList(nn.EmbeddingBag(r, 128, mode="sum") for r in rows)
            self.bottom = mlp((512, 256, 128), 13)
            self.cross = Cross(27 * 128)
            self.top = mlp((1024, 1024, 512, 256, 1), 27 * 128, last_relu=False)

        def forward(self, dense, indices, offsets):
            x = self.bottom(dense)
            pooled = torch.stack([m(i, o) for m, i, o in zip(self.emb, indices, offsets)], 1)
            c = torch.cat([x.unsqueeze(1), pooled], 1)
            return self.top(self.cross(c.reshape(x.shape[0], -1)))

    torch.manual_seed(0)
    return DCN().eval()


def inputs(model, batch, seed):
    import torch
    from perfkernels.datasets import DLRM_V2_BAG_SIZES
    g = torch.Generator().manual_seed(seed)
    idx = [torch.randint(0, r, (batch * k,), generator=g)
           for r, k in zip(model.rows, DLRM_V2_BAG_SIZES)]
    offs = [torch.arange(batch) * k for k in DLRM_V2_BAG_SIZES]
    return torch.rand(batch, 13, generator=g), idx, offs


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch
    import perfkernels
    import perfkernels.torch as pkt
    torch.set_num_threads(args.threads)
    perfkernels.set_num_threads(args.threads)
    stock = build(args.max_rows)
    kw = {} if args.bits is None else {"bits": args.bits}
    variants = {"stock": stock, "convert": pkt.convert(copy.deepcopy(stock), **kw),
                "optimize": pkt.optimize(copy.deepcopy(stock), **kw)}
    if args.compile:
        variants["compile(stock)"] = torch.compile(stock)
    tables = "float32" if args.bits is None else f"{args.bits}-bit rows (stock: float32)"
    print(f"threads {args.threads}, rows capped at {args.max_rows}, tables {tables}, inference "
          f"(no_grad)")
    for batch in args.batch:
        rounds = max(3, args.rounds if batch <= 64 else args.rounds // 8)
        x = inputs(stock, batch, 0)
        with torch.no_grad():
            want = stock(*x) if args.bits is None else variants["convert"](*x)
            for name, m in variants.items():          # warm up, capture, check
                for _ in range(2):
                    got = m(*x)
                if args.bits is None or name != "stock":
                    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=name)
        if batch == args.batch[0]:
            print(pkt.last_optimize_report())
        times = {n: [] for n in variants}
        names = list(variants)
        with torch.no_grad():
            for r in range(rounds):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    t = time.perf_counter()
                    variants[name](*x)
                    times[name].append(time.perf_counter() - t)
        for name in names:
            ratio = statistics.median(a / b for a, b in zip(times["stock"], times[name]))
            print(f"batch {batch:5d} {name:15s} p50 {statistics.median(times[name]) * 1e3:9.3f} ms"
                  f"  stock/this {ratio:5.2f}x  ({rounds} rounds)")


if __name__ == "__main__":
    main()
