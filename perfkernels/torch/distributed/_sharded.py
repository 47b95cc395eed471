"""ShardedEmbeddingBagCollection: the tables of an EmbeddingBagCollection spread over the ranks
of a ``torch.distributed`` process group by a :class:`~._plan.ShardingPlan`.

Each rank feeds its own batch (data-parallel input, TorchRec's KeyedJaggedTensor layout) and gets
its own pooled rows back (``[its batch, sum of dims]``), as the unsharded collection gives them.
One forward pass is three ``all_to_all_single`` exchanges (four with per-sample weights):

1. counts: per destination, the number of indices it will get, this rank's batch size, a
   status (a rank whose input is bad says so here, and every rank raises, none hangs) and
   whether it trains (all ranks must agree);
2. features: per destination, the lengths and indices of every feature whose table it holds rows
   of (row-wise tables: only the indices in its row block, rebased to it), feature-major;
   the per-sample weights travel alike;
3. pooled rows: each owner looks up everything it got in one ``embedding_bags_multi`` call, the
   samples of every source back to back, and sends each source its rows; the source adds the
   partial sums of a row-wise table in the order of its shards (fixed), so results are the same
   from run to run.

Backward sends each owner the gradient of its pooled rows (one more exchange); the owner updates
its rows with the fused optimizer (:func:`perfkernels.embedding_bag_backward_update`, the state
with the shard) or gives them a dense gradient.  Data-parallel tables are looked up locally; when
they train, their features go to every rank in exchange 2 and their gradients in the backward
exchange, and every replica applies the same update from the whole global batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

import perfkernels as pk
import perfkernels.torch as pt
from perfkernels.torch import BagBackward, FusedOptimizer, KeyedTensor
from perfkernels.torch._bridge import index_error
from perfkernels.torch import _bags

from ._comm import Group, int_tensor
from ._plan import DATA_PARALLEL, ShardingPlan, Table, row_bytes, table_format

_INIT_BLOCK = 1 << 16          # rows per independently seeded block of the initial values


@dataclass
class _TableInfo:
    index: int
    name: str
    rows: int
    dim: int
    mode: str
    dtype: Optional[torch.dtype]       # float tables
    bits: int                          # packed tables (8 / 4 / 2), else 0
    features: list
    sharding: Any
    init: tuple                        # (low, high) of the uniform initial values


@dataclass
class _Slot:
    """One (feature, table shard) pair: what one rank looks up for one feature."""
    feature: int                       # the module's feature number (output order)
    table: int
    start: int                         # first global row of the shard
    col: int                           # first output column of the feature
    dim: int


class _Shard(torch.nn.Module):
    """The rows ``[row_start, row_end)`` of one table that this rank holds (``weight``, a
    parameter for float tables, a uint8 buffer of packed rows otherwise) and their fused
    optimizer state (``momentum1``; the Adam family also ``momentum2`` and ``step``)."""

    def __init__(self, weight: Tensor, trainable: bool) -> None:
        super().__init__()
        if trainable:
            self.weight = torch.nn.Parameter(weight)
        else:
            self.register_buffer("weight", weight)


def _numpy(t: Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor (bfloat16 as ``ml_dtypes.bfloat16``), no copy."""
    t = t.detach()
    if t.dtype is torch.bfloat16:
        import ml_dtypes
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _pooling_mode(pooling: Any) -> str:
    """``"sum"`` / ``"mean"`` from a string or TorchRec's ``PoolingType``."""
    mode = str(getattr(pooling, "name", pooling)).lower()
    if mode not in ("sum", "mean"):
        raise ValueError(f"pooling must be sum or mean; got {pooling!r}")
    return mode


def _seed(seed: int, table: int, block: int) -> int:
    return (seed * 0x9E3779B1 + table * 0x85EBCA6B + block * 0xC2B2AE35) % (2 ** 63)


def initial_rows(seed: int, table: int, rows: tuple, dim: int, low: float, high: float
                 ) -> Tensor:
    """Uniform(low, high) float32 rows ``rows = (start, end)`` of table number ``table``: each
    block of 65536 rows has its own seed, so a row's value does not depend on the sharding."""
    start, end = rows
    out = torch.empty(end - start, dim)
    for block in range(start // _INIT_BLOCK, -(-end // _INIT_BLOCK)):
        b0 = block * _INIT_BLOCK
        g = torch.Generator().manual_seed(_seed(seed, table, block))
        values = torch.empty(_INIT_BLOCK, dim).uniform_(low, high, generator=g)
        lo, hi = max(start, b0), min(end, b0 + _INIT_BLOCK)
        out[lo - start:hi - start] = values[lo - b0:hi - b0]
    return out


def _segment_ids(lengths: Tensor, total: int) -> Tensor:
    """The bag number of each of ``total`` entries whose bags have ``lengths``."""
    return torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device),
                                   lengths, output_size=total)


class _ShardedTables(torch.nn.Module):
    """What the sharded collections share: the local shards of every table (``<attr>.<table>``,
    ``attr`` the unsharded collection's: ``embedding_bags`` or ``embeddings``) and their fused
    optimizers, the slots each rank looks up, the check that every rank built the module alike,
    the input's validation, the first exchange (counts and status) and the owner's update."""

    #: the attribute holding the shards, and the state_dict prefix (the unsharded collection's)
    _shards_attr = "embedding_bags"

    def __init__(self, tables: Sequence[Any], plan: ShardingPlan,
                 process_group: Optional[Any] = None, *, is_weighted: bool = False,
                 fused_optimizer: Any = None,
                 gradient_division: bool = True, seed: int = 0, device: Any = None,
                 _weights: Optional[dict] = None) -> None:
        super().__init__()
        self._group = Group(process_group)
        g = self._group
        plan.validate(tables, g.size)          # before any collective: refuse a bad plan
        self.plan = plan
        self._is_weighted = is_weighted
        self._configs = list(tables)
        self._gradient_division = gradient_division
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        self._tables: list[_TableInfo] = []
        self._feature_names: list[str] = []
        self._feature_table: list[int] = []
        for i, cfg in enumerate(self._configs):
            spec = Table.from_config(cfg)
            dtype, bits = table_format(spec.data_type)
            features = list(getattr(cfg, "feature_names", None) or [spec.name])
            bound = math.sqrt(1.0 / spec.num_embeddings)
            lo = getattr(cfg, "weight_init_min", None)
            hi = getattr(cfg, "weight_init_max", None)
            info = _TableInfo(i, spec.name, spec.num_embeddings, spec.embedding_dim,
                              self._table_mode(cfg), dtype, bits,
                              features, plan.shardings[spec.name],
                              (-bound if lo is None else lo, bound if hi is None else hi))
            self._check_table(info)
            self._tables.append(info)
            for f in features:
                if f in self._feature_names:
                    raise ValueError(f"feature {f!r} is read by two tables")
                self._feature_names.append(f)
                self._feature_table.append(i)
        self._dims = [self._tables[t].dim for t in self._feature_table]
        #: the type the indices and lengths travel in: int32 while every row number fits
        self._itype = (torch.int32 if max((t.rows for t in self._tables), default=0) < 2**31
                       else torch.int64)
        self._cols = np.concatenate([[0], np.cumsum(self._dims)]).astype(int).tolist()
        self._fused = (None if fused_optimizer is None
                       else FusedOptimizer.from_spec(fused_optimizer))
        self._optimizers: dict = {}

        # the local rows of every table (0 rows where this rank holds none)
        setattr(self, self._shards_attr, torch.nn.ModuleDict())
        for t in self._tables:
            start, end = t.sharding.rows_of(g.rank)
            if _weights is not None:
                rows = _weights[t.name][start:end].detach().to(torch.float32, copy=True)
            else:
                rows = initial_rows(seed, t.index, (start, end), t.dim, *t.init)
            if t.bits:
                packed = pk.quantize_rowwise(rows.numpy(), bits=t.bits) if end > start else \
                    np.zeros((0, row_bytes(t.dim, t.bits)), np.uint8)
                weight = torch.from_numpy(packed).to(self._device)
            else:
                weight = rows.to(device=self._device, dtype=t.dtype).contiguous()
            shard = _Shard(weight, trainable=not t.bits)
            if self._fused is not None and not t.bits:
                opt = FusedOptimizer(self._fused.name, self._fused.options())
                for name, buf in opt.initial_buffers(weight).items():
                    shard.register_buffer(name, buf)
                self._optimizers[t.name] = opt
            self._shards[t.name] = shard

        # what each rank looks up: its slots, grouped by table, features in order
        self._slots: list[list[_Slot]] = [[] for _ in range(g.size)]
        self._dp_slots: list[_Slot] = []
        for t in self._tables:
            for f, name in enumerate(self._feature_names):
                if self._feature_table[f] != t.index:
                    continue
                if t.sharding.sharding_type == DATA_PARALLEL:
                    self._dp_slots.append(_Slot(f, t.index, 0, self._cols[f], t.dim))
                    continue
                for k, r in enumerate(t.sharding.ranks):
                    self._slots[r].append(_Slot(f, t.index, t.sharding.row_offsets[k],
                                                self._cols[f], t.dim))
        self._register_state_dict_hook(_state_dict_hook)
        self._register_load_state_dict_pre_hook(_load_state_dict_pre_hook, with_module=True)
        self._check_agreement()

    # ------------------------------------------------------------------ construction helpers
    @property
    def _shards(self) -> torch.nn.ModuleDict:
        return getattr(self, self._shards_attr)

    def _table_mode(self, cfg: Any) -> str:
        """The pooling of a table (``"sum"`` / ``"mean"``; unpooled collections: ``"none"``)."""
        return _pooling_mode(getattr(cfg, "pooling", "sum"))

    def _check_table(self, info: _TableInfo) -> None:
        """Refuse a table this collection cannot hold (every format is fine by default)."""

    def _index_error(self, message: str) -> Exception:
        """The exception for an index outside its table, raised on the rank that got it."""
        return ValueError(f"rank {self._group.rank}: {message}")

    @staticmethod
    def _configs_of(configs: Sequence[Any], shards: Any, data_type: Any) -> tuple:
        """An unsharded collection's tables as configs of ``data_type`` (a format for every
        table, a dict of formats by table, or None: the table's own) and its full weights."""
        out, weights = [], {}
        for cfg in configs:
            spec = Table.from_config(cfg)
            fmt = data_type.get(spec.name) if isinstance(data_type, dict) else data_type
            if fmt is None:
                fmt = getattr(cfg, "data_type", None) or shards[spec.name].weight.dtype
            out.append(_Config(spec.name, spec.num_embeddings, spec.embedding_dim,
                               list(getattr(cfg, "feature_names", None) or [spec.name]),
                               getattr(cfg, "pooling", "sum"), fmt))
            weights[spec.name] = shards[spec.name].weight
        return out, weights

    def _check_agreement(self) -> None:
        """Every rank must hold the same tables, features and plan: compared once here (one
        small all_gather of a description), so that a mismatch is refused by every rank, naming
        the first rank that differs, before any batch is exchanged."""
        mine = (self._feature_names,
                [(t.name, t.rows, t.dim, t.mode, str(t.dtype), t.bits) for t in self._tables],
                {n: (s.sharding_type, s.ranks, s.row_offsets)
                 for n, s in self.plan.shardings.items()},
                self._is_weighted, self._fused.name if self._fused else None)
        every = self._group.all_gather_object(mine, "comparing the collection across ranks")
        for r, theirs in enumerate(every):
            if theirs == mine:
                continue
            what = ["features", "tables", "plans", "is_weighted", "fused optimizers"]
            for k in range(len(mine)):
                if theirs[k] != mine[k]:
                    detail = ""
                    if k == 0:
                        detail = (f": rank {self._group.rank} has {mine[0]}, rank {r} has "
                                  f"{theirs[0]}")
                    elif k in (1, 2):
                        a = dict((x[0], x) for x in mine[1]) if k == 1 else mine[2]
                        b = dict((x[0], x) for x in theirs[1]) if k == 1 else theirs[2]
                        bad = sorted(set(a) ^ set(b)) or [n for n in a if a[n] != b.get(n)]
                        detail = f" (table {bad[0]!r})" if bad else ""
                    raise ValueError(f"rank {r} and rank {self._group.rank} disagree on the "
                                     f"{what[k]} of the sharded collection{detail}; every rank "
                                     f"must build it alike")

    # ------------------------------------------------------------------ shared API
    @property
    def process_group(self) -> Any:
        return self._group.pg

    def collective_seconds(self, reset: bool = True) -> dict:
        """Seconds this rank spent in each exchange since the last reset, by what it carried
        (counts, features, weights, pooled rows, gradients): the wait for the slowest rank
        included."""
        out = dict(self._group.seconds)
        if reset:
            self._group.seconds.clear()
        return out

    def collective_bytes(self, reset: bool = True) -> dict:
        """Bytes this rank sent to other ranks in each exchange since the last reset."""
        out = dict(self._group.bytes_sent)
        if reset:
            self._group.bytes_sent.clear()
        return out

    def _trainable(self) -> list:
        return [(name, shard.weight) for name, shard in self._shards.items()
                if isinstance(shard.weight, torch.nn.Parameter) and shard.weight.requires_grad]

    def _split_input(self, features: Any, strict: bool = True) -> tuple:
        """Per feature of the module: (values, lengths, weights) of this rank's batch; the
        batch size; and the exception to raise instead, when the input is bad.  ``strict``:
        every feature of the module must be in the input (others are ignored); else a feature
        the input lacks has no values, and one the module lacks is a ``KeyError``."""
        keys = list(features.keys())
        values = features.values()
        lengths = features.lengths()
        weights = features.weights_or_none() if self._is_weighted else None
        rank = self._group.rank

        def refuse(message: str) -> Exception:
            return ValueError(f"rank {rank}: {message}")
        missing = [f for f in self._feature_names if f not in keys]
        unknown = [k for k in keys if k not in self._feature_names]
        if missing and strict:
            return None, 0, refuse(f"the input's features {keys} lack {missing} (the "
                                   f"collection's are {self._feature_names})")
        if unknown and not strict:
            return None, 0, KeyError(f"feature {unknown[0]!r} is in no table of this collection")
        if self._is_weighted and weights is None:
            return None, 0, refuse("the collection is weighted but the input has no weights")
        if lengths.numel() % max(len(keys), 1):
            return None, 0, refuse(f"lengths has {lengths.numel()} entries, not a multiple of "
                                   f"the {len(keys)} keys")
        batch = lengths.numel() // max(len(keys), 1)
        lengths = lengths.to(self._itype)
        if bool((lengths < 0).any()):
            return None, batch, refuse("lengths has a negative entry")
        per_key = lengths.view(len(keys), batch).sum(1).tolist() if keys else []
        if sum(per_key) != values.numel():
            return None, batch, refuse(f"the lengths add up to {sum(per_key)} but there are "
                                       f"{values.numel()} values")
        starts = np.concatenate([[0], np.cumsum(per_key)]).astype(int).tolist()
        out = []
        for f, name in enumerate(self._feature_names):
            if name not in keys:            # not strict: a feature with no values
                out.append((torch.zeros(0, dtype=self._itype, device=self._device),
                            torch.zeros(batch, dtype=self._itype, device=self._device), None))
                continue
            k = keys.index(name)
            v = values[starts[k]:starts[k + 1]]
            rows = self._tables[self._feature_table[f]].rows
            if v.numel():
                lo, hi = (int(x) for x in torch.aminmax(v))
                if lo < 0 or hi >= rows:
                    bad = lo if lo < 0 else hi
                    pos = int((v == bad).nonzero()[0])
                    return None, batch, self._index_error(
                        f"feature {name!r}: values[{starts[k] + pos}] = {bad} is out of range "
                        f"for table {self._tables[self._feature_table[f]].name!r} of {rows} "
                        f"rows")
            w = None if weights is None else weights[starts[k]:starts[k + 1]].to(torch.float32)
            out.append((v.to(device=self._device, dtype=self._itype),
                        lengths[k * batch:(k + 1) * batch].to(self._device),
                        None if w is None else w.to(self._device)))
        return out, batch, None

    def _exchange_head(self, counts: Sequence[int], batch: int, error: Optional[Exception],
                       training: bool, extra: Sequence[int] = ()) -> tuple:
        """Exchange 1: to every rank, the number of indices it will get, this rank's batch size,
        its status, whether it trains and ``extra`` integers.  Raises ``error`` here (this
        rank's bad input), or ``ValueError`` when another rank refused its input or the ranks
        disagree on training; returns (the indices each rank sends here, each rank's batch
        size, each rank's ``extra``)."""
        g = self._group
        status = 0 if error is None else 1
        width = 4 + len(extra)
        head = int_tensor([x for r in range(g.size)
                           for x in (counts[r], batch, status, int(training), *extra)],
                          self._device)
        got = g.all_to_all(head, [width] * g.size, [width] * g.size,
                           "exchanging the batch sizes")
        got = got.view(g.size, width).tolist()
        if error is not None:
            raise error
        bad = [r for r in range(g.size) if got[r][2]]
        if bad:
            raise ValueError(f"rank {bad[0]} refused its input (see its error); no batch was "
                             f"exchanged")
        modes = [r for r in range(g.size) if bool(got[r][3]) != training]
        if modes:       # the data-parallel features travel only when training
            mine, theirs = ("with", "without") if training else ("without", "with")
            raise ValueError(f"rank {g.rank} runs the collection {mine} gradients but rank "
                             f"{modes[0]} {theirs}; every rank must call it alike "
                             f"(torch.no_grad() on all or none)")
        return [c[0] for c in got], [c[1] for c in got], [c[4:] for c in got]

    def _apply_grad(self, t: _TableInfo, b: BagBackward, grads: dict) -> None:
        """Step table ``t``'s local rows by its fused optimizer for the lookup ``b`` (every
        source's entries of the table), or put torch's dense gradient of them in ``grads``."""
        shard = self._shards[t.name]
        if self._fused is not None:
            self._optimizers[t.name].update(shard.weight, shard._buffers, b)
            self._stepped.add(t.name)
        else:       # torch's dense gradient: every entry's row summed into zeros
            dense = torch.zeros(shard.weight.shape, dtype=torch.float32,
                                device=b.grad_output.device)
            dense.index_add_(0, b.indices.long(), b.entry_grads)
            grads[t.name] = dense.to(shard.weight.dtype)

    def _count_steps(self, absent: Sequence[str] = ()) -> None:
        """Every rank counts every table's step (but those of the ``absent`` tables, which no
        rank's input read), holding its rows or not, so the step counts (of the Adam family)
        agree across ranks and survive resharding."""
        for name, opt in self._optimizers.items():
            if name not in self._stepped and name not in absent:
                opt.skip(self._shards[name]._buffers)


class ShardedEmbeddingBagCollection(_ShardedTables):
    """A model-parallel :class:`~perfkernels.torch.EmbeddingBagCollection` over a process group.

    ``ShardedEmbeddingBagCollection(tables, plan, process_group=None, *, is_weighted=False,
    fused_optimizer=None, gradient_division=True, seed=0, device=None)``

    * ``tables``: :class:`~perfkernels.torch.EmbeddingBagConfig` (or TorchRec's, or
      :class:`Table`) per table; ``data_type`` picks the format: float32, float16, bfloat16, or
      8 / 4 / 2 bits (``torch.quint8`` / ``quint4x2`` / ``quint2x4``, TorchRec's INT8 / INT4 /
      INT2: inference only);
    * ``plan``: a :class:`ShardingPlan` for the group's size (:func:`plan` makes one);
    * ``process_group``: the group (default: the default group; with none initialised, a world of
      one process);
    * ``fused_optimizer``: ``(name, options)`` as for the unsharded collection ("sgd",
      "adagrad", "rowwise_adagrad", "adam", "rowwise_adam", "adamw"): owners update their rows
      during backward, the state next to the rows (the Adam family's step count on every rank);
      without it, the local rows get dense gradients (``shard.weight.grad``);
    * ``gradient_division``: divide the tables' gradients by the world size, so that with each
      rank's loss a mean over its batch they match DistributedDataParallel's averaged dense
      gradients, and a single process on the global batch (TorchRec's default too);
    * ``seed``: the initial values (uniform, +-sqrt(1 / rows) or the config's bounds) depend on
      the seed and the row only, not on the plan.

    ``forward(features)`` takes this rank's batch as a KeyedJaggedTensor (ours or TorchRec's:
    ``keys()``, ``values()``, ``lengths()``, ``weights_or_none()``) holding at least the
    collection's features, and returns a :class:`~perfkernels.torch.KeyedTensor` of this rank's
    pooled rows.  Every rank must call it, in the same order as the other collectives.
    ``state_dict`` gives ShardedTensors (``torch.distributed.checkpoint`` saves and reshards
    them); ``load_state_dict`` takes them or full tables.  The parameters are the local rows,
    ``embedding_bags.<table>.weight``.
    """

    def __init__(self, tables: Sequence[Any], plan: ShardingPlan,
                 process_group: Optional[Any] = None, *, is_weighted: bool = False,
                 fused_optimizer: Any = None,
                 gradient_division: bool = True, seed: int = 0, device: Any = None,
                 _weights: Optional[dict] = None) -> None:
        super().__init__(tables, plan, process_group, is_weighted=is_weighted,
                         fused_optimizer=fused_optimizer, gradient_division=gradient_division,
                         seed=seed, device=device, _weights=_weights)
        # per owner, the output columns of its slots (for adding its partial sums)
        self._colmaps = [self._slot_columns(s) for s in self._slots]
        self._dp_colmap = self._slot_columns(self._dp_slots)

    @classmethod
    def from_collection(cls, collection: torch.nn.Module, plan: ShardingPlan,
                        process_group: Optional[Any] = None, *, data_type: Any = None,
                        **kwargs: Any) -> "ShardedEmbeddingBagCollection":
        """Shard an unsharded collection (ours, or TorchRec's ``EmbeddingBagCollection``, which
        every rank holds alike, e.g. built with the same seed): each rank keeps its rows.
        ``data_type`` converts every table (e.g. ``torch.float16`` or 8 for 8-bit rows), or, a
        dict, the tables it names."""
        configs, weights = cls._configs_of(collection.embedding_bag_configs(),
                                           collection.embedding_bags, data_type)
        weighted = collection.is_weighted() if hasattr(collection, "is_weighted") else False
        kwargs.setdefault("is_weighted", weighted)
        return cls(configs, plan, process_group, _weights=weights, **kwargs)

    def _slot_columns(self, slots: list) -> Tensor:
        cols = [torch.arange(s.col, s.col + s.dim) for s in slots]
        return (torch.cat(cols) if cols else torch.zeros(0, dtype=torch.int64)).to(self._device)

    # ------------------------------------------------------------------ TorchRec-like API
    def is_weighted(self) -> bool:
        return self._is_weighted

    def embedding_bag_configs(self) -> list:
        return self._configs

    # ------------------------------------------------------------------ forward
    def forward(self, features: Any) -> KeyedTensor:
        """This rank's pooled rows: ``values()`` is ``[its batch, sum of dims]``, the features
        in table order (each table's ``feature_names`` in order)."""
        trainable = self._trainable()
        training = torch.is_grad_enabled() and bool(trainable)
        dummy = torch.zeros((), requires_grad=training)
        out = _ShardedLookup.apply(self, features, training, dummy,
                                   *[w for _, w in trainable])
        return KeyedTensor(self._feature_names, self._dims, out)

    def _bucketize(self, per_feature: list, batch: int) -> dict:
        """Per (feature, shard start row): the lengths [batch], indices (rebased to the shard)
        and weights of the feature's entries that fall in that shard's rows, in input order."""
        pieces = {}
        for f, (v, lengths, w) in enumerate(per_feature):
            t = self._tables[self._feature_table[f]]
            s = t.sharding
            if s.sharding_type == DATA_PARALLEL:
                continue
            if len(s.ranks) == 1:
                pieces[(f, 0)] = (lengths, v, w)
                continue
            inner = torch.tensor(s.row_offsets[1:-1], dtype=v.dtype, device=v.device)
            bucket = torch.bucketize(v, inner, right=True)
            bag = _segment_ids(lengths, v.numel())
            key = bucket * batch + bag
            order = torch.argsort(key, stable=True)
            counts = torch.bincount(key, minlength=len(s.ranks) * batch).view(
                len(s.ranks), batch).to(v.dtype)
            starts = torch.tensor(s.row_offsets[:-1], dtype=v.dtype, device=v.device)
            local = v[order] - starts[bucket[order]]
            sizes = counts.sum(1).tolist()
            vs = local.split(sizes)
            ws = w[order].split(sizes) if w is not None else [None] * len(sizes)
            for k, start in enumerate(s.row_offsets[:-1]):
                pieces[(f, start)] = (counts[k], vs[k], ws[k])
        return pieces

    def _forward(self, features: Any, training: bool) -> tuple:
        g = self._group
        dev = self._device
        per_feature, batch, error = self._split_input(features)

        # 1. counts and status
        send_dp = training and bool(self._dp_slots)
        counts = [0] * g.size
        payload_i: list = []
        payload_w: list = []
        if error is None:
            pieces = self._bucketize(per_feature, batch)
            for r in range(g.size):
                chosen = [pieces[(s.feature, s.start)] for s in self._slots[r]]
                if send_dp:
                    chosen += [(per_feature[s.feature][1], per_feature[s.feature][0],
                                per_feature[s.feature][2]) for s in self._dp_slots]
                payload_i += [c[0] for c in chosen]
                payload_i += [c[1] for c in chosen]
                payload_w += [c[2] for c in chosen]
                counts[r] = sum(int(c[1].numel()) for c in chosen)
        n_in, batches, _ = self._exchange_head(counts, batch, error, training)

        # 2. features to their owners
        mine = self._slots[g.rank]
        send = torch.cat(payload_i) if payload_i else torch.zeros(0, dtype=self._itype,
                                                                  device=dev)
        dp_count = len(self._dp_slots) if send_dp else 0
        send_splits = [(len(self._slots[r]) + dp_count) * batch + counts[r]
                       for r in range(g.size)]
        nslots = len(mine) + dp_count
        recv_splits = [nslots * batches[s] + n_in[s] for s in range(g.size)]
        recv = g.all_to_all(send, send_splits, recv_splits, "sending the features to their "
                                                            "owners")
        recv_w = None
        if self._is_weighted:
            send_w = (torch.cat(payload_w) if payload_w
                      else torch.zeros(0, dtype=torch.float32, device=dev))
            recv_w = g.all_to_all(send_w, counts, n_in, "sending the per-sample weights to "
                                                        "their owners")
        # reorder: feature-major over the global batch (sources in rank order)
        total = sum(batches)
        lengths_by_source, idx_pieces, w_pieces = [], [], []
        w_parts = recv_w.split(n_in) if recv_w is not None else [None] * g.size
        for s, part in enumerate(recv.split(recv_splits)):
            lens = part[:nslots * batches[s]].view(nslots, batches[s])
            lengths_by_source.append(lens)
            sizes = lens.sum(1).tolist()
            idx_pieces.append(part[nslots * batches[s]:].split(sizes))
            w_pieces.append(w_parts[s].split(sizes) if w_parts[s] is not None else None)
        lengths_all = (torch.cat(lengths_by_source, dim=1) if nslots
                       else torch.zeros(0, total, dtype=self._itype, device=dev))
        order = [(s, j) for j in range(nslots) for s in range(g.size)]
        indices_all = (torch.cat([idx_pieces[s][j] for s, j in order]) if order
                       else torch.zeros(0, dtype=self._itype, device=dev))
        weights_all = (torch.cat([w_pieces[s][j] for s, j in order])
                       if self._is_weighted and order else None)

        # 3. one lookup of everything this rank owns; rows back to their sources
        n_own = int(lengths_all[:len(mine)].sum()) if mine else 0
        own = self._lookup(mine, indices_all[:n_own], lengths_all[:len(mine)].reshape(-1),
                           None if weights_all is None else weights_all[:n_own], total)
        width = [int(sum(s.dim for s in self._slots[r])) for r in range(g.size)]
        pooled = g.all_to_all(own.reshape(-1), [b * width[g.rank] for b in batches],
                              [batch * w for w in width], "returning the pooled rows")
        out = torch.zeros(batch, self._cols[-1], dtype=torch.float32, device=dev)
        for r, block in enumerate(pooled.split([batch * w for w in width])):
            if width[r]:       # partial sums added in rank order: the same every run
                out.index_add_(1, self._colmaps[r], block.view(batch, width[r]))
        inv_counts = {}
        for f, (v, lengths, w) in enumerate(per_feature):
            t = self._tables[self._feature_table[f]]
            if t.mode == "mean" and t.sharding.sharding_type != DATA_PARALLEL:
                inv = 1.0 / lengths.clamp(min=1).to(torch.float32)
                inv_counts[f] = inv
                c = self._cols[f]
                out[:, c:c + t.dim] *= inv.unsqueeze(1)
        if self._dp_slots:
            dp = self._lookup_local(per_feature, batch)
            out.index_copy_(1, self._dp_colmap, dp)
        saved = dict(batch=batch, batches=batches, lengths_all=lengths_all,
                     indices_all=indices_all, weights_all=weights_all, n_own=n_own,
                     inv_counts=inv_counts, width=width, send_dp=send_dp)
        return out, saved

    def _tables_of(self, slots: Sequence[_Slot]) -> tuple:
        tables, bits, dims = [], [], []
        for s in slots:
            t = self._tables[s.table]
            w = self.embedding_bags[t.name].weight
            tables.append(w)
            bits.append(t.bits or None)
            dims.append(t.dim)
        return tables, bits, dims

    def _lookup(self, slots: Sequence[_Slot], indices: Tensor, lengths: Tensor,
                weights: Optional[Tensor], batch: int, modes: Any = "sum") -> Tensor:
        """``[batch, sum of the slots' dims]``: every slot's bags (``lengths``, slot-major) in
        its table shard, by one :func:`perfkernels.embedding_bags_multi` call on CPU, or a
        perfkernels.cuda lookup per slot for CUDA tables."""
        if not slots:
            return torch.zeros(batch, 0, dtype=torch.float32, device=self._device)
        tables, bits, dims = self._tables_of(slots)
        if self._device.type != "cpu":      # perfkernels.cuda, through perfkernels.torch
            offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
            parts = []
            for j, (w, b, d) in enumerate(zip(tables, bits, dims)):
                o = offsets[j * batch:(j + 1) * batch + 1]
                a, e = int(o[0]), int(o[-1])
                mode = modes if isinstance(modes, str) else modes[j]
                psw = None if weights is None else weights[a:e]
                if b:   # the lookup itself: torch's quantized ops (and their aliases) sum
                    out = _bags.lookup(w, indices[a:e], o - a, psw, mode, True, None, b, d)
                else:   # weights in mode mean: TorchRec's pooling, our opt-in in the functional
                    out = pt.embedding_bag(indices[a:e], w.detach(), o - a, mode=mode,
                                           per_sample_weights=psw, include_last_offset=True,
                                           weighted_mean=True)
                parts.append(out.float())
            return torch.cat(parts, dim=1)
        try:
            out = pk.embedding_bags_multi(
                [_numpy(w) for w in tables], _numpy(indices), lengths=_numpy(lengths),
                per_sample_weights=None if weights is None else _numpy(weights),
                modes=modes, bits=bits if any(bits) else None, dims=dims)
        except IndexError as exc:
            raise index_error(exc) from None
        return torch.from_numpy(out)

    def _lookup_local(self, per_feature: list, batch: int) -> Tensor:
        """The data-parallel features, on this rank's whole replicas, in their tables' modes."""
        slots = self._dp_slots
        indices = torch.cat([per_feature[s.feature][0] for s in slots])
        lengths = torch.cat([per_feature[s.feature][1] for s in slots])
        weights = (torch.cat([per_feature[s.feature][2] for s in slots])
                   if self._is_weighted else None)
        return self._lookup(slots, indices, lengths, weights, batch,
                            [self._tables[s.table].mode for s in slots])

    # ------------------------------------------------------------------ backward
    def _backward(self, grad: Tensor, saved: dict) -> dict:
        """Send each owner the gradient of its pooled rows; update (or give gradients to) the
        rows this rank holds.  Returns {table name: dense gradient} without a fused optimizer."""
        g = self._group
        batch, batches, width = saved["batch"], saved["batches"], saved["width"]
        grad = grad.to(torch.float32)
        if self._gradient_division and g.size > 1:
            grad = grad / g.size
        for f, inv in saved["inv_counts"].items():
            c = self._cols[f]
            grad[:, c:c + self._dims[f]] *= inv.unsqueeze(1)
        dp_width = int(self._dp_colmap.numel()) if saved["send_dp"] else 0
        dp_grad = grad.index_select(1, self._dp_colmap) if dp_width else None
        parts = []
        for r in range(g.size):
            parts.append(grad.index_select(1, self._colmaps[r]).reshape(-1))
            if dp_width:
                parts.append(dp_grad.reshape(-1))
        send = torch.cat(parts) if parts else grad.new_zeros(0)
        me = width[g.rank]
        recv = g.all_to_all(send, [batch * (w + dp_width) for w in width],
                            [b * (me + dp_width) for b in batches],
                            "returning the gradients to the owners")
        own_rows, dp_rows = [], []
        for s, part in enumerate(recv.split([b * (me + dp_width) for b in batches])):
            own_rows.append(part[:batches[s] * me].view(batches[s], me))
            if dp_width:
                dp_rows.append(part[batches[s] * me:].view(batches[s], dp_width))
        total = sum(batches)
        grads: dict = {}
        self._stepped: set = set()
        lengths_all, indices_all, weights_all = (saved["lengths_all"], saved["indices_all"],
                                                 saved["weights_all"])
        mine = self._slots[g.rank]
        if mine:
            g_own = torch.cat(own_rows)
            self._update(mine, g_own, lengths_all[:len(mine)], indices_all, weights_all, 0,
                         total, "sum", grads)
        if dp_width:
            g_dp = torch.cat(dp_rows)
            self._update(self._dp_slots, g_dp, lengths_all[len(mine):], indices_all,
                         weights_all, saved["n_own"], total, None, grads)
        self._count_steps()
        return grads

    def _update(self, slots: Sequence[_Slot], grad: Tensor, lengths: Tensor, indices: Tensor,
                weights: Optional[Tensor], first: int, total: int, mode: Optional[str],
                grads: dict) -> None:
        """Per table among ``slots`` (its features consecutive): one update of its rows from
        all of its features' bags (as the unsharded collection does)."""
        counts = lengths.sum(1).tolist()
        pos, col, j = first, 0, 0
        while j < len(slots):
            t = self._tables[slots[j].table]
            k = j
            while k < len(slots) and slots[k].table == t.index:
                k += 1
            n = int(sum(counts[j:k]))
            g_rows = torch.cat([grad[:, col + i * t.dim: col + (i + 1) * t.dim]
                                for i in range(k - j)]) if k - j > 1 else \
                grad[:, col:col + t.dim].contiguous()
            lens = lengths[j:k].reshape(-1)
            offsets = torch.cat([lens.new_zeros(1), lens.cumsum(0)])
            shard = self.embedding_bags[t.name]
            b = BagBackward(g_rows, indices[pos:pos + n], offsets,
                            None if weights is None else weights[pos:pos + n], mode or t.mode,
                            True, None, shard.weight.shape[0], shard.weight.dtype)
            self._apply_grad(t, b, grads)
            pos += n
            col += (k - j) * t.dim
            j = k


class _ShardedLookup(torch.autograd.Function):
    """The sharded forward and its reverse exchange as one autograd node.  Its inputs after the
    first are the local trainable rows (they get the dense gradients; with a fused optimizer they
    are updated in place and get none)."""

    @staticmethod
    def forward(ctx, module: ShardedEmbeddingBagCollection, features: Any, training: bool,
                dummy: Tensor, *weights: Tensor) -> Tensor:
        out, saved = module._forward(features, training)
        ctx.module, ctx.saved = module, saved
        ctx.names = [name for name, _ in module._trainable()] if training else []
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        grads = ctx.module._backward(grad.clone(), ctx.saved)
        ctx.saved = None
        return (None, None, None, None, *[grads.get(n) for n in ctx.names])


@dataclass
class _Config:
    name: str
    num_embeddings: int
    embedding_dim: int
    feature_names: list
    pooling: Any
    data_type: Any


# ---------------------------------------------------------------------- state_dict hooks

def _sharded_tensor(module: ShardedEmbeddingBagCollection, t: _TableInfo, local: Tensor) -> Any:
    """``local`` (this rank's rows of table ``t``, or their state) as a ShardedTensor whose
    global layout is the plan's: made from the plan alone, with no collective."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
    from torch.distributed._shard.sharded_tensor.metadata import (ShardedTensorMetadata,
                                                                  TensorProperties)
    g = module._group
    s = t.sharding
    tail = list(local.shape[1:])
    dev = str(local.device)
    metas = []
    mine = None
    for k, r in enumerate(s.ranks):
        a, b = s.row_offsets[k], s.row_offsets[k + 1]
        meta = ShardMetadata([a] + [0] * len(tail), [b - a] + tail,
                             f"rank:{g.global_rank(r)}/"
                             f"{dev if r == g.rank else local.device.type}")
        metas.append(meta)
        if r == g.rank:
            mine = meta
    props = TensorProperties(dtype=local.dtype, layout=local.layout, requires_grad=False,
                             memory_format=torch.contiguous_format, pin_memory=False)
    meta = ShardedTensorMetadata(metas, torch.Size([t.rows] + tail), props)
    shards = [Shard(local.detach(), mine)] if mine is not None else []
    return ShardedTensor._init_from_local_shards_and_global_metadata(
        shards, meta, process_group=g.pg if g.distributed else None)


def _state_dict_hook(module, state_dict, prefix, local_metadata):
    """Sharded tables' rows and states as ShardedTensors (data-parallel ones stay tensors)."""
    if not module._group.distributed:
        return state_dict
    for t in module._tables:
        if t.sharding.sharding_type == DATA_PARALLEL:
            continue
        for field in ("weight", "momentum1", "momentum2"):
            key = f"{prefix}{module._shards_attr}.{t.name}.{field}"
            if key in state_dict:
                state_dict[key] = _sharded_tensor(module, t, state_dict[key])
    return state_dict


def _load_state_dict_pre_hook(module, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
    """Take this rank's rows from a ShardedTensor (its local shard) or from a full table."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    rank = module._group.rank
    for t in module._tables:
        start, end = t.sharding.rows_of(rank)
        for field in ("weight", "momentum1", "momentum2"):
            key = f"{prefix}{module._shards_attr}.{t.name}.{field}"
            value = state_dict.get(key)
            if value is None:
                continue
            if isinstance(value, ShardedTensor):
                shards = value.local_shards()
                local = shards[0].tensor if shards else None
                if local is None and end == start:      # this rank holds none of the rows
                    local = getattr(module._shards[t.name], field)
                if local is None or local.shape[0] != end - start:
                    raise ValueError(f"{key}: the ShardedTensor's local rows do not match this "
                                     f"rank's {end - start} rows of the plan; load a "
                                     f"checkpoint with torch.distributed.checkpoint, which "
                                     f"reshards")
                state_dict[key] = local
            elif value.shape[0] == t.rows and (end - start != t.rows or start != 0):
                state_dict[key] = value[start:end]
