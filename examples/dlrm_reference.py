"""The reference DLRM: a small, faithful copy of ``DLRM_Net`` from facebookresearch/dlrm's
``dlrm_s_pytorch.py`` (the model code users run), without its multi-device, quotient-remainder,
mixed-dimension and quantized-embedding options, which the Criteo Kaggle inference configuration
leaves off.  What is kept is kept as written there: ``create_mlp`` (Linear + ReLU, a Sigmoid at
``sigmoid_layer``, a ``Sequential``, Xavier-style normal initialisation), ``create_emb`` (one
``nn.EmbeddingBag(n, m, mode="sum", sparse=True)`` per table, uniform +-sqrt(1/n)),
``apply_mlp``, ``apply_emb`` (a Python loop over the tables, optional per-sample weights),
``interact_features`` with ``"dot"`` (the pairwise dot products of the concatenated features,
the index lists built per call, with or without each feature's product with itself:
``arch_interaction_itself``) and ``"cat"``, and ``sequential_forward`` (with the optional
``loss_threshold`` clamp).

Criteo Kaggle's configuration (the repository's ``bench/dlrm_s_criteo_kaggle.sh``):
``--arch-sparse-feature-size=16 --arch-mlp-bot="13-512-256-64-16" --arch-mlp-top="512-256-1"``
with the dataset's 26 table sizes, dot interaction, one index per table and sample; see
``kaggle_model`` and ``kaggle_batch``.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

#: Criteo Kaggle (Display Advertising Challenge) cardinalities of the 26 categorical features
CRITEO_KAGGLE_ROWS = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593,
                      3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105,
                      142572]


class DLRM_Net(nn.Module):  # noqa: N801  (the reference's name)
    def create_mlp(self, ln, sigmoid_layer):
        # build MLP layer by layer
        layers = nn.ModuleList()
        for i in range(0, ln.size - 1):
            n = ln[i]
            m = ln[i + 1]

            # construct fully connected operator
            LL = nn.Linear(int(n), int(m), bias=True)

            # initialize the weights
            # custom Xavier input, output or two-sided fill
            mean = 0.0  # std_dev = np.sqrt(variance)
            std_dev = np.sqrt(2 / (m + n))  # np.sqrt(1 / m) # np.sqrt(1 / n)
            W = np.random.normal(mean, std_dev, size=(m, n)).astype(np.float32)
            std_dev = np.sqrt(1 / m)  # np.sqrt(2 / (m + 1))
            bt = np.random.normal(mean, std_dev, size=m).astype(np.float32)
            LL.weight.data = torch.tensor(W, requires_grad=True)
            LL.bias.data = torch.tensor(bt, requires_grad=True)
            layers.append(LL)

            # construct sigmoid or relu operator
            if i == sigmoid_layer:
                layers.append(nn.Sigmoid())
            else:
                layers.append(nn.ReLU())

        # use Sequential container to wrap all layers
        return torch.nn.Sequential(*layers)

    def create_emb(self, m, ln, weighted_pooling=None):
        emb_l = nn.ModuleList()
        v_W_l = []
        for i in range(0, ln.size):
            n = ln[i]
            # construct embedding operator
            EE = nn.EmbeddingBag(n, m, mode="sum", sparse=True)
            # initialize embeddings
            W = np.random.uniform(
                low=-np.sqrt(1 / n), high=np.sqrt(1 / n), size=(n, m)
            ).astype(np.float32)
            EE.weight.data = torch.tensor(W, requires_grad=True)
            if weighted_pooling is None:
                v_W_l.append(None)
            else:
                v_W_l.append(torch.ones(n, dtype=torch.float32))
            emb_l.append(EE)
        return emb_l, v_W_l

    def __init__(
        self,
        m_spa=None,
        ln_emb=None,
        ln_bot=None,
        ln_top=None,
        arch_interaction_op=None,
        arch_interaction_itself=False,
        sigmoid_bot=-1,
        sigmoid_top=-1,
        loss_threshold=0.0,
        weighted_pooling=None,
    ):
        super(DLRM_Net, self).__init__()

        if (
            (m_spa is not None)
            and (ln_emb is not None)
            and (ln_bot is not None)
            and (ln_top is not None)
            and (arch_interaction_op is not None)
        ):
            # save arguments
            self.output_d = 0
            self.parallel_model_batch_size = -1
            self.parallel_model_is_not_prepared = True
            self.arch_interaction_op = arch_interaction_op
            self.arch_interaction_itself = arch_interaction_itself
            self.loss_threshold = loss_threshold
            if weighted_pooling is not None and weighted_pooling != "fixed":
                self.weighted_pooling = "learned"
            else:
                self.weighted_pooling = weighted_pooling
            self.quantize_emb = False

            # create operators
            self.emb_l, w_list = self.create_emb(m_spa, ln_emb, weighted_pooling)
            if self.weighted_pooling == "learned":
                self.v_W_l = nn.ParameterList()
                for w in w_list:
                    self.v_W_l.append(nn.Parameter(w))
            else:
                self.v_W_l = w_list
            self.bot_l = self.create_mlp(ln_bot, sigmoid_bot)
            self.top_l = self.create_mlp(ln_top, sigmoid_top)

    def apply_mlp(self, x, layers):
        # use Sequential container to wrap all layers
        return layers(x)

    def apply_emb(self, lS_o, lS_i, emb_l, v_W_l):
        # WARNING: notice that we are processing the batch at once. We implicitly
        # assume that the data is laid out such that:
        # 1. each embedding is indexed with a group of sparse indices,
        #   corresponding to a single lookup
        # 2. for each embedding the lookups are further organized into a batch
        # 3. for a list of embedding tables there is a list of batched lookups

        ly = []
        for k, sparse_index_group_batch in enumerate(lS_i):
            sparse_offset_group_batch = lS_o[k]

            # embedding lookup
            # We are using EmbeddingBag, which implicitly uses sum operator.
            # The embeddings are represented as tall matrices, with sum
            # happening vertically across 0 axis, resulting in a row vector
            if v_W_l[k] is not None:
                per_sample_weights = v_W_l[k].gather(0, sparse_index_group_batch)
            else:
                per_sample_weights = None

            E = emb_l[k]
            V = E(
                sparse_index_group_batch,
                sparse_offset_group_batch,
                per_sample_weights=per_sample_weights,
            )

            ly.append(V)

        return ly

    def interact_features(self, x, ly):

        if self.arch_interaction_op == "dot":
            # concatenate dense and sparse features
            (batch_size, d) = x.shape
            T = torch.cat([x] + ly, dim=1).view((batch_size, -1, d))
            # perform a dot product
            Z = torch.bmm(T, torch.transpose(T, 1, 2))
            # append dense feature with the interactions (into a row vector)
            # approach 2: unique
            _, ni, nj = Z.shape
            # approach 2: custom
            offset = 1 if self.arch_interaction_itself else 0
            li = torch.tensor([i for i in range(ni) for j in range(i + offset)])
            lj = torch.tensor([j for i in range(nj) for j in range(i + offset)])
            Zflat = Z[:, li, lj]
            # concatenate dense features and interactions
            R = torch.cat([x] + [Zflat], dim=1)
        elif self.arch_interaction_op == "cat":
            # concatenation features (into a row vector)
            R = torch.cat([x] + ly, dim=1)
        else:
            raise ValueError(
                "ERROR: --arch-interaction-op="
                + self.arch_interaction_op
                + " is not supported"
            )

        return R

    def forward(self, dense_x, lS_o, lS_i):
        return self.sequential_forward(dense_x, lS_o, lS_i)

    def sequential_forward(self, dense_x, lS_o, lS_i):
        # process dense features (using bottom mlp), resulting in a row vector
        x = self.apply_mlp(dense_x, self.bot_l)

        # process sparse features(using embeddings), resulting in a list of row vectors
        ly = self.apply_emb(lS_o, lS_i, self.emb_l, self.v_W_l)

        # interact features (dense and sparse)
        z = self.interact_features(x, ly)

        # obtain probability of a click (using top mlp)
        p = self.apply_mlp(z, self.top_l)

        # clamp output if needed
        if 0.0 < self.loss_threshold and self.loss_threshold < 1.0:
            z = torch.clamp(p, min=self.loss_threshold, max=(1.0 - self.loss_threshold))
        else:
            z = p

        return z


def kaggle_model(max_rows: int | None = None, m_spa: int = 16, interaction: str = "dot",
                 interaction_itself: bool = False, seed: int = 0) -> DLRM_Net:
    """DLRM_Net as ``dlrm_s_pytorch.py`` builds it for Criteo Kaggle: 26 tables of the dataset's
    sizes (capped at ``max_rows`` when given) x ``m_spa``, bottom MLP 13-512-256-64-m_spa, top MLP
    (interactions)-512-256-1 with a sigmoid last.  ``np.random.seed(seed)`` first, as the
    reference seeds its initialisation."""
    np.random.seed(seed)
    ln_emb = np.array([min(n, max_rows) if max_rows else n for n in CRITEO_KAGGLE_ROWS])
    ln_bot = np.array([13, 512, 256, 64, m_spa])
    num_fea = ln_emb.size + 1  # sparse features + dense feature
    if interaction == "dot":   # as the reference computes the top MLP's input size
        num_int = (num_fea * (num_fea + 1)) // 2 if interaction_itself else (
            num_fea * (num_fea - 1)) // 2
        num_int += m_spa
    else:
        num_int = num_fea * m_spa
    ln_top = np.array([num_int, 512, 256, 1])
    return DLRM_Net(m_spa, ln_emb, ln_bot, ln_top, arch_interaction_op=interaction,
                    arch_interaction_itself=interaction_itself, sigmoid_bot=-1,
                    sigmoid_top=ln_top.size - 2)


def kaggle_batch(model: DLRM_Net, batch: int, rng: np.random.Generator, bag_size: int = 1,
                 zipf_a: float = 1.1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One batch as the reference's Criteo data loader hands it to the model: dense [B, 13]
    (log(1 + x) of count features), offsets lS_o [26, B] and indices lS_i [26, B * bag_size]
    (one-hot: bag_size 1).  Indices are Zipf-distributed over each table (a few hot rows)."""
    dense = torch.from_numpy(np.log1p(rng.lognormal(0, 1, (batch, 13))).astype(np.float32))
    rows = [e.num_embeddings for e in model.emb_l]
    lS_i = torch.from_numpy(np.stack([((rng.zipf(zipf_a, batch * bag_size) - 1) * 2654435761) % n
                                      for n in rows]).astype(np.int64))
    lS_o = torch.arange(0, batch * bag_size, bag_size).repeat(len(rows), 1)
    return dense, lS_o, lS_i
