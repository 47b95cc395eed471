"""DLRM in plain PyTorch, then the same model after ``perfkernels.torch.convert``.

The model is the DLRM of Naumov et al. (2019) in one of four classes (``--model``; the table
``MODEL_CLASSES``):

``criteo`` (default)
    a bottom MLP 13-512-256-64 on the dense features, 26 embedding tables (Criteo Kaggle's
    cardinalities, capped by ``--max-rows``) of dimension 64, pairwise dot-product interaction,
    a top MLP 512-256-1, 10 lookups per table: the embedding-light end (the MLPs take most of a
    batch).
``rm1``, ``rm2``, ``rm3``
    DeepRecSys's public configurations of the recommendation-model classes of Meta's papers
    (dense features and bottom MLP, tables x rows x dimension, lookups per table, top MLP,
    concatenation interaction): RM1 128-64-32, 8 x 4M x 32, 80 lookups, 256-64-1; RM2
    256-128-64, 32 x 500K x 64, 120 lookups, 128-64-1 (embedding-dominated: its end-to-end
    speed is the lookup kernel's); RM3 2560-1024-256-32, 10 x 2M x 32, 20 lookups, 512-256-1
    (MLP-dominated).  Their rows are capped by ``--max-rows``, whose default per class keeps one
    float32 copy of the tables near 512 MiB (RM2 at full size is 4 GB per copy; the comparison
    holds several copies), so that it runs on a 2-core, 24 GiB machine shared with other work.

Data are synthetic: log-normal dense features, sparse features with Zipf-distributed indices (a
few hot rows, a long cold tail) or uniform ones (``--indices uniform``, every lookup a likely
cache miss), ``--bag-size`` indices per feature (default: the class's lookups), random labels.

What it does:

1. trains the stock model and a converted copy on the same batches, one step of each in turn
   (SGD, sparse embedding gradients), and checks that the two loss curves agree; with ``--fused-optimizer NAME``
   (``sgd``, ``adagrad``, ``rowwise_adagrad``, ``adam``) the converted model's tables are instead updated
   during backward by perfkernels' fused kernel (``EmbeddingBag.set_fused_optimizer``), and the
   stock model's tables by the same optimizer run unfused on torch's sparse gradients
   (``torch.optim.Adagrad``, ``torch.optim.SparseAdam``; row-wise Adagrad written with torch
   ops), the MLPs by SGD in both;
2. runs batched inference with float32, float16 and 8-bit tables, stock PyTorch (torch's
   quantized EmbeddingBag for 8-bit) against the converted model, checks that the predictions
   agree and prints the time per batch, end to end and for the embedding stage, and the
   embedding stage's share of each side's time.  Two views side by side, all sampled in turn:
   each side's default placement (torch's tables as torch allocated them; ours placed by
   ``convert``: 2 MiB-aligned on huge pages) and the same placement on both sides (torch's float
   tables moved onto huge pages by ``perfkernels.torch.place(..., "hugepage")``, what
   ``THP_MEM_ALLOC_ENABLE=1`` gives torch's allocations).  The AnonHugePages each side's tables
   got is printed beside the times.

    python examples/dlrm.py                       # batch 2048, tables capped at 1M rows
    python examples/dlrm.py --model rm2 --batch 256 --indices uniform --train-steps 0
    python examples/dlrm.py --max-rows 1000 --batch 64 --train-steps 20 --infer-batches 3
    python examples/dlrm.py --plot dlrm.png       # also draw the time breakdown
    python examples/dlrm.py --fused-optimizer rowwise_adagrad --lr 0.01 --infer-batches 0
    python examples/dlrm.py --fused-optimizer adam --lr 0.001 --infer-batches 0
    python examples/dlrm.py --latency --plot latency.png   # serving latency, p50/p99 by batch
    python examples/dlrm.py --optimize --train-steps 0   # inference of optimize()'s model
    python examples/dlrm.py --optimize --fused-optimizer adam --lr 0.001 --infer-batches 0

``--latency`` measures serving latency instead, of the reference DLRM (``dlrm_reference.py``:
facebookresearch's ``DLRM_Net``'s operations) at Criteo Kaggle's shape, for batches 1 to 2048: stock
eager, stock ``torch.compile``, ``convert()`` and ``optimize()`` (``dlrm_latency.py`` says how).
``--optimize`` trains and times the converted model after ``perfkernels.torch.optimize`` (its
lookups and the dot interaction one fused op, whose backward steps each table by its own rule;
in inference the "emb" columns still time the converted modules' lookups alone).

(Adagrad's steps are normalised by the gradient's size, so the SGD default ``--lr 0.1`` makes both
models diverge alike; 0.01 trains.)

Both sides use PyTorch's default thread count.  The converted model differs from the stock one by
one line: ``model = perfkernels.torch.convert(model)``.
"""
from __future__ import annotations

import argparse
import copy
import functools
import sys
import time
import warnings
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

import perfkernels.torch as pt
from perfkernels.torch._placement import huge_page_share

#: Criteo Kaggle (Display Advertising Challenge) cardinalities of the 26 categorical features
CRITEO_KAGGLE_ROWS = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593,
                      3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105,
                      142572]


class ModelClass(NamedTuple):
    """One model class: table rows, embedding dimension, lookups per table and sample, the bottom
    MLP (its first size is the number of dense features, its last the dimension), the top MLP's
    sizes after the interaction (the last is 1), the interaction (``"dot"``: pairwise dot
    products, ``"cat"``: concatenation) and the default cap on rows per table."""
    table_rows: tuple
    dim: int
    lookups: int
    bottom: tuple
    top: tuple
    interaction: str
    max_rows: int


#: The model classes of ``--model`` (DeepRecSys's public configurations for rm1-rm3).
MODEL_CLASSES = {
    "criteo": ModelClass(tuple(CRITEO_KAGGLE_ROWS), 64, 10, (13, 512, 256, 64), (512, 256, 1),
                         "dot", 1_000_000),
    "rm1": ModelClass((4_000_000,) * 8, 32, 80, (128, 64, 32), (256, 64, 1), "cat", 500_000),
    "rm2": ModelClass((500_000,) * 32, 64, 120, (256, 128, 64), (128, 64, 1), "cat", 65_536),
    "rm3": ModelClass((2_000_000,) * 10, 32, 20, (2560, 1024, 256, 32), (512, 256, 1), "cat",
                      400_000),
}


def mlp(sizes: list[int], last_sigmoid: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        layers.append(nn.Sigmoid() if last_sigmoid and i == len(sizes) - 2 else nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """Bottom MLP, one EmbeddingBag per sparse feature, interaction (dot or cat), top MLP.
    ``bottom``: the bottom MLP's sizes from the dense features to ``dim`` (default Criteo's
    13-512-256-dim); ``top``: the top MLP's sizes after the interaction (default 512-256-1)."""

    def __init__(self, table_rows: list[int], dim: int = 64, sparse: bool = True,
                 bottom: tuple | None = None, top: tuple = (512, 256, 1),
                 interaction: str = "dot") -> None:
        super().__init__()
        bottom = list(bottom or (13, 512, 256))
        if bottom[-1] != dim:
            bottom.append(dim)
        self.num_dense = bottom[0]
        self.bottom = mlp(bottom)
        self.tables = nn.ModuleList(nn.EmbeddingBag(n, dim, mode="sum", sparse=sparse)
                                    for n in table_rows)
        for t in self.tables:   # DLRM's initialisation: uniform(+-sqrt(1/rows))
            nn.init.uniform_(t.weight, -np.sqrt(1 / t.num_embeddings),
                             np.sqrt(1 / t.num_embeddings))
        f = len(table_rows) + 1
        self.interaction = interaction
        width = dim + f * (f - 1) // 2 if interaction == "dot" else f * dim
        self.top = mlp([width, *top], last_sigmoid=True)
        rows, cols = torch.tril_indices(f, f, offset=-1)
        self.register_buffer("pairs", rows * f + cols, persistent=False)

    @classmethod
    def of_class(cls, spec: ModelClass, max_rows: int, dim: int | None = None,
                 sparse: bool = True) -> "DLRM":
        """The model of a :class:`ModelClass`, rows capped at ``max_rows`` (``dim`` overrides
        the class's dimension)."""
        dim = dim or spec.dim
        return cls([min(n, max_rows) for n in spec.table_rows], dim, sparse,
                   spec.bottom[:-1] + (dim,), spec.top, spec.interaction)

    def embed(self, indices: list[torch.Tensor], offsets: list[torch.Tensor]) -> list[torch.Tensor]:
        # .float(): a no-op for float32 tables, the cast back for torch's float16 tables
        return [t(i, o).float() for t, i, o in zip(self.tables, indices, offsets)]

    def interact(self, x: torch.Tensor, ly: list[torch.Tensor]) -> torch.Tensor:
        # (getattr: dlrm_distributed's DenseDLRM borrows this method and has no `interaction`)
        if getattr(self, "interaction", "dot") == "cat":
            return torch.cat([x] + ly, dim=1)
        t = torch.stack([x] + ly, dim=1)                        # [B, F, D]
        z = torch.bmm(t, t.transpose(1, 2)).flatten(1)          # [B, F * F]
        return torch.cat([x, z[:, self.pairs]], dim=1)

    def forward(self, dense: torch.Tensor, indices: list[torch.Tensor],
                offsets: list[torch.Tensor]) -> torch.Tensor:
        x = self.bottom(dense)
        return self.top(self.interact(x, self.embed(indices, offsets))).squeeze(1)


def make_batches(table_rows: list[int], batch: int, bag_size: int, count: int, seed: int,
                 zipf_a: float = 1.1, num_dense: int = 13, indices: str = "zipf") -> list[tuple]:
    """Synthetic batches: (dense [B, num_dense], indices per table, offsets per table, labels).
    Indices are Zipf-distributed over each table, hot rows scattered by a fixed permutation-like
    hash so that they are not all at the start of the table, or uniform (``indices="uniform"``)."""
    rng = np.random.default_rng(seed)
    offsets = torch.arange(0, batch * bag_size, bag_size)
    out = []
    draw = indices
    for _ in range(count):
        dense = torch.from_numpy(np.log1p(rng.lognormal(0, 1, (batch, num_dense)))
                                 .astype(np.float32))
        indices = []
        for rows in table_rows:
            if draw == "uniform":
                indices.append(torch.from_numpy(rng.integers(0, rows, batch * bag_size)))
                continue
            z = rng.zipf(zipf_a, batch * bag_size) - 1
            indices.append(torch.from_numpy((z * 2654435761) % rows))
        labels = torch.from_numpy((rng.random(batch) < 0.25).astype(np.float32))
        out.append((dense, indices, [offsets] * len(table_rows), labels))
    return out


class RowwiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad (FBGEMM's EXACT_ROWWISE_ADAGRAD) on sparse gradients, with torch ops: the
    gradient is coalesced (duplicates summed), then each touched row r gets
    ``h[r] += mean(g[r]^2); w[r] -= lr * g[r] / (sqrt(h[r]) + eps)``.  The unfused counterpart
    of ``fused_optimizer=("rowwise_adagrad", ...)``."""

    def __init__(self, params, lr: float, eps: float = 1e-8) -> None:
        super().__init__(params, {"lr": lr, "eps": eps})

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "sum" not in state:
                    state["sum"] = torch.zeros(p.shape[0])
                g = p.grad.coalesce()
                rows, values = g.indices()[0], g.values()
                h = state["sum"].index_select(0, rows) + values.pow(2).mean(1)
                state["sum"].index_copy_(0, rows, h)
                p.index_add_(0, rows, values / (h.sqrt() + group["eps"]).unsqueeze(1),
                             alpha=-group["lr"])


def table_optimizer(model: DLRM, name: str, lr: float, eps: float) -> torch.optim.Optimizer:
    """The stock model's tables under optimizer `name`, unfused (torch's sparse gradients)."""
    params = list(model.tables.parameters())
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, eps=eps)
    if name == "rowwise_adagrad":
        return RowwiseAdagrad(params, lr=lr, eps=eps)
    if name == "adam":
        return torch.optim.SparseAdam(params, lr=lr, eps=eps)
    return torch.optim.SGD(params, lr=lr)


class _Trainer:
    """One model's training state: SGD on the BCE loss for its parameters (the MLPs only with
    `tables_apart`, the tables then being updated by `table_opt`, or by their fused optimizer
    during backward)."""

    def __init__(self, model: nn.Module, lr: float, table_opt: torch.optim.Optimizer | None,
                 tables_apart: bool):
        params = [p for name, p in model.named_parameters()
                  if not (tables_apart and name.startswith("tables."))]
        self.model, self.table_opt = model, table_opt
        self.opt = torch.optim.SGD(params, lr=lr)
        self.loss_fn = nn.BCELoss()
        self.losses: list[float] = []
        self.times: list[float] = []
        model.train()

    def step(self, dense, ix, off, y) -> None:
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        if self.table_opt is not None:
            self.table_opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(dense, ix, off), y)
        loss.backward()
        self.opt.step()
        if self.table_opt is not None:
            self.table_opt.step()
        self.times.append(time.perf_counter() - t0)
        self.losses.append(loss.item())

    def median_step(self) -> float:
        return float(np.median(self.times[1:] or self.times))


def train(stock: nn.Module, ours: nn.Module, batches: list[tuple], lr: float,
          table_opt: torch.optim.Optimizer | None = None, tables_apart: bool = False
          ) -> tuple[list[float], float, list[float], float]:
    """Train both models on the same batches, one step of each in turn (so both see the same
    machine state); returns each one's loss curve and median seconds per step."""
    from tqdm import tqdm
    a = _Trainer(stock, lr, table_opt, tables_apart)
    b = _Trainer(ours, lr, None, tables_apart)
    for i, batch in enumerate(tqdm(batches, desc="train (torch and perfkernels in turn)",
                                   file=sys.stderr, leave=False)):
        first, second = (a, b) if i % 2 == 0 else (b, a)   # alternate who goes first
        first.step(*batch)
        second.step(*batch)
    return a.losses, a.median_step(), b.losses, b.median_step()


def time_inference(models: dict[str, nn.Module], batches: list[tuple], repeat: int
                   ) -> dict[str, dict[str, float]]:
    """Median seconds per batch of each model, end to end and for the embedding stage, sampled
    in turn (one batch each per round) so that machine noise hits all alike."""
    samples = {name: {"total": [], "embedding": []} for name in models}
    with torch.inference_mode():
        for m in models.values():                 # warm-up
            m.eval()
            m(*batches[0][:3])
        for _ in range(repeat):
            for dense, ix, off, _ in batches:
                for name, m in models.items():
                    t0 = time.perf_counter()
                    m.embed(ix, off)
                    t1 = time.perf_counter()
                    m(dense, ix, off)
                    t2 = time.perf_counter()
                    samples[name]["embedding"].append(t1 - t0)
                    samples[name]["total"].append(t2 - t1)
    return {name: {k: float(np.median(v)) for k, v in s.items()} for name, s in samples.items()}


def torch_quantized(model: DLRM) -> DLRM:
    """Stock PyTorch's 8-bit tables: torch.ao.nn.quantized.EmbeddingBag (weight-only,
    float_qparams), as ``torch.ao.quantization.convert`` would build them."""
    from torch.ao.nn.quantized import EmbeddingBag as QEmbeddingBag
    from torch.ao.quantization.qconfig import float_qparams_weight_only_qconfig
    q = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # torch's deprecation notice for quantized tensors
        for i, t in enumerate(q.tables):
            t.qconfig = float_qparams_weight_only_qconfig
            q.tables[i] = QEmbeddingBag.from_float(t)
    return q


def half_tables(model: DLRM) -> DLRM:
    """Stock PyTorch with float16 tables (outputs cast back to float32 in embed())."""
    h = copy.deepcopy(model)
    for t in h.tables:
        t.weight.data = t.weight.data.half()
    return h


def huge_pages(model: nn.Module) -> str:
    """The share of a model's float / packed tables on huge pages now (AnonHugePages of their
    mappings), e.g. ``"512/512 MiB"``; ``"?"`` for torch's quantized modules, whose packed
    tables are not reachable as tensors."""
    tables = [t for name, t in (*model.named_parameters(), *model.named_buffers())
              if name.startswith("tables.") and t.dim() == 2]
    if not tables:
        return "?"
    huge, total = huge_page_share(tables)
    return f"{huge / 2**20:.0f}/{total / 2**20:.0f} MiB"


def inference_variants(stock: DLRM, convert=pt.convert):
    """(name, torch model, torch model on huge pages or None, converted model) for float32,
    float16 and 8-bit tables, built one at a time (each holds copies of the tables).
    ``convert``: pt.convert, or pt.optimize with its example inputs."""
    f32 = copy.deepcopy(stock)        # so that placing the converted tables leaves stock's alone
    yield "float32", stock, pt.place(copy.deepcopy(stock), "hugepage"), convert(f32)
    del f32
    half = half_tables(stock)
    yield ("float16", half, pt.place(copy.deepcopy(half), "hugepage"),
           convert(stock, dtype=torch.float16))
    del half
    yield "8-bit", torch_quantized(stock), None, convert(stock, bits=8)


def run(args: argparse.Namespace) -> dict:
    """The whole comparison; returns the measurements (also used by `perfkernels bench`)."""
    if getattr(args, "latency", False):   # serving latency of the reference DLRM instead
        return _latency_module().run_latency(args)
    torch.manual_seed(args.seed)
    spec = MODEL_CLASSES[args.model]
    dim = args.dim or spec.dim
    bag_size = args.bag_size or spec.lookups
    max_rows = args.max_rows or spec.max_rows
    stock = DLRM.of_class(spec, max_rows, dim)
    table_rows = [t.num_embeddings for t in stock.tables]
    result: dict = {"model": args.model, "table_rows": table_rows}

    def batches_of(count: int, seed: int) -> list[tuple]:
        return make_batches(table_rows, args.batch, bag_size, count, seed,
                            num_dense=stock.num_dense, indices=args.indices)

    print(f"model {args.model}: {len(table_rows)} tables x {dim} (max {max(table_rows):,} rows), "
          f"{bag_size} {args.indices} lookups per table, batch {args.batch}, "
          f"torch threads {torch.get_num_threads()}")
    # ---- training: the same batches through both, loss curves must agree
    if args.train_steps:
        batches = batches_of(args.train_steps, args.seed)
        ours = pt.convert(copy.deepcopy(stock))
        fused = args.fused_optimizer
        table_opt = None
        if fused:
            table_opt = table_optimizer(stock, fused, args.lr, args.eps)
            options = {"lr": args.lr} if fused == "sgd" else {"lr": args.lr, "eps": args.eps}
            for t in ours.tables:
                t.set_fused_optimizer((fused, options))
        if getattr(args, "optimize", False):
            # the lookups and the dot interaction one fused op, in training too: its backward
            # steps each table by its own rule (the fused optimizer above, or a sparse gradient)
            ours = pt.optimize(ours, example_inputs=tuple(batches[0][:3]))
        loss_t, step_t, loss_o, step_o = train(stock, ours, batches, args.lr, table_opt,
                                               bool(fused))
        del ours, table_opt
        diff = float(np.max(np.abs(np.array(loss_t) - np.array(loss_o))))
        result["train"] = {"torch_s": step_t, "ours_s": step_o, "max_loss_diff": diff,
                           "loss_first": loss_t[0], "loss_last": loss_t[-1],
                           "fused_optimizer": fused}
        how = (f"tables: {fused}, torch unfused vs perfkernels fused" if fused
               else "tables: SGD on sparse gradients")
        print(f"training, {args.train_steps} steps ({how}): loss {loss_t[0]:.4f} -> "
              f"{loss_t[-1]:.4f}; max |loss torch - loss perfkernels| = {diff:.2e}")
        print(f"  time per step: torch {step_t * 1e3:.1f} ms, perfkernels {step_o * 1e3:.1f} ms "
              f"({step_t / step_o:.2f}x)")
        # fused and unfused Adagrad round differently (sums of duplicate rows, sqrt of the moment),
        # and training amplifies last-bit differences over the steps: a looser default there;
        # looser still for Adam, whose normalised step moves an element by about lr whatever its
        # gradient, so a near-zero gradient summed in another order can flip a step's sign
        tol = args.loss_tol if args.loss_tol is not None else (1e-3 if fused in (
            "adagrad", "rowwise_adagrad") else 5e-3 if fused == "adam" else 1e-4)
        if diff > tol:
            raise SystemExit(f"loss curves differ by {diff:.2e} > {tol}")

    # ---- inference: float32, float16 and 8-bit tables
    if not args.infer_batches:
        return result
    batches = batches_of(args.infer_batches, args.seed + 1)
    result["infer"] = {}
    print(f"\ninference, batch {args.batch}; ms per batch, end to end and embedding stage (emb);"
          f" 'torch hp': torch's tables on huge pages (= THP_MEM_ALLOC_ENABLE=1); speedups "
          f"vs torch's default placement (dflt) and the same placement (same); emb %: the "
          f"embedding stage's share of the time; AnonHugePages of the tables")
    print(f"{'tables':<9}{'torch':>8}{'torch hp':>9}{'ours':>8}{'x dflt':>8}{'x same':>8}"
          f"{'emb torch':>10}{'emb hp':>8}{'emb ours':>9}{'emb x':>7}{'emb %':>10}"
          f"{'max |dp|':>10}  huge pages torch / torch hp / ours")
    optimize = getattr(args, "optimize", False)
    # optimize(): converted as convert() does, then its lookups and the dot interaction one op
    make = (functools.partial(pt.optimize, example_inputs=tuple(batches[0][:3])) if optimize
            else pt.convert)
    for name, ref, ref_hp, conv in inference_variants(stock, make):
        if optimize:
            report = pt.last_optimize_report()
            print(f"  optimize() ({name}): " + ("; ".join(w for _, _, w in report.fused)
                                               if report.fused else "nothing fused"))
        with torch.inference_mode():
            p_ref = torch.cat([ref(*b[:3]) for b in batches])
            p_conv = torch.cat([conv(*b[:3]) for b in batches])
        dp = float((p_ref - p_conv).abs().max())
        tol = args.pred_tol if name != "float16" else 10 * args.pred_tol
        models = {"torch": ref, "ours": conv}
        if ref_hp is not None:
            models["torch_hp"] = ref_hp
        t = time_inference(models, batches, args.repeat)
        hp = t.get("torch_hp")
        pages = " / ".join(huge_pages(m) if m is not None else "-" for m in (ref, ref_hp, conv))
        result["infer"][name] = {**t, "max_pred_diff": dp, "huge_pages": pages}

        def ms(side, key="total"):
            return "-" if side is None else f"{side[key] * 1e3:.2f}"

        same = "-" if hp is None else f"{hp['total'] / t['ours']['total']:.2f}x"
        share = (f"{t['torch']['embedding'] / t['torch']['total']:.0%}/"
                 f"{t['ours']['embedding'] / t['ours']['total']:.0%}")
        print(f"{name:<9}{ms(t['torch']):>8}{ms(hp):>9}{ms(t['ours']):>8}"
              f"{t['torch']['total'] / t['ours']['total']:>7.2f}x{same:>8}"
              f"{ms(t['torch'], 'embedding'):>10}{ms(hp, 'embedding'):>8}"
              f"{ms(t['ours'], 'embedding'):>9}"
              f"{t['torch']['embedding'] / t['ours']['embedding']:>6.2f}x {share:>9} "
              f"{dp:>9.1e}  {pages}")
        del ref, ref_hp, conv, models
        if dp > tol:
            raise SystemExit(f"{name}: predictions differ by {dp:.2e} > {tol}")
    if args.plot:
        plot(result, args.plot)
    return result


def plot(result: dict, path: str) -> None:
    """Stacked bars: embedding stage and the rest (MLPs, interaction) per variant and side."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels, emb, rest = [], [], []
    for name, r in result["infer"].items():
        for side in ("torch", "ours"):
            labels.append(f"{name}\n{'torch' if side == 'torch' else 'perfkernels'}")
            emb.append(r[side]["embedding"] * 1e3)
            rest.append(max(r[side]["total"] - r[side]["embedding"], 0) * 1e3)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(labels, emb, label="embedding stage")
    ax.bar(labels, rest, bottom=emb, label="MLPs + interaction")
    ax.set_ylabel("ms per batch")
    ax.set_title("DLRM inference time per batch")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    print(f"plot written to {path}")


def _latency_module():
    """dlrm_latency.py beside this file (by path: this file may be loaded by path too)."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "perfkernels_dlrm_latency", Path(__file__).resolve().parent / "dlrm_latency.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(MODEL_CLASSES), default="criteo",
                   help="model class (default criteo; rm1-rm3: DeepRecSys's configurations)")
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--max-rows", type=int, default=None,
                   help="cap on rows per table (default per model: criteo 1M, rm1 500K, "
                        "rm2 65536, rm3 400K; about 512 MiB per float32 copy of the rm tables)")
    p.add_argument("--dim", type=int, default=None, help="embedding dimension (default: the "
                                                         "model's, 64 for criteo)")
    p.add_argument("--bag-size", type=int, default=None,
                   help="indices per sparse feature and sample (DLRM's "
                        "--num-indices-per-lookup; default: the model's, 10 for criteo; 1 is "
                        "Criteo's one-hot)")
    p.add_argument("--indices", choices=["zipf", "uniform"], default="zipf",
                   help="index distribution (default zipf)")
    p.add_argument("--train-steps", type=int, default=200)
    p.add_argument("--infer-batches", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3, help="timed passes over the batches")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--fused-optimizer", choices=["sgd", "adagrad", "rowwise_adagrad", "adam"],
                   help="train the converted model's tables with this fused optimizer (and the "
                        "stock model's with the same optimizer, unfused)")
    p.add_argument("--eps", type=float, default=1e-8, help="eps of the adagrad variants and adam")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loss-tol", type=float, default=None,
                   help="largest |loss difference| accepted (default 1e-4; 1e-3 with an Adagrad "
                        "--fused-optimizer, 5e-3 with adam)")
    p.add_argument("--pred-tol", type=float, default=1e-4)
    p.add_argument("--optimize", action="store_true",
                   help="optimize() the converted model (its lookups and the dot interaction "
                        "become one fused op) before training and timing it")
    p.add_argument("--plot", metavar="PATH", help="save the time breakdown as an image")
    p.add_argument("--distributed", action="store_true",
                   help="shard the tables over the ranks of a torchrun world instead "
                        "(examples/dlrm_distributed.py; --batch is per rank)")
    _latency_module().add_arguments(p)
    if "--distributed" in (sys.argv[1:] if argv is None else argv):
        from dlrm_distributed import add_arguments   # beside this file
        add_arguments(p)
    return p.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.distributed:
        from dlrm_distributed import Dense, run_distributed
        model_class = MODEL_CLASSES[arguments.model]   # its tables and MLP sizes (dot interaction)
        run_distributed(arguments, [(min(n, arguments.max_rows or model_class.max_rows),
                                     arguments.dim or model_class.dim,
                                     arguments.bag_size or model_class.lookups)
                                    for n in model_class.table_rows],
                        Dense(model_class.bottom[0], model_class.bottom[1:-1],
                              model_class.top[:-1]))
    else:
        run(arguments)
