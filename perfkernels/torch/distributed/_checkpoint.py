"""Checkpoints of a sharded collection: sharded, through ``torch.distributed.checkpoint`` (each
rank writes its rows; loading reshards onto any plan and world size), and a plain single file of
the full tables for serving.
"""
from __future__ import annotations

import os
from typing import Optional, Union

import torch

from ._plan import DATA_PARALLEL
from ._sharded import _ShardedTables

PathLike = Union[str, "os.PathLike[str]"]


def save_checkpoint(module: torch.nn.Module, path: PathLike) -> None:
    """Write ``module.state_dict()`` (sharded tables as ShardedTensors, each rank its own rows,
    replicated tensors once) to the directory ``path`` with ``torch.distributed.checkpoint``.
    Every rank of the module's group calls it."""
    import torch.distributed.checkpoint as dcp
    pg = getattr(module, "process_group", None)
    dcp.save({"model": module.state_dict()}, checkpoint_id=os.fspath(path), process_group=pg,
             no_dist=not _distributed())


def load_checkpoint(module: torch.nn.Module, path: PathLike) -> None:
    """Fill ``module`` from a checkpoint written by :func:`save_checkpoint`, on any plan and any
    number of ranks (each rank reads the parts of the saved rows that its plan gives it), or into
    an unsharded :class:`~perfkernels.torch.EmbeddingBagCollection` in a single process."""
    import torch.distributed.checkpoint as dcp
    pg = getattr(module, "process_group", None)
    state = {"model": module.state_dict()}
    dcp.load(state, checkpoint_id=os.fspath(path), process_group=pg, no_dist=not _distributed())
    module.load_state_dict(state["model"])


def _distributed() -> bool:
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized()


def export_tables(module: _ShardedTables, path: Optional[PathLike] = None,
                  dst: int = 0) -> Optional[dict]:
    """Gather every table whole on rank ``dst`` (one table at a time, one ``all_to_all_single``
    each) and, there, ``torch.save`` to ``path`` the dict ``{"state_dict": {"embedding_bags.
    <table>.weight": tensor, ...}, "formats": {table: "float32" | "float16" | "bfloat16" |
    "8-bit" | "4-bit" | "2-bit"}}``.  The state_dict has the unsharded collection's keys, so
    ``EmbeddingBagCollection.load_state_dict`` takes it (float tables); packed tables are their
    uint8 rows.  Returns the dict on ``dst``, None elsewhere.  Every rank calls it; ``dst`` needs
    the memory of the whole model (no optimizer state is exported).  A sharded
    ``EmbeddingCollection``'s keys are ``embeddings.<table>.weight``, its unsharded
    collection's."""
    g = module._group
    tables: dict = {}
    formats: dict = {}
    for t in module._tables:
        local = module._shards[t.name].weight.detach()
        formats[t.name] = f"{t.bits}-bit" if t.bits else str(t.dtype).replace("torch.", "")
        s = t.sharding
        if s.sharding_type == DATA_PARALLEL:
            if g.rank == dst:
                tables[f"{module._shards_attr}.{t.name}.weight"] = local.clone()
            continue
        as_bytes = local.contiguous().view(torch.uint8).reshape(-1)
        send_splits = [as_bytes.numel() if r == dst else 0 for r in range(g.size)]
        rows_from = [0] * g.size
        for k, r in enumerate(s.ranks):
            rows_from[r] = s.row_offsets[k + 1] - s.row_offsets[k]
        row = _row_bytes_of(local)
        recv_splits = [rows_from[r] * row if g.rank == dst else 0 for r in range(g.size)]
        got = g.all_to_all(as_bytes, send_splits, recv_splits,
                           f"gathering table {t.name!r} on rank {dst}")
        if g.rank != dst:
            continue
        blocks = dict(zip(range(g.size), got.split(recv_splits)))
        ordered = [blocks[r] for r in s.ranks]          # ranks in row order
        full = torch.cat(ordered).view(local.dtype).reshape(t.rows, *local.shape[1:])
        tables[f"{module._shards_attr}.{t.name}.weight"] = full
    if g.rank != dst:
        return None
    result = {"state_dict": tables, "formats": formats}
    if path is not None:
        torch.save(result, os.fspath(path))
    return result


def _row_bytes_of(local: torch.Tensor) -> int:
    return (local.shape[1] if local.dim() > 1 else 1) * local.element_size()
