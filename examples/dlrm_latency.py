"""Serving latency of the reference DLRM (``examples/dlrm.py --latency``, ``python -m perfkernels
bench --family dlrm --latency``).

The model is ``dlrm_reference.py`` beside this file (the architecture and torch operations of
facebookresearch's ``DLRM_Net``) at Criteo Kaggle's shape: 26 tables x 16 (the dataset's sizes,
capped by ``--max-rows``), bottom MLP 13-512-256-64-16, top MLP 367-512-256-1, dot interaction, one
index per table and sample; inference.  Columns, each a copy of the same model::

    stock            the model as written, eager
    stock compiled   torch.compile(stock)
    convert          perfkernels.torch.convert(model), eager
    optimize         perfkernels.torch.optimize(model), eager, and optimize compiled:
                     torch.compile of it (only where this perfkernels has optimize)

For each batch size (``--batches``, default 1, 16, 128, 2048) every column is warmed up (compiled
columns compile there), then timed one forward at a time, the columns in turn and in a rotating
order, over ``--rounds`` rounds of a few distinct batches; the table gives the median (p50) and
the 99th percentile (p99) of the per-forward times, and each column's speed-up over stock eager
(the median over rounds of stock's time over the column's, robust to a machine's drift).  Predictions of every column are checked against stock's (``--pred-tol``).  ``--plot``
draws p50 against batch size.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
import torch

import perfkernels.torch as pt

HERE = Path(__file__).resolve().parent


def _reference():
    """dlrm_reference.py beside this file (loaded by path: this module may be loaded so too)."""
    name = "perfkernels_dlrm_reference"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / "dlrm_reference.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def parse_batches(text: str) -> list[int]:
    try:
        batches = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise SystemExit(f"--batches must be comma-separated positive integers; got {text!r}")
    if not batches or min(batches) < 1:
        raise SystemExit(f"--batches must be comma-separated positive integers; got {text!r}")
    return batches


def build_columns(stock: torch.nn.Module, example: tuple, compile_: bool
                  ) -> tuple[dict[str, torch.nn.Module], list[str]]:
    """The models to time, by column name, and notes on columns left out."""
    notes = []
    columns: dict[str, torch.nn.Module] = {"stock": stock}
    if compile_:
        columns["stock compiled"] = torch.compile(stock, dynamic=False)
    columns["convert"] = pt.convert(copy.deepcopy(stock))
    if hasattr(pt, "optimize"):
        try:
            optimized = pt.optimize(copy.deepcopy(stock), example_inputs=example)
        except Exception as exc:  # noqa: BLE001  (reported, the other columns still run)
            notes.append(f"optimize: failed, {type(exc).__name__}: {exc}")
        else:
            columns["optimize"] = optimized
            if compile_:
                columns["optimize compiled"] = torch.compile(optimized, dynamic=False)
    else:
        notes.append("optimize: not in this perfkernels (no perfkernels.torch.optimize)")
    return columns, notes


def time_batch(columns: dict[str, torch.nn.Module], batches: list[tuple], rounds: int,
               warmup: int, budget_s: float) -> dict[str, np.ndarray]:
    """Per-forward seconds of each column on these batches: the columns in turn, in a rotating
    order, after `warmup` untimed forwards each; stops early once `budget_s` has passed and at
    least a fifth of the rounds ran."""
    names = list(columns)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(warmup):
        for n in names:
            for b in batches[:2]:
                columns[n](*b)
    start = time.perf_counter()
    for r in range(rounds):
        b = batches[r % len(batches)]
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            m = columns[n]
            t0 = time.perf_counter_ns()
            m(*b)
            samples[n].append((time.perf_counter_ns() - t0) * 1e-9)
        if r >= rounds // 5 and time.perf_counter() - start > budget_s:
            break
    return {n: np.array(v) for n, v in samples.items()}


def run_latency(args: argparse.Namespace) -> dict:
    """Build the columns, time every batch size, print the table; returns the measurements:
    ``{"columns": [...], "notes": [...], "threads": n, "batches": {B: {column: {"p50": s,
    "p99": s, "max_pred_diff": d}}}}``."""
    if getattr(args, "train_step", False):
        return run_step_latency(args)
    ref = _reference()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    batches = parse_batches(args.batches)
    dim = args.dim or 16
    bag_size = args.bag_size or 1
    max_rows = args.max_rows or 1_000_000
    grad = bool(getattr(args, "grad_on", False))
    stock = ref.kaggle_model(max_rows, dim=dim, seed=args.seed).eval()
    rows = [e.num_embeddings for e in stock.emb_l]
    compile_ = not args.no_compile
    inputs = {b: [ref.kaggle_batch(stock, b, rng, bag_size) for _ in range(args.distinct)]
              for b in batches}
    print(f"reference DLRM (facebookresearch DLRM_Net's operations), {len(rows)} tables x {dim} "
          f"(max {max(rows):,} rows), bottom MLP 13-512-256-64-{dim}, top MLP "
          f"{stock.top_l[0].in_features}-512-256-1, dot interaction, {bag_size} index per table "
          f"and sample; inference ({'grad mode on, as a loop without no_grad runs it' if grad else 'inference mode'}); "
          f"torch threads {torch.get_num_threads()}")
    result: dict = {"threads": torch.get_num_threads(), "batches": {}, "grad": grad}
    with (contextlib.nullcontext() if grad else torch.inference_mode()):
        columns, notes = build_columns(stock, inputs[batches[0]][0], compile_)
        result["columns"], result["notes"] = list(columns), notes
        for note in notes:
            print(f"  ({note})")
        width = max(max(len(n) for n in columns), 25) + 2
        print(f"\nms per forward, p50 / p99 (speed-up over stock eager: median of per-round "
              f"ratios); up to {args.rounds} rounds, columns in turn, warm-up excluded")
        print(f"{'batch':>6}" + "".join(f"{n:>{width}}" for n in columns) + f"{'max |dp|':>10}")
        for b in batches:
            want = [stock(*x) for x in inputs[b]]
            diffs = {}
            for n, m in columns.items():
                got = [m(*x) for x in inputs[b]]           # also the compile, before timing
                diffs[n] = max(float((g - w).detach().abs().max()) for g, w in zip(got, want))
            t = time_batch(columns, inputs[b], args.rounds, args.warmup, args.budget)
            # speed-up: the median over rounds of stock's time / the column's time in that round
            # (the columns of a round ran back to back, so machine drift cancels)
            stats = {n: {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)),
                         "speedup": float(np.median(t["stock"] / v)), "samples": len(v),
                         "max_pred_diff": diffs[n]} for n, v in t.items()}
            result["batches"][b] = stats
            cells = "".join(
                f"{s['p50'] * 1e3:.3f} / {s['p99'] * 1e3:.3f} ({s['speedup']:.2f}x)"
                .rjust(width) for s in stats.values())
            print(f"{b:>6}{cells}{max(diffs.values()):>10.1e}")
            bad = {n: d for n, d in diffs.items() if d > args.pred_tol}
            if bad:
                raise SystemExit(f"batch {b}: predictions differ from stock's by "
                                 f"{bad} > {args.pred_tol}")
    if args.plot:
        plot_latency(result, args.plot)
    return result


def train_columns(stock: torch.nn.Module, optimizer: str, lr: float
                  ) -> tuple[dict[str, object], list[str]]:
    """One training step per column (forward, binary cross-entropy, backward, optimizer step),
    each on its own copy of ``stock``: ``stock`` with torch's ``optimizer`` ("sgd" or
    "adagrad", which take the tables' sparse gradients) over every parameter; ``convert`` and
    ``optimize`` with the same optimizer fused into the tables (the table updated during
    backward) and torch's over the MLPs."""
    notes: list[str] = []
    torch_opt = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad}[optimizer]

    def step_of(model, opt):
        def step(dense, offsets, indices, target):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.binary_cross_entropy(model(dense, offsets, indices),
                                                            target)
            loss.backward()
            opt.step()
        return step
    model = copy.deepcopy(stock).train()
    columns: dict[str, object] = {"stock": step_of(model, torch_opt(model.parameters(), lr=lr))}
    sides = [("convert", pt.convert)]
    if hasattr(pt, "optimize"):
        sides.append(("optimize", pt.optimize))
    else:
        notes.append("optimize: not in this perfkernels (no perfkernels.torch.optimize)")
    for name, make in sides:
        model = make(copy.deepcopy(stock)).train()
        tables = set()
        for bag in model.emb_l:
            bag.set_fused_optimizer((optimizer, {"lr": lr}))
            tables.add(id(bag.weight))
        dense = [p for p in model.parameters() if id(p) not in tables]
        columns[name] = step_of(model, torch_opt(dense, lr=lr))
    columns["dense only"] = _dense_only_step(stock, torch_opt, lr)
    notes.append("dense only: the same step with the tables' part free (a constant interaction "
                 "input): what no embedding kernel can beat")
    return columns, notes


class _DenseOnly(torch.nn.Module):
    """The MLPs of a reference DLRM on a constant interaction output: the lower bound of a step
    in which the lookups, the interaction and the tables' update cost nothing."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.bot_l = copy.deepcopy(model.bot_l)
        self.top_l = copy.deepcopy(model.top_l)
        self.pairs = self.top_l[0].in_features - model.bot_l[-2].out_features
        self._constant: dict = {}

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        z = self._constant.get(dense.shape[0])
        if z is None:
            z = self._constant[dense.shape[0]] = torch.rand(dense.shape[0], self.pairs)
        return self.top_l(torch.cat([self.bot_l(dense), z], dim=1))


def _dense_only_step(stock: torch.nn.Module, torch_opt, lr: float):
    model = _DenseOnly(stock).train()
    opt = torch_opt(model.parameters(), lr=lr)

    def step(dense, offsets, indices, target):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.binary_cross_entropy(model(dense), target).backward()
        opt.step()
    return step


def run_step_latency(args: argparse.Namespace) -> dict:
    """``--latency --train-step``: the latency of a training step of the same model, columns
    stock / convert / optimize (see :func:`train_columns`), timed as :func:`run_latency` times
    forwards; returns ``{"columns": [...], "notes": [...], "threads": n, "batches": {B:
    {column: {"p50": s, "p99": s, "speedup": x}}}}``."""
    ref = _reference()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    batches = parse_batches(args.batches)
    dim = args.dim or 16
    bag_size = args.bag_size or 1
    optimizer = getattr(args, "fused_optimizer", None) or "sgd"
    if optimizer not in ("sgd", "adagrad"):
        raise SystemExit(f"--train-step compares torch's sparse sgd or adagrad; got "
                         f"--fused-optimizer {optimizer}")
    lr = getattr(args, "lr", None) or 0.01
    stock = ref.kaggle_model(args.max_rows or 1_000_000, dim=dim, seed=args.seed)
    columns, notes = train_columns(stock, optimizer, lr)
    print(f"reference DLRM, {len(stock.emb_l)} tables x {dim}, training step (forward, "
          f"backward, {optimizer} lr {lr}: torch's on sparse gradients for stock, fused into "
          f"the tables for convert / optimize); torch threads {torch.get_num_threads()}")
    for note in notes:
        print(f"  ({note})")
    width = 27
    print(f"\nms per step, p50 / p99 (speed-up over stock: median of per-round ratios)")
    print(f"{'batch':>6}" + "".join(f"{n:>{width}}" for n in columns))
    result: dict = {"threads": torch.get_num_threads(), "columns": list(columns),
                    "notes": notes, "batches": {}}
    for b in batches:
        data = []
        for _ in range(args.distinct):
            dense, offsets, indices = ref.kaggle_batch(stock, b, rng, bag_size)
            data.append((dense, offsets, indices,
                         torch.from_numpy(rng.integers(0, 2, (b, 1)).astype(np.float32))))
        t = time_batch(columns, data, args.rounds, args.warmup, args.budget)
        stats = {n: {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)),
                     "speedup": float(np.median(t["stock"] / v)), "samples": len(v)}
                 for n, v in t.items()}
        result["batches"][b] = stats
        print(f"{b:>6}" + "".join(
            f"{s['p50'] * 1e3:.3f} / {s['p99'] * 1e3:.3f} ({s['speedup']:.2f}x)".rjust(width)
            for s in stats.values()))
    return result


def plot_latency(result: dict, path: str) -> None:
    """p50 (solid) and p99 (dotted) per forward against batch size, one colour per column."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    batches = sorted(result["batches"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, name in enumerate(result["columns"]):
        colour = f"C{k}"
        p50 = [result["batches"][b][name]["p50"] * 1e3 for b in batches]
        p99 = [result["batches"][b][name]["p99"] * 1e3 for b in batches]
        ax.plot(batches, p50, "o-", color=colour, label=f"{name} p50")
        ax.plot(batches, p99, ":", color=colour, alpha=0.6)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("ms per forward (p50; dotted: p99)")
    ax.set_title(f"Reference DLRM (Criteo Kaggle shape) inference latency, "
                 f"{result['threads']} thread(s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    print(f"plot written to {path}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The latency mode's options (examples/dlrm.py adds them to its own)."""
    g = p.add_argument_group("latency mode (--latency)")
    g.add_argument("--latency", action="store_true",
                   help="serving latency of the reference DLRM at Criteo Kaggle's shape (p50 and "
                        "p99 per batch size): stock eager and compiled, convert(), optimize()")
    g.add_argument("--batches", default="1,16,128,2048", metavar="B,B,...",
                   help="batch sizes of --latency (default 1,16,128,2048)")
    g.add_argument("--rounds", type=int, default=300,
                   help="timed forwards per column and batch size (default 300)")
    g.add_argument("--warmup", type=int, default=5, help="untimed forwards first (default 5)")
    g.add_argument("--budget", type=float, default=30.0,
                   help="seconds per batch size after which the rounds stop early (default 30)")
    g.add_argument("--distinct", type=int, default=4,
                   help="distinct input batches cycled through (default 4)")
    g.add_argument("--threads", type=int, default=None,
                   help="torch (and so perfkernels) threads (default: torch's)")
    g.add_argument("--train-step", action="store_true",
                   help="time training steps (forward, backward, --fused-optimizer sgd or "
                        "adagrad, default sgd, at --lr) instead of forwards: stock with torch's "
                        "sparse optimizer against convert() and optimize() with it fused")
    g.add_argument("--grad-on", action="store_true",
                   help="time the forwards with grad mode on (the model in eval mode, no "
                        "torch.no_grad(): what an inference loop that never turns gradients off "
                        "runs) instead of under torch.inference_mode()")
    g.add_argument("--no-compile", action="store_true",
                   help="leave out the torch.compile columns (they compile per batch size)")
