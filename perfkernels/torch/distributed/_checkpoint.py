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
    tables: dict = {}
    formats: dict = {}
    for t, full in _gathered(module, dst):
        formats[t.name] = f"{t.bits}-bit" if t.bits else str(t.dtype).replace("torch.", "")
        if full is not None:
            tables[f"{module._shards_attr}.{t.name}.weight"] = full
    if module._group.rank != dst:
        return None
    result = {"state_dict": tables, "formats": formats}
    if path is not None:
        torch.save(result, os.fspath(path))
    return result


def export_table_files(module: _ShardedTables, directory: PathLike,
                       dst: int = 0) -> Optional[dict]:
    """Gather every table whole on rank ``dst``, one at a time, and write each there as a table
    file ``directory/<table>.pkt`` (packed rows stay packed; written atomically, see
    :func:`perfkernels.tables.save_table`), so that a server maps the tables instead of loading
    a checkpoint into memory::

        out = pkd.export_table_files(ebc, "/data/tables")           # every rank calls it
        serving = EmbeddingBagCollection.from_files(out["files"],    # on rank dst, or later
                                                    feature_names=out["feature_names"],
                                                    pooling=out["pooling"])

    Returns, on ``dst``, ``{"files": {table: path}, "feature_names": {table: [feature, ...]},
    "pooling": {table: "sum" | "mean"}}``, also written as ``directory/tables.json`` (file names
    relative to it); None elsewhere.  ``dst`` holds one whole table at a time, not the model;
    no optimizer state is written.  A sharded :class:`ShardedEmbeddingCollection`'s tables are
    written too (pooling ``"none"``: map each with :func:`perfkernels.tables.load_table`)."""
    import json

    from ... import tables as _tables
    directory = os.fspath(directory)
    mine = module._group.rank == dst
    if mine:
        os.makedirs(directory, exist_ok=True)
    files: dict = {}
    for t, full in _gathered(module, dst):
        if full is None:
            continue
        path = os.path.join(directory, f"{t.name}.pkt")
        _tables.save_table(path, full, bits=t.bits or None, dim=t.dim if t.bits else None)
        files[t.name] = path
    if not mine:
        return None
    manifest = {"files": files,
                "feature_names": {t.name: list(t.features) for t in module._tables},
                "pooling": {t.name: t.mode for t in module._tables}}
    tmp = os.path.join(directory, f".tables.json.{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump({**manifest, "files": {k: os.path.basename(v) for k, v in files.items()}},
                  f, indent=1)
    os.replace(tmp, os.path.join(directory, "tables.json"))
    return manifest


def _gathered(module: _ShardedTables, dst: int):
    """Each table of ``module`` as ``(info, whole table on dst or None)``, one at a time (one
    ``all_to_all_single`` each for a sharded table); every rank iterates it to the end."""
    g = module._group
    for t in module._tables:
        local = module._shards[t.name].weight.detach()
        s = t.sharding
        if s.sharding_type == DATA_PARALLEL:
            yield t, (local.clone() if g.rank == dst else None)
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
            yield t, None
            continue
        blocks = dict(zip(range(g.size), got.split(recv_splits)))
        ordered = [blocks[r] for r in s.ranks]          # ranks in row order
        yield t, torch.cat(ordered).view(local.dtype).reshape(t.rows, *local.shape[1:])


def _row_bytes_of(local: torch.Tensor) -> int:
    return (local.shape[1] if local.dim() > 1 else 1) * local.element_size()
