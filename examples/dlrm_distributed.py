"""DLRM with its embedding tables sharded over processes and hosts (``examples/dlrm.py
--distributed``): perfkernels.torch.distributed for the tables, DistributedDataParallel for the
MLPs.

Run under torchrun, one process per rank (gloo on CPU)::

    torchrun --nproc-per-node 2 examples/dlrm.py --distributed --max-rows 100000
    # several hosts: the same command on each, with a rendezvous endpoint all of them reach
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST0:29500 \\
        --rdzv-id dlrm examples/dlrm.py --distributed

Every rank feeds its own slice of each global batch (``--batch`` samples per rank).  The planner
places the tables (``--memory-budget`` bytes per rank; ranks per host from torchrun's
LOCAL_WORLD_SIZE, for table-row-wise sharding) and rank 0 prints the plan.  The tables train with a
fused optimizer on their owners, the MLPs with SGD under DistributedDataParallel.  Unless
``--no-check``, rank 0 first trains the same model in one process on the global batches (the
other ranks wait at a monitored barrier) and the distributed loss curve must match it, and the
predictions after training too.
"""
from __future__ import annotations

import argparse
import datetime
import os
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import perfkernels.torch as pt
from perfkernels.torch import distributed as pkd

from dlrm import DLRM, mlp


@dataclass(frozen=True)
class Dense:
    """The dense part of a DLRM-like model: dense input features and the hidden sizes of the
    bottom and top MLPs (defaults: DLRM on Criteo, 13-512-256-D and 512-256-1)."""
    features: int = 13
    bottom: tuple = (512, 256)
    top: tuple = (512, 256)


class DenseDLRM(nn.Module):
    """DLRM without its tables: bottom MLP, dot interaction with the pooled embeddings, top MLP.
    ``forward(dense, pooled)`` with ``pooled`` ``[B, tables * dim]`` (a KeyedTensor's values)."""

    interact = DLRM.interact

    def __init__(self, num_tables: int, dim: int, dense: Dense = Dense()) -> None:
        super().__init__()
        self.dim = dim
        self.bottom = mlp([dense.features, *dense.bottom, dim])
        f = num_tables + 1
        self.top = mlp([dim + f * (f - 1) // 2, *dense.top, 1], last_sigmoid=True)
        rows, cols = torch.tril_indices(f, f, offset=-1)
        self.register_buffer("pairs", rows * f + cols, persistent=False)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        ly = list(pooled.split(self.dim, dim=1))
        return self.top(self.interact(x, ly)).squeeze(1)


def table_configs(tables: Sequence[tuple]) -> list:
    """``tables``: (rows, dim, lookups per sample) each; feature ``f<i>`` reads table ``t<i>``."""
    return [pt.EmbeddingBagConfig(rows, dim, name=f"t{i}", feature_names=[f"f{i}"])
            for i, (rows, dim, _) in enumerate(tables)]


def make_batches(tables: Sequence[tuple], batch: int, count: int, seed: int,
                 dense_features: int = 13, zipf_a: float = 1.1) -> list:
    """Global batches (dense [B, dense_features], keys, values, lengths, labels): each table's
    lookups per sample as given, Zipf-distributed rows scattered by a multiplicative hash."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        dense = torch.from_numpy(np.log1p(rng.lognormal(0, 1, (batch, dense_features)))
                                 .astype(np.float32))
        values, lengths = [], []
        for rows, _, lookups in tables:
            z = rng.zipf(zipf_a, batch * lookups) - 1
            values.append(torch.from_numpy((z * 2654435761) % rows))
            lengths.append(torch.full((batch,), lookups, dtype=torch.int64))
        labels = torch.from_numpy((rng.random(batch) < 0.25).astype(np.float32))
        out.append((dense, values, lengths, labels))
    return out


def rank_slice(batch_tuple: tuple, lo: int, hi: int) -> tuple:
    """Samples lo:hi of a global batch: (dense, KeyedJaggedTensor, labels)."""
    dense, values, lengths, labels = batch_tuple
    keys = [f"f{i}" for i in range(len(values))]
    vals, lens = [], []
    for v, n in zip(values, lengths):
        per = int(n[0])                      # fixed lookups per sample
        vals.append(v[lo * per:hi * per])
        lens.append(n[lo:hi])
    kjt = pt.KeyedJaggedTensor(keys, torch.cat(vals), lengths=torch.cat(lens))
    return dense[lo:hi], kjt, labels[lo:hi]


def fused_spec(args: argparse.Namespace) -> tuple:
    name = args.fused_optimizer or "sgd"
    return (name, {"lr": args.lr} if name == "sgd" else {"lr": args.lr, "eps": args.eps})


def train_single(tables: Sequence[tuple], args: argparse.Namespace, batches: list,
                 dense_part: Dense) -> tuple:
    """The same model in one process on the global batches: (losses, model parts)."""
    configs = table_configs(tables)
    ebc = pt.EmbeddingBagCollection(configs, fused_optimizer=fused_spec(args))
    with torch.no_grad():
        for i, c in enumerate(configs):
            bound = (1.0 / c.num_embeddings) ** 0.5
            ebc.embedding_bags[c.name].weight.copy_(
                pkd.initial_rows(args.seed, i, (0, c.num_embeddings), c.embedding_dim, -bound,
                                 bound))
    torch.manual_seed(args.seed)
    dense_model = DenseDLRM(len(tables), tables[0][1], dense_part)
    opt = torch.optim.SGD(dense_model.parameters(), lr=args.lr)
    losses = []
    for b in batches:
        dense, kjt, labels = rank_slice(b, 0, len(b[3]))
        loss = nn.functional.binary_cross_entropy(dense_model(dense, ebc(kjt).values()), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, ebc, dense_model


def run_distributed(args: argparse.Namespace, tables: Sequence[tuple],
                    dense_part: Dense = Dense()) -> dict:
    """Train and infer DLRM with ``tables`` ((rows, dim, lookups per sample) each) sharded over
    the torchrun world, and the MLPs of ``dense_part``; returns rank 0's measurements."""
    if len({d for _, d, _ in tables}) != 1:
        raise SystemExit("DLRM's dot interaction needs one embedding dim for every table")
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    dim = tables[0][1]
    configs = table_configs(tables)
    plan = pkd.plan(configs, world, batch_size=args.batch, memory_budget=args.memory_budget,
                    local_world_size=local_world if local_world < world else None,
                    pooling_factors={c.name: t[2] for c, t in zip(configs, tables)},
                    optimizer=fused_spec(args)[0], replicate_below=args.replicate_below)
    if rank == 0:
        print(plan, flush=True)
    gb = args.batch * world
    batches = make_batches(tables, gb, args.train_steps, args.seed, dense_part.features)
    result: dict = {"world_size": world, "backend": backend}

    reference = None
    if not args.no_check:
        if rank == 0:
            reference = train_single(tables, args, batches, dense_part)
        pkd.check_peers(timeout=args.timeout + 600)   # the others wait for the reference

    ebc = pkd.ShardedEmbeddingBagCollection(configs, plan, fused_optimizer=fused_spec(args),
                                            seed=args.seed)
    torch.manual_seed(args.seed)
    dense_model = nn.parallel.DistributedDataParallel(DenseDLRM(len(tables), dim,
                                                                 dense_part))
    opt = torch.optim.SGD(dense_model.parameters(), lr=args.lr)
    lo, hi = rank * args.batch, (rank + 1) * args.batch
    losses, times = [], []
    for b in batches:
        dense, kjt, labels = rank_slice(b, lo, hi)
        t0 = time.perf_counter()
        loss = nn.functional.binary_cross_entropy(dense_model(dense, ebc(kjt).values()), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    step = float(np.median(times[1:] or times))
    comm = ebc.collective_seconds()
    result["train"] = {"loss_first": losses[0], "loss_last": losses[-1], "step_s": step,
                       "samples_per_s": gb / step}

    # inference: every rank its slice; rank 0 compares with the single-process model
    infer = make_batches(tables, gb, args.infer_batches, args.seed + 1, dense_part.features)
    preds, t_inf = [], []
    with torch.no_grad():
        for b in infer:
            dense, kjt, _ = rank_slice(b, lo, hi)
            t0 = time.perf_counter()
            preds.append(dense_model.module(dense, ebc(kjt).values()))
            t_inf.append(time.perf_counter() - t0)
    gathered = [None] * world
    dist.all_gather_object(gathered, preds)
    verdict = ""
    if rank == 0:
        print(f"training on {world} ranks ({backend}), {len(batches)} steps, batch {args.batch} "
              f"per rank: loss {losses[0]:.4f} -> {losses[-1]:.4f}; {step * 1e3:.1f} ms per "
              f"step, {gb / step:,.0f} samples/s; in collectives (rank 0, all steps): "
              + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in comm.items()))
        if infer:
            t = float(np.median(t_inf))
            print(f"inference: {t * 1e3:.2f} ms per batch, {gb / t:,.0f} samples/s")
            result["infer"] = {"batch_s": t, "samples_per_s": gb / t}
        if reference is not None:
            ref_losses, ref_ebc, ref_dense = reference
            diff = float(np.max(np.abs(np.array(losses) - np.array(ref_losses))))
            tol = args.loss_tol if args.loss_tol is not None else (
                1e-3 if args.fused_optimizer in ("adagrad", "rowwise_adagrad")
                else 5e-3 if args.fused_optimizer == "adam" else 1e-4)
            result["train"]["max_loss_diff"] = diff
            if diff > tol:
                verdict = f"loss curves differ by {diff:.2e} > {tol}"
            else:
                print(f"loss curves agree with the single-process run: max |difference| "
                      f"{diff:.2e} <= {tol}")
            dp = 0.0
            with torch.no_grad():
                for i, b in enumerate(infer):
                    dense, kjt, _ = rank_slice(b, 0, gb)
                    expected = ref_dense(dense, ref_ebc(kjt).values())
                    ours = torch.cat([p[i] for p in gathered])
                    dp = max(dp, float((ours - expected).abs().max()))
            result["max_pred_diff"] = dp
            if dp > args.pred_tol:
                verdict = verdict or f"predictions differ by {dp:.2e} > {args.pred_tol}"
            elif infer:
                print(f"predictions agree: max |difference| {dp:.2e}")
    verdicts = [None] * world
    dist.all_gather_object(verdicts, verdict)
    dist.destroy_process_group()
    if verdicts[0]:
        raise SystemExit(verdicts[0])
    return result


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of the distributed run (beside dlrm.py's --batch, --lr, ...)."""
    p.add_argument("--backend", choices=["gloo", "nccl", "mpi"],
                   help="torch.distributed backend (default: nccl with a GPU, else gloo)")
    p.add_argument("--timeout", type=float, default=300,
                   help="seconds a collective may wait for the other ranks before failing")
    p.add_argument("--memory-budget", type=int, default=None,
                   help="bytes of tables (and fused-optimizer state) per rank")
    p.add_argument("--replicate-below", type=int, default=64 * 1024,
                   help="replicate tables of at most this many bytes on every rank")
    p.add_argument("--no-check", action="store_true",
                   help="skip the single-process reference run (large models)")
