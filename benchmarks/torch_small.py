"""perfkernels.torch where a call is too small for the kernel to matter: the Python around it.

    python benchmarks/torch_small.py [--rounds 30] [--threads 1]

Two comparisons, each interleaved in one process (round after round, every contender once per
round) and reported as the median time and the median of the per-round ratios:

1. an eager tiny call (one bag of one index, 1,000 x 16 table, no grad): an identity
   ``nn.Module`` call, stock ``torch.nn.EmbeddingBag``, ``perfkernels.torch.EmbeddingBag`` and
   ``perfkernels.embedding_bag`` on NumPy arrays.  The module's own cost is ours minus (identity
   module + NumPy call);
2. a small DLRM (tables of 1,000 / 2,000 / 3,000 rows x 16, batch 128, bags of 1 to 10
   indices, bottom MLP 13-64-16, top MLP 22-64-1): stock against ``perfkernels.torch.convert``,
   for the inference forward (no grad) and one training step (forward, BCE loss, backward,
   SGD step with sparse table gradients).

A benchmark, not a test: it asserts nothing about time (the two models' outputs are checked to
agree).
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from torch import nn

import perfkernels as pk
import perfkernels.torch as pt


def _interleaved(fns: dict, rounds: int, calls: int) -> dict:
    """Per contender: the list of per-call times (us), one per round, contenders interleaved
    (in reverse order every other round, so that no contender always follows the same one)."""
    times = {name: [] for name in fns}
    for r in range(rounds):
        for name, fn in (reversed(fns.items()) if r % 2 else fns.items()):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - t0) / calls * 1e6)
    return times


def _ratio(times: dict, a: str, b: str) -> float:
    """Median over rounds of time(a) / time(b)."""
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


class _Identity(nn.Module):
    def forward(self, input, offsets=None):
        return input


def tiny_call(rounds: int) -> dict:
    stock = nn.EmbeddingBag(1000, 16, mode="sum")
    ours = pt.EmbeddingBag(1000, 16, mode="sum")
    ours.load_state_dict(stock.state_dict())
    ix, off = torch.tensor([3]), torch.tensor([0])
    w, ixn, offn = stock.weight.detach().numpy(), ix.numpy(), off.numpy()
    identity = _Identity()
    assert torch.equal(ours(ix, off), stock(ix, off))
    with torch.no_grad():
        times = _interleaved({
            "identity module": lambda: identity(ix, off),
            "torch.nn.EmbeddingBag": lambda: stock(ix, off),
            "perfkernels.torch.EmbeddingBag": lambda: ours(ix, off),
            "perfkernels.embedding_bag (NumPy)": lambda: pk.embedding_bag(w, ixn, offn),
        }, rounds, 2000)
    return times


def _mlp(sizes: list[int], last_sigmoid: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        layers.append(nn.Sigmoid() if last_sigmoid and i == len(sizes) - 2 else nn.ReLU())
    return nn.Sequential(*layers)


class SmallDLRM(nn.Module):
    """DLRM's architecture at a small size: bottom MLP, one EmbeddingBag per sparse feature,
    pairwise dot interaction, top MLP."""

    def __init__(self, rows=(1000, 2000, 3000), dim: int = 16) -> None:
        super().__init__()
        self.bottom = _mlp([13, 64, dim])
        self.tables = nn.ModuleList(nn.EmbeddingBag(n, dim, mode="sum", sparse=True)
                                    for n in rows)
        f = len(rows) + 1
        self.top = _mlp([dim + f * (f - 1) // 2, 64, 1], last_sigmoid=True)
        r, c = torch.tril_indices(f, f, offset=-1)
        self.register_buffer("pairs", r * f + c, persistent=False)

    def forward(self, dense, indices, offsets):
        x = self.bottom(dense)
        t = torch.stack([x] + [e(i, o) for e, i, o in zip(self.tables, indices, offsets)], dim=1)
        z = torch.bmm(t, t.transpose(1, 2)).flatten(1)
        return self.top(torch.cat([x, z[:, self.pairs]], dim=1)).squeeze(1)


def _batch(rows, batch: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    dense = torch.rand(batch, 13, generator=gen)
    indices, offsets = [], []
    for n in rows:
        lengths = torch.randint(1, 11, (batch,), generator=gen)
        indices.append(torch.randint(0, n, (int(lengths.sum()),), generator=gen))
        offsets.append(torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)[:-1]]))
    labels = (torch.rand(batch, generator=gen) < 0.25).float()
    return dense, indices, offsets, labels


def small_dlrm(rounds: int) -> dict:
    rows = (1000, 2000, 3000)
    torch.manual_seed(0)
    stock = SmallDLRM(rows)
    ours = pt.convert(copy.deepcopy(stock))
    dense, ix, off, labels = _batch(rows, 128, 1)
    with torch.no_grad():
        torch.testing.assert_close(ours(dense, ix, off), stock(dense, ix, off))
    loss_fn = nn.BCELoss()
    opts = {id(m): torch.optim.SGD(m.parameters(), lr=0.01) for m in (stock, ours)}

    def step(model):
        opt = opts[id(model)]
        opt.zero_grad()
        loss_fn(model(dense, ix, off), labels).backward()
        opt.step()

    def infer(model):
        with torch.no_grad():
            model(dense, ix, off)

    return _interleaved({
        "inference, stock": lambda: infer(stock),
        "inference, converted": lambda: infer(ours),
        "training step, stock": lambda: step(stock),
        "training step, converted": lambda: step(ours),
    }, rounds, 50)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    pk.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.rounds} rounds; "
          f"us per call, median and best round")
    t = tiny_call(args.rounds)
    for name, v in t.items():
        print(f"  {name:36s} {statistics.median(v):8.2f} {min(v):8.2f}")
    extra = [o - i - n for o, i, n in zip(t["perfkernels.torch.EmbeddingBag"],
                                          t["identity module"],
                                          t["perfkernels.embedding_bag (NumPy)"])]
    print(f"  our module above identity module + NumPy call: {statistics.median(extra):.2f} us "
          f"(best round {min(extra):.2f}); stock / ours: "
          f"{_ratio(t, 'torch.nn.EmbeddingBag', 'perfkernels.torch.EmbeddingBag'):.2f}x")
    d = small_dlrm(args.rounds)
    for name, v in d.items():
        print(f"  {name:36s} {statistics.median(v):8.1f} {min(v):8.1f}")
    for what in ("inference", "training step"):
        print(f"  {what}: stock / converted = "
              f"{_ratio(d, f'{what}, stock', f'{what}, converted'):.3f}x")


if __name__ == "__main__":
    main()
