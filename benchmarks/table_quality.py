"""The quality of quantized tables, measured: AUC and log-loss of a reduced DLRM-v2 whose trained
tables are stored as float32, float16, 8-bit, 4-bit and 4-bit big / 8-bit small rows.

1. **Data with a planted signal.**  :class:`perfkernels.datasets.CriteoLike` inputs (MLPerf
   DLRM-v2's 26 multi-hot features, power-law IDs) over tables whose rows are MLPerf's divided by
   ``--scale`` and capped at ``--cap``; a hidden *teacher* labels every pair: label 1 with
   probability ``sigmoid(logit)``, the logit a sum of per-row effects (mean over each bag), dot
   products of per-row vectors of feature pairs, and a linear term in the dense features
   (:class:`Teacher`).  The teacher's values are drawn from its own seed; nothing of it is shared
   with the student but the inputs.
2. **Training in float32**, ``--steps`` steps of ``--batch`` pairs: D = 128 sum-pooled tables
   (``nn.EmbeddingBag``, sparse gradients, plain SGD; Adam for the dense part) initialised as
   TorchRec does (uniform(-sqrt(1/rows), sqrt(1/rows))), a bottom MLP, a low-rank cross network
   on the 27 x 128 concatenation and a top MLP, narrower than DLRM-v2's (``--width``: its dense
   part does not train in minutes on 2 cores; the tables and the interaction's shape are
   DLRM-v2's).
3. **Each format**: the trained tables converted by :func:`perfkernels.tables.build_table`
   (bit for bit torch's row-wise prepack for 8/4-bit), looked up by one
   :func:`perfkernels.embedding_bags_multi` call, the same dense part; AUC and log-loss on
   ``--eval`` held-out pairs, the difference of AUC against float32, and the logits' error.
4. **The full-size shape, sampled rows** (``--full-size-pairs``): DLRM-v2's full row counts
   (204M rows), its full dense part (untrained, seeded), inputs over the full tables.  A logit
   depends only on the rows its pair touches, so each table holds just the rows the batch touches,
   drawn from the full-size table's initial distribution (uniform(-sqrt(1/rows), sqrt(1/rows))
   with the full ``rows``); the logits of every format are compared with float32's.

    python benchmarks/table_quality.py --int8-dense --full-size-pairs 256 --plot /tmp/auc.png

AUC is the rank statistic (Mann-Whitney: the share of positive-negative pairs ordered right, ties
counting one half), :func:`auc`.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Optional, Sequence

import numpy as np
import torch
from torch import nn

import perfkernels as pk
from perfkernels import datasets, tables

DIM = 128
#: full-size rows from which a table counts as big (4-bit in the 4/8 mix)
BIG_ROWS = 1_000_000
FORMATS = ("float32", "float16", "8", "4", "4:big,8:small")


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` for binary ``labels``: the probability that a
    random positive scores above a random negative, ties counting one half (from the average
    ranks of the scores).  NaN when a class is missing."""
    scores = np.asarray(scores, np.float64).ravel()
    labels = np.asarray(labels).ravel().astype(bool)
    if scores.shape != labels.shape:
        raise ValueError(f"scores and labels differ in shape: {scores.shape} and {labels.shape}")
    pos, n = int(labels.sum()), labels.size
    neg = n - pos
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(n, np.float64)
    # average rank (1-based) of each run of equal scores
    starts = np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1]]))
    ends = np.concatenate([starts[1:], [n]])
    avg = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def log_loss(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean binary cross-entropy of ``sigmoid(logits)`` against ``labels`` (natural log)."""
    z = np.asarray(logits, np.float64).ravel()
    y = np.asarray(labels, np.float64).ravel()
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


def mix_formats(spec: str, full_rows: Sequence[int]) -> list:
    """Each table's format: one for all, or ``4:big,8:small`` (big: ``BIG_ROWS`` full-size rows
    and more)."""
    if spec == "4:big,8:small":
        return [4 if r >= BIG_ROWS else 8 for r in full_rows]
    return [tables.table_format(int(spec) if spec.isdigit() else spec)] * len(full_rows)


def _pool_mean(values: torch.Tensor, lengths: torch.Tensor, table: torch.Tensor,
               start: int, batch: int) -> torch.Tensor:
    offs = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    return nn.functional.embedding_bag(values[offs[start]:offs[start + batch]], table,
                                       offs[start:start + batch] - offs[start], mode="mean")


class Teacher:
    """The hidden labeller: ``logit = bias + sum_f a_f * mean_bag(e_f) + sum_{(f,g)} <mean_bag(
    u_f), mean_bag(u_g)> + dense @ w``, with per-row scalars ``e_f`` and 4-vectors ``u_f``
    (normal), a fixed set of feature pairs, all scaled so that the logit's spread is about
    ``strength``; ``bias`` sets about ``rate`` of positive labels."""

    def __init__(self, rows: Sequence[int], seed: int, dense: int = datasets.DLRM_V2_DENSE,
                 strength: float = 2.0, rate: float = 0.25, pairs: int = 13) -> None:
        g = torch.Generator().manual_seed(10_000 + seed)
        self.effects = [torch.randn(r, 1, generator=g) for r in rows]
        self.vectors = [torch.randn(r, 4, generator=g) / 2 for r in rows]
        F = len(rows)
        idx = torch.randperm(F * F, generator=g).tolist()
        self.pairs = [(i // F, i % F) for i in idx if i // F < i % F][:pairs]
        self.a = torch.randn(F, generator=g)
        self.w = torch.randn(dense, generator=g) / math.sqrt(dense)
        self.scale, self.bias = 1.0, 0.0
        self.strength, self.rate = strength, rate

    def raw(self, batch: datasets.Batch) -> torch.Tensor:
        B = batch.batch_size
        values, lengths = torch.from_numpy(batch.values), torch.from_numpy(batch.lengths)
        z = torch.from_numpy(batch.dense) @ self.w
        u = []
        for f, (e, v) in enumerate(zip(self.effects, self.vectors)):
            z = z + self.a[f] * _pool_mean(values, lengths, e, f * B, B)[:, 0]
            u.append(_pool_mean(values, lengths, v, f * B, B))
        for f, g in self.pairs:
            z = z + (u[f] * u[g]).sum(1)
        return z

    def calibrate(self, batch: datasets.Batch) -> None:
        """Set the scale and bias from one batch (spread ``strength``, ``rate`` positives)."""
        z = self.raw(batch)
        self.scale = self.strength / float(z.std())
        self.bias = -float(torch.quantile(z * self.scale, 1 - self.rate))

    def labels(self, batch: datasets.Batch, seed: int) -> np.ndarray:
        p = torch.sigmoid(self.raw(batch) * self.scale + self.bias)
        g = torch.Generator().manual_seed(seed)
        return (torch.rand(p.shape, generator=g) < p).float().numpy()


# the dense part's pieces are the DLRM-v2 example's (examples/dlrm_v2.py)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from dlrm_v2 import LowRankCrossNet as CrossNet, mlp  # noqa: E402


class Dense(nn.Module):
    """The dense part: bottom MLP (to D), cross network and top MLP on ``[B, (F + 1) * D]``."""

    def __init__(self, features: int, bottom: Sequence[int], layers: int, rank: int,
                 top: Sequence[int], dense: int = datasets.DLRM_V2_DENSE) -> None:
        super().__init__()
        self.bottom = mlp(list(bottom) + [DIM], dense)
        self.cross = CrossNet((features + 1) * DIM, layers, rank)
        self.top = mlp(list(top) + [1], (features + 1) * DIM, last_relu=False)

    def over(self, x: torch.Tensor) -> torch.Tensor:
        return self.top(self.cross(x))[:, 0]


class Student(nn.Module):
    """Float32 tables (sparse gradients) and the dense part, for training."""

    def __init__(self, rows: Sequence[int], dense_part: Dense) -> None:
        super().__init__()
        self.tables = nn.ModuleList(nn.EmbeddingBag(r, DIM, mode="sum", sparse=True)
                                    for r in rows)
        for t, r in zip(self.tables, rows):
            nn.init.uniform_(t.weight, -math.sqrt(1 / r), math.sqrt(1 / r))
        self.dense = dense_part

    def forward(self, batch: datasets.Batch) -> torch.Tensor:
        B = batch.batch_size
        values, lengths = torch.from_numpy(batch.values), torch.from_numpy(batch.lengths)
        offs = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        parts = [self.dense.bottom(torch.from_numpy(batch.dense))]
        for f, t in enumerate(self.tables):
            s = f * B
            parts.append(t(values[offs[s]:offs[s + B]], offs[s:s + B] - offs[s]))
        return self.dense.over(torch.cat(parts, 1))


def quantized_logits(dense_part: Dense, tabs: Sequence[np.ndarray], fmts: Sequence,
                     batch: datasets.Batch, over=None) -> np.ndarray:
    """Logits of ``batch`` with the tables ``tabs`` (format ``fmts``) looked up by one
    :func:`perfkernels.embedding_bags_multi` call into the cross network's input."""
    B = batch.batch_size
    x = torch.empty(B, (len(tabs) + 1) * DIM)
    with torch.no_grad():
        x[:, :DIM] = dense_part.bottom(torch.from_numpy(batch.dense))
        pk.embedding_bags_multi(list(tabs), batch.values, lengths=batch.lengths,
                                bits=[f if isinstance(f, int) else None for f in fmts],
                                dims=[DIM] * len(tabs), out=x[:, DIM:].numpy())
        z = (over or dense_part.over)(x)
    return z.reshape(-1).float().numpy()


def convert_tables(weights: Sequence[np.ndarray], fmts: Sequence) -> list:
    """The float32 tables in their formats, by :func:`perfkernels.tables.build_table`."""
    return [tables.build_table(tables.ArraySource(w), f, progress=False)
            for w, f in zip(weights, fmts)]


def train_and_evaluate(args: argparse.Namespace, log=print) -> dict:
    """Train the reduced model in float32, evaluate every format on held-out pairs."""
    torch.manual_seed(args.seed)
    rows = [min(r, args.cap) for r in datasets.dlrm_v2_rows(args.scale)]
    gen = datasets.CriteoLike(rows, exponent=args.exponent, seed=args.seed)
    teacher = Teacher(rows, args.seed)
    teacher.calibrate(gen.batch(4096, index=10 ** 7))
    w = args.width
    dense_part = Dense(len(rows), (4 * w, 2 * w), 2, w, (4 * w, w))
    model = Student(rows, dense_part)
    opt_sparse = torch.optim.SGD(list(model.tables.parameters()), lr=args.table_lr)
    opt_dense = torch.optim.Adam(dense_part.parameters(), lr=args.lr)
    loss_fn = nn.BCEWithLogitsLoss()
    t0 = time.perf_counter()
    for step in range(args.steps):
        b = gen.batch(args.batch, index=step)
        y = torch.from_numpy(teacher.labels(b, seed=step))
        loss = loss_fn(model(b), y)
        opt_sparse.zero_grad()
        opt_dense.zero_grad()
        loss.backward()
        opt_sparse.step()
        opt_dense.step()
        if log and (step + 1) % max(1, args.steps // 5) == 0:
            log(f"step {step + 1}/{args.steps}: loss {loss.item():.4f} "
                f"({time.perf_counter() - t0:.0f} s)")
    train_s = time.perf_counter() - t0
    model.eval()
    held = [gen.batch(min(args.eval, 8192), index=10 ** 8 + i)
            for i in range(max(1, math.ceil(args.eval / 8192)))]
    labels = np.concatenate([teacher.labels(b, seed=10 ** 8 + i) for i, b in enumerate(held)])
    weights = [t.weight.detach().numpy() for t in model.tables]
    result = {"rows": rows, "train_s": train_s, "pairs": int(labels.size),
              "positive_rate": float(labels.mean()), "formats": {}}
    with torch.no_grad():
        teacher_auc = auc(np.concatenate([teacher.raw(b).numpy() for b in held]), labels)
    result["teacher_auc"] = teacher_auc
    ref = None
    for spec in args.formats:
        fmts = mix_formats(spec, datasets.DLRM_V2_ROWS)
        tabs = convert_tables(weights, fmts)
        z = np.concatenate([quantized_logits(dense_part, tabs, fmts, b) for b in held])
        ref = z if ref is None else ref
        r = {"auc": auc(z, labels), "log_loss": log_loss(z, labels),
             "table_bytes": sum(t.nbytes for t in tabs),
             "logit_mean_abs_err": float(np.mean(np.abs(z - ref))),
             "logit_max_abs_err": float(np.max(np.abs(z - ref)))}
        result["formats"][spec] = r
    base = result["formats"][args.formats[0]]["auc"]
    for r in result["formats"].values():
        r["auc_loss"] = base - r["auc"]
    if args.int8_dense:
        from perfkernels.torch import quantize_dense
        fmts = mix_formats(args.formats[0], datasets.DLRM_V2_ROWS)
        tabs = convert_tables(weights, fmts)
        cal = []
        for i in range(4):
            b = gen.batch(256, index=10 ** 6 + i)
            x = torch.empty(256, (len(tabs) + 1) * DIM)
            with torch.no_grad():
                x[:, :DIM] = dense_part.bottom(torch.from_numpy(b.dense))
            pk.embedding_bags_multi(tabs, b.values, lengths=b.lengths, bits=[None] * len(tabs),
                                    dims=[DIM] * len(tabs), out=x[:, DIM:].numpy())
            cal.append((x,))

        class Over(nn.Module):
            def forward(self, x):
                return dense_part.over(x)

        over = quantize_dense(Over().eval(), cal[0], calibration=cal)
        z = np.concatenate([quantized_logits(dense_part, tabs, fmts, b, over) for b in held])
        result["int8_dense"] = {"auc": auc(z, labels), "log_loss": log_loss(z, labels),
                                "auc_loss": base - auc(z, labels),
                                "logit_mean_abs_err": float(np.mean(np.abs(z - ref)))}
    return result


def full_size_logit_errors(args: argparse.Namespace) -> dict:
    """Logit error of each format against float32 on DLRM-v2's full-size shape, each table
    holding only the rows the batch touches (drawn as the full table's initialiser draws)."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "examples"))
    import dlrm_v2 as ex
    full = list(datasets.DLRM_V2_ROWS)
    gen = datasets.CriteoLike(full, exponent=args.exponent, seed=args.seed)
    b = gen.batch(args.full_size_pairs, index=0)
    B = b.batch_size
    torch.manual_seed(args.seed)
    values = b.values.copy()
    offs = b.offsets()
    compact = []
    rng = np.random.default_rng(args.seed)
    for f, n in enumerate(full):
        seg = slice(offs[f * B], offs[(f + 1) * B])
        uniq, inv = np.unique(values[seg], return_inverse=True)
        values[seg] = inv
        bound = math.sqrt(1 / n)
        compact.append(rng.uniform(-bound, bound, (len(uniq), DIM)).astype(np.float32))
    sampled = datasets.Batch(b.dense, b.keys, b.lengths, values, b.labels)
    out = {"pairs": B, "rows_sampled": sum(len(c) for c in compact), "formats": {}}
    ref, model = None, None
    for spec in args.formats:
        fmts = mix_formats(spec, full)
        tabs = convert_tables(compact, fmts)
        sparse = ex.collection_of(tabs, fmts, sampled.keys)
        if model is None:
            model = ex.DLRMv2(sparse).eval()
        model.sparse = sparse                     # the same dense part for every format
        with torch.no_grad():
            z = model(torch.from_numpy(sampled.dense),
                      sampled.to_kjt(torchrec=False)).reshape(-1).numpy()
        ref = z if ref is None else ref
        out["formats"][spec] = {"logit_mean_abs_err": float(np.mean(np.abs(z - ref))),
                                "logit_max_abs_err": float(np.max(np.abs(z - ref))),
                                "logit_std": float(np.std(ref))}
    return out


def plot(result: dict, path: str) -> None:
    """Bar chart of AUC by format (matplotlib)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(result["formats"])
    aucs = [result["formats"][n]["auc"] for n in names]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(names, aucs, color="#4c72b0")
    lo = min(aucs)
    ax.set_ylim(lo - 0.01, max(aucs) + 0.005)
    for i, a in enumerate(aucs):
        ax.text(i, a + 0.0005, f"{a:.4f}", ha="center", fontsize=8)
    ax.set_ylabel("held-out AUC")
    ax.set_title(f"Reduced DLRM-v2, tables by format ({result['pairs']:,} pairs)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, default=1, help="divide DLRM-v2's rows by this")
    p.add_argument("--cap", type=int, default=100_000, help="at most this many rows a table")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.002, help="Adam's, for the dense part")
    p.add_argument("--table-lr", type=float, default=1.0,
                   help="plain SGD's on the tables' sparse gradients")
    p.add_argument("--width", type=int, default=64,
                   help="dense part: bottom 13-4w-2w-128, cross 2 layers of rank w, top 4w-w-1")
    p.add_argument("--eval", type=int, default=32768, help="held-out pairs")
    p.add_argument("--exponent", type=float, default=1.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--formats", default=",".join(FORMATS).replace("4:big,8:small", "4/8"),
                   help="comma list; the first is the reference (float32); 4/8 = 4-bit big "
                        "tables, 8-bit small")
    p.add_argument("--int8-dense", action="store_true",
                   help="also evaluate float32 tables with the dense part (cross + top) in int8 "
                        "(torchao PT2E, compiled)")
    p.add_argument("--full-size-pairs", type=int, default=0,
                   help="also measure the logit error on the full-size shape at this batch")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--plot", default=None, help="write a PNG of AUC by format here")
    args = p.parse_args(argv)
    args.formats = [f.replace("4/8", "4:big,8:small") for f in args.formats.split(",")]
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.threads:
        pk.set_num_threads(args.threads)
        torch.set_num_threads(args.threads)
    r = train_and_evaluate(args)
    print(f"reduced DLRM-v2: {sum(r['rows']):,} rows (at most {args.cap:,} a table), trained "
          f"{args.steps} x {args.batch} pairs in {r['train_s']:.0f} s; {r['pairs']:,} held-out "
          f"pairs, {100 * r['positive_rate']:.1f}% positive, teacher's own AUC "
          f"{r['teacher_auc']:.4f}")
    print(f"{'tables':>14} {'MiB':>8} {'AUC':>8} {'AUC loss':>9} {'log-loss':>9} "
          f"{'mean|dz|':>9} {'max|dz|':>9}")
    for name, f in r["formats"].items():
        print(f"{name:>14} {f['table_bytes'] / 2**20:8.1f} {f['auc']:8.4f} {f['auc_loss']:9.5f} "
              f"{f['log_loss']:9.5f} {f['logit_mean_abs_err']:9.2e} {f['logit_max_abs_err']:9.2e}")
    if "int8_dense" in r:
        f = r["int8_dense"]
        print(f"{'int8 dense':>14} {'':>8} {f['auc']:8.4f} {f['auc_loss']:9.5f} "
              f"{f['log_loss']:9.5f} {f['logit_mean_abs_err']:9.2e}")
    if args.plot:
        plot(r, args.plot)
        print(f"plot: {args.plot}")
    if args.full_size_pairs:
        fs = full_size_logit_errors(args)
        print(f"full-size DLRM-v2 shape (204M rows, untrained), {fs['pairs']} pairs, "
              f"{fs['rows_sampled']:,} rows sampled: logit error against float32")
        for name, f in fs["formats"].items():
            print(f"{name:>14} mean |dz| {f['logit_mean_abs_err']:.2e}, max |dz| "
                  f"{f['logit_max_abs_err']:.2e} (logits' std {f['logit_std']:.2e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
