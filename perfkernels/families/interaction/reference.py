"""The float64 NumPy reference of the interaction family (DLRM's dot interaction), written from the
formula: see perfkernels/reference.py."""
from __future__ import annotations

import numpy as np

from perfkernels._reference_base import Expected

__all__ = ["dot_interaction", "interaction_pairs"]


def interaction_pairs(n: int, pairs="dlrm", self_interaction: bool = False):
    """(li, lj) as int64 arrays: ``"dlrm"`` the lower triangle row by row (facebookresearch DLRM's
    ``interact_features``), ``"torchrec"`` the upper one (``InteractionArch``), or a given tuple."""
    if not isinstance(pairs, str):
        li, lj = pairs
        return np.asarray(li, dtype=np.int64), np.asarray(lj, dtype=np.int64)
    if pairs == "dlrm":
        keep = np.tril(np.ones((n, n), bool), 0 if self_interaction else -1)
    else:
        keep = np.triu(np.ones((n, n), bool), 0 if self_interaction else 1)
    li, lj = np.nonzero(keep)       # row-major: row by row, columns ascending
    return li.astype(np.int64), lj.astype(np.int64)


def dot_interaction(dense, sparse, *, pairs="dlrm", self_interaction=False) -> Expected:
    """``[B, D + P]``: dense, then ``z[li[p]] . z[lj[p]]`` with ``z = [dense, sparse[:, f]...]``
    per sample, in float64; the magnitude is the dot product of the absolute values (the bound of
    a float32 summation's error)."""
    x = np.asarray(dense, dtype=np.float64)
    s = np.asarray(sparse, dtype=np.float64)
    z = np.concatenate([x[:, None, :], s], axis=1)
    li, lj = interaction_pairs(z.shape[1], pairs, self_interaction)
    dots = np.einsum("bpd,bpd->bp", z[:, li], z[:, lj])
    mags = np.einsum("bpd,bpd->bp", np.abs(z[:, li]), np.abs(z[:, lj]))
    return Expected(np.concatenate([x, dots], axis=1), np.concatenate([np.abs(x), mags], axis=1))
