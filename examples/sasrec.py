"""SASRec (self-attentive sequential recommendation) in plain PyTorch, then the same model after
``perfkernels.torch.convert``.

The model is SASRec of Kang & McAuley (2018): an item table (``--items`` rows, 1M by default, of
dimension ``--dim`` 64, row 0 the padding item), a learned positional table, ``--blocks`` (2)
causal transformer blocks over the user's last ``--seq`` (50) items, and scores that are dot
products of each position's hidden state with item embeddings.  Training is SASRec's: for every
position, the next item (positive) against one random item (negative), binary cross-entropy.  The
positive, negative and history items of a batch are looked up in one call of the item table.

What it does:

1. trains the stock model and a converted copy on the same batches, one step of each in turn, and
   checks that the loss curves agree.  Stock: the item table with ``sparse=True`` and
   ``torch.optim.Adagrad`` on its sparse gradient; converted: the item table updated during
   backward by perfkernels' fused Adagrad (``Embedding.set_fused_optimizer``, the same formula),
   so it never materialises a gradient.  The rest of both models: SGD.  Prints the time per
   training step of each side.
2. serves: scores ``--candidates`` (100) items for each user's next item from the last position,
   stock against converted under ``torch.no_grad()``, checks that the predictions agree and
   prints the time per batch, end to end and for the item lookup alone.

    python examples/sasrec.py                          # 1M items, batch 256
    python examples/sasrec.py --items 5000 --batch 32 --train-steps 5 --infer-batches 2

Both sides use PyTorch's default thread count (``--threads`` sets it).  The converted model
differs from the stock one by ``perfkernels.torch.convert(model)`` and the fused optimizer.
"""
from __future__ import annotations

import argparse
import copy
import pathlib
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _compare import check, common_options, start, timed, train_in_turn  # noqa: E402


class SASRec(torch.nn.Module):
    def __init__(self, items: int, dim: int, seq: int, blocks: int, heads: int = 1) -> None:
        super().__init__()
        self.item_emb = torch.nn.Embedding(items + 1, dim, padding_idx=0, sparse=True)
        self.pos_emb = torch.nn.Embedding(seq, dim)
        layer = torch.nn.TransformerEncoderLayer(dim, heads, dim_feedforward=dim, dropout=0.0,
                                                 batch_first=True, norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, blocks, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(dim)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(seq),
                             persistent=False)
        self.seq = seq

    def encode(self, history_rows: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(self.seq, device=history.device)
        x = history_rows * (history_rows.shape[-1] ** 0.5) + self.pos_emb(positions)
        x = x * (history != 0).unsqueeze(-1)
        return self.norm(self.blocks(x, mask=self.mask, is_causal=True))

    def forward(self, history: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
        """SASRec's training loss for one batch (one lookup of every item of the batch)."""
        b, s = history.shape
        rows = self.item_emb(torch.cat([history, pos, neg], dim=1))
        h = self.encode(rows[:, :s], history)
        pos_logit = (h * rows[:, s:2 * s]).sum(-1)
        neg_logit = (h * rows[:, 2 * s:]).sum(-1)
        valid = (pos != 0).float()
        loss = (F.binary_cross_entropy_with_logits(pos_logit, torch.ones_like(pos_logit),
                                                   reduction="none")
                + F.binary_cross_entropy_with_logits(neg_logit, torch.zeros_like(neg_logit),
                                                     reduction="none"))
        return (loss * valid).sum() / valid.sum()

    def predict(self, history: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Scores ``[B, C]`` of the candidate items for each user's next item."""
        s = history.shape[1]
        rows = self.item_emb(torch.cat([history, candidates], dim=1))
        h = self.encode(rows[:, :s], history)[:, -1]
        return (rows[:, s:] * h.unsqueeze(1)).sum(-1)


def batches(args, gen: torch.Generator, n: int):
    """Synthetic sessions: item IDs skewed to popular items, short histories left-padded."""
    for _ in range(n):
        ids = (torch.rand(args.batch, args.seq + 1, generator=gen) ** 3 * args.items).long() + 1
        ids = ids.clamp(max=args.items)
        lengths = torch.randint(args.seq // 4, args.seq + 1, (args.batch, 1), generator=gen)
        keep = torch.arange(args.seq + 1).flip(0).unsqueeze(0) <= lengths
        ids = ids * keep
        neg = torch.randint(1, args.items + 1, (args.batch, args.seq), generator=gen)
        yield ids[:, :-1].contiguous(), ids[:, 1:].contiguous(), neg * (ids[:, 1:] != 0)


def train(args, stock: SASRec, ours: SASRec) -> dict:
    opt_stock = [torch.optim.Adagrad([stock.item_emb.weight], lr=args.lr),
                 torch.optim.SGD([p for n, p in stock.named_parameters()
                                  if n != "item_emb.weight"], lr=args.lr)]
    ours.item_emb.set_fused_optimizer(("adagrad", {"lr": args.lr, "eps": 1e-10}))
    opt_ours = [torch.optim.SGD([p for n, p in ours.named_parameters()
                                 if n != "item_emb.weight"], lr=args.lr)]
    gen = torch.Generator().manual_seed(1)
    result = train_in_turn([("stock", stock, opt_stock), ("ours", ours, opt_ours)],
                           batches(args, gen, args.train_steps))
    losses, diff = result["losses"], result["max_loss_diff"]
    print(f"train: {args.train_steps} steps, loss {losses['stock'][0]:.4f} -> "
          f"{losses['stock'][-1]:.4f} (stock), max |stock - ours| = {diff:.2e}")
    if args.train_steps > 1:
        s, o = result["step_ms"]["stock"], result["step_ms"]["ours"]
        print(f"       time per step: stock (sparse Adagrad) {s:.1f} ms, ours (fused Adagrad) "
              f"{o:.1f} ms: {s / o:.2f}x")
    return result


def infer(args, stock: SASRec, ours: SASRec) -> dict:
    gen = torch.Generator().manual_seed(2)
    times = {"stock": [], "ours": [], "stock lookup": [], "ours lookup": []}
    diff = 0.0
    with torch.no_grad():
        for history, _, _ in batches(args, gen, args.infer_batches + 1):
            cand = torch.randint(1, args.items + 1, (args.batch, args.candidates), generator=gen)
            ids = torch.cat([history, cand], dim=1)
            for _ in range(args.repeat):
                a, ta = timed(lambda: stock.predict(history, cand))
                b, tb = timed(lambda: ours.predict(history, cand))
                _, la = timed(lambda: stock.item_emb(ids))
                _, lb = timed(lambda: ours.item_emb(ids))
                for k, v in (("stock", ta), ("ours", tb), ("stock lookup", la),
                             ("ours lookup", lb)):
                    times[k].append(v)
            diff = max(diff, float((a - b).abs().max()))
    med = {k: statistics.median(v[args.repeat:] or v) * 1e3 for k, v in times.items()}
    print(f"serve: {args.infer_batches} batches of {args.batch} users x {args.candidates} "
          f"candidates, max |stock - ours| = {diff:.2e}")
    print(f"       time per batch: stock {med['stock']:.2f} ms, ours {med['ours']:.2f} ms: "
          f"{med['stock'] / med['ours']:.2f}x; item lookup alone: stock "
          f"{med['stock lookup']:.3f} ms, ours {med['ours lookup']:.3f} ms: "
          f"{med['stock lookup'] / med['ours lookup']:.2f}x")
    return {"max_pred_diff": diff, "batch_ms": med}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--seq", type=int, default=50)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--candidates", type=int, default=100)
    ap.add_argument("--train-steps", type=int, default=20)
    ap.add_argument("--infer-batches", type=int, default=10)
    common_options(ap, "inference batch")
    return ap.parse_args(argv)


def run(args) -> dict:
    pkt = start(args)
    stock = SASRec(args.items, args.dim, args.seq, args.blocks)
    ours = pkt.convert(copy.deepcopy(stock), inplace=True)
    assert type(ours.item_emb) is pkt.Embedding
    print(f"SASRec: {args.items:,} items x {args.dim}, sequence {args.seq}, {args.blocks} blocks, "
          f"batch {args.batch}, {torch.get_num_threads()} threads")
    result = {}
    if args.infer_batches:
        result["infer"] = infer(args, stock, ours)
        check(result["infer"]["max_pred_diff"], args, "predictions")
    if args.train_steps:
        result["train"] = train(args, stock, ours)
        check(result["train"]["max_loss_diff"], args, "loss curves")
    return result


if __name__ == "__main__":
    run(parse_args())
