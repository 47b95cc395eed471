"""The float64 NumPy reference of the interaction family (DLRM's dot interaction), written from the
formula: see perfkernels/reference.py."""
from __future__ import annotations

import numpy as np

from perfkernels._reference_base import Expected

__all__ = ["dot_interaction", "dot_interaction_backward", "interaction_pairs"]


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


def dot_interaction_backward(grad, dense, sparse, *, pairs="dlrm", self_interaction=False
                             ) -> tuple[Expected, Expected]:
    """``(d_dense, d_sparse)`` of :func:`dot_interaction`'s output gradient ``grad``, in float64:
    per sample ``dz = (G + G^T) z`` with ``G[li[p], lj[p]] += grad[D + p]``, then ``d_dense =
    grad[:, :D] + dz[:, 0]`` and ``d_sparse = dz[:, 1:]``; the magnitudes are the same products of
    absolute values."""
    x = np.asarray(dense, dtype=np.float64)
    s = np.asarray(sparse, dtype=np.float64)
    g = np.asarray(grad, dtype=np.float64)
    z = np.concatenate([x[:, None, :], s], axis=1)
    n, d = z.shape[1], x.shape[1]
    li, lj = interaction_pairs(n, pairs, self_interaction)
    G = np.zeros((z.shape[0], n, n))
    A = np.zeros_like(G)
    for p, (i, j) in enumerate(zip(li, lj)):   # pairs may repeat: add, not assign
        G[:, i, j] += g[:, d + p]
        A[:, i, j] += np.abs(g[:, d + p])
    dz = (G + G.transpose(0, 2, 1)) @ z
    mag = (A + A.transpose(0, 2, 1)) @ np.abs(z)
    return (Expected(g[:, :d] + dz[:, 0], np.abs(g[:, :d]) + mag[:, 0]),
            Expected(dz[:, 1:], mag[:, 1:]))
