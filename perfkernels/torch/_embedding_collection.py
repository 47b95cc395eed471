"""perfkernels.torch.EmbeddingCollection: many unpooled tables, TorchRec's jagged input and output.

TorchRec is never required: :class:`JaggedTensor` here carries TorchRec's layout (and the methods a
model uses); when TorchRec is installed its ``JaggedTensor`` is returned instead, and a real
``torchrec.KeyedJaggedTensor`` is accepted as input.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from ._collection import _init_table, _Jagged, _kjt_parts, _table_dtype
from ._embedding import Embedding


@dataclass
class EmbeddingConfig:
    """One table of an :class:`EmbeddingCollection` (the fields of ``torchrec.EmbeddingConfig``
    that matter here; a torchrec config object is accepted wherever this one is)."""
    num_embeddings: int
    embedding_dim: int
    name: str = ""
    feature_names: list = field(default_factory=list)
    weight_init_max: Optional[float] = None
    weight_init_min: Optional[float] = None
    data_type: Any = None                  # a torch dtype (or torchrec DataType FP32/FP16)


class JaggedTensor(_Jagged):
    """One feature's unpooled rows in TorchRec's layout: ``values()`` ``[n, D]`` (every sample's
    rows back to back), ``lengths()`` ``[B]`` rows per sample, ``offsets()`` ``[B + 1]``."""

    def __init__(self, values: Tensor, lengths: Optional[Tensor] = None,
                 offsets: Optional[Tensor] = None, weights: Optional[Tensor] = None) -> None:
        if lengths is None and offsets is None:
            raise ValueError("give lengths or offsets")
        self._values, self._lengths = values, lengths
        self._offsets, self._weights = offsets, weights

    def to_dense(self) -> list:
        """One ``[length_b, D]`` tensor per sample."""
        return list(torch.split(self._values, self.lengths().tolist()))


def _jagged_class():
    try:
        from torchrec.sparse.jagged_tensor import JaggedTensor as TorchRecJagged
    except ImportError:
        return JaggedTensor
    return TorchRecJagged


class EmbeddingCollection(torch.nn.Module):
    """TorchRec-style collection of unpooled embedding tables (``torchrec.EmbeddingCollection``)
    on perfkernels' kernels.

    ``EmbeddingCollection(tables, device=None, need_indices=False)`` with one
    :class:`EmbeddingConfig` (or ``torchrec.EmbeddingConfig``) per table.  ``forward`` takes a
    :class:`~perfkernels.torch.KeyedJaggedTensor` (or TorchRec's) and returns a dict mapping each
    feature to a :class:`JaggedTensor` (TorchRec's when installed): the feature's rows, one per
    ID, with the KJT's lengths (and with ``need_indices=True`` the IDs as its weights, as TorchRec
    does).  The features of one table are looked up in one call.  Parameters are
    ``embeddings.<table name>.weight`` (each table an :class:`~perfkernels.torch.Embedding`), as
    in TorchRec's unsharded collection, so its ``state_dict`` loads unchanged; gradients are the
    tables' (dense, or set ``module.embeddings[name].sparse = True``), or with
    ``fused_optimizer=`` every table is updated during backward.
    """

    def __init__(self, tables: Sequence[Any], device=None, need_indices: bool = False,
                 fused_optimizer: Optional[Any] = None, placement: str = "auto") -> None:
        super().__init__()
        self._configs = list(tables)
        self._need_indices = need_indices
        self.embeddings = torch.nn.ModuleDict()
        self._feature_table: dict[str, str] = {}
        for cfg in self._configs:
            if cfg.name in self.embeddings:
                raise ValueError(f"two tables are named {cfg.name!r}")
            emb = Embedding(cfg.num_embeddings, cfg.embedding_dim, device=device,
                            dtype=_table_dtype(cfg.data_type), placement=placement)
            _init_table(emb, cfg, fused_optimizer)
            self.embeddings[cfg.name] = emb
            for feature in (cfg.feature_names or [cfg.name]):
                if feature in self._feature_table:
                    raise ValueError(f"feature {feature!r} is in two tables")
                self._feature_table[feature] = cfg.name

    def embedding_configs(self) -> list:
        return self._configs

    def need_indices(self) -> bool:
        return self._need_indices

    def forward(self, features: Any) -> dict:
        """``{feature: JaggedTensor}`` for every feature of the input."""
        keys, values, offsets, batch = _kjt_parts(features)
        lengths = features.lengths()
        num_keys = len(keys)
        bounds = offsets[::batch].tolist() if batch > 0 else [0] * (num_keys + 1)
        by_table: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            if key not in self._feature_table:
                raise KeyError(f"feature {key!r} is in no table of this collection")
            by_table.setdefault(self._feature_table[key], []).append(i)
        jagged = _jagged_class()
        out: dict[str, Any] = {}
        for table, idx in by_table.items():
            # the table's features in one lookup: their value ranges, back to back
            pieces = [values[bounds[i]:bounds[i + 1]] for i in idx]
            ids = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
            rows = self.embeddings[table](ids)
            sizes = [bounds[i + 1] - bounds[i] for i in idx]
            for i, part, ids_part in zip(idx, torch.split(rows, sizes), torch.split(ids, sizes)):
                lens = lengths[i * batch:(i + 1) * batch]
                out[keys[i]] = jagged(values=part, lengths=lens,
                                      weights=ids_part if self._need_indices else None)
        return {k: out[k] for k in keys}
