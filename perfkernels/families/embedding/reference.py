"""The float64 NumPy reference of the embedding family (embedding_bag), and the bag conventions
every bag-shaped reference reuses (:func:`bag_bounds`).  See perfkernels/reference.py for what a
reference is and how it is compared."""
from __future__ import annotations

import numpy as np

from perfkernels._reference_base import Expected

__all__ = ["bag_bounds", "embedding_bag"]


def bag_bounds(num_indices: int, offsets=None, lengths=None, include_last_offset: bool = False,
               shape2d: tuple[int, int] | None = None) -> list[tuple[int, int]]:
    """``[(begin, end), ...]``: the half-open range of (flattened) indices of each bag.

    Exactly one convention applies: ``shape2d = (B, L)`` (2-D indices: B bags of L), ``lengths``
    (caffe2: bag b is the next ``lengths[b]`` indices) or ``offsets`` (PyTorch: bag b is
    ``[offsets[b], offsets[b+1])``, the last bag ending at ``num_indices`` unless
    ``include_last_offset``, where the last offset is that end and is not a bag).
    """
    if shape2d is not None:
        num_bags, length = shape2d
        return [(b * length, (b + 1) * length) for b in range(num_bags)]
    if lengths is not None:
        ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
        begins = ends - np.asarray(lengths, dtype=np.int64)
        return [(int(b), int(e)) for b, e in zip(begins, ends)]
    bounds = [int(o) for o in np.asarray(offsets).reshape(-1)]
    if not include_last_offset:
        bounds.append(num_indices)
    return list(zip(bounds[:-1], bounds[1:]))


def check_indices(flat: np.ndarray, rows: int) -> None:
    bad = np.flatnonzero((flat < 0) | (flat >= rows))
    if bad.size:
        j = int(bad[0])
        raise IndexError(f"indices[{j}] = {int(flat[j])} is out of range for a table of {rows} rows")


def embedding_bag(weight, indices, offsets=None, *, lengths=None, per_sample_weights=None,
                  mode: str = "sum", include_last_offset: bool = False, padding_idx=None,
                  positional_weights: bool = False) -> Expected:
    """Pooled rows of ``weight`` (any float dtype, or a float64 table): ``Expected([B, D], ...)``.

    ``out[b] = sum over j in bag b of w_j * weight[indices[j]]`` in float64, where ``w_j`` is 1,
    ``per_sample_weights[j]`` or, with ``positional_weights``, ``per_sample_weights[j - begin of
    the bag]``.  Entries equal to ``padding_idx`` (negative: counted from the end) are skipped and
    not counted; ``mode="mean"`` divides a bag by its count of remaining entries, and an empty bag
    is zeros in every mode.  2-D ``indices`` without offsets or lengths are ``B`` bags of ``L``.
    """
    table = np.asarray(weight).astype(np.float64)
    rows, dim = table.shape
    idx = np.asarray(indices)
    shape2d = idx.shape if idx.ndim == 2 and offsets is None and lengths is None else None
    flat = idx.reshape(-1).astype(np.int64)
    check_indices(flat, rows)
    bounds = bag_bounds(flat.size, offsets, lengths, include_last_offset, shape2d)
    pad = None if padding_idx is None else int(padding_idx) + (rows if padding_idx < 0 else 0)
    psw = (None if per_sample_weights is None
           else np.asarray(per_sample_weights, dtype=np.float64).reshape(-1))

    value = np.zeros((len(bounds), dim))
    magnitude = np.zeros((len(bounds), dim))
    for b, (begin, end) in enumerate(bounds):
        entries = np.arange(begin, end)
        entries = entries[flat[entries] != pad] if pad is not None else entries
        if entries.size == 0:
            continue
        if psw is None:
            w = np.ones(entries.size)
        else:
            w = psw[entries - begin] if positional_weights else psw[entries]
        terms = w[:, None] * table[flat[entries]]
        value[b] = terms.sum(axis=0)
        magnitude[b] = np.abs(terms).sum(axis=0)
        if mode == "mean":
            value[b] /= entries.size
            magnitude[b] /= entries.size
    return Expected(value, magnitude)
