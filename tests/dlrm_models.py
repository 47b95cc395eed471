"""The two public DLRM implementations of the whole-model tests.

``DLRM_Net``: facebookresearch/dlrm ``dlrm_s_pytorch.py``'s model, the faithful copy in
``examples/dlrm_reference.py`` (the single-device path: ``create_mlp``, ``create_emb``,
``apply_mlp``, ``apply_emb``, ``interact_features`` with "dot", with and without
``arch_interaction_itself``, and "cat", ``sequential_forward``), without the QR / MD embeddings,
the distributed and multi-GPU paths and the argument parsing; :func:`dlrm_net` builds it.

``TorchRecDLRM``: TorchRec's ``torchrec.models.dlrm`` (``SparseArch``, ``DenseArch``,
``InteractionArch``, ``OverArch``) over perfkernels' own ``EmbeddingBagCollection``,
``KeyedJaggedTensor`` and ``KeyedTensor`` stand-ins (TorchRec is not needed).
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
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


DLRM_Net = _reference().DLRM_Net


def dlrm_net(rows, dim, bottom, top, interaction="dot", itself=False, seed=0) -> DLRM_Net:
    """A DLRM_Net as dlrm_s_pytorch.py builds it from its command line (``ln_top`` gets the
    interaction's width in front, as the script computes it)."""
    np.random.seed(seed)
    F = len(rows)
    if interaction == "dot":
        num_fea = F + 1
        num_int = (num_fea * (num_fea + 1)) // 2 + dim if itself else \
            (num_fea * (num_fea - 1)) // 2 + dim
    else:
        num_int = F * dim + bottom[-1]
    return DLRM_Net(dim, np.array(rows), np.array(bottom), np.array([num_int] + list(top)),
                    arch_interaction_op=interaction, arch_interaction_itself=itself,
                    sigmoid_top=len(top) - 1)   # the script: ln_top.size - 2


def dlrm_inputs(rows, batch, dense_dim, bag=1, seed=0, index_dtype=torch.int64):
    """(dense_x, lS_o, lS_i) as DLRM's random data generator makes them: per table, B offsets
    and the indices of B bags of ``bag`` entries each (1: one-hot)."""
    g = torch.Generator().manual_seed(seed)
    dense = torch.rand(batch, dense_dim, generator=g)
    lS_o = [torch.arange(batch, dtype=index_dtype) * bag for _ in rows]
    lS_i = [torch.randint(0, r, (batch * bag,), generator=g, dtype=index_dtype) for r in rows]
    return dense, lS_o, lS_i


# --------------------------------------------------------------------------- TorchRec's DLRM


def _mlp(sizes):
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers)


class SparseArch(nn.Module):
    def __init__(self, embedding_bag_collection):
        super().__init__()
        self.embedding_bag_collection = embedding_bag_collection
        self.sparse_feature_names = [
            name for conf in embedding_bag_collection.embedding_bag_configs()
            for name in (conf.feature_names or [conf.name])]
        self.F = len(self.sparse_feature_names)

    def forward(self, features):
        sparse_features = self.embedding_bag_collection(features)
        B = features.stride()
        sparse = sparse_features.to_dict()
        sparse_values = []
        for name in self.sparse_feature_names:
            sparse_values.append(sparse[name])
        return torch.cat(sparse_values, dim=1).reshape(B, self.F, -1)


class DenseArch(nn.Module):
    def __init__(self, in_features, layer_sizes):
        super().__init__()
        self.model = _mlp([in_features] + list(layer_sizes))

    def forward(self, features):
        return self.model(features)


class InteractionArch(nn.Module):
    def __init__(self, num_sparse_features):
        super().__init__()
        self.F = num_sparse_features
        self.register_buffer("triu_indices",
                             torch.triu_indices(self.F + 1, self.F + 1, offset=1),
                             persistent=False)

    def forward(self, dense_features, sparse_features):
        if self.F <= 0:
            return dense_features
        (B, D) = dense_features.shape
        combined_values = torch.cat((dense_features.unsqueeze(1), sparse_features), dim=1)
        interactions = torch.bmm(combined_values, torch.transpose(combined_values, 1, 2))
        interactions_flat = interactions[:, self.triu_indices[0], self.triu_indices[1]]
        return torch.cat((dense_features, interactions_flat), dim=1)


class OverArch(nn.Module):
    def __init__(self, in_features, layer_sizes):
        super().__init__()
        self.model = nn.Sequential(_mlp([in_features] + list(layer_sizes[:-1])),
                                   nn.Linear(layer_sizes[-2], layer_sizes[-1], bias=True))

    def forward(self, features):
        return self.model(features)


class TorchRecDLRM(nn.Module):
    def __init__(self, embedding_bag_collection, dense_in_features, dense_arch_layer_sizes,
                 over_arch_layer_sizes):
        super().__init__()
        self.sparse_arch = SparseArch(embedding_bag_collection)
        num_sparse_features = len(self.sparse_arch.sparse_feature_names)
        self.dense_arch = DenseArch(dense_in_features, dense_arch_layer_sizes)
        self.inter_arch = InteractionArch(num_sparse_features)
        over_in = dense_arch_layer_sizes[-1] + (num_sparse_features + 1) * num_sparse_features // 2
        self.over_arch = OverArch(over_in, over_arch_layer_sizes)

    def forward(self, dense_features, sparse_features):
        embedded_dense = self.dense_arch(dense_features)
        embedded_sparse = self.sparse_arch(sparse_features)
        concatenated_dense = self.inter_arch(dense_features=embedded_dense,
                                             sparse_features=embedded_sparse)
        return self.over_arch(concatenated_dense)
