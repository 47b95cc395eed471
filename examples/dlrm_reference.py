"""A reference-shaped DLRM: the architecture of facebookresearch/dlrm's ``DLRM_Net``
(``dlrm_s_pytorch.py``, single-device inference path), written here, running the same torch
operations in the same order, so that what ``perfkernels.torch.optimize`` must recognise in that
model's graph is what this model's graph holds.

The torch operations of ``ReferenceDLRM.forward``, in order (``B`` the batch, ``d`` the
embedding dimension, ``F`` the number of tables):

1. Bottom MLP: one ``nn.Sequential`` of ``nn.Linear`` (with bias) each followed by ``nn.ReLU``,
   except an ``nn.Sigmoid`` after the Linear at index ``sigmoid_bottom`` (-1: none), called on the
   dense features.
2. Embeddings: one ``nn.EmbeddingBag(rows, d, mode="sum", sparse=True)`` per table, called in a
   Python loop as ``bag(indices[k], offsets[k], per_sample_weights=w)``, ``w`` ``None``, or with
   per-row pooling weights ``weights[k].gather(0, indices[k])``.
3. Interaction ``"dot"``: ``torch.cat([x] + pooled, dim=1).view((B, -1, d))``, then
   ``torch.bmm(T, torch.transpose(T, 1, 2))``, then two index lists built on every call with
   ``torch.tensor`` (the pairs ``(i, j)``, ``j < i``, or ``j <= i`` with the self-interaction,
   row by row) and the advanced index ``Z[:, rows, cols]``, then ``torch.cat([x] + [pairs],
   dim=1)``.  Interaction ``"cat"``: ``torch.cat([x] + pooled, dim=1)``.
4. Top MLP: as the bottom one, the Sigmoid after its last Linear by default.
5. ``torch.clamp(p, min=t, max=1 - t)`` when the loss threshold ``t`` is in (0, 1).

Facts kept from the reference besides the operations: its attribute names ``bot_l``, ``emb_l``,
``top_l`` and ``v_W_l`` (so its checkpoints' state-dict keys load), its call convention
``model(dense, offsets, indices)``, the width of the top MLP's input (``d`` plus the number of
pairs, or ``(F + 1) * d`` for ``"cat"``) and its initialisation (Linear weights normal with
standard deviation ``sqrt(2 / (fan_in + fan_out))``, biases ``sqrt(1 / fan_out)``, tables
uniform in ``+-sqrt(1 / rows)``).  Left out, as the Criteo Kaggle inference configuration leaves
them off: multi-device execution, quotient-remainder and mixed-dimension embeddings, quantized
tables and the argument parsing.

Criteo Kaggle's configuration (the reference's ``bench/dlrm_s_criteo_kaggle.sh``): embedding
dimension 16, bottom MLP 13-512-256-64-16, top MLP 512-256-1, the dataset's 26 table sizes, dot
interaction, one index per table and sample; see ``kaggle_model`` and ``kaggle_batch``.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import torch
from torch import nn

#: Criteo Kaggle (Display Advertising Challenge) cardinalities of the 26 categorical features
CRITEO_KAGGLE_ROWS = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593,
                      3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105,
                      142572]


def interaction_width(num_tables: int, dim: int, interaction: str = "dot",
                      self_interaction: bool = False) -> int:
    """Width of the interaction's output (the top MLP's input): ``dim`` plus one dot product per
    pair of the ``num_tables + 1`` feature vectors (``j < i``; ``j <= i`` with
    ``self_interaction``) for ``"dot"``, the ``num_tables + 1`` vectors side by side for
    ``"cat"``."""
    vectors = num_tables + 1
    if interaction == "dot":
        return dim + vectors * (vectors + 1 if self_interaction else vectors - 1) // 2
    if interaction == "cat":
        return vectors * dim
    raise ValueError(f"interaction must be 'dot' or 'cat'; got {interaction!r}")


def _mlp(sizes: Sequence[int], sigmoid_at: int, g: torch.Generator) -> nn.Sequential:
    """Linear layers ``sizes[0] -> sizes[1] -> ...``, each followed by a ReLU, or by a Sigmoid at
    Linear number ``sigmoid_at``."""
    modules: list[nn.Module] = []
    for k, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        linear = nn.Linear(int(fan_in), int(fan_out), bias=True)
        with torch.no_grad():
            linear.weight.normal_(0.0, math.sqrt(2.0 / (fan_in + fan_out)), generator=g)
            linear.bias.normal_(0.0, math.sqrt(1.0 / fan_out), generator=g)
        modules += [linear, nn.Sigmoid() if k == sigmoid_at else nn.ReLU()]
    return nn.Sequential(*modules)


class ReferenceDLRM(nn.Module):
    """Bottom MLP, one sum-pooled EmbeddingBag per table, dot or cat interaction, top MLP, with
    the torch operations of facebookresearch's ``DLRM_Net`` (listed in this module's docstring).

    Parameters
    ----------
    table_rows : sequence of int
        Rows of each embedding table.
    dim : int
        Embedding dimension; also the bottom MLP's output width.
    bottom : sequence of int
        Bottom MLP sizes, from the number of dense features to ``dim``.
    top : sequence of int
        Top MLP sizes after the interaction (its input width is computed, see
        :func:`interaction_width`), e.g. ``(512, 256, 1)``.
    interaction : {"dot", "cat"}
    self_interaction : bool
        With ``"dot"``: include each vector's dot product with itself.
    sigmoid_bottom, sigmoid_top : int or None
        The Linear (counted from 0) followed by a Sigmoid instead of a ReLU; -1 for none.  The
        top MLP's default, None, is its last Linear.
    loss_threshold : float
        When in (0, 1), the prediction is clamped to ``[loss_threshold, 1 - loss_threshold]``.
    pooling_weights : None, "fixed" or "learned"
        Per-row weights of the pooled rows (all ones to start): none, constant tensors, or
        Parameters.
    seed : int
        Seed of the initialisation.
    """

    def __init__(self, table_rows: Sequence[int], dim: int, bottom: Sequence[int],
                 top: Sequence[int], *, interaction: str = "dot", self_interaction: bool = False,
                 sigmoid_bottom: int = -1, sigmoid_top: Optional[int] = None,
                 loss_threshold: float = 0.0, pooling_weights: Optional[str] = None,
                 seed: int = 0) -> None:
        super().__init__()
        if int(bottom[-1]) != dim:
            raise ValueError(f"bottom must end with dim={dim}; got {list(bottom)}")
        if pooling_weights not in (None, "fixed", "learned"):
            raise ValueError("pooling_weights must be None, 'fixed' or 'learned'; "
                             f"got {pooling_weights!r}")
        g = torch.Generator().manual_seed(seed)
        self.interaction = interaction
        self.self_interaction = bool(self_interaction)
        self.loss_threshold = float(loss_threshold)
        top_sizes = [interaction_width(len(table_rows), dim, interaction, self_interaction),
                     *top]
        self.emb_l = nn.ModuleList()   # registered first, as there (the parameters' order)
        for rows in table_rows:
            bag = nn.EmbeddingBag(int(rows), dim, mode="sum", sparse=True)
            bound = math.sqrt(1.0 / int(rows))
            with torch.no_grad():
                bag.weight.uniform_(-bound, bound, generator=g)
            self.emb_l.append(bag)
        ones = [torch.ones(int(rows)) for rows in table_rows]
        if pooling_weights == "learned":
            self.v_W_l = nn.ParameterList(nn.Parameter(w) for w in ones)
        else:
            self.v_W_l = ones if pooling_weights == "fixed" else [None] * len(ones)
        self.bot_l = _mlp(list(bottom), sigmoid_bottom, g)
        self.top_l = _mlp(top_sizes, len(top_sizes) - 2 if sigmoid_top is None else sigmoid_top,
                          g)

    def _pooled(self, offsets, indices) -> list[torch.Tensor]:
        out = []
        for k, bag in enumerate(self.emb_l):
            weights = self.v_W_l[k]
            if weights is not None:
                weights = weights.gather(0, indices[k])
            out.append(bag(indices[k], offsets[k], per_sample_weights=weights))
        return out

    def _interact(self, x: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        if self.interaction == "cat":
            return torch.cat([x] + pooled, dim=1)
        if self.interaction != "dot":
            raise ValueError(f"interaction must be 'dot' or 'cat'; got {self.interaction!r}")
        batch, dim = x.shape
        stacked = torch.cat([x] + pooled, dim=1).view((batch, -1, dim))
        gram = torch.bmm(stacked, torch.transpose(stacked, 1, 2))
        n = gram.shape[1]
        diagonal = 1 if self.self_interaction else 0
        pairs = [(i, j) for i in range(n) for j in range(i + diagonal)]
        rows = torch.tensor([i for i, _ in pairs])
        cols = torch.tensor([j for _, j in pairs])
        return torch.cat([x] + [gram[:, rows, cols]], dim=1)

    def forward(self, dense: torch.Tensor, offsets, indices) -> torch.Tensor:
        """Click probability ``[B, 1]`` of ``dense`` ``[B, bottom[0]]`` and, per table, the
        ``offsets`` and ``indices`` of its bags (lists, or ``[F, B]`` / ``[F, N]`` tensors)."""
        p = self.top_l(self._interact(self.bot_l(dense), self._pooled(offsets, indices)))
        t = self.loss_threshold
        if 0.0 < t < 1.0:
            p = torch.clamp(p, min=t, max=1.0 - t)
        return p


def kaggle_model(max_rows: int | None = None, dim: int = 16, interaction: str = "dot",
                 self_interaction: bool = False, seed: int = 0) -> ReferenceDLRM:
    """The model at Criteo Kaggle's shape: 26 tables of the dataset's sizes (capped at
    ``max_rows`` when given) x ``dim``, bottom MLP 13-512-256-64-dim, top MLP
    (interaction)-512-256-1 with a Sigmoid last."""
    rows = [min(n, max_rows) if max_rows else n for n in CRITEO_KAGGLE_ROWS]
    return ReferenceDLRM(rows, dim, [13, 512, 256, 64, dim], [512, 256, 1],
                         interaction=interaction, self_interaction=self_interaction, seed=seed)


def kaggle_batch(model: ReferenceDLRM, batch: int, rng: np.random.Generator, bag_size: int = 1,
                 zipf_a: float = 1.1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One batch as the reference's Criteo data loader hands it to the model: dense [B, 13]
    (log(1 + x) of count features), offsets [26, B] and indices [26, B * bag_size] (one-hot:
    bag_size 1).  Indices are Zipf-distributed over each table (a few hot rows)."""
    dense = torch.from_numpy(np.log1p(rng.lognormal(0, 1, (batch, 13))).astype(np.float32))
    rows = [e.num_embeddings for e in model.emb_l]
    indices = torch.from_numpy(np.stack([((rng.zipf(zipf_a, batch * bag_size) - 1) * 2654435761)
                                         % n for n in rows]).astype(np.int64))
    offsets = torch.arange(0, batch * bag_size, bag_size).repeat(len(rows), 1)
    return dense, offsets, indices
