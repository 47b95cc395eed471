"""The SASRec example with its item table costing nothing: how much any lookup could gain.

``examples/sasrec.py``'s model, three ways, timed in turn in one process:

- ``stock``: the model as written (``torch.nn.Embedding`` item table; training: torch's
  ``Adagrad`` on its sparse gradient);
- ``ours``: ``perfkernels.torch.convert(model)`` (training: the item table's fused Adagrad);
- ``free``: the stock model whose item lookup returns a tensor computed once (serving) or a
  parameter no optimizer steps (training: its gradient is still computed, as any table's would
  be): the lookup, its gradient's scatter and the table update cost nothing.

``stock / free`` is the most that any implementation of the item table (lookup, gradient and
update) could gain end to end; ``ours / free`` is how far ours is from that.

    python benchmarks/ceiling/sasrec_ceiling.py [--threads 1 2] [--rounds 15]

Needs PyTorch and an installed perfkernels.  Not an asv benchmark.
"""
from __future__ import annotations

import argparse
import copy
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
import sasrec  # noqa: E402

import perfkernels.torch as pkt  # noqa: E402


class _Fixed(torch.nn.Module):
    """An item 'lookup' that returns the same rows whatever it is given."""

    def __init__(self, rows: torch.Tensor, trainable: bool) -> None:
        super().__init__()
        self.rows = torch.nn.Parameter(rows.clone(), requires_grad=trainable)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.rows


def _ratios(per: dict) -> str:
    med = {k: statistics.median(v) * 1e3 for k, v in per.items()}

    def ratio(a, b):
        return statistics.median(x / y for x, y in zip(per[a], per[b]))
    return ("  ".join(f"{k} {v:6.2f}" for k, v in med.items())
            + f"   stock/ours {ratio('stock', 'ours'):.2f}x  stock/free "
            f"{ratio('stock', 'free'):.2f}x  ours/free {ratio('ours', 'free'):.2f}x")


def serve(args, stock, ours) -> str:
    gen = torch.Generator().manual_seed(2)
    history, _, _ = next(sasrec.batches(args, gen, 1))
    cand = torch.randint(1, args.items + 1, (args.batch, args.candidates), generator=gen)
    with torch.no_grad():
        free = copy.deepcopy(stock)
        free.item_emb = _Fixed(stock.item_emb(torch.cat([history, cand], 1)), False)
        sides = {name: (lambda m=m: m.predict(history, cand))
                 for name, m in (("stock", stock), ("ours", ours), ("free", free))}
        per = {k: [] for k in sides}
        for _ in range(args.rounds):
            for k, fn in sides.items():
                fn()
                start = time.perf_counter()
                for _ in range(5):
                    fn()
                per[k].append((time.perf_counter() - start) / 5)
    return _ratios(per)


def train(args, stock, ours) -> str:
    gen = torch.Generator().manual_seed(1)
    data = list(sasrec.batches(args, gen, 4))
    h, p, n = data[0]
    free = copy.deepcopy(stock)
    free.item_emb = _Fixed(stock.item_emb(torch.cat([h, p, n], 1)).detach(), True)
    ours.item_emb.set_fused_optimizer(("adagrad", {"lr": args.lr, "eps": 1e-10}))

    def dense_opt(m):
        return torch.optim.SGD([q for k, q in m.named_parameters()
                                if not k.startswith("item_emb")], lr=args.lr)
    sides = {"stock": (stock, [dense_opt(stock),
                               torch.optim.Adagrad([stock.item_emb.weight], lr=args.lr)]),
             "ours": (ours, [dense_opt(ours)]), "free": (free, [dense_opt(free)])}
    per = {k: [] for k in sides}
    for r in range(args.rounds + 2):
        for k, (m, opts) in sides.items():
            start = time.perf_counter()
            for o in opts:
                o.zero_grad(set_to_none=True)
            m(*data[r % len(data)]).backward()
            for o in opts:
                o.step()
            if r >= 2:          # the first steps make the optimizers' state
                per[k].append(time.perf_counter() - start)
    return _ratios(per)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    model_args = sasrec.parse_args([])
    model_args.rounds = args.rounds
    torch.manual_seed(0)
    stock = sasrec.SASRec(model_args.items, model_args.dim, model_args.seq, model_args.blocks)
    ours = pkt.convert(copy.deepcopy(stock), inplace=True)
    print(f"SASRec {model_args.items:,} items x {model_args.dim}, sequence {model_args.seq}, "
          f"batch {model_args.batch}; ms, medians of {args.rounds} interleaved rounds")
    for threads in args.threads:
        torch.set_num_threads(threads)
        print(f"serve  {threads} thr  {serve(model_args, stock, ours)}", flush=True)
    for threads in args.threads:
        torch.set_num_threads(threads)
        print(f"train  {threads} thr  {train(model_args, copy.deepcopy(stock), copy.deepcopy(ours))}",
              flush=True)


if __name__ == "__main__":
    main()
