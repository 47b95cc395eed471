"""perfkernels.torch.EmbeddingCollection: many unpooled tables, TorchRec's jagged input and output.

TorchRec is never required: :class:`JaggedTensor` here carries TorchRec's layout (and the methods a
model uses); when TorchRec is installed its ``JaggedTensor`` is returned instead, and a real
``torchrec.KeyedJaggedTensor`` is accepted as input.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

import perfkernels as pk
from perfkernels import _memory

from . import _bags, _fused_ops, _graph
from ._bridge import _BF16
from ._collection import _init_table, _Jagged, _kjt_parts, _table_dtype
from ._embedding import TORCH_INDEX_MESSAGE, Embedding, _as_tensor, _plain, weight_gradient

_NUMPY_DTYPES = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: _BF16}
#: outputs of at least this many bytes come from the memory pool in eager calls: a fresh
#: allocation that large is mapped by malloc (its threshold is 128 KiB) and faults on every call
_POOLED_BYTES = 128 << 10


@dataclass
class EmbeddingConfig:
    """One table of an :class:`EmbeddingCollection` (the fields of ``torchrec.EmbeddingConfig``
    that matter here; a torchrec config object is accepted wherever this one is).

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> pkt.EmbeddingConfig(1000, 16, name="item", feature_names=["item"]).embedding_dim
    16
    """
    num_embeddings: int
    embedding_dim: int
    name: str = ""
    feature_names: list = field(default_factory=list)
    weight_init_max: Optional[float] = None
    weight_init_min: Optional[float] = None
    data_type: Any = None                  # a torch dtype (or torchrec DataType FP32/FP16)


class JaggedTensor(_Jagged):
    """One feature's unpooled rows in TorchRec's layout: ``values()`` ``[n, D]`` (every sample's
    rows back to back), ``lengths()`` ``[B]`` rows per sample, ``offsets()`` ``[B + 1]``.

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> jt = pkt.JaggedTensor(torch.arange(6.0).view(3, 2), lengths=torch.tensor([2, 1]))
    >>> jt.offsets()
    tensor([0, 2, 3])
    """

    def __init__(self, values: Tensor, lengths: Optional[Tensor] = None,
                 offsets: Optional[Tensor] = None, weights: Optional[Tensor] = None) -> None:
        if lengths is None and offsets is None:
            raise ValueError("give lengths or offsets")
        self._values, self._lengths = values, lengths
        self._offsets, self._weights = offsets, weights

    def to_dense(self) -> list:
        """One ``[length_b, D]`` tensor per sample."""
        return list(torch.split(self._values, self.lengths().tolist()))


@functools.lru_cache(maxsize=None)
def _jagged_class():
    """TorchRec's JaggedTensor when TorchRec imports, else ours (looked up once: a failed import
    searches sys.path, tens of microseconds a call)."""
    try:
        from torchrec.sparse.jagged_tensor import JaggedTensor as TorchRecJagged
    except (ImportError, OSError):   # OSError: an FBGEMM built for another torch
        return JaggedTensor
    return TorchRecJagged


class EmbeddingCollection(torch.nn.Module):
    """TorchRec-style collection of unpooled embedding tables (``torchrec.EmbeddingCollection``)
    on perfkernels' kernels.

    ``EmbeddingCollection(tables, device=None, need_indices=False)`` with one
    :class:`EmbeddingConfig` (or ``torchrec.EmbeddingConfig``) per table.  ``forward`` takes a
    :class:`~perfkernels.torch.KeyedJaggedTensor` (or TorchRec's) and returns, as TorchRec's
    collection, a dict mapping each feature (in the order of the tables and their features;
    ``feature@table`` for a feature of several tables) to a :class:`JaggedTensor` (TorchRec's
    when installed): the feature's rows as float32, one per ID, with the KJT's lengths (and with
    ``need_indices=True`` the IDs as its weights).  Input keys no table reads are ignored.
    When the tables share a dtype and D (and run our kernel), every feature is looked up
    in one call of the native op ``perfkernels::embedding_collection``, whose rows the features'
    JaggedTensors are slices of; otherwise the features of one table are looked up together.  Parameters are
    ``embeddings.<table name>.weight`` (each table an :class:`~perfkernels.torch.Embedding`), as
    in TorchRec's unsharded collection, so its ``state_dict`` loads unchanged; gradients are the
    tables' (dense, or set ``module.embeddings[name].sparse = True``), or with
    ``fused_optimizer=`` every table is updated during backward.

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> ec = pkt.EmbeddingCollection([pkt.EmbeddingConfig(100, 8, name="t", feature_names=["f"])])
    >>> kjt = pkt.KeyedJaggedTensor(["f"], torch.tensor([4, 5, 6]), lengths=torch.tensor([2, 1]))
    >>> ec(kjt)["f"].values().shape       # one row per ID, samples back to back
    torch.Size([3, 8])
    """

    def __prepare_scriptable__(self):
        return _graph.refuse_collection_script(self)

    def __init__(self, tables: Sequence[Any], device=None, need_indices: bool = False,
                 fused_optimizer: Optional[Any] = None, placement: str = "auto") -> None:
        super().__init__()
        self._configs = list(tables)
        self._need_indices = need_indices
        self.embeddings = torch.nn.ModuleDict()
        # (output name, feature, table) in TorchRec's order: tables, then each table's
        # features; a feature of several tables is named "feature@table"
        self._outputs: list[tuple[str, str, str]] = []
        tables_of: dict[str, list] = {}
        for cfg in self._configs:
            if cfg.name in self.embeddings:
                raise ValueError(f"two tables are named {cfg.name!r}")
            emb = Embedding(cfg.num_embeddings, cfg.embedding_dim, device=device,
                            dtype=_table_dtype(cfg.data_type), placement=placement)
            _init_table(emb, cfg, fused_optimizer)
            self.embeddings[cfg.name] = emb
            for feature in (cfg.feature_names or [cfg.name]):
                tables_of.setdefault(feature, []).append(cfg.name)
        for cfg in self._configs:
            for feature in (cfg.feature_names or [cfg.name]):
                shared = len(tables_of[feature]) > 1
                self._outputs.append((f"{feature}@{cfg.name}" if shared else feature, feature,
                                      cfg.name))
        #: feature -> its table, for the features of one table (the one-call route's map)
        self._feature_table: dict[str, str] = {f: t[0] for f, t in tables_of.items()
                                               if len(t) == 1}
        self._shared = len(self._feature_table) < len(tables_of)

    def embedding_configs(self) -> list:
        return self._configs

    @property
    def device(self) -> torch.device:
        """The device of the tables (of the first one; CPU when there are none), as TorchRec's
        collection has it."""
        for emb in self.embeddings.values():
            return emb.weight.device
        return torch.device("cpu")

    def need_indices(self) -> bool:
        return self._need_indices

    def forward(self, features: Any) -> dict:
        """``{name: JaggedTensor}`` for every feature of every table, in the order of the tables
        and their features, as TorchRec's collection: ``name`` is the feature (``feature@table``
        for a feature of several tables), the rows float32 whatever the table's dtype.  Keys of
        the input that no table reads are ignored; a feature missing from the input is missing
        from the output (TorchRec raises ``KeyError``; a sharded collection's rank may hold no
        sample of a feature)."""
        if isinstance(features, torch.fx.Proxy):
            # fx symbolic tracing (torchrec.fx.symbolic_trace too): one leaf call of the lookup
            names = list(self.embeddings)
            return _traced_embedding_collection(
                features, [self.embeddings[n].weight for n in names],
                tuple((name, feature, names.index(table)) for name, feature, table in self._outputs),
                self._need_indices)
        keys, values, offsets, batch = _kjt_parts(features)
        lengths = features.lengths()
        position = {k: i for i, k in enumerate(keys)}
        outputs = [o for o in self._outputs if o[1] in position]
        num_keys = len(keys)
        meta = values.device.type == "meta" or self.device.type == "meta"
        if meta:
            # meta tensors hold no data: the values per key that the KJT knows (TorchRec's
            # KeyedJaggedTensor keeps them from its construction)
            bounds = [0]
            for n in features.length_per_key():
                bounds.append(bounds[-1] + int(n))
        else:
            bounds = offsets[::batch].tolist() if batch > 0 else [0] * (num_keys + 1)
        jagged = _jagged_class()
        rows = None
        if not meta and not self._shared and len(outputs) == num_keys == len(position):
            # every key is a feature of one table: all of them in one call
            rows = self._one_call(keys, values, offsets, bounds)
        if rows is not None:
            # every feature's rows from one call: each feature a slice of them
            sizes = [bounds[i + 1] - bounds[i] for i in range(num_keys)]
            parts = torch.split(rows.float(), sizes)
            ids = torch.split(values, sizes) if self._need_indices else [None] * num_keys
            lens = lengths.split(batch) if batch > 0 else [lengths] * num_keys
            out = {}
            for name, feature, _ in outputs:
                i = position[feature]
                out[name] = jagged(values=parts[i], lengths=lens[i], weights=ids[i])
            return out
        by_table: dict[str, list] = {}
        for name, feature, table in outputs:
            by_table.setdefault(table, []).append((name, position[feature]))
        out: dict[str, Any] = {}
        for table, wanted in by_table.items():
            # the table's features in one lookup: their value ranges, back to back
            idx = [i for _, i in wanted]
            pieces = [values[bounds[i]:bounds[i + 1]] for i in idx]
            ids = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
            rows = self.embeddings[table](ids).float()
            sizes = [bounds[i + 1] - bounds[i] for i in idx]
            for (name, i), part, ids_part in zip(wanted, torch.split(rows, sizes),
                                                 torch.split(ids, sizes)):
                lens = lengths[i * batch:(i + 1) * batch]
                out[name] = jagged(values=part, lengths=lens,
                                   weights=ids_part if self._need_indices else None)
        return {name: out[name] for name, _, _ in outputs}

    def _one_call(self, keys: list, values: Tensor, offsets: Tensor,
                  bounds: list) -> Optional[Tensor]:
        """Every feature's rows ``[n, D]`` from one call of the native op, when its tables share
        a dtype and D and each is a plain CPU table our kernel answers as torch (options that
        run torch's implementation, such as ``max_norm``, take the per-table route); else None."""
        names = list(self.embeddings)
        modules = [self.embeddings[n] for n in names]
        first = modules[0].weight
        # while a graph is captured the tensors are the tracer's: their dtype, device and layout
        # decide (the op's fake kernel stands for the kernel)
        capturing = _bags.capturing()
        for m in modules:
            w = m.weight
            plain = (_capturable(values, w) if capturing else _plain(values, w))
            if (m.max_norm is not None or m.scale_grad_by_freq or not plain
                    or w.dtype != first.dtype or w.shape[1] != first.shape[1]):
                return None
        if values.dim() != 1 or offsets.dtype not in (torch.int32, torch.int64):
            return None
        position = {n: t for t, n in enumerate(names)}
        tables = [position[self._feature_table[k]] for k in keys]
        weights = [m.weight for m in modules]
        if any(w.requires_grad for w in weights) and (
                torch.is_grad_enabled() or torch._C._get_tracing_state() is not None):
            op = embedding_collection_op     # (jit.trace: chosen without the grad mode, see _graph)
        else:
            op = embedding_collection_inference_op
            if (not capturing and values.shape[0] * first.shape[1] * first.element_size()
                    >= _POOLED_BYTES and not _bags._profiler_enabled()):
                return _pooled_rows(modules, tables, values, bounds)
        if capturing:
            return op(weights, values, offsets, len(keys), tables, self._group_of(modules))
        try:
            return op(weights, values, offsets, len(keys), tables, self._group_of(modules))
        except RuntimeError as exc:
            if str(exc).startswith(TORCH_INDEX_MESSAGE):
                raise IndexError(TORCH_INDEX_MESSAGE) from None
            raise

    def _group_of(self, modules: list) -> int:
        """The id under which the backward finds these modules (their gradient rules)."""
        key = tuple(id(m) for m in modules)
        if getattr(self, "_group_key", None) != key:
            self._group = _fused_ops.register_group(modules)
            self._group_key = key
        return self._group


def _traced_embedding_collection(features: Any, weights: list, outputs: tuple,
                                 need_indices: bool) -> dict:
    """The lookup of an :class:`EmbeddingCollection` as one node of an fx graph (a leaf of
    symbolic tracing): ``{name: JaggedTensor}`` for each ``(name, feature, table)`` of ``outputs``
    present in the input, each feature's rows torch's lookup in its table, as float32."""
    keys, values, offsets, batch = _kjt_parts(features)
    lengths = features.lengths()
    position = {k: i for i, k in enumerate(keys)}
    bounds = offsets[::batch].tolist() if batch > 0 else [0] * (len(keys) + 1)
    jagged = _jagged_class()
    out = {}
    for name, feature, table in outputs:
        if feature not in position:
            continue
        i = position[feature]
        ids = values[bounds[i]:bounds[i + 1]]
        rows = torch.nn.functional.embedding(ids, weights[table]).float()
        out[name] = jagged(values=rows, lengths=lengths[i * batch:(i + 1) * batch],
                           weights=ids if need_indices else None)
    return out


torch.fx.wrap("_traced_embedding_collection")


def _pooled_rows(modules: list, tables: list, values: Tensor, bounds: list) -> Tensor:
    """The eager form of the inference op: the same rows, written into one output from the
    package's memory pool by the kernel of each key (a fresh tensor of a large batch costs page
    faults and zeroing on every call; the pool's memory is already mapped)."""
    first = modules[0].weight
    out = _memory.empty((values.shape[0], first.shape[1]), _NUMPY_DTYPES[first.dtype])
    ids = values.numpy()
    for k, t in enumerate(tables):
        a, b = bounds[k], bounds[k + 1]
        if a < b:
            m = modules[t]
            try:
                pk.embedding(m._table_array(m.weight), ids[a:b], out=out[a:b])
            except IndexError:
                raise IndexError(TORCH_INDEX_MESSAGE) from None
    return _as_tensor(out, first.dtype)


def _capturable(values: Tensor, weight: Tensor) -> bool:
    """Whether a captured lookup can be the op: CPU, int32/int64 IDs, a 2-D table of our dtypes."""
    return (values.device.type == "cpu" and values.dtype in (torch.int32, torch.int64)
            and weight.device.type == "cpu" and weight.dim() == 2
            and weight.dtype in (torch.float32, torch.float16, torch.bfloat16))


# --------------------------------------------------------------------------- the registered op

# Defined, with its CPU kernel, by perfkernels' native library (native/ops.cpp): every feature of
# a jagged tensor looked up unpooled in one call, row j of the [n, D] result the row of
# values[j] in the table of its key.  Registered here: the fake kernels and the autograd formula
# (each table's gradient by its module's rule, from the rows of its keys).
#: (weights, values, offsets, num_keys, tables, group) -> [n, D] rows
embedding_collection_op = torch.ops.perfkernels.embedding_collection.default
#: the same without autograd, for calls and graphs that record no gradient
embedding_collection_inference_op = torch.ops.perfkernels.embedding_collection_inference.default


@torch.library.register_fake("perfkernels::embedding_collection_inference")
@torch.library.register_fake("perfkernels::embedding_collection")
def _collection_fake(weights, values, offsets, num_keys, tables, group):
    return weights[0].new_empty((values.shape[0], weights[0].shape[1]))


def _collection_setup(ctx, inputs, output):
    weights, values, offsets, num_keys, tables, group = inputs
    ctx.save_for_backward(values, offsets)
    ctx.options = (num_keys, list(tables), group,
                   [(w.shape[0], w.dtype, w.requires_grad) for w in weights])


def _collection_backward(ctx, grad):
    values, offsets = ctx.saved_tensors
    num_keys, tables, group, meta = ctx.options
    batch = (offsets.shape[0] - 1) // num_keys
    bounds = offsets[::batch].tolist() if batch > 0 else [0] * (num_keys + 1)
    grads: list = [None] * len(meta)
    if ctx.needs_input_grad[0]:
        for t in sorted(set(tables)):
            rows, dtype, requires = meta[t]
            if not requires:
                continue
            keys = [k for k in range(num_keys) if tables[k] == t]
            ids = torch.cat([values[bounds[k]:bounds[k + 1]] for k in keys])
            g = torch.cat([grad[bounds[k]:bounds[k + 1]] for k in keys])
            module = _fused_ops._group_module(group, t)
            padding = -1 if module is None or module.padding_idx is None else module.padding_idx
            sparse = bool(module is not None and module.sparse)
            grads[t] = weight_gradient(module, g, ids, rows, padding, sparse, dtype)
    return grads, None, None, None, None, None


torch.library.register_autograd("perfkernels::embedding_collection", _collection_backward,
                                setup_context=_collection_setup)
