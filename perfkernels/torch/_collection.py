"""perfkernels.torch.EmbeddingBagCollection: many tables, TorchRec's jagged input and pooled output.

TorchRec is never required: :class:`KeyedJaggedTensor` and :class:`KeyedTensor` here carry the
same layout (and the methods of TorchRec's classes that a model uses); a real
``torchrec.KeyedJaggedTensor`` is accepted too.
"""
from __future__ import annotations

import dataclasses
import enum
import math
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

import perfkernels as pk

from . import _bags, _graph, _native_ops  # noqa: F401 (_native_ops: the ops)
from ._bridge import as_numpy, index_error, index_error_at
from ._embedding_bag import EmbeddingBag
from ._quantized import QuantizedEmbeddingBag

#: the multi-table kernel's wording of a bad index
_MULTI_INDEX_MESSAGE = re.compile(r"indices\[(\d+)\] = (-?\d+) \(entry (\d+) of feature (\d+)\) "
                                  r"is out of range for table (\d+) of (\d+) rows")

#: perfkernels' multi-table lookup, when this build has it (else one call per feature)
_multi_lookup = getattr(pk, "embedding_bags_multi", None)


@dataclass
class EmbeddingBagConfig:
    """One table of a collection (the fields of ``torchrec.EmbeddingBagConfig`` that matter here;
    a torchrec config object is accepted wherever this one is).

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> pkt.EmbeddingBagConfig(1000, 16, name="item", feature_names=["item"], pooling="mean").pooling
    'mean'
    """
    num_embeddings: int
    embedding_dim: int
    name: str = ""
    feature_names: list = field(default_factory=list)
    pooling: Any = "sum"                   # "sum" / "mean" or torchrec's PoolingType
    weight_init_max: Optional[float] = None
    weight_init_min: Optional[float] = None
    data_type: Any = None                  # a torch dtype (or torchrec DataType FP32/FP16)
    #                                        (a quantized table's: "INT8", "INT4" or "INT2")


def _pooling_mode(pooling: Any) -> str:
    name = getattr(pooling, "name", pooling)
    mode = str(name).lower()
    if mode not in ("sum", "mean"):
        raise ValueError(f"pooling must be sum or mean; got {pooling!r}")
    return mode


def _table_dtype(data_type: Any) -> Optional[torch.dtype]:
    if data_type is None or isinstance(data_type, torch.dtype):
        return data_type
    name = str(getattr(data_type, "name", data_type)).upper()
    if name in ("INT8", "INT4", "INT2"):
        raise ValueError(f"data_type {name}: a collection's quantized tables come from "
                         f"convert(collection, bits={name[3:]}) or "
                         "EmbeddingBagCollection.from_files (quantized table files), not from "
                         "a config")
    return {"FP32": torch.float32, "FP16": torch.float16, "BF16": torch.bfloat16}.get(name)


def _table(bag: torch.nn.Module) -> Tensor:
    """A collection table's rows: the float weight, or a quantized table's packed rows."""
    return bag.packed_weight if isinstance(bag, QuantizedEmbeddingBag) else bag.weight


def _bits(bag: torch.nn.Module) -> int:
    """0 for a float table, else the bits of its quantized rows."""
    return bag.bits if isinstance(bag, QuantizedEmbeddingBag) else 0


class _Jagged:
    """What :class:`KeyedJaggedTensor` and :class:`~perfkernels.torch.JaggedTensor` share: values
    back to back, optional per-value weights, and lengths or offsets (each made from the other
    on first use)."""

    _values: Tensor
    _weights: Optional[Tensor]
    _lengths: Optional[Tensor]
    _offsets: Optional[Tensor]

    def values(self) -> Tensor:
        return self._values

    def weights_or_none(self) -> Optional[Tensor]:
        return self._weights

    def lengths(self) -> Tensor:
        if self._lengths is None:
            self._lengths = self._offsets[1:] - self._offsets[:-1]
        return self._lengths

    def offsets(self) -> Tensor:
        if self._offsets is None:
            lengths = self._lengths
            self._offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
        return self._offsets


def _init_table(table: torch.nn.Module, cfg: Any, fused_optimizer: Optional[Any]) -> None:
    """A collection's new table as TorchRec initialises it: uniform in
    [weight_init_min, weight_init_max] (default +-sqrt(1 / num_embeddings)), and the fused
    optimizer when one is given."""
    hi = cfg.weight_init_max
    lo = cfg.weight_init_min
    bound = math.sqrt(1.0 / cfg.num_embeddings)
    with torch.no_grad():
        table.weight.uniform_(-bound if lo is None else lo, bound if hi is None else hi)
    if fused_optimizer is not None:
        table.set_fused_optimizer(fused_optimizer)


def _kjt_parts(features: Any) -> tuple[list, Tensor, Tensor, int]:
    """A KJT's keys, values, offsets and batch size B (its F * B + 1 offsets say B)."""
    keys = list(features.keys())
    values = features.values()
    offsets = features.offsets()
    return keys, values, offsets, (offsets.numel() - 1) // max(len(keys), 1)


class KeyedJaggedTensor(_Jagged):
    """Jagged sparse features in TorchRec's layout: the ``values`` of every key back to back,
    ``lengths[f * B + b]`` values for key f and sample b (or ``offsets``, F * B + 1 entries), and
    optional per-value ``weights``.

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> kjt = pkt.KeyedJaggedTensor(["item", "user"], torch.tensor([1, 2, 3, 7, 9]),
    ...                             lengths=torch.tensor([2, 1, 1, 1]))
    >>> kjt.keys(), kjt.offsets()
    (['item', 'user'], tensor([0, 2, 3, 4, 5]))
    """

    def __init__(self, keys: Sequence[str], values: Tensor, weights: Optional[Tensor] = None,
                 lengths: Optional[Tensor] = None, offsets: Optional[Tensor] = None) -> None:
        if (lengths is None) == (offsets is None):
            raise ValueError("give lengths or offsets (one of them)")
        self._keys = list(keys)
        self._values = values
        self._weights = weights
        self._lengths = lengths
        self._offsets = offsets

    @classmethod
    def from_lengths_sync(cls, keys, values, lengths, weights=None) -> "KeyedJaggedTensor":
        return cls(keys, values, weights=weights, lengths=lengths)

    def keys(self) -> list:
        return self._keys

    def stride(self) -> int:
        """The batch size B."""
        n = (self._lengths.numel() if self._lengths is not None else self._offsets.numel() - 1)
        return n // max(len(self._keys), 1)


class KeyedTensor:
    """Pooled embeddings in TorchRec's layout: ``values()`` is ``[B, sum of dims]``, key k's
    columns at ``offset_per_key()[k]``.

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> kt = pkt.KeyedTensor(["a", "b"], [2, 1], torch.arange(6.0).view(2, 3))
    >>> kt.offset_per_key(), kt.to_dict()["b"]
    ([0, 2, 3], tensor([[2.],
            [5.]]))
    """

    def __init__(self, keys: Sequence[str], length_per_key: Sequence[int], values: Tensor) -> None:
        self._keys = list(keys)
        self._length_per_key = list(length_per_key)
        self._values = values

    def keys(self) -> list:
        return self._keys

    def values(self) -> Tensor:
        return self._values

    def length_per_key(self) -> list:
        return self._length_per_key

    def offset_per_key(self) -> list:
        out = [0]
        for n in self._length_per_key:
            out.append(out[-1] + n)
        return out

    def to_dict(self) -> dict:
        return dict(zip(self._keys, torch.split(self._values, self._length_per_key, dim=1)))

    def __getitem__(self, key: str) -> Tensor:
        i = self._keys.index(key)
        start = sum(self._length_per_key[:i])
        return self._values[:, start:start + self._length_per_key[i]]


def _check_jagged(values: Tensor, offsets: Tensor, weights: Optional[Tensor], num_keys: int
                  ) -> None:
    """The checks the multi-table kernel makes on a KJT, with its messages, for the routes that
    slice the KJT per feature (autograd, CUDA): F * B + 1 offsets (so F * B lengths), the first
    0, non-decreasing, the last ``len(values)``, one weight per value."""
    count, n = offsets.numel(), values.numel()
    if offsets.dim() != 1 or count == 0 or (count - 1) % max(num_keys, 1):
        raise ValueError(f"offsets has {count} entries; it needs F * B + 1 for the {num_keys} "
                         f"tables")
    first = int(offsets[0])
    if first != 0:
        raise ValueError(f"offsets[0] = {first}: the first offset must be 0")
    down = torch.nonzero(offsets[1:] < offsets[:-1])
    if down.numel():
        i = int(down[0, 0]) + 1
        raise ValueError(f"offsets[{i}] = {int(offsets[i])} < offsets[{i - 1}] = "
                         f"{int(offsets[i - 1])}: offsets must be non-decreasing")
    last = int(offsets[-1])
    if last != n:
        raise ValueError(f"offsets[{count - 1}] = {last} != len(indices) = {n}: the last offset "
                         "must equal the number of values")
    if weights is not None and tuple(weights.shape) != (n,):
        raise ValueError(f"per_sample_weights has shape {tuple(weights.shape)}; it needs one "
                         f"weight per value, shape ({n},)")


class EmbeddingBagCollection(torch.nn.Module):
    """TorchRec-style collection of pooled embedding tables on perfkernels' kernels.

    ``EmbeddingBagCollection(tables, is_weighted=False, device=None)`` with one
    :class:`EmbeddingBagConfig` (or ``torchrec.EmbeddingBagConfig``) per table.  ``forward`` takes
    a :class:`KeyedJaggedTensor` (or TorchRec's) and returns a :class:`KeyedTensor` whose
    ``values()`` are the pooled rows of every feature side by side, ``[B, sum of dims]``, in the
    order of the tables and their ``feature_names``; as TorchRec's, a feature read by several
    tables is named ``feature@table`` (one slot per table, of that table's width).  Under
    ``torch.fx`` / ``torchrec.fx`` symbolic tracing the lookup is one leaf call; on the meta
    device forward gives the output's shape without reading data.  The parameters are
    ``embedding_bags.<table name>.weight``, as in TorchRec's unsharded collection, so its
    ``state_dict`` loads unchanged.  Gradients: each table's ``sparse`` setting (dense by
    default; set ``module.embedding_bags[name].sparse = True`` for COO gradients), or with
    ``fused_optimizer=("rowwise_adagrad", {"lr": ..., "eps": ...})`` every table is updated during
    backward and returns no gradient (FBGEMM's fused table-batched embeddings), its optimizer state
    in ``state_dict`` as ``embedding_bags.<table name>.momentum1`` (the Adam family also
    ``momentum2`` and the table's step count ``step``).  A table shared by several
    features is looked up once for all of them, so it is updated once per step with every
    feature's rows (duplicates across features summed first, as FBGEMM's exact optimizers do).
    ``placement=`` places every table (see :class:`EmbeddingBag`).

    Quantized tables (row-wise 8/4/2-bit, :class:`QuantizedEmbeddingBag`, inference only) come
    from ``convert(collection, bits=4)`` or from quantized table files
    (:meth:`from_files`); a collection may mix them with float tables.  Every table is still
    looked up in one call, and graphs (``torch.compile``, ``torch.export``, ``jit.trace``,
    ``torch.fx``) record one op for all of them.

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> ebc = pkt.EmbeddingBagCollection(
    ...     [pkt.EmbeddingBagConfig(100, 8, name="item", feature_names=["item"]),
    ...      pkt.EmbeddingBagConfig(50, 4, name="user", feature_names=["user"], pooling="mean")])
    >>> kjt = pkt.KeyedJaggedTensor(["item", "user"], torch.tensor([1, 2, 3, 7, 9]),
    ...                             lengths=torch.tensor([2, 1, 1, 1]))         # 2 samples
    >>> pooled = ebc(kjt)
    >>> pooled.keys(), pooled.values().shape
    (['item', 'user'], torch.Size([2, 12]))
    """

    def __prepare_scriptable__(self):
        return _graph.refuse_collection_script(self)

    def __init__(self, tables: Sequence[Any], is_weighted: bool = False, device=None,
                 fused_optimizer: Optional[Any] = None, placement: str = "auto") -> None:
        super().__init__()
        self._is_weighted = is_weighted
        self._configs = list(tables)
        self.embedding_bags = torch.nn.ModuleDict()
        self._feature_table: list[tuple[str, str, int]] = []   # (feature, table, dim)
        for cfg in self._configs:
            if cfg.name in self.embedding_bags:
                raise ValueError(f"two tables are named {cfg.name!r}")
            bag = EmbeddingBag(cfg.num_embeddings, cfg.embedding_dim,
                               mode=_pooling_mode(cfg.pooling), include_last_offset=True,
                               device=device, dtype=_table_dtype(cfg.data_type),
                               placement=placement)
            bag.output_dtype = torch.float32
            _init_table(bag, cfg, fused_optimizer)
            self.embedding_bags[cfg.name] = bag
            for feature in (cfg.feature_names or [cfg.name]):
                self._feature_table.append((feature, cfg.name, cfg.embedding_dim))
        # output names as TorchRec's: "feature@table" for a feature of several tables
        count: dict[str, int] = {}
        for feature, _, _ in self._feature_table:
            count[feature] = count.get(feature, 0) + 1
        self._embedding_names = [f"{f}@{t}" if count[f] > 1 else f
                                 for f, t, _ in self._feature_table]

    @classmethod
    def from_files(cls, files: Any, *, feature_names: Optional[Any] = None, pooling: Any = "sum",
                   is_weighted: bool = False, populate: bool = False
                   ) -> "EmbeddingBagCollection":
        """A collection over table files of :mod:`perfkernels.tables` (``{table name: path}``,
        in order; ``feature_names``: ``{table name: [feature, ...]}``, default the table's name;
        ``pooling``: ``"sum"`` / ``"mean"``, or ``{table name: pooling}``),
        each mapped copy-on-write and shared between processes, as :meth:`EmbeddingBag.from_file`
        (float tables) and :meth:`QuantizedEmbeddingBag.from_file` (8/4/2-bit rows) map them;
        rows, D and format come from the files, and formats may be mixed.  Nothing is read or
        copied now, so a collection of 13 GiB of 4-bit tables is ready in milliseconds;
        ``populate=True`` maps every page now instead (reading what the page cache lacks), so
        that no lookup pays a page fault later (:func:`perfkernels.tables.load_table`).

        Examples
        --------
        >>> import os, tempfile, numpy as np, torch, perfkernels as pk, perfkernels.torch as pkt
        >>> from perfkernels import tables
        >>> d = tempfile.mkdtemp()
        >>> info = tables.save_table(os.path.join(d, "item.pkt"),
        ...                          pk.quantize_rowwise(np.ones((100, 8), np.float32), bits=4),
        ...                          bits=4, dim=8)
        >>> ebc = pkt.EmbeddingBagCollection.from_files({"item": os.path.join(d, "item.pkt")})
        >>> kjt = pkt.KeyedJaggedTensor(["item"], torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1]))
        >>> ebc(kjt).values()[:, 0]
        tensor([2., 1.])
        """
        from ._table_files import collection_from_files
        return collection_from_files(cls, files, bag_cls=EmbeddingBag,
                                     quantized_cls=QuantizedEmbeddingBag,
                                     config_cls=EmbeddingBagConfig, feature_names=feature_names,
                                     pooling=pooling, is_weighted=is_weighted,
                                     populate=populate)

    @classmethod
    def from_tables(cls, tables: Any, *, bits: Any = None, dims: Optional[Any] = None,
                    feature_names: Optional[Any] = None, pooling: Any = "sum",
                    is_weighted: bool = False) -> "EmbeddingBagCollection":
        """A collection over tables already in memory (``{table name: table}``, in order), each
        used in place, never copied: float32 / float16 / bfloat16 ``[rows, D]`` arrays or tensors
        (the float tables are the modules' weights), or packed 8/4/2-bit rows (uint8, as
        :func:`perfkernels.quantize_rowwise` and :func:`perfkernels.tables.build_tables` return
        them; ``bits``: one value for every packed table, or ``{table name: bits}``; ``dims``:
        ``{table name: D}`` where the row's bytes leave D open, an odd D of 4-bit rows).  Formats
        may be mixed.  ``feature_names`` and ``pooling`` as for :meth:`from_files`.  A read-only
        array (a read-only mapping) is refused: map table files with :meth:`from_files`.

        Examples
        --------
        >>> import numpy as np, torch, perfkernels as pk, perfkernels.torch as pkt
        >>> item = pk.quantize_rowwise(np.ones((100, 8), np.float32), bits=4)
        >>> user = np.full((50, 4), 0.5, np.float32)
        >>> ebc = pkt.EmbeddingBagCollection.from_tables({"item": item, "user": user},
        ...                                              bits={"item": 4})
        >>> kjt = pkt.KeyedJaggedTensor(["item", "user"], torch.tensor([1, 2, 3, 7]),
        ...                             lengths=torch.tensor([2, 0, 1, 1]))
        >>> ebc(kjt).values().detach()[:, [0, 8]]     # item's first column, then user's
        tensor([[2.0000, 0.5000],
                [0.0000, 0.5000]])
        """
        from ._table_files import collection_from_tables
        return collection_from_tables(cls, tables, bag_cls=EmbeddingBag,
                                      quantized_cls=QuantizedEmbeddingBag,
                                      config_cls=EmbeddingBagConfig, bits=bits, dims=dims,
                                      feature_names=feature_names, pooling=pooling,
                                      is_weighted=is_weighted)

    def is_weighted(self) -> bool:
        return self._is_weighted

    @property
    def device(self) -> torch.device:
        """The device of the tables (of the first one; CPU when there are none), as TorchRec's
        collection has it."""
        for bag in self.embedding_bags.values():
            return _table(bag).device
        return torch.device("cpu")

    def embedding_bag_configs(self) -> list:
        """The tables' configs, in order; a quantized table's ``data_type`` says its bits
        (``"INT8"`` / ``"INT4"`` / ``"INT2"``, or TorchRec's ``DataType`` member when the config
        is TorchRec's), also after ``convert(collection, bits=...)``."""
        out = []
        for cfg in self._configs:
            bag = self.embedding_bags[cfg.name] if cfg.name in self.embedding_bags else None
            bits = _bits(bag) if bag is not None else 0
            if bits and dataclasses.is_dataclass(cfg):
                kind = type(cfg.data_type)
                name = f"INT{bits}"
                value = (kind[name] if isinstance(cfg.data_type, enum.Enum)
                         and name in kind.__members__ else name)
                if cfg.data_type != value:
                    cfg = dataclasses.replace(cfg, data_type=value)
            out.append(cfg)
        return out

    def forward(self, features: Any) -> KeyedTensor:
        """Pooled rows for every feature of every table (KeyedTensor layout)."""
        if isinstance(features, torch.fx.Proxy):
            # fx symbolic tracing (torchrec.fx.symbolic_trace too): one leaf call of the lookup
            names = list(self.embedding_bags)
            return _traced_collection(
                features, [_table(self.embedding_bags[n]) for n in names],
                tuple(f for f, _, _ in self._feature_table),
                tuple(names.index(t) for _, t, _ in self._feature_table),
                tuple(int(self.embedding_bags[n].mode == "mean") for n in names),
                tuple(-1 if b.padding_idx is None else b.padding_idx % b.num_embeddings
                      for b in (self.embedding_bags[n] for n in names)),
                self._is_weighted, tuple(self._embedding_names),
                tuple(d for _, _, d in self._feature_table),
                tuple(_bits(self.embedding_bags[n]) for n in names),
                tuple(self.embedding_bags[n].embedding_dim for n in names))
        keys, values, offsets, batch = _kjt_parts(features)
        weights = features.weights_or_none() if self._is_weighted else None
        out = None
        no_grad = not (torch.is_grad_enabled() and self._needs_grad(weights))
        if values.device.type == "meta" or self.device.type == "meta":
            # meta tensors hold no data: the op's fake kernel gives the output's shape
            out = self._lookup_op(keys, values, offsets, weights, batch)
        elif _bags.capturing():       # (torch.jit.trace too: no lookup traced as a constant)
            out = self._lookup_op(keys, values, offsets, weights, batch)
        elif no_grad:
            if _bags._profiler_enabled():
                out = self._profiled_op(keys, values, offsets, weights, batch)
            if out is None and _multi_lookup is not None:
                out = self._lookup_all(keys, values, offsets, weights)
        if out is None:
            out = self._lookup_each(keys, values, offsets, weights, batch)
        return KeyedTensor(list(self._embedding_names),
                           [d for _, _, d in self._feature_table], out)

    def _needs_grad(self, weights: Optional[Tensor]) -> bool:
        return (any(_table(b).requires_grad for b in self.embedding_bags.values())
                or (weights is not None and weights.requires_grad))

    def _lookup_each(self, keys: list, values: Tensor, offsets: Tensor,
                     weights: Optional[Tensor], batch: int) -> Tensor:
        """One lookup per table (autograd, compile, CUDA), concatenated in feature order.  The
        features of a table shared by several are looked up together, as one batch of bags, so a
        fused optimizer updates the table once per step from all of them (FBGEMM's exact
        optimizers do the same), not once per feature."""
        _check_jagged(values, offsets, weights, len(keys))
        position = {k: i for i, k in enumerate(keys)}
        by_table: dict[str, list[tuple[int, int]]] = {}     # table -> (slot, input feature)
        for slot, (feature, table, _) in enumerate(self._feature_table):
            if feature not in position:
                raise KeyError(f"feature {feature!r} (table {table!r}) is not in the input; "
                               f"its keys are {keys}")
            by_table.setdefault(table, []).append((slot, position[feature]))
        pooled: dict[int, Tensor] = {}
        for table, feats in by_table.items():
            segments = [offsets[f * batch:(f + 1) * batch + 1] for _, f in feats]
            out = self._lookup_segments(self.embedding_bags[table], values, weights, segments)
            for i, (slot, _) in enumerate(feats):     # (not split(batch): batch may be 0)
                pooled[slot] = out[i * batch:(i + 1) * batch] if len(feats) > 1 else out
        parts = [pooled[slot] for slot in range(len(self._feature_table))]
        return torch.cat(parts, dim=1) if parts else values.new_zeros((batch, 0),
                                                                      dtype=torch.float32)

    def _lookup_op(self, keys: list, values: Tensor, offsets: Tensor,
                   weights: Optional[Tensor], batch: int) -> Tensor:
        """Every feature through the registered op ``perfkernels::embedding_bag_collection``
        (what torch.compile and torch.export see: its output shape does not depend on the data,
        unlike the per-feature slices of the values)."""
        position = {k: i for i, k in enumerate(keys)}
        names = list(self.embedding_bags)
        tables = [self.embedding_bags[n] for n in names]
        features, table_index = [], []
        for feature, table, _ in self._feature_table:
            if feature not in position:
                raise KeyError(f"feature {feature!r} (table {table!r}) is not in the input; "
                               f"its keys are {keys}")
            features.append(position[feature])
            table_index.append(names.index(table))
        ws = [_table(b) for b in tables]
        grad = (_bags.records_grad(weights, *ws) if torch._C._get_tracing_state() is None
                else _graph.records_grad_traced(weights, *ws))   # (jit.trace: see _graph)
        mean = [int(b.mode == "mean") for b in tables]
        padding = [-1 if b.padding_idx is None else b.padding_idx % b.num_embeddings
                   for b in tables]
        bits = [_bits(b) for b in tables]
        if any(bits):
            return _packed_collection(ws, bits, [b.embedding_dim for b in tables], values,
                                      offsets, weights, len(keys), features, table_index, mean,
                                      padding, grad)
        op = (torch.ops.perfkernels.embedding_bag_collection if grad
              else torch.ops.perfkernels.embedding_bag_collection_inference)
        return op(ws, values, offsets, weights, len(keys), features, table_index, mean, padding)

    def _profiled_op(self, keys: list, values: Tensor, offsets: Tensor,
                     weights: Optional[Tensor], batch: int) -> Optional[Tensor]:
        """While a profiler runs: the lookup through the registered op, which the profiler
        records by name (``perfkernels::embedding_bag_collection``); None where the op refuses
        the input (the eager route then answers, with its own exception)."""
        try:
            return self._lookup_op(keys, values, offsets, weights, batch)
        except (RuntimeError, KeyError):
            return None

    def _one_call_plan(self, keys: list) -> Optional[tuple]:
        """For a one-call lookup of ``keys``: (table modules in key order, which of them hold
        quantized rows, bits and dims or None, the output's column order or None), or None when
        the input is not exactly this collection's features.  Kept per key order while the
        collection's table modules stay the same objects (a module replaced in
        ``embedding_bags`` makes a new plan); what a module's attributes say (mode, padding_idx,
        its table) is read on every call."""
        modules = tuple(self.embedding_bags._modules.values())
        cache = self.__dict__.get("_plans")
        if cache is None or len(cache[0]) != len(modules) or any(
                a is not b for a, b in zip(cache[0], modules)):
            cache = (modules, {})
            self.__dict__["_plans"] = cache
        key = tuple(keys)
        if key in cache[1]:
            return cache[1][key]
        table_of = {f: t for f, t, _ in self._feature_table}
        plan = None
        if (len(table_of) == len(self._feature_table) and len(keys) == len(table_of)
                and all(k in table_of for k in keys)):      # (else a feature of several tables)
            bags = [self.embedding_bags[table_of[k]] for k in keys]
            quantized = [isinstance(b, QuantizedEmbeddingBag) for b in bags]
            bits = [_bits(b) or None for b in bags]
            packed = (bits, [b.embedding_dim for b in bags]) if any(quantized) else None
            order = [f for f, _, _ in self._feature_table]
            cols = None
            if order != list(keys):   # the input's key order differs from the tables' order
                start, col = {}, 0
                for k, b in zip(keys, bags):
                    start[k] = col
                    col += b.embedding_dim
                dims = {k: b.embedding_dim for k, b in zip(keys, bags)}
                cols = torch.cat([torch.arange(start[k], start[k] + dims[k]) for k in order])
            plan = (bags, quantized, packed, cols)
        cache[1][key] = plan
        return plan

    def _lookup_all(self, keys: list, values: Tensor, offsets: Tensor,
                    weights: Optional[Tensor]) -> Optional[Tensor]:
        """Every feature in one multi-table kernel call (CPU, no gradient), when the input holds
        exactly this collection's features; None otherwise (the caller loops)."""
        plan = self._one_call_plan(keys)
        if plan is None:
            return None
        bags, quantized, packed, cols = plan
        arrays = []
        for b, q in zip(bags, quantized):
            t = (b._buffers if q else b._parameters).get("packed_weight" if q else "weight")
            a = b._table_array(_table(b) if t is None else t)
            if a is None:          # a table off the CPU
                return None
            arrays.append(a)
        extra = {} if packed is None else {"bits": packed[0], "dims": packed[1]}
        try:
            out = _multi_lookup(arrays, as_numpy(values), offsets=as_numpy(offsets),
                                per_sample_weights=None if weights is None
                                else as_numpy(weights.float()),
                                modes=[b.mode for b in bags],
                                padding_idx=[b.padding_idx for b in bags], **extra)
        except IndexError as exc:
            # torch's wording, the position within the feature's values (as a lookup of that
            # feature alone, the path with a gradient, and TorchRec's say it)
            m = _MULTI_INDEX_MESSAGE.search(str(exc))
            if m is not None:
                entry, value, rows = (int(m.group(i)) for i in (3, 2, 6))
                raise index_error_at(entry, value, rows) from None
            raise index_error(exc) from None
        out = torch.from_numpy(out)
        return out if cols is None else out.index_select(1, cols)

    @staticmethod
    def _lookup_segments(bag: torch.nn.Module, values: Tensor, weights: Optional[Tensor],
                         segments: list) -> Tensor:
        """The bags of one or more features (each a B + 1 slice of the KJT offsets) in one lookup:
        their values back to back, offsets rebased onto them; ``[len(segments) * B, D]``."""
        compiling = torch.compiler.is_compiling()
        seg_values, seg_weights, seg_offsets = [], [], []
        base = 0
        for i, o in enumerate(segments):
            start, end = o[0], o[-1]
            if not compiling:
                start, end = int(start), int(end)
            seg_values.append(values[start:end])
            if weights is not None:
                seg_weights.append(weights[start:end])
            last = i == len(segments) - 1
            seg_offsets.append((o if last else o[:-1]) - start + base)
            base = base + (end - start)
        if len(segments) == 1:
            seg, w, offs = seg_values[0], (seg_weights or [None])[0], seg_offsets[0]
        else:
            seg, offs = torch.cat(seg_values), torch.cat(seg_offsets)
            w = torch.cat(seg_weights) if weights is not None else None
        if isinstance(bag, QuantizedEmbeddingBag):     # no gradient for its rows
            return _bags.lookup(bag.packed_weight, seg, offs, w, bag.mode, True, bag.padding_idx,
                                bag.bits, bag.embedding_dim)
        # TorchRec (FBGEMM) pools weighted features in mode mean too
        return _bags.bag_forward(bag.weight, seg, offs, w,
                                 bag._spec()._replace(weighted_mean=True), torch.float32)


def _traced_collection(features: Any, weights: list, feature_names: tuple, table_index: tuple,
                       mean: tuple, padding_idx: tuple, is_weighted: bool, names: tuple,
                       dims: tuple, bits: tuple = (), table_dims: tuple = ()) -> KeyedTensor:
    """The lookup of a collection as one node of an fx graph (a leaf of symbolic tracing): every
    feature through ``perfkernels::embedding_bag_collection`` (with quantized tables, ``bits``
    not all 0: ``perfkernels::embedding_bag_collection_packed``), the output a KeyedTensor named
    ``names``."""
    keys, values, offsets, _ = _kjt_parts(features)
    psw = features.weights_or_none() if is_weighted else None
    position = {k: i for i, k in enumerate(keys)}
    missing = [f for f in feature_names if f not in position]
    if missing:
        raise KeyError(f"feature {missing[0]!r} is not in the input; its keys are {keys}")
    grad = torch.is_grad_enabled() and (any(w.requires_grad for w in weights)
                                        or (psw is not None and psw.requires_grad))
    features_at = [position[f] for f in feature_names]
    if any(bits):
        out = _packed_collection(list(weights), list(bits), list(table_dims), values, offsets,
                                 psw, len(keys), features_at, list(table_index), list(mean),
                                 list(padding_idx), grad)
        return KeyedTensor(list(names), list(dims), out)
    op = (torch.ops.perfkernels.embedding_bag_collection if grad
          else torch.ops.perfkernels.embedding_bag_collection_inference)
    out = op(list(weights), values, offsets, psw, len(keys), features_at,
             list(table_index), list(mean), list(padding_idx))
    return KeyedTensor(list(names), list(dims), out)


torch.fx.wrap("_traced_collection")


def _packed_collection(weights: list, bits: list, dims: list, values: Tensor, offsets: Tensor,
                       psw: Optional[Tensor], num_keys: int, features: list, tables: list,
                       mean: list, padding_idx: list, grad: bool) -> Tensor:
    """A collection with quantized tables through ``perfkernels::embedding_bag_collection_packed``
    (inference only: quantized rows have no gradient), or the error saying why not."""
    if grad:
        raise RuntimeError(
            "a collection with quantized tables is looked up without gradients in graphs "
            "(torch.compile, torch.export, jit.trace, fx); its float tables or per-sample "
            "weights require grad here: capture it under torch.no_grad(), or set "
            "requires_grad=False on them")
    return torch.ops.perfkernels.embedding_bag_collection_packed(
        weights, bits, dims, values, offsets, psw, num_keys, features, tables, mean,
        padding_idx)


# --------------------------------------------------------------------------- the registered op

# ``perfkernels::embedding_bag_collection(Tensor[] weights, Tensor values, Tensor offsets,
# Tensor? per_sample_weights, SymInt num_keys, SymInt[] features, SymInt[] tables, SymInt[] mean,
# SymInt[] padding_idx) -> Tensor``: the pooled rows of a collection, ``[B, sum of the dims]``;
# output slot i is input feature ``features[i]`` (of ``num_keys`` in the KJT ``values`` /
# ``offsets``, F * B + 1 entries) looked up in ``weights[tables[i]]``; per table, ``mean`` (1:
# mode mean) and ``padding_idx`` (-1: none).  Defined, with its CPU kernel (every slot in one
# split of the work), by the native library (``_native_ops``); here its fake kernel and autograd.

@torch.library.register_fake("perfkernels::embedding_bag_collection")
def _collection_fake(weights, values, offsets, per_sample_weights, num_keys, features, tables,
                     mean, padding_idx):
    batch = (offsets.shape[0] - 1) // max(num_keys, 1)
    return values.new_empty((batch, sum(weights[t].shape[1] for t in tables)),
                            dtype=torch.float32)


torch.library.register_fake("perfkernels::embedding_bag_collection_inference")(_collection_fake)


# ``perfkernels::embedding_bag_collection_packed(Tensor[] weights, SymInt[] bits, SymInt[] dims,
# Tensor values, Tensor offsets, Tensor? per_sample_weights, SymInt num_keys, SymInt[] features,
# SymInt[] tables, SymInt[] mean, SymInt[] padding_idx) -> Tensor``: the same over tables of any
# format, table t quantized to ``bits[t]`` bits with ``dims[t]`` values a row (0: a float table);
# no autograd (an inference op).

@torch.library.register_fake("perfkernels::embedding_bag_collection_packed")
def _collection_packed_fake(weights, bits, dims, values, offsets, per_sample_weights, num_keys,
                            features, tables, mean, padding_idx):
    batch = (offsets.shape[0] - 1) // max(num_keys, 1)
    width = sum(dims[t] if bits[t] else weights[t].shape[1] for t in tables)
    return values.new_empty((batch, width), dtype=torch.float32)


def _collection_setup(ctx, inputs, output):
    weights, values, offsets, psw, num_keys, features, tables, mean, padding_idx = inputs
    ctx.save_for_backward(values, offsets, psw, *weights)
    ctx.options = (num_keys, features, tables, mean, padding_idx)


def _collection_backward(ctx, grad_output):
    """Dense table gradients (and that of the per-sample weights), written with torch ops of
    data-independent shapes so that they trace: every entry of the KJT is visited once per output
    slot, masked to that slot's feature (O(slots x entries x D): the traced route's price)."""
    values, offsets, psw, *weights = ctx.saved_tensors
    num_keys, features, tables, mean, padding_idx = ctx.options
    need_w = ctx.needs_input_grad[0]
    batch = (offsets.shape[0] - 1) // max(num_keys, 1)
    bag, num_bags = _bags.bag_of_entries(values, offsets, True)
    feature_of, sample_of = bag // max(batch, 1), bag % max(batch, 1)
    grads = [torch.zeros(w.shape, dtype=torch.float32, device=w.device) if need_w else None
             for w in weights]
    grad_psw = (torch.zeros(values.shape, dtype=torch.float32, device=values.device)
                if psw is not None and ctx.needs_input_grad[3] else None)
    col = 0
    for f, t in zip(features, tables):
        w = weights[t]
        rows, dim = w.shape
        g = grad_output[:, col:col + dim].float().index_select(0, sample_of)
        col += dim
        scale = (feature_of == f).float()
        more = _bags.entry_scales(values, bag, num_bags, "mean" if mean[t] else "sum",
                                  None if padding_idx[t] < 0 else padding_idx[t], rows)
        if more is not None:
            scale = scale * more
        row = torch.where(feature_of == f, values, 0).long()
        if grad_psw is not None:
            grad_psw = grad_psw + scale * (g * w.detach().index_select(0, row).float()).sum(1)
        if need_w:
            if psw is not None:
                scale = scale * psw.float()
            grads[t].index_add_(0, row, g * scale.unsqueeze(1))
    grads = [None if g is None else g.to(w.dtype) for g, w in zip(grads, weights)]
    if grad_psw is not None:
        grad_psw = grad_psw.to(psw.dtype)
    return grads, None, None, grad_psw, None, None, None, None, None


torch.library.register_autograd("perfkernels::embedding_bag_collection", _collection_backward,
                                setup_context=_collection_setup)
