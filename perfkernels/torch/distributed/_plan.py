"""Sharding plans: which rank holds which rows of which table, and the planner that makes them.

A plan is plain data (:class:`ShardingPlan`: one :class:`TableSharding` per table), so it can be
written by hand, printed, pickled and checked (:meth:`ShardingPlan.validate`) before any process
talks to another.  :func:`plan` balances the bytes each rank holds (never past its memory budget)
and the bytes its lookups read (rows x pooling factor x bytes per row).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Union

import torch

#: the sharding types, in the words TorchRec uses
TABLE_WISE = "table_wise"
ROW_WISE = "row_wise"
TABLE_ROW_WISE = "table_row_wise"
DATA_PARALLEL = "data_parallel"
SHARDING_TYPES = (TABLE_WISE, ROW_WISE, TABLE_ROW_WISE, DATA_PARALLEL)

_FLOAT_FORMATS = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}
_STATE_BYTES = {None: lambda dim: 0, "sgd": lambda dim: 0, "rowwise_adagrad": lambda dim: 4,
                "adagrad": lambda dim: 4 * dim, "adam": lambda dim: 8 * dim,
                "adamw": lambda dim: 8 * dim, "rowwise_adam": lambda dim: 4 * dim + 4,
                # sgd with momentum: the momentum buffer, [rows, D] float32
                "sgd with momentum": lambda dim: 4 * dim}


def _optimizer_key(optimizer: Any) -> Optional[str]:
    """The planner's name of a fused optimizer's state: a name, a spec as ``fused_optimizer=``
    takes it (``("sgd", {"momentum": 0.9})``: ``"sgd with momentum"``, whose buffer counts) or a
    :class:`~perfkernels.torch.FusedOptimizer`."""
    if optimizer is None or isinstance(optimizer, str):
        return optimizer
    if isinstance(optimizer, (tuple, list)) and len(optimizer) == 2:
        name, options = optimizer
        momentum = (options or {}).get("momentum", 0) if isinstance(options, Mapping) else 0
    elif hasattr(optimizer, "name"):
        name, momentum = optimizer.name, getattr(optimizer, "momentum", 0)
    else:
        raise TypeError(f"optimizer must be a fused optimizer's name, its (name, options) spec or "
                        f"a FusedOptimizer; got {optimizer!r}")
    return "sgd with momentum" if name == "sgd" and momentum else name


def table_format(data_type: Any) -> tuple[Optional[torch.dtype], int]:
    """``(float dtype, 0)`` for a float table, ``(None, bits)`` for a packed 8/4/2-bit one.

    Accepts a torch float dtype, 8 / 4 / 2, torch's quantized dtypes (``torch.quint8``,
    ``torch.quint4x2``, ``torch.quint2x4``) or TorchRec's ``DataType`` (FP32, FP16, BF16, INT8,
    INT4, INT2); None is float32."""
    if data_type is None:
        return torch.float32, 0
    if isinstance(data_type, torch.dtype):
        if data_type in _FLOAT_FORMATS:
            return data_type, 0
        bits = {"quint8": 8, "quint4x2": 4, "quint2x4": 2}.get(str(data_type).split(".")[-1])
        if bits:
            return None, bits
    elif isinstance(data_type, int) and not isinstance(data_type, bool):
        if data_type in (8, 4, 2):
            return None, data_type
    else:
        name = str(getattr(data_type, "name", data_type)).upper()
        named = {"FP32": (torch.float32, 0), "FP16": (torch.float16, 0),
                 "BF16": (torch.bfloat16, 0), "INT8": (None, 8), "INT4": (None, 4),
                 "INT2": (None, 2)}
        if name in named:
            return named[name]
    raise ValueError(f"table format must be float32, float16, bfloat16 or 8 / 4 / 2 bits; got "
                     f"{data_type!r}")


def row_bytes(dim: int, data_type: Any) -> int:
    """Bytes of one row in memory (packed rows: codes, then scale and bias)."""
    dtype, bits = table_format(data_type)
    if bits:
        return dim + 8 if bits == 8 else -(-dim * bits // 8) + 4
    return dim * _FLOAT_FORMATS[dtype]


@dataclass(frozen=True)
class Table:
    """What the planner needs to know of a table.

    ``pooling_factor``: the expected lookups per sample over all of the table's features (the
    indices a sample names in it).  ``data_type``: see :func:`table_format`.  ``feature_names``:
    the input features that read this table (default: the table's name)."""
    name: str
    num_embeddings: int
    embedding_dim: int
    pooling_factor: float = 1.0
    data_type: Any = torch.float32
    feature_names: tuple = ()

    def __post_init__(self) -> None:
        if self.num_embeddings < 1 or self.embedding_dim < 1:
            raise ValueError(f"table {self.name!r}: num_embeddings and embedding_dim must be >= 1; "
                             f"got {self.num_embeddings} x {self.embedding_dim}")
        if not (self.pooling_factor >= 0 and math.isfinite(self.pooling_factor)):
            raise ValueError(f"table {self.name!r}: pooling_factor must be finite and >= 0; got "
                             f"{self.pooling_factor}")
        table_format(self.data_type)

    def row_bytes(self) -> int:
        return row_bytes(self.embedding_dim, self.data_type)

    @classmethod
    def from_config(cls, config: Any, pooling_factor: float = 1.0) -> "Table":
        """From an :class:`~perfkernels.torch.EmbeddingBagConfig` (or TorchRec's)."""
        if isinstance(config, Table):
            return config
        return cls(config.name, int(config.num_embeddings), int(config.embedding_dim),
                   float(pooling_factor), getattr(config, "data_type", None) or torch.float32,
                   tuple(getattr(config, "feature_names", None) or ()))


@dataclass(frozen=True)
class TableSharding:
    """Where one table lives.

    ``ranks[k]`` holds rows ``row_offsets[k]`` to ``row_offsets[k + 1]`` (a contiguous block;
    table-wise: one rank, every row).  Data-parallel: every rank holds the whole table
    (``ranks`` is every rank, ``row_offsets`` is ``(0, rows)``)."""
    sharding_type: str
    ranks: tuple
    row_offsets: tuple

    def rows_of(self, rank: int) -> tuple[int, int]:
        """The row range ``[start, end)`` that ``rank`` holds (``(0, 0)``: none)."""
        if self.sharding_type == DATA_PARALLEL:
            return (0, self.row_offsets[-1]) if rank in self.ranks else (0, 0)
        if rank not in self.ranks:
            return (0, 0)
        k = self.ranks.index(rank)
        return self.row_offsets[k], self.row_offsets[k + 1]


@dataclass
class ShardingPlan:
    """A plan for ``world_size`` ranks: ``shardings[table name]`` is a :class:`TableSharding`.

    ``tables`` (the :class:`Table` of each name) and ``batch_size`` (samples per rank) are kept
    for :meth:`explain`; ``memory_budget`` (bytes per rank, None: unlimited) for
    :meth:`validate`; ``optimizer`` (the fused optimizer, whose state is counted with the rows)."""
    world_size: int
    shardings: dict
    tables: dict = field(default_factory=dict)
    memory_budget: Optional[list] = None
    batch_size: int = 1
    optimizer: Optional[str] = None
    local_world_size: Optional[int] = None

    # -- accounting
    def _state_row_bytes(self, table: Table) -> int:
        return _STATE_BYTES[self.optimizer](table.embedding_dim)

    def bytes_per_rank(self) -> list:
        """Bytes each rank holds: its rows and their optimizer state."""
        out = [0] * self.world_size
        for name, s in self.shardings.items():
            t = self.tables.get(name)
            if t is None:
                continue
            per_row = t.row_bytes() + self._state_row_bytes(t)
            for r in range(self.world_size):
                a, b = s.rows_of(r)
                out[r] += (b - a) * per_row
        return out

    def lookups_per_rank(self) -> list:
        """Expected rows each rank reads per step: a sharded table's lookups (every rank's batch,
        ``world_size * batch_size`` samples) split in proportion to the rows each owner holds
        (indices spread evenly over the rows); a data-parallel table's lookups of the rank's own
        batch."""
        out = [0.0] * self.world_size
        for name, s in self.shardings.items():
            t = self.tables.get(name)
            if t is None:
                continue
            for r in range(self.world_size):
                a, b = s.rows_of(r)
                if s.sharding_type == DATA_PARALLEL:
                    out[r] += self.batch_size * t.pooling_factor if b else 0.0
                else:
                    out[r] += (self.world_size * self.batch_size * t.pooling_factor
                               * (b - a) / t.num_embeddings)
        return out

    def explain(self) -> str:
        """A table: each table's sharding, ranks, rows and bytes per rank, and expected lookups
        per rank and step; then each rank's totals against its budget."""
        lines = [f"sharding plan: {len(self.shardings)} tables on {self.world_size} ranks, "
                 f"batch {self.batch_size} per rank"
                 + (f", optimizer state of {self.optimizer}" if self.optimizer else "")]
        head = f"{'table':<16}{'sharding':<16}{'rank':>5}{'rows':>20}{'MiB':>10}{'lookups':>12}"
        lines += [head, "-" * len(head)]
        for name, s in self.shardings.items():
            t = self.tables.get(name)
            per_row = (t.row_bytes() + self._state_row_bytes(t)) if t else 0
            first = True
            for r in s.ranks:
                a, b = s.rows_of(r)
                if t is None:
                    look = float("nan")
                elif s.sharding_type == DATA_PARALLEL:
                    look = self.batch_size * t.pooling_factor
                else:
                    look = (self.world_size * self.batch_size * t.pooling_factor * (b - a)
                            / t.num_embeddings)
                lines.append(f"{name if first else '':<16}{s.sharding_type if first else '':<16}"
                             f"{r:>5}{f'{a}:{b}':>20}{(b - a) * per_row / 2**20:>10.2f}"
                             f"{look:>12.0f}")
                first = False
        lines.append("-" * len(head))
        used, looks = self.bytes_per_rank(), self.lookups_per_rank()
        for r in range(self.world_size):
            budget = (self.memory_budget or [None] * self.world_size)[r]
            cap = "unlimited" if budget is None else f"{budget / 2**20:.2f} MiB"
            owned = [n for n, s in self.shardings.items()
                     if s.sharding_type != DATA_PARALLEL and r in s.ranks]
            lines.append(f"rank {r}: {used[r] / 2**20:.2f} MiB of {cap}, {looks[r]:.0f} lookups "
                         f"per step, shards of {len(owned)} table(s)")
        return "\n".join(lines)

    __str__ = explain

    # -- checks
    def validate(self, tables: Optional[Sequence[Any]] = None,
                 world_size: Optional[int] = None) -> None:
        """Refuse a plan that cannot run, naming the table and the rank: a world size other than
        the plan's, a table without a sharding (or a sharding without a table), a rank outside
        the world, a shard with no rows, row blocks that do not cover the table, a table-row-wise
        shard that leaves its node group, a rank over its memory budget."""
        if world_size is not None and world_size != self.world_size:
            raise ValueError(f"the plan is for {self.world_size} ranks but the process group has "
                             f"{world_size}")
        if tables is not None:
            given = {Table.from_config(t).name: Table.from_config(t) for t in tables}
            for name in given:
                if name not in self.shardings:
                    raise ValueError(f"table {name!r} has no sharding in the plan (the plan "
                                     f"shards {sorted(self.shardings)})")
            for name in self.shardings:
                if name not in given:
                    raise ValueError(f"the plan shards table {name!r}, which is not one of the "
                                     f"tables {sorted(given)}")
            for name, t in given.items():
                known = self.tables.get(name)
                if known is not None and (known.num_embeddings, known.embedding_dim) != (
                        t.num_embeddings, t.embedding_dim):
                    raise ValueError(f"table {name!r} is {t.num_embeddings} x {t.embedding_dim} "
                                     f"but the plan was made for {known.num_embeddings} x "
                                     f"{known.embedding_dim}")
                self.tables.setdefault(name, t)
        for name, s in self.shardings.items():
            rows = self.tables[name].num_embeddings if name in self.tables else s.row_offsets[-1]
            if s.sharding_type not in SHARDING_TYPES:
                raise ValueError(f"table {name!r}: sharding type must be one of "
                                 f"{', '.join(SHARDING_TYPES)}; got {s.sharding_type!r}")
            if not s.ranks:
                raise ValueError(f"table {name!r}: the sharding names no rank")
            for r in s.ranks:
                if not 0 <= r < self.world_size:
                    raise ValueError(f"table {name!r}: rank {r} is outside the world of "
                                     f"{self.world_size} ranks")
            if len(set(s.ranks)) != len(s.ranks):
                raise ValueError(f"table {name!r}: a rank appears twice in {list(s.ranks)}")
            if s.sharding_type == DATA_PARALLEL:
                if tuple(s.row_offsets) != (0, rows):
                    raise ValueError(f"table {name!r}: a data-parallel table is whole on every "
                                     f"rank: row_offsets must be (0, {rows})")
                continue
            if len(s.row_offsets) != len(s.ranks) + 1 or s.row_offsets[0] != 0 \
                    or s.row_offsets[-1] != rows:
                raise ValueError(f"table {name!r}: row_offsets {list(s.row_offsets)} must run from "
                                 f"0 to its {rows} rows with one block per rank "
                                 f"({len(s.ranks)} ranks)")
            for k, r in enumerate(s.ranks):
                if s.row_offsets[k + 1] <= s.row_offsets[k]:
                    raise ValueError(f"table {name!r}: rank {r} would hold no rows (rows "
                                     f"{s.row_offsets[k]}:{s.row_offsets[k + 1]}); leave it out "
                                     f"of the table's ranks")
            if s.sharding_type == TABLE_WISE and len(s.ranks) != 1:
                raise ValueError(f"table {name!r}: table-wise sharding puts the table on one "
                                 f"rank; got ranks {list(s.ranks)}")
            if s.sharding_type == TABLE_ROW_WISE and self.local_world_size:
                nodes = {r // self.local_world_size for r in s.ranks}
                if len(nodes) > 1:
                    raise ValueError(f"table {name!r}: table-row-wise shards stay inside one node "
                                     f"group of {self.local_world_size} ranks; ranks "
                                     f"{list(s.ranks)} span groups {sorted(nodes)}")
        if self.memory_budget is not None:
            for r, (used, budget) in enumerate(zip(self.bytes_per_rank(), self.memory_budget)):
                if budget is not None and used > budget:
                    held = [n for n, s in self.shardings.items() if r in s.ranks]
                    raise ValueError(f"rank {r} would hold {used} bytes, over its budget of "
                                     f"{budget} bytes (tables {held})")


def _budgets(memory_budget: Union[None, int, Sequence[Optional[int]]], world_size: int) -> list:
    if memory_budget is None or isinstance(memory_budget, (int, float)):
        return [memory_budget] * world_size
    budgets = list(memory_budget)
    if len(budgets) != world_size:
        raise ValueError(f"memory_budget has {len(budgets)} entries for {world_size} ranks")
    return budgets


def _split_rows(rows: int, ranks: Sequence[int], free: Sequence[float], row_size: int
                ) -> Optional[list]:
    """Rows per rank of ``ranks``: as even as each rank's free bytes allow (water-filling: a
    rank that cannot take its share takes what fits, the rest is shared by the others); None when
    the ranks together have no room."""
    cap = [math.inf if f == math.inf else int(f // row_size) for f in free]
    counts = [0] * len(ranks)
    left, open_ = rows, [k for k in range(len(ranks)) if cap[k] > 0]
    while left > 0 and open_:
        share, extra = divmod(left, len(open_))
        for i, k in enumerate(list(open_)):
            want = share + (1 if i < extra else 0)
            take = min(want, cap[k] - counts[k])
            counts[k] += take
            left -= take
        open_ = [k for k in open_ if counts[k] < cap[k]]
    return None if left > 0 else counts


def plan(tables: Sequence[Any], world_size: int, *, batch_size: int = 2048,
         memory_budget: Union[None, int, Sequence[Optional[int]]] = None,
         local_world_size: Optional[int] = None, pooling_factors: Optional[Mapping] = None,
         sharding_types: Optional[Mapping[str, str]] = None,
         replicate_below: int = 64 * 1024, optimizer: Any = None) -> ShardingPlan:
    """A sharding plan for ``tables`` on ``world_size`` ranks.

    ``tables``: :class:`Table`, :class:`~perfkernels.torch.EmbeddingBagConfig` or TorchRec's
    configs (with ``pooling_factors[name]``, lookups per sample, for the configs).
    ``batch_size``: samples per rank and step.  ``memory_budget``: bytes per rank (one number, or
    one per rank; None: unlimited); rows and fused-optimizer state count, and no rank is ever
    planned past it.  ``optimizer``: the fused optimizer, as ``fused_optimizer=`` takes it (a
    name, or ``(name, options)``, where ``("sgd", {"momentum": 0.9})`` counts the momentum
    buffer), or None.  ``local_world_size``: ranks per host, for table-row-wise
    sharding.  ``sharding_types[name]`` forces a table's sharding type.

    The planner, greedily, heaviest table first:

    * a table of at most ``replicate_below`` bytes is replicated on every rank (data-parallel: no
      communication in the forward pass) if every rank has room for it;
    * a table whose lookup cost (global batch x pooling factor x bytes per row) is at most a
      rank's fair share of the total, and that fits on some rank, goes whole (table-wise) to
      the rank with the least lookup cost so far, ties to the least bytes;
    * any other table is split by rows: across one host's ranks (table-row-wise, the least
      loaded host that has room) when ``local_world_size`` divides the world into several hosts,
      else across every rank (row-wise); rows as even as the free memory allows.

    Raises ``ValueError`` naming the table when no placement fits the budgets, or when a forced
    sharding type cannot be honoured.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1; got {world_size}")
    if local_world_size is not None and (local_world_size < 1 or world_size % local_world_size):
        raise ValueError(f"local_world_size {local_world_size} must divide world_size "
                         f"{world_size}")
    optimizer = _optimizer_key(optimizer)
    if optimizer not in _STATE_BYTES:
        raise ValueError(f"optimizer must be one of sgd, adagrad, rowwise_adagrad, adam, "
                         f"rowwise_adam, adamw (or a (name, options) spec such as "
                         f"('sgd', {{'momentum': 0.9}})) or None; got {optimizer!r}")
    specs = [Table.from_config(t, (pooling_factors or {}).get(getattr(t, "name", None), 1.0))
             for t in tables]
    names = [t.name for t in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"two tables share a name: {names}")
    forced = dict(sharding_types or {})
    for name, kind in forced.items():
        if name not in names:
            raise ValueError(f"sharding_types names table {name!r}, which is not one of {names}")
        if kind not in SHARDING_TYPES:
            raise ValueError(f"table {name!r}: sharding type must be one of "
                             f"{', '.join(SHARDING_TYPES)}; got {kind!r}")
    budgets = _budgets(memory_budget, world_size)
    free = [math.inf if b is None else float(b) for b in budgets]
    cost = [0.0] * world_size
    shardings: dict = {}
    result = ShardingPlan(world_size, shardings, {t.name: t for t in specs},
                          None if memory_budget is None else budgets, batch_size, optimizer,
                          local_world_size)

    def per_row(t: Table) -> int:
        return t.row_bytes() + result._state_row_bytes(t)

    def lookup_cost(t: Table) -> float:
        return world_size * batch_size * t.pooling_factor * t.row_bytes()

    everyone = tuple(range(world_size))
    sharded = []
    for t in specs:
        size = t.num_embeddings * per_row(t)
        kind = forced.get(t.name)
        if kind == DATA_PARALLEL or (kind is None and size <= replicate_below
                                     and all(f >= size for f in free)):
            short = [r for r in everyone if free[r] < size]
            if short:
                raise ValueError(f"table {t.name!r} ({size} bytes) cannot be replicated: rank "
                                 f"{short[0]} has {free[short[0]]:.0f} bytes free")
            for r in everyone:
                free[r] -= size
                cost[r] += batch_size * t.pooling_factor * t.row_bytes()
            shardings[t.name] = TableSharding(DATA_PARALLEL, everyone, (0, t.num_embeddings))
        else:
            sharded.append(t)
    fair = sum(lookup_cost(t) for t in sharded) / world_size
    hosts = ([tuple(range(h, h + local_world_size)) for h in range(0, world_size,
                                                                   local_world_size)]
             if local_world_size and local_world_size < world_size else None)

    def place_rows(t: Table, kind: str, ranks: Sequence[int]) -> bool:
        counts = _split_rows(t.num_embeddings, ranks, [free[r] for r in ranks], per_row(t))
        if counts is None:
            return False
        owners = [r for r, c in zip(ranks, counts) if c > 0]
        offsets = [0]
        for r, c in zip(ranks, counts):
            if c > 0:
                offsets.append(offsets[-1] + c)
                free[r] -= c * per_row(t)
                cost[r] += lookup_cost(t) * c / t.num_embeddings
        shardings[t.name] = TableSharding(kind, tuple(owners), tuple(offsets))
        return True

    for t in sorted(sharded, key=lambda t: (-lookup_cost(t), -t.num_embeddings, t.name)):
        size = t.num_embeddings * per_row(t)
        kind = forced.get(t.name)
        if kind is None:
            kind = TABLE_WISE if (lookup_cost(t) <= fair or world_size == 1) else (
                TABLE_ROW_WISE if hosts else ROW_WISE)
            if kind == TABLE_WISE and not any(f >= size for f in free):
                kind = TABLE_ROW_WISE if hosts else ROW_WISE
        if kind == TABLE_WISE:
            fits = [r for r in everyone if free[r] >= size]
            if not fits:
                best = max(everyone, key=lambda r: free[r])
                raise ValueError(f"table {t.name!r} ({size} bytes) fits on no rank: the most "
                                 f"room is {free[best]:.0f} bytes, on rank {best}")
            r = min(fits, key=lambda r: (cost[r], -free[r], r))
            free[r] -= size
            cost[r] += lookup_cost(t)
            shardings[t.name] = TableSharding(TABLE_WISE, (r,), (0, t.num_embeddings))
        elif kind == TABLE_ROW_WISE:
            groups = hosts or [everyone]
            for group in sorted(groups, key=lambda g: (sum(cost[r] for r in g), g[0])):
                if place_rows(t, TABLE_ROW_WISE, group):
                    break
            else:
                raise ValueError(f"table {t.name!r} ({size} bytes) fits in no node group: the "
                                 f"most room in one is "
                                 f"{max(sum(free[r] for r in g) for g in groups):.0f} bytes")
        elif not place_rows(t, ROW_WISE, everyone):
            raise ValueError(f"table {t.name!r} ({size} bytes) does not fit in the "
                             f"{sum(free):.0f} bytes left on all ranks together")
    result.shardings = {t.name: shardings[t.name] for t in specs}
    result.validate(world_size=world_size)
    return result
