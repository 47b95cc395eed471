"""ShardedEmbeddingCollection: the tables of an unpooled EmbeddingCollection spread over the ranks
of a ``torch.distributed`` process group by a :class:`~._plan.ShardingPlan`.

Each rank feeds its own batch (a KeyedJaggedTensor) and gets ``{feature: JaggedTensor}`` back,
one row per ID, as the unsharded :class:`~perfkernels.torch.EmbeddingCollection` gives them on
that batch.  One forward pass is three ``all_to_all_single`` exchanges:

1. counts: per destination, the number of IDs it will get, this rank's batch size, a status (a
   rank whose input is bad says so here; every rank raises, none hangs) and whether it trains
   (shared with the bag collection);
2. IDs: to each owner, per (feature, shard) it serves, the count of this rank's IDs that fall in
   its row block, then those IDs, rebased to the block (stably sorted by block: each block's IDs
   stay in input order);
3. rows: each owner looks up each of its tables once (every source's IDs of the table) and sends
   every source its rows in the order it got the IDs (as bytes: any float format); the source
   puts each block's rows back at its IDs' positions (a rank's own IDs' rows, and in backward
   their gradients, stay out of the exchanges).

Backward sends each owner the gradient of the rows it sent (float32, one more exchange); the
owner steps its rows with the fused optimizer, each ID a bag of one
(``perfkernels::embedding_bag_backward_update``, one call per table over every source's IDs), or
gives them a dense gradient.  Data-parallel tables are looked up locally; when they train their
IDs ride along in exchange 2 and their gradients in the backward exchange, to every rank, so
every replica applies the update of the whole global batch.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from perfkernels.torch import BagBackward
from perfkernels.torch._embedding import TORCH_INDEX_MESSAGE, lookup
from perfkernels.torch._embedding_collection import _jagged_class

from ._comm import int_tensor
from ._plan import DATA_PARALLEL, ShardingPlan
from ._sharded import _ShardedTables, _Slot, _TableInfo


def _as_rows(block: Tensor, dtype: torch.dtype, dim: int) -> Tensor:
    """Bytes received (``uint8``) as ``[n, dim]`` rows of ``dtype`` (copied when the block does
    not start on an element boundary of ``dtype``)."""
    size = torch.empty(0, dtype=dtype).element_size()
    if block.storage_offset() % size:
        block = block.clone()
    return block.view(dtype).view(-1, dim)


def _cat(tensors: list) -> Tensor:
    """``torch.cat`` that does not copy a lone tensor."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


def _bounds(sizes: Sequence[int]) -> tuple:
    """The start and end of each of consecutive blocks of ``sizes``."""
    ends = np.cumsum(sizes).tolist()
    return [e - n for e, n in zip(ends, sizes)], ends


def _groups(slots: Sequence[_Slot]) -> list:
    """``[(table, first slot, end slot)]``: runs of consecutive slots of one table."""
    out: list = []
    for j, s in enumerate(slots):
        if out and out[-1][0] == s.table:
            out[-1] = (s.table, out[-1][1], j + 1)
        else:
            out.append((s.table, j, j + 1))
    return out


class ShardedEmbeddingCollection(_ShardedTables):
    """A model-parallel :class:`~perfkernels.torch.EmbeddingCollection` (unpooled: one row per
    ID) over a process group.

    ``ShardedEmbeddingCollection(tables, plan, process_group=None, *, need_indices=False,
    fused_optimizer=None, gradient_division=True, seed=0)``

    * ``tables``: :class:`~perfkernels.torch.EmbeddingConfig` (or TorchRec's, or
      :class:`Table`) per table; float32, float16 or bfloat16 rows;
    * ``plan``: a :class:`ShardingPlan` for the group's size (:func:`plan` makes one from the
      same configs; its ``pooling_factors`` are the IDs per sample): table-wise, row-wise,
      table-row-wise or data-parallel tables;
    * ``fused_optimizer``: ``(name, options)`` as for the unsharded collection ("sgd",
      "adagrad", "rowwise_adagrad", "adam", "rowwise_adam", "adamw"): the owners step their rows
      during backward, each ID a bag of one; without it the local rows get dense gradients;
    * ``gradient_division``: divide the gradients by the world size (each rank's loss a mean
      over its batch: the gradient of the global batch's mean, as DistributedDataParallel);
    * ``seed``: the initial values depend on the seed and the row only, not on the plan;
    * ``need_indices``: each JaggedTensor's weights are its IDs, as the unsharded collection's.

    ``forward(features)`` takes this rank's batch as a KeyedJaggedTensor (ours or TorchRec's)
    and returns ``{feature: JaggedTensor}`` for the input's features, in the order of the tables
    and their features: the rows of the feature's IDs (float32, as TorchRec's) with the input's
    lengths.  A feature of no table is a
    ``KeyError``, an ID outside its table torch's ``IndexError`` (on the rank that got it; the
    other ranks raise ``ValueError``; nothing is exchanged or written).  Every rank must call it,
    in the same order as the other collectives.  The parameters are the local rows,
    ``embeddings.<table>.weight`` (the unsharded collection's names); ``state_dict`` gives
    ShardedTensors (``torch.distributed.checkpoint`` saves and reshards them).
    """

    _shards_attr = "embeddings"

    def __init__(self, tables: Sequence[Any], plan: ShardingPlan,
                 process_group: Optional[Any] = None, *, need_indices: bool = False,
                 fused_optimizer: Any = None, gradient_division: bool = True, seed: int = 0,
                 device: Any = None, _weights: Optional[dict] = None) -> None:
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(f"a sharded EmbeddingCollection's tables are CPU tables; got "
                             f"device={device!r}")
        super().__init__(tables, plan, process_group, is_weighted=False,
                         fused_optimizer=fused_optimizer, gradient_division=gradient_division,
                         seed=seed, device=None, _weights=_weights)
        self._need_indices = need_indices

    def _table_mode(self, cfg: Any) -> str:
        return "none"

    def _check_table(self, info: _TableInfo) -> None:
        if info.bits:
            raise ValueError(f"table {info.name!r}: an EmbeddingCollection's rows are float32, "
                             f"float16 or bfloat16; got {info.bits}-bit rows")

    def _index_error(self, message: str) -> Exception:
        return IndexError(f"{TORCH_INDEX_MESSAGE} (rank {self._group.rank}: {message})")

    @classmethod
    def from_collection(cls, collection: torch.nn.Module, plan: ShardingPlan,
                        process_group: Optional[Any] = None, *, data_type: Any = None,
                        **kwargs: Any) -> "ShardedEmbeddingCollection":
        """Shard an unsharded collection (ours, or TorchRec's ``EmbeddingCollection``) that
        every rank holds alike: each rank keeps its rows.  ``data_type`` converts every table
        (``torch.float16``, ``torch.bfloat16``), or, a dict, the tables it names."""
        configs, weights = cls._configs_of(collection.embedding_configs(),
                                           collection.embeddings, data_type)
        if hasattr(collection, "need_indices"):
            kwargs.setdefault("need_indices", collection.need_indices())
        return cls(configs, plan, process_group, _weights=weights, **kwargs)

    def embedding_configs(self) -> list:
        return self._configs

    def need_indices(self) -> bool:
        return self._need_indices

    # ------------------------------------------------------------------ forward
    def forward(self, features: Any) -> dict:
        """``{feature: JaggedTensor}`` of this rank's batch, as the unsharded collection."""
        trainable = self._trainable()
        training = torch.is_grad_enabled() and bool(trainable)
        dummy = torch.zeros((), requires_grad=training)
        meta: dict = {}
        values = _ShardedGather.apply(self, features, training, meta, dummy,
                                      *[w for _, w in trainable])
        jagged = _jagged_class()
        ids = (features.values().split(features.lengths().view(len(meta["keys"]), -1)
                                       .sum(1).tolist()) if self._need_indices and meta["keys"]
               else [None] * len(meta["keys"]))
        out = {key: jagged(values=v.float(), lengths=lens, weights=i)
               for key, v, lens, i in zip(meta["keys"], values, meta["lengths"], ids)}
        # as the unsharded collection (and TorchRec's): the tables' feature order, float32 rows
        return {key: out[key] for key in self._feature_names if key in out}

    def _route(self, per_feature: list) -> tuple:
        """Per (feature, shard start row): the feature's IDs in that shard's rows, rebased and
        in input order; per feature, the permutation that sorted its IDs by shard (None for a
        table of one shard) and the IDs per shard."""
        pieces, routes = {}, {}
        for f, (v, _, _) in enumerate(per_feature):
            s = self._tables[self._feature_table[f]].sharding
            if s.sharding_type == DATA_PARALLEL:
                continue
            if len(s.ranks) == 1:
                pieces[(f, 0)] = v
                routes[f] = (None, [v.numel()])
                continue
            inner = torch.tensor(s.row_offsets[1:-1], dtype=v.dtype)
            bucket = torch.bucketize(v, inner, right=True)
            order = torch.argsort(bucket, stable=True)
            sizes = torch.bincount(bucket, minlength=len(s.ranks)).tolist()
            starts = torch.tensor(s.row_offsets[:-1], dtype=v.dtype)
            local = v[order] - starts[bucket[order]]
            for start, part in zip(s.row_offsets[:-1], local.split(sizes)):
                pieces[(f, start)] = part
            routes[f] = (order, sizes)
        return pieces, routes

    def _forward(self, features: Any, training: bool) -> tuple:
        g = self._group
        per_feature, batch, error = self._split_input(features, strict=False)
        send_dp = training and bool(self._dp_slots)
        dp = list(self._dp_slots) if send_dp else []

        # 1. counts and status; 2. to each owner, per slot the count of IDs, then the IDs
        counts = [0] * g.size
        payload: list = []
        routes: dict = {}
        sent: list = [[] for _ in range(g.size)]       # [owner][slot]: IDs sent
        if error is None:
            pieces, routes = self._route(per_feature)
            for r in range(g.size):
                chosen = [pieces[(s.feature, s.start)] for s in self._slots[r]]
                chosen += [per_feature[s.feature][0] for s in dp]
                sent[r] = [c.numel() for c in chosen]
                payload.append(int_tensor(sent[r], self._device).to(self._itype))
                payload += chosen
                counts[r] = sum(sent[r])
        # and whether the input holds each table's features (the unsharded collection steps
        # a table only when the global batch has one of its features)
        keys = list(features.keys())
        n_in, _, extras = self._exchange_head(
            counts, batch, error, training,
            [int(any(f in keys for f in t.features)) for t in self._tables])
        absent = [t.name for i, t in enumerate(self._tables) if not any(e[i] for e in extras)]
        mine = self._slots[g.rank] + dp
        send = torch.cat(payload) if payload else torch.zeros(0, dtype=self._itype)
        send_splits = [len(self._slots[r]) + len(dp) + counts[r] for r in range(g.size)]
        recv_splits = [len(mine) + n_in[s] for s in range(g.size)]
        recv = g.all_to_all(send, send_splits, recv_splits, "sending the IDs to their owners")
        got: list = []                                  # [source][slot]: IDs received
        for part in recv.split(recv_splits):
            got.append(part[len(mine):].split(part[:len(mine)].tolist()))

        # 3. each table looked up once for every source; rows back, as bytes, to their sources
        # (this rank's own rows stay out of the exchange)
        me = g.rank
        own = self._slots[me]
        back: list = [[None] * len(own) for _ in range(g.size)]
        for t, a, b in _groups(own):
            ids = _cat([got[s][j] for j in range(a, b) for s in range(g.size)])
            rows = lookup(self._shards[self._tables[t].name].weight.detach(), ids)
            sizes = [got[s][j].numel() for j in range(a, b) for s in range(g.size)]
            parts = iter(rows.split(sizes))
            for j in range(a, b):
                for s in range(g.size):
                    back[s][j] = next(parts)
        send_b = [back[s][j].reshape(-1).view(torch.uint8) for s in range(g.size) if s != me
                  for j in range(len(own))]
        rows_in = g.all_to_all(
            torch.cat(send_b) if send_b else torch.zeros(0, dtype=torch.uint8),
            [0 if s == me else sum(x.numel() * x.element_size() for x in back[s])
             for s in range(g.size)],
            [0 if r == me else sum(n * self._row_bytes(sl)
                                   for n, sl in zip(sent[r], self._slots[r]))
             for r in range(g.size)], "returning the rows")

        # put every block's rows back at its IDs' positions
        blocks: dict = {}
        pos = 0
        for r in range(g.size):
            for j, (n, sl) in enumerate(zip(sent[r], self._slots[r])):
                if r == me:
                    blocks[(sl.feature, sl.start)] = back[me][j]
                    continue
                t = self._tables[sl.table]
                size = n * self._row_bytes(sl)
                blocks[(sl.feature, sl.start)] = _as_rows(rows_in[pos:pos + size],
                                                          self._shards[t.name].weight.dtype,
                                                          t.dim)
                pos += size
        lengths = features.lengths()
        out = []
        for i, key in enumerate(keys):
            f = self._feature_names.index(key)
            t = self._tables[self._feature_table[f]]
            if t.sharding.sharding_type == DATA_PARALLEL:
                out.append(lookup(self._shards[t.name].weight.detach(), per_feature[f][0]))
                continue
            order, sizes = routes[f]
            parts = [blocks[(f, start)] for start in t.sharding.row_offsets[:-1]]
            if order is None:
                out.append(parts[0])
            else:
                rows = torch.empty(order.numel(), t.dim, dtype=parts[0].dtype)
                for part, a, b in zip(parts, *_bounds(sizes)):
                    rows.index_copy_(0, order[a:b], part)
                out.append(rows)
        saved = dict(keys=keys, routes=routes, got=got, sent=sent, dp=dp, absent=absent,
                     dp_ids=[per_feature[sl.feature][0].numel() for sl in dp])
        return keys, [lengths[i * batch:(i + 1) * batch] for i in range(len(keys))], out, saved

    def _row_bytes(self, slot: _Slot) -> int:
        t = self._tables[slot.table]
        return t.dim * self._shards[t.name].weight.element_size()

    # ------------------------------------------------------------------ backward
    def _backward(self, grads_out: Sequence[Optional[Tensor]], saved: dict) -> dict:
        """Send each owner the gradient of the rows it sent; step (or give gradients to) the
        rows this rank holds.  Returns {table name: dense gradient} without a fused optimizer."""
        g = self._group
        routes, got, sent, dp = saved["routes"], saved["got"], saved["sent"], saved["dp"]
        scale = 1.0 / g.size if self._gradient_division and g.size > 1 else 1.0
        per_feature: dict = {}
        for key, grad in zip(saved["keys"], grads_out):
            per_feature[self._feature_names.index(key)] = grad
        pieces: dict = {}
        for f, (order, sizes) in routes.items():
            grad = per_feature.get(f)
            n = sum(sizes)
            dim = self._dims[f]
            grad = torch.zeros(n, dim) if grad is None else grad.float().reshape(n, dim)
            if scale != 1.0:
                grad = grad * scale
            s = self._tables[self._feature_table[f]].sharding
            parts = [grad] if order is None else grad.index_select(0, order).split(sizes)
            for start, part in zip(s.row_offsets[:-1], parts):
                pieces[(f, start)] = part
        for sl, n in zip(dp, saved["dp_ids"]):
            grad = per_feature.get(sl.feature)
            grad = torch.zeros(n, sl.dim) if grad is None else grad.float().reshape(n, sl.dim)
            pieces[(sl.feature, "dp")] = grad * scale if scale != 1.0 else grad
        # to each owner, the gradients of its slots' rows (this rank's own: no exchange)
        me = g.rank
        outgoing = [[pieces[(sl.feature, sl.start)] for sl in self._slots[r]]
                    + [pieces[(sl.feature, "dp")] for sl in dp] for r in range(g.size)]
        mine = self._slots[me] + dp
        dims = [sl.dim for sl in mine]
        recv_splits = [0 if s == me else sum(ids.numel() * d for ids, d in zip(got[s], dims))
                       for s in range(g.size)]
        send = [x.reshape(-1) for r in range(g.size) if r != me for x in outgoing[r]]
        recv = g.all_to_all(
            torch.cat(send) if send else torch.zeros(0),
            [0 if r == me else sum(x.numel() for x in outgoing[r]) for r in range(g.size)],
            recv_splits, "returning the gradients to the owners")
        rows_of: list = []                              # [source][slot]: gradient rows
        for s, part in enumerate(recv.split(recv_splits)):
            rows_of.append(outgoing[me] if s == me else
                           [p.view(-1, d) for p, d in
                            zip(part.split([ids.numel() * d for ids, d in zip(got[s], dims)]),
                                dims)])
        grads: dict = {}
        self._stepped: set = set()
        for t, a, b in _groups(mine):        # one update per table: every source's IDs
            if self._tables[t].name in saved["absent"]:
                continue
            order = [(j, s) for j in range(a, b) for s in range(g.size)]
            ids = _cat([got[s][j] for j, s in order])
            rows = _cat([rows_of[s][j] for j, s in order])
            shard = self._shards[self._tables[t].name]
            n = ids.numel()
            bag = BagBackward(rows, ids, torch.arange(n + 1, dtype=ids.dtype), None, "sum", True,
                              None, shard.weight.shape[0], shard.weight.dtype)
            self._apply_grad(self._tables[t], bag, grads)
        self._count_steps(saved["absent"])
        return grads


class _ShardedGather(torch.autograd.Function):
    """The sharded lookup and its reverse exchange as one autograd node: outputs are the values
    of each input feature (then an empty placeholder, so that there is always one); inputs after
    the fourth are the local trainable rows (dense gradients, or none with a fused optimizer)."""

    @staticmethod
    def forward(ctx, module: ShardedEmbeddingCollection, features: Any, training: bool,
                meta: dict, dummy: Tensor, *weights: Tensor) -> tuple:
        keys, lengths, values, saved = module._forward(features, training)
        meta["keys"], meta["lengths"] = keys, lengths
        ctx.module, ctx.saved = module, saved
        ctx.names = [name for name, _ in module._trainable()] if training else []
        return (*values, torch.zeros(0))

    @staticmethod
    def backward(ctx, *grads: Tensor):
        out = ctx.module._backward(grads[:-1], ctx.saved)
        ctx.saved = None
        return (None, None, None, None, None, *[out.get(n) for n in ctx.names])
