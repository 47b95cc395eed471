"""Small, faithful copies of two public DLRM implementations, for the whole-model tests.

``DLRM_Net``: facebookresearch/dlrm ``dlrm_s_pytorch.py`` (the single-device path:
``create_mlp``, ``create_emb``, ``apply_mlp``, ``apply_emb``, ``interact_features`` with "dot",
with and without ``arch_interaction_itself``, and "cat", ``sequential_forward``), without the
QR / MD embeddings, the distributed and multi-GPU paths and the argument parsing.

``TorchRecDLRM``: TorchRec's ``torchrec.models.dlrm`` (``SparseArch``, ``DenseArch``,
``InteractionArch``, ``OverArch``) over perfkernels' own ``EmbeddingBagCollection``,
``KeyedJaggedTensor`` and ``KeyedTensor`` stand-ins (TorchRec is not needed).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn


class DLRM_Net(nn.Module):
    def create_mlp(self, ln, sigmoid_layer):
        layers = nn.ModuleList()
        for i in range(0, ln.size - 1):
            n = ln[i]
            m = ln[i + 1]
            LL = nn.Linear(int(n), int(m), bias=True)
            mean = 0.0
            std_dev = np.sqrt(2 / (m + n))
            W = np.random.normal(mean, std_dev, size=(m, n)).astype(np.float32)
            std_dev = np.sqrt(1 / m)
            bt = np.random.normal(mean, std_dev, size=m).astype(np.float32)
            LL.weight.data = torch.tensor(W, requires_grad=True)
            LL.bias.data = torch.tensor(bt, requires_grad=True)
            layers.append(LL)
            if i == sigmoid_layer:
                layers.append(nn.Sigmoid())
            else:
                layers.append(nn.ReLU())
        return torch.nn.Sequential(*layers)

    def create_emb(self, m, ln, weighted_pooling=None):
        emb_l = nn.ModuleList()
        for i in range(0, ln.size):
            n = ln[i]
            EE = nn.EmbeddingBag(n, m, mode="sum", sparse=True)
            W = np.random.uniform(low=-np.sqrt(1 / n), high=np.sqrt(1 / n),
                                  size=(n, m)).astype(np.float32)
            EE.weight.data = torch.tensor(W, requires_grad=True)
            emb_l.append(EE)
        return emb_l

    def __init__(self, m_spa=None, ln_emb=None, ln_bot=None, ln_top=None,
                 arch_interaction_op=None, arch_interaction_itself=False, sigmoid_bot=-1,
                 sigmoid_top=-1, loss_threshold=0.0):
        super(DLRM_Net, self).__init__()
        self.arch_interaction_op = arch_interaction_op
        self.arch_interaction_itself = arch_interaction_itself
        self.loss_threshold = loss_threshold
        self.emb_l = self.create_emb(m_spa, ln_emb)
        self.bot_l = self.create_mlp(ln_bot, sigmoid_bot)
        self.top_l = self.create_mlp(ln_top, sigmoid_top)

    def apply_mlp(self, x, layers):
        return layers(x)

    def apply_emb(self, lS_o, lS_i, emb_l):
        ly = []
        for k, sparse_index_group_batch in enumerate(lS_i):
            sparse_offset_group_batch = lS_o[k]
            E = emb_l[k]
            V = E(sparse_index_group_batch, sparse_offset_group_batch)
            ly.append(V)
        return ly

    def interact_features(self, x, ly):
        if self.arch_interaction_op == "dot":
            (batch_size, d) = x.shape
            T = torch.cat([x] + ly, dim=1).view((batch_size, -1, d))
            Z = torch.bmm(T, torch.transpose(T, 1, 2))
            _, ni, nj = Z.shape
            offset = 1 if self.arch_interaction_itself else 0
            li = torch.tensor([i for i in range(ni) for j in range(i + offset)])
            lj = torch.tensor([j for i in range(nj) for j in range(i + offset)])
            Zflat = Z[:, li, lj]
            R = torch.cat([x] + [Zflat], dim=1)
        elif self.arch_interaction_op == "cat":
            R = torch.cat([x] + ly, dim=1)
        else:
            raise ValueError("ERROR: --arch-interaction-op=" + self.arch_interaction_op
                             + " is not supported")
        return R

    def forward(self, dense_x, lS_o, lS_i):
        return self.sequential_forward(dense_x, lS_o, lS_i)

    def sequential_forward(self, dense_x, lS_o, lS_i):
        x = self.apply_mlp(dense_x, self.bot_l)
        ly = self.apply_emb(lS_o, lS_i, self.emb_l)
        z = self.interact_features(x, ly)
        p = self.apply_mlp(z, self.top_l)
        if 0.0 < self.loss_threshold and self.loss_threshold < 1.0:
            z = torch.clamp(p, min=self.loss_threshold, max=(1.0 - self.loss_threshold))
        else:
            z = p
        return z


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
