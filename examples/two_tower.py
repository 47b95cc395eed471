"""A two-tower retrieval model in plain PyTorch, then the same model after
``perfkernels.torch.convert``.

The model is the usual two-tower (dual encoder) retriever of recommendation systems (YouTube's
"sampling-bias-corrected" retrieval, TorchRec's two-tower example): a user tower and an item tower
each map their sparse features to a unit vector of ``--out`` (64) floats, and a user's affinity to
an item is the dot product of the two.

- user tower: the user's ID (``nn.Embedding``, ``--users`` rows, 1M by default) and the mean of
  the items in their history (``nn.EmbeddingBag(mode="mean")`` over ``--items`` rows, 1M, a
  ``--history`` of 20 items, padding item 0), concatenated, then an MLP;
- item tower: the item's ID (``nn.Embedding``, ``--items`` rows) and its category
  (``nn.Embedding``, ``--categories`` rows), concatenated, then an MLP.

Training is in-batch softmax: each user's positive item against the other positives of the batch
(cross-entropy over ``[B, B]`` logits divided by a temperature).

What it does:

1. trains the stock model and a converted copy on the same batches, one step of each in turn, and
   checks that the loss curves agree.  Stock: every table with ``sparse=True`` and
   ``torch.optim.Adagrad`` on its sparse gradient; converted: each table updated during backward
   by perfkernels' fused Adagrad (``set_fused_optimizer``, the same formula), so no table
   gradient is materialised.  The MLPs: SGD on both sides.  Prints the time per training step.
2. retrieves: builds the item index (the item tower over ``--corpus`` items, in batches of
   ``--index-batch``), then for batches of ``--batch`` users computes the user tower and the top
   ``--k`` items by dot product.  Stock against converted under ``torch.no_grad()``: checks that
   the index and the scores agree, and prints the time to build the index and per query batch.

    python examples/two_tower.py                          # 1M users, 1M items
    python examples/two_tower.py --users 5000 --items 5000 --train-steps 5 --corpus 2000

Both sides use PyTorch's default thread count (``--threads`` sets it).  The converted model
differs from the stock one by ``perfkernels.torch.convert(model)`` and the fused optimizers.
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


def mlp(sizes: list[int]) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class TwoTower(torch.nn.Module):
    def __init__(self, users: int, items: int, categories: int, dim: int, out: int,
                 temperature: float = 0.05) -> None:
        super().__init__()
        self.user_id = torch.nn.Embedding(users, dim, sparse=True)
        self.history = torch.nn.EmbeddingBag(items, dim, mode="mean", sparse=True,
                                             padding_idx=0)
        self.item_id = torch.nn.Embedding(items, dim, sparse=True)
        self.category = torch.nn.Embedding(categories, dim // 4, sparse=True)
        self.user_mlp = mlp([2 * dim, 256, out])
        self.item_mlp = mlp([dim + dim // 4, 256, out])
        self.temperature = temperature

    def tables(self) -> list[torch.nn.Module]:
        return [self.user_id, self.history, self.item_id, self.category]

    def user(self, user: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.user_id(user), self.history(history)], dim=1)
        return F.normalize(self.user_mlp(x), dim=1)

    def item(self, item: torch.Tensor, category: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.item_id(item), self.category(category)], dim=1)
        return F.normalize(self.item_mlp(x), dim=1)

    def forward(self, user, history, item, category) -> torch.Tensor:
        """In-batch softmax loss: row b's positive is item b, the rest of the batch negatives."""
        logits = self.user(user, history) @ self.item(item, category).T / self.temperature
        return F.cross_entropy(logits, torch.arange(logits.shape[0]))


def category_of(items: torch.Tensor, categories: int) -> torch.Tensor:
    """A fixed category per item (a hash of its ID)."""
    return (items * 2654435761) % categories


def batches(args, gen: torch.Generator, n: int):
    """Synthetic interactions: users and items skewed to popular ones, histories of items."""
    for _ in range(n):
        user = (torch.rand(args.batch, generator=gen) ** 2 * args.users).long()
        item = (torch.rand(args.batch, generator=gen) ** 3 * (args.items - 1)).long() + 1
        history = (torch.rand(args.batch, args.history, generator=gen) ** 3
                   * (args.items - 1)).long() + 1
        lengths = torch.randint(1, args.history + 1, (args.batch, 1), generator=gen)
        history = history * (torch.arange(args.history).unsqueeze(0) < lengths)  # 0: padding
        yield user, history, item, category_of(item, args.categories)


def train(args, stock: TwoTower, ours: TwoTower) -> dict:
    table_params = [t.weight for t in stock.tables()]
    opt_stock = [torch.optim.Adagrad(table_params, lr=args.lr),
                 torch.optim.SGD([p for p in stock.parameters()
                                  if all(p is not q for q in table_params)], lr=args.lr)]
    for t in ours.tables():
        t.set_fused_optimizer(("adagrad", {"lr": args.lr, "eps": 1e-10}))
    ours_tables = [t.weight for t in ours.tables()]
    opt_ours = [torch.optim.SGD([p for p in ours.parameters()
                                 if all(p is not q for q in ours_tables)], lr=args.lr)]
    gen = torch.Generator().manual_seed(1)
    result = train_in_turn([("stock", stock, opt_stock), ("ours", ours, opt_ours)],
                           batches(args, gen, args.train_steps), alternate=True)
    losses, diff = result["losses"], result["max_loss_diff"]
    print(f"train: {args.train_steps} steps, in-batch softmax, loss {losses['stock'][0]:.4f} -> "
          f"{losses['stock'][-1]:.4f} (stock), max |stock - ours| = {diff:.2e}")
    if args.train_steps > 1:
        s, o = result["step_ms"]["stock"], result["step_ms"]["ours"]
        print(f"       time per step: stock (sparse Adagrad on 4 tables) {s:.1f} ms, ours (fused "
              f"Adagrad) {o:.1f} ms: {s / o:.2f}x")
    return result


def build_index(model: TwoTower, corpus: torch.Tensor, categories: int, batch: int
                ) -> torch.Tensor:
    """The item tower over every item of the corpus: ``[len(corpus), out]``."""
    return torch.cat([model.item(ids, category_of(ids, categories))
                      for ids in corpus.split(batch)])


def retrieve(args, stock: TwoTower, ours: TwoTower) -> dict:
    gen = torch.Generator().manual_seed(2)
    corpus = torch.randperm(args.items - 1, generator=gen)[:args.corpus] + 1
    times: dict[str, list] = {"stock index": [], "ours index": [], "stock": [], "ours": []}
    with torch.no_grad():
        for m in (stock, ours):
            m.eval()
        index = {}
        for _ in range(args.repeat):
            for name, m in (("stock", stock), ("ours", ours)):
                index[name], dt = timed(lambda m=m: build_index(m, corpus, args.categories,
                                                                args.index_batch))
                times[f"{name} index"].append(dt)
        index_diff = float((index["stock"] - index["ours"]).abs().max()) if len(corpus) else 0.0
        score_diff, same_items = 0.0, 0
        for user, history, _, _ in batches(args, gen, args.query_batches):
            for _ in range(args.repeat):
                found = {}
                for name, m in (("stock", stock), ("ours", ours)):
                    found[name], dt = timed(lambda m=m, name=name: torch.topk(
                        m.user(user, history) @ index[name].T, min(args.k, len(corpus)), dim=1))
                    times[name].append(dt)
            score_diff = max(score_diff, float((found["stock"].values
                                                - found["ours"].values).abs().max()))
            same_items += int((found["stock"].indices == found["ours"].indices).all(1).sum())
        for m in (stock, ours):
            m.train()
    med = {k: statistics.median(v) * 1e3 for k, v in times.items() if v}
    users = args.query_batches * args.batch
    print(f"retrieve: index of {len(corpus):,} items, {args.query_batches} query batches of "
          f"{args.batch} users, top {args.k}; max |stock - ours|: index {index_diff:.2e}, "
          f"scores {score_diff:.2e}; same top-{args.k} items for {same_items} of {users} users")
    print(f"       build the index: stock {med['stock index']:.1f} ms, ours "
          f"{med['ours index']:.1f} ms: {med['stock index'] / med['ours index']:.2f}x; per query "
          f"batch: stock {med['stock']:.2f} ms, ours {med['ours']:.2f} ms: "
          f"{med['stock'] / med['ours']:.2f}x")
    return {"max_index_diff": index_diff, "max_score_diff": score_diff,
            "same_top_k": same_items / max(users, 1), "ms": med}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, default=1_000_000)
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--categories", type=int, default=1000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--out", type=int, default=64, help="the towers' output size")
    ap.add_argument("--history", type=int, default=20)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--train-steps", type=int, default=20)
    ap.add_argument("--corpus", type=int, default=100_000, help="items in the retrieval index")
    ap.add_argument("--index-batch", type=int, default=8192)
    ap.add_argument("--query-batches", type=int, default=5)
    ap.add_argument("--k", type=int, default=100)
    common_options(ap, "index and query batch")
    return ap.parse_args(argv)


def run(args) -> dict:
    pkt = start(args)
    if args.items < 2 or args.corpus > args.items - 1:
        sys.exit(f"--corpus ({args.corpus}) must be at most --items - 1 ({args.items - 1})")
    stock = TwoTower(args.users, args.items, args.categories, args.dim, args.out)
    ours = pkt.convert(copy.deepcopy(stock), inplace=True)
    assert type(ours.user_id) is pkt.Embedding and type(ours.history) is pkt.EmbeddingBag
    print(f"two-tower: {args.users:,} users, {args.items:,} items x {args.dim}, history "
          f"{args.history}, batch {args.batch}, {torch.get_num_threads()} threads")
    result = {}
    if args.corpus and args.query_batches:
        result["retrieve"] = retrieve(args, stock, ours)
        worst = max(result["retrieve"]["max_index_diff"], result["retrieve"]["max_score_diff"])
        check(worst, args, "index or scores")
    if args.train_steps:
        result["train"] = train(args, stock, ours)
        check(result["train"]["max_loss_diff"], args, "loss curves")
    return result


if __name__ == "__main__":
    run(parse_args())
