"""convert() of TorchRec's collections: every feature in one multi-table call.

TorchRec is never imported by perfkernels unless a model holds its modules.  What is converted:

* ``torchrec.quant.embedding_modules.EmbeddingBagCollection`` (the inference collection that
  ``QuantEmbeddingBagCollection.from_float`` / ``torchrec.inference.modules.quantize_embeddings``
  make, on FBGEMM's table-batched int-N kernel): its packed rows are read into perfkernels'
  row-wise layout byte for byte (FBGEMM keeps a row's fp16 scale and bias *before* its codes and
  pads rows to an alignment; ours keep them after the codes, 8-bit rows with float32 scale and
  bias), never through float, and the converted collection answers every feature in one call of
  :func:`perfkernels.embedding_bags_multi`: TorchRec's outputs bit for bit.
* ``torchrec.quant.embedding_modules.EmbeddingCollection`` (unpooled): the same rows, each value
  looked up in the same one call.

The converted module keeps TorchRec's class (a subclass of it, ``isinstance`` holds), its
attributes, its output keys and its ``state_dict`` (FBGEMM's rows stay where ``state_dict`` reads
them); only ``forward`` changes.
"""
from __future__ import annotations

import copy
import re
from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

import perfkernels as pk

from ._bridge import as_numpy, feature_index_error, index_error, index_error_at

#: FBGEMM's row-wise qparams: a float16 scale and a float16 bias, 4 bytes before the codes
_QPARAM_BYTES = 4


def is_torchrec_module(module: torch.nn.Module) -> bool:
    """Whether ``module`` is one of TorchRec's classes (checked without importing TorchRec)."""
    return type(module).__module__.startswith("torchrec.")


def _sparse_kind(spec_type: Any) -> str:
    """FBGEMM's SparseType of a table as a lower-case name: int8, int4, int2, fp16, fp32 ..."""
    return str(getattr(spec_type, "value", spec_type)).lower()


_BITS = {"int8": 8, "int4": 4, "int2": 2}


def _our_rows(tbe: torch.nn.Module, index: int, dim: int, kind: str
              ) -> tuple[Tensor, Optional[int]]:
    """Table ``index`` of FBGEMM's table-batched module ``tbe`` in our layout: (rows, bits), rows
    a uint8 ``[R, row bytes]`` tensor (codes, then scale and bias) for int-N tables, else a float
    ``[R, D]`` tensor (bits None).  A copy of the bytes, never dequantized."""
    data, scale_shift = tbe.split_embedding_weights()[index]
    if kind in ("fp16", "fp32"):
        dtype = torch.float16 if kind == "fp16" else torch.float32
        rows = data.view(torch.uint8) if data.dtype != torch.uint8 else data
        width = dim * (2 if kind == "fp16" else 4)
        return rows[:, :width].contiguous().view(dtype), None
    bits = _BITS[kind]
    codes = data[:, :(dim * bits + 7) // 8]
    if scale_shift is None:       # the qparams still in front of the codes
        scale_shift, codes = data[:, :_QPARAM_BYTES], data[:, _QPARAM_BYTES:][:, :codes.shape[1]]
    if bits == 8:                 # ours: float32 scale and bias (exact widenings of FBGEMM's)
        qparams = scale_shift.contiguous().view(torch.float16).float().view(torch.uint8)
    else:                         # ours: float16 scale and bias, as FBGEMM's
        qparams = scale_shift
    return torch.cat([codes, qparams], dim=1).contiguous(), bits


def _tables_of(module: torch.nn.Module, configs: list) -> tuple[list, list, list]:
    """Our rows, bits and D of each table of TorchRec's quantized ``module``, in the order of
    its feature names (one entry per feature: a table read by two features is listed twice,
    the same tensor)."""
    tables, bits, dims = [], [], []
    for (_key, group), tbe in zip(module._key_to_tables.items(), module._emb_modules):
        specs = tbe.embedding_specs
        for i, cfg in enumerate(group):
            kind = _sparse_kind(specs[i][3])
            if kind not in ("int8", "int4", "int2", "fp16", "fp32"):
                raise ValueError(f"table {cfg.name!r} is stored as {kind}, which perfkernels "
                                 "does not read")
            rows, b = _our_rows(tbe, i, cfg.embedding_dim, kind)
            for _ in cfg.feature_names:
                tables.append(rows)
                bits.append(b)
                dims.append(cfg.embedding_dim)
    return tables, bits, dims


def _reason_quant(module: torch.nn.Module) -> Optional[str]:
    """Why TorchRec's quantized collection ``module`` cannot be converted (None: it can)."""
    if getattr(module, "_device", torch.device("cpu")).type != "cpu":
        return f"its tables are on {module._device}; perfkernels runs on the CPU"
    for tbe in module._emb_modules:
        if type(tbe).__name__ != "IntNBitTableBatchedEmbeddingBagsCodegen":
            return (f"a table group runs on {type(tbe).__name__}, whose rows perfkernels does not "
                    "read")
        if getattr(tbe, "index_remappings", None) is not None and any(
                r is not None for r in getattr(tbe, "index_remappings", []) or []):
            return "its tables are pruned (an index remapping), which perfkernels does not do"
    return None


class _Lookup:
    """The tables of a converted collection, in feature order, and the one call over them."""

    def __init__(self, tables: list, bits: list, dims: list, modes: list) -> None:
        self.tables = tables
        self.arrays = [as_numpy(t) for t in tables]
        self.all_bits = list(bits)
        self.bits = bits if any(b is not None for b in bits) else None
        self.dims = dims
        self.modes = modes

    def __call__(self, values: Tensor, offsets: Tensor, weights: Optional[Tensor],
                 names: Optional[list] = None) -> Tensor:
        """The pooled rows; ``names``: the features in slot order, named in the errors."""
        try:
            out = pk.embedding_bags_multi(
                self.arrays, as_numpy(values), offsets=as_numpy(offsets),
                per_sample_weights=None if weights is None else as_numpy(weights.float()),
                modes=self.modes, bits=self.bits, dims=self.dims)
        except IndexError as exc:
            from ._collection import _MULTI_INDEX_MESSAGE
            m = _MULTI_INDEX_MESSAGE.search(str(exc))
            if m is not None:
                entry, value, feature, rows = (int(m.group(i)) for i in (3, 2, 4, 6))
                err = index_error_at(entry, value, rows)
                if names is not None and feature < len(names):
                    err = feature_index_error(err, names[feature])
                raise err from None
            raise index_error(exc) from None
        except ValueError as exc:
            m = _OFFSET_POSITION.search(str(exc))
            slots = len(self.arrays)
            if m is None or names is None or not slots:
                raise
            batch = (offsets.shape[0] - 1) // slots
            i = max(int(m.group(1)) - 1, 0)
            f = min(i // max(batch, 1), len(names) - 1)
            raise ValueError(f"the KeyedJaggedTensor's lengths / offsets at feature "
                             f"{names[f]!r}, sample {i - f * batch}: {exc}") from None
        return torch.from_numpy(out)


#: the first offset an offsets error names
_OFFSET_POSITION = re.compile(r"offsets\[(\d+)\]")


def _feature_inputs(features: Any, names: list) -> tuple[Tensor, Tensor, Optional[Tensor], int]:
    """The KJT's values, offsets and weights with its features in the order ``names`` (a KJT
    whose keys are exactly ``names`` as it is; else TorchRec's own permute, which also repeats a
    feature read by two tables), and its batch size."""
    keys = features.keys()
    if keys != names:
        missing = [k for k in names if k not in keys]
        if missing:
            raise KeyError(f"feature {missing[0]!r} is not in the input; its keys are {keys}")
        features = features.permute([keys.index(k) for k in names])
    values, offsets = features.values(), features.offsets()
    batch = (offsets.shape[0] - 1) // max(len(names), 1)
    return values, offsets, features.weights_or_none(), batch


def _modes(module: torch.nn.Module) -> list:
    modes = []
    for (key, group) in module._key_to_tables.items():
        pooling = key[0] if isinstance(key, tuple) else key
        mode = str(getattr(pooling, "name", pooling)).lower()
        for cfg in group:
            modes.extend([mode] * len(cfg.feature_names))
    return modes


# --------------------------------------------------------------------------- converted classes

def _torchrec_graph_forward(module: torch.nn.Module, features: Any) -> Any:
    from ._torchrec_graph import graph_forward
    return graph_forward(module, features)


def _tracing() -> bool:
    """Whether a graph tool is tracing (torch.fx / torchrec.fx, torch.export, torch.compile,
    torch.jit.trace): a quantized collection records one registered op (jit.trace: TorchRec's
    forward), the others TorchRec's own forward, whose ops it knows."""
    return (torch.fx._symbolic_trace.is_fx_tracing() or torch.compiler.is_compiling()
            or torch.jit.is_tracing())


def _torchrec_class(module: torch.nn.Module) -> type:
    """TorchRec's class that a converted collection's class was made from."""
    for cls in type(module).__mro__[1:]:
        if cls not in (_QuantEBCForward, _QuantECForward, _FloatEBCForward) and \
                cls.__module__.startswith("torchrec."):
            return cls
    raise TypeError(f"{type(module).__name__} is not a converted TorchRec collection")


class _Scriptable:
    """``torch.jit.script`` of a converted collection scripts TorchRec's own class sharing its
    tables (TorchScript compiles TorchRec's forward, not ours, which calls Python): a quantized
    collection then runs TorchRec's table-batched kernel, the same bits as ours; a float one
    TorchRec's loop over its tables, which convert() made ours."""

    def __prepare_scriptable__(self) -> torch.nn.Module:
        return _shallow(self, _torchrec_class(self))


def _base_forward(self: Any, features: Any) -> Any:
    """TorchRec's forward of the class this converted collection was made from."""
    return _torchrec_class(self).forward(self, features)


class _QuantEBCForward(_Scriptable):
    """forward() of a converted ``torchrec.quant`` EmbeddingBagCollection (mixed in before
    TorchRec's class)."""

    def _torchrec_forward(self, features: Any) -> Any:
        return _base_forward(self, features)

    def forward(self, features: Any) -> Any:
        from torchrec.sparse.jagged_tensor import KeyedTensor
        lookup: _Lookup = self._pk_lookup
        if not lookup.arrays:
            return _QuantEBCForward._torchrec_forward(self, features)
        if _tracing():
            if torch.jit.is_tracing():
                # jit.trace would record our rows as constants, which TorchScript's executor
                # hands the op as one constant list that no longer holds valid tensors from
                # the second call on: TorchRec's forward (FBGEMM's ops, the same bits)
                return _QuantEBCForward._torchrec_forward(self, features)
            return _torchrec_graph_forward(self, features)
        values, offsets, weights, _ = _feature_inputs(features, self._feature_names)
        out = lookup(values, offsets, weights if self._is_weighted else None,
                     self._feature_names)
        if self._output_dtype != torch.float32:
            out = out.to(self._output_dtype)
        return KeyedTensor(keys=self._embedding_names, values=out,
                           length_per_key=self._length_per_key)


class _QuantECForward(_Scriptable):
    """forward() of a converted ``torchrec.quant`` EmbeddingCollection: every value its own bag
    of one row in the one multi-table call, split per feature into TorchRec's JaggedTensors."""

    def _torchrec_forward(self, features: Any) -> Any:
        return _base_forward(self, features)

    def forward(self, features: Any) -> Any:
        from torchrec.sparse.jagged_tensor import JaggedTensor
        lookup: _Lookup = self._pk_lookup
        if _tracing():
            return _QuantECForward._torchrec_forward(self, features)
        names = self._pk_names
        values, offsets, _, batch = _feature_inputs(features, names)
        lengths = offsets[1:] - offsets[:-1]
        bounds = offsets[::max(batch, 1)].tolist() if batch else [0] * (len(names) + 1)
        # feature f's values are bags 0 .. n_f - 1 of its slot (one row each), then empty bags
        # up to the longest feature's count: one call for every feature
        starts = torch.tensor(bounds[:-1], dtype=torch.int64)
        counts = torch.tensor(bounds[1:], dtype=torch.int64) - starts
        longest = int(counts.max()) if len(names) else 0
        step = torch.arange(longest, dtype=torch.int64)
        bags = (starts[:, None] + torch.minimum(step[None, :], counts[:, None])).reshape(-1)
        rows = lookup(values, torch.cat([bags, torch.tensor([bounds[-1]])]), None)
        out = {}
        col = 0
        for f, (name, dim) in enumerate(zip(self._pk_outputs, lookup.dims)):
            start, end = bounds[f], bounds[f + 1]
            emb = rows[:end - start, col:col + dim]
            col += dim
            if self._output_dtype != torch.float32:
                emb = emb.to(self._output_dtype)
            out[name] = JaggedTensor(
                values=emb, lengths=lengths[f * batch:(f + 1) * batch],
                weights=values[start:end] if self.need_indices() else None)
        return out


class _FloatEBCForward(_Scriptable):
    """forward() of TorchRec's float EmbeddingBagCollection after convert() swapped its tables
    for ours: without a gradient to record, every feature in one multi-table call over those
    tables (float or, after ``bits=``, packed rows); else TorchRec's loop over them."""

    def _torchrec_forward(self, features: Any) -> Any:
        return _base_forward(self, features)

    def forward(self, features: Any) -> Any:
        if _tracing() or (torch.is_grad_enabled() and any(
                p.requires_grad for p in self.parameters())):
            return self._torchrec_forward(features)
        lookup = self._pk_float_lookup()
        if lookup is None:
            return self._torchrec_forward(features)
        from torchrec.sparse.jagged_tensor import KeyedTensor
        names = [f for cfg in self._embedding_bag_configs for f in cfg.feature_names]
        values, offsets, weights, _ = _feature_inputs(features, names)
        out = lookup(values, offsets, weights if self._is_weighted else None, names)
        return KeyedTensor(keys=self._embedding_names, values=out,
                           length_per_key=self._lengths_per_embedding)

    def _pk_float_lookup(self) -> Optional[_Lookup]:
        """The one call over the tables as they are now (None where one is not ours, or not
        one the multi-table kernel runs: TorchRec's loop answers)."""
        from ._embedding_bag import EmbeddingBag
        from ._quantized import QuantizedEmbeddingBag
        tables, bits, dims, modes = [], [], [], []
        for cfg in self._embedding_bag_configs:
            m = self.embedding_bags[cfg.name]
            if isinstance(m, QuantizedEmbeddingBag):
                t, b = m.packed_weight, m.bits
                mode = m.mode if m.average_mean else "sum"
                ok = m.output_dtype in (None, torch.float32) and m.padding_idx is None
            elif isinstance(m, EmbeddingBag):
                t, b, mode = m.weight, None, m.mode
                ok = (m.max_norm is None and m.padding_idx is None and t.dtype == torch.float32
                      and m.output_dtype in (None, torch.float32))
            else:
                return None
            if not ok or t.device.type != "cpu" or mode not in ("sum", "mean"):
                return None
            for _ in cfg.feature_names:
                tables.append(t.detach())
                bits.append(b)
                dims.append(cfg.embedding_dim)
                modes.append(mode)
        key = tuple((id(t), t.data_ptr()) for t in tables)
        cached = self.__dict__.get("_pk_cache")
        if cached is None or cached[0] != key:
            cached = (key, _Lookup(tables, bits, dims, modes))
            self.__dict__["_pk_cache"] = cached
        return cached[1]


def convert_float_collections(model: torch.nn.Module, report: Any) -> torch.nn.Module:
    """After convert() swapped the tables: TorchRec's float EmbeddingBagCollections in
    ``model`` run every feature in one call (their class becomes a subclass of TorchRec's; a
    bare collection is ``model`` itself)."""
    qual = "torchrec.modules.embedding_modules.EmbeddingBagCollection"

    def swapped(name: str, m: torch.nn.Module) -> Optional[torch.nn.Module]:
        if f"{type(m).__module__}.{type(m).__name__}" != qual:
            return None
        report.swapped.append((name, "torchrec EmbeddingBagCollection",
                               "perfkernels EmbeddingBagCollection",
                               "its tables in one call without a gradient"))
        return _shallow(m, _converted_class(type(m), _FloatEBCForward))

    top = swapped("", model)
    if top is not None:
        return top
    for name, parent in list(model.named_modules()):
        for child_name, child in list(parent._modules.items()):
            new = None if child is None else swapped(
                f"{name}.{child_name}" if name else child_name, child)
            if new is not None:
                setattr(parent, child_name, new)
    return model


_CLASSES: dict = {}


def _converted_class(base: type, mixin: type) -> type:
    """A subclass of TorchRec's ``base`` whose forward is ``mixin``'s, made once per class and
    named in this module (so that pickle finds it)."""
    # the graph form's fx leaf must be registered before any trace begins (torch.fx patches
    # the functions registered when its trace starts)
    from . import _torchrec_graph  # noqa: F401
    key = (base, mixin)
    if key not in _CLASSES:
        name = f"Converted{'Float' if mixin is _FloatEBCForward else ''}{base.__name__}"
        cls = type(name, (mixin, base), {"__module__": __name__, "__qualname__": name})
        _CLASSES[key] = cls
        globals()[name] = cls
    return _CLASSES[key]


def __getattr__(name: str) -> type:
    """The converted classes, made on first use (unpickling a converted model)."""
    if name == "ConvertedEmbeddingBagCollection":
        from torchrec.quant.embedding_modules import EmbeddingBagCollection
        return _converted_class(EmbeddingBagCollection, _QuantEBCForward)
    if name == "ConvertedFloatEmbeddingBagCollection":
        from torchrec.modules.embedding_modules import EmbeddingBagCollection
        return _converted_class(EmbeddingBagCollection, _FloatEBCForward)
    if name == "ConvertedEmbeddingCollection":
        from torchrec.quant.embedding_modules import EmbeddingCollection
        return _converted_class(EmbeddingCollection, _QuantECForward)
    raise AttributeError(name)


def _shallow(module: torch.nn.Module, cls: type) -> torch.nn.Module:
    """A new object of ``cls`` sharing ``module``'s attributes, buffers and submodules (their
    dicts copied, so that the original keeps its own)."""
    new = cls.__new__(cls)
    new.__dict__ = dict(module.__dict__)
    for key in ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"):
        if key in new.__dict__:
            new.__dict__[key] = copy.copy(new.__dict__[key])
    return new


def swap(name: str, module: torch.nn.Module, bits: Optional[int], report: Any
         ) -> Optional[torch.nn.Module]:
    """Our replacement for TorchRec's collection ``module`` (None, with the reason in
    ``report.skipped`` where it is one we cannot take; None without a word for TorchRec's other
    modules, whose children convert() goes on to visit)."""
    kind = type(module).__name__
    qual = f"{type(module).__module__}.{kind}"
    quant = {"torchrec.quant.embedding_modules.EmbeddingBagCollection": _QuantEBCForward,
             "torchrec.quant.embedding_modules.EmbeddingCollection": _QuantECForward}
    if qual in quant:
        if isinstance(module, (_QuantEBCForward, _QuantECForward)):
            return None
        reason = _reason_quant(module)
        if reason is None and getattr(module, "_is_weighted", False):
            reason = ("its features are weighted, and perfkernels' weighted pooling of int-N rows "
                      "can differ from FBGEMM's in the last bit: left to TorchRec")
        if reason is None and bits is not None:
            reason = (f"bits={bits} does not apply to TorchRec's quantized collection (its rows "
                      "are read as they are); convert it without bits=")
        if reason is None:
            configs = (module._embedding_bag_configs if quant[qual] is _QuantEBCForward
                       else module._embedding_configs)
            try:
                tables, tbits, dims = _tables_of(module, configs)
            except ValueError as exc:
                reason = str(exc)
        if reason is not None:
            report.skipped.append((name, f"torchrec.quant {kind}", reason))
            return None
        new = _shallow(module, _converted_class(type(module), quant[qual]))
        if quant[qual] is _QuantEBCForward:
            modes = _modes(module)
        else:
            modes = ["sum"] * len(tables)
            new._pk_names = [f for _k, g in module._key_to_tables.items()
                             for cfg in g for f in cfg.feature_names]
            new._pk_outputs = [n for _k, g in module._key_to_tables.items()
                               for n in module._embedding_names_by_batched_tables[_k]]
        new._pk_lookup = _Lookup(tables, tbits, dims, modes)
        kinds = sorted({f"{b}-bit" if b else str(t.dtype).replace("torch.", "")
                        for t, b in zip(tables, tbits)})
        report.swapped.append((name, f"torchrec.quant {kind}", f"perfkernels {kind}",
                               f"{len(set(map(id, tables)))} tables ({', '.join(kinds)}) in one "
                               "call"))
        return new
    return None
