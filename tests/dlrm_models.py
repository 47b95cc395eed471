"""The two DLRM shapes of the whole-model tests, written here from the public models'
architectures and the torch operations their forwards run (what ``optimize()`` must recognise).

``ReferenceDLRM`` (``examples/dlrm_reference.py``): facebookresearch/dlrm ``dlrm_s_pytorch.py``'s
model, its operation sequence listed in that module's docstring; :func:`dlrm_net` builds it,
:func:`dlrm_inputs` makes its inputs.

``TorchRecDLRM``: the architecture of TorchRec's ``torchrec.models.dlrm.DLRM`` over perfkernels'
own ``EmbeddingBagCollection``, ``KeyedJaggedTensor`` and ``KeyedTensor`` (TorchRec is not
needed).  Its forward runs, in order: the dense MLP (Linear + ReLU per layer) on the dense
features; the collection on the sparse features, its ``KeyedTensor.to_dict()`` read in feature
order, ``torch.cat(..., dim=1).reshape(-1, F, D)``; the interaction
``C = torch.cat((x.unsqueeze(1), S), dim=1)``, ``torch.bmm(C, torch.transpose(C, 1, 2))``,
indexed by the two rows of a non-persistent ``torch.triu_indices(F + 1, F + 1, offset=1)``
buffer (the pairs above the diagonal), ``torch.cat((x, pairs), dim=1)``; the over MLP (Linear +
ReLU per layer but the last, a plain Linear last).  Its top input width is
``D + F * (F + 1) / 2``.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
import torch.nn as nn


def _reference():
    """examples/dlrm_reference.py, loaded by path under the name examples/dlrm_latency.py gives
    it (so the two share one module)."""
    name = "perfkernels_dlrm_reference"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "examples" / "dlrm_reference.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


ReferenceDLRM = _reference().ReferenceDLRM


def dlrm_net(rows, dim, bottom, top, interaction="dot", itself=False, seed=0) -> ReferenceDLRM:
    """A reference-shaped DLRM: tables of ``rows`` x ``dim``, ``bottom`` MLP sizes (ending with
    ``dim``), ``top`` MLP sizes after the interaction (a Sigmoid last)."""
    return ReferenceDLRM(rows, dim, bottom, top, interaction=interaction, self_interaction=itself,
                         seed=seed)


def dlrm_inputs(rows, batch, dense_dim, bag=1, seed=0, index_dtype=torch.int64):
    """(dense, offsets, indices) as DLRM's random data generator makes them: per table, B offsets
    and the indices of B bags of ``bag`` entries each (1: one-hot)."""
    g = torch.Generator().manual_seed(seed)
    dense = torch.rand(batch, dense_dim, generator=g)
    offsets = [torch.arange(batch, dtype=index_dtype) * bag for _ in rows]
    indices = [torch.randint(0, r, (batch * bag,), generator=g, dtype=index_dtype) for r in rows]
    return dense, offsets, indices


# --------------------------------------------------------------------- TorchRec's architecture


def _relu_layers(width: int, sizes) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for size in sizes:
        layers += [nn.Linear(width, size), nn.ReLU()]
        width = size
    return layers


class _PooledFeatures(nn.Module):
    """The collection's pooled vector of every feature, as ``[B, F, D]``."""

    def __init__(self, collection, features: list[str], dim: int) -> None:
        super().__init__()
        self.embedding_bag_collection = collection
        self.features, self.dim = features, dim

    def forward(self, kjt):
        by_feature = self.embedding_bag_collection(kjt).to_dict()
        flat = torch.cat([by_feature[f] for f in self.features], dim=1)
        return flat.reshape(-1, len(self.features), self.dim)


class _PairsAboveDiagonal(nn.Module):
    """The dense vector, then the dot products of the pairs (i, j), i < j, of the dense vector
    and the F pooled ones (the dense vector first)."""

    def __init__(self, num_features: int) -> None:
        super().__init__()
        self.num_features = num_features
        self.register_buffer("triu_indices", torch.triu_indices(num_features + 1,
                                                                num_features + 1, offset=1),
                             persistent=False)

    def forward(self, x, pooled):
        if self.num_features == 0:
            return x
        vectors = torch.cat((x.unsqueeze(1), pooled), dim=1)
        gram = torch.bmm(vectors, torch.transpose(vectors, 1, 2))
        pairs = gram[:, self.triu_indices[0], self.triu_indices[1]]
        return torch.cat((x, pairs), dim=1)


class TorchRecDLRM(nn.Module):
    """TorchRec's DLRM architecture (see the module docstring) over ``embedding_bag_collection``
    (all tables of one dimension D, the last of ``dense_arch_layer_sizes``)."""

    def __init__(self, embedding_bag_collection, dense_in_features: int,
                 dense_arch_layer_sizes, over_arch_layer_sizes) -> None:
        super().__init__()
        configs = embedding_bag_collection.embedding_bag_configs()
        dims = {c.embedding_dim for c in configs}
        if len(dims) != 1 or dense_arch_layer_sizes[-1] not in dims:
            raise ValueError("the tables' dimensions and the dense MLP's last size must be one "
                             f"value; got {sorted(dims)} and {dense_arch_layer_sizes[-1]}")
        if len(over_arch_layer_sizes) < 2:
            raise ValueError("over_arch_layer_sizes needs two sizes or more; got "
                             f"{list(over_arch_layer_sizes)}")
        features = [f for c in configs for f in (c.feature_names or [c.name])]
        dim, n = dense_arch_layer_sizes[-1], len(features)
        self.sparse_arch = _PooledFeatures(embedding_bag_collection, features, dim)
        self.dense_arch = nn.Sequential(*_relu_layers(dense_in_features, dense_arch_layer_sizes))
        self.inter_arch = _PairsAboveDiagonal(n)
        *hidden, out = over_arch_layer_sizes
        self.over_arch = nn.Sequential(*_relu_layers(dim + n * (n + 1) // 2, hidden),
                                       nn.Linear(hidden[-1], out))

    def forward(self, dense_features, sparse_features):
        x = self.dense_arch(dense_features)
        return self.over_arch(self.inter_arch(x, self.sparse_arch(sparse_features)))
