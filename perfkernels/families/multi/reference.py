"""The float64 NumPy reference of the multi family (embedding_bags_multi: many tables in
TorchRec's KeyedJaggedTensor layout), built from the embedding and quantized references.  See
perfkernels/reference.py."""
from __future__ import annotations

import numpy as np

from perfkernels._reference_base import Expected
from perfkernels.families.embedding.reference import embedding_bag
from perfkernels.families.quantized.reference import dequantize_rowwise

__all__ = ["embedding_bags_multi", "embedding_bags_interaction"]


def embedding_bags_multi(tables, indices, *, lengths=None, offsets=None, per_sample_weights=None,
                         modes="sum", padding_idx=None, bits=None, dims=None) -> Expected:
    """F features in TorchRec's KeyedJaggedTensor layout, pooled: ``Expected([B, sum(D_f)], ...)``.

    ``indices`` holds every feature's values back to back; ``lengths[f*B + b]`` (or the running
    sum ``offsets``, F*B + 1 entries) is the bag of feature f for sample b, and feature f reads
    ``tables[f]`` (a float table, or a packed one with ``bits[f]`` and optionally ``dims[f]``).
    Sample b's row holds the features' pooled rows side by side, in feature order.  ``modes``,
    ``padding_idx``, ``bits`` and ``dims`` are one value for every table or a list of F; each
    feature's bags follow :func:`embedding_bag`, with ``per_sample_weights`` one per value.
    """
    num_features = len(tables)

    def per_feature(value):
        return list(value) if isinstance(value, (list, tuple)) else [value] * num_features

    flat = np.asarray(indices).reshape(-1).astype(np.int64)
    if offsets is None:
        offsets = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))])
    offsets = np.asarray(offsets, dtype=np.int64)
    batch = (offsets.size - 1) // num_features
    weights = None if per_sample_weights is None else np.asarray(per_sample_weights).reshape(-1)
    values, magnitudes = [], []
    for f, (table, mode, pad, b, d) in enumerate(zip(tables, per_feature(modes),
                                                     per_feature(padding_idx), per_feature(bits),
                                                     per_feature(dims))):
        begin, end = int(offsets[f * batch]), int(offsets[(f + 1) * batch])
        table = table if b is None else dequantize_rowwise(table, b, d)
        part = embedding_bag(table, flat[begin:end], offsets[f * batch:(f + 1) * batch + 1] - begin,
                             include_last_offset=True, mode=mode, padding_idx=pad,
                             per_sample_weights=None if weights is None else weights[begin:end])
        values.append(part.value)
        magnitudes.append(part.magnitude)
    return Expected(np.concatenate(values, axis=1).reshape(batch, -1),
                    np.concatenate(magnitudes, axis=1).reshape(batch, -1))


def embedding_bags_interaction(dense, tables, indices, offsets, *, interaction="dot",
                               pairs="dlrm", self_interaction=False, include_last_offset=False,
                               per_sample_weights=None, modes="sum", padding_idx=None, bits=None,
                               dims=None) -> Expected:
    """F pooled lookups (``indices[f]`` / ``offsets[f]`` in ``tables[f]``, as
    :func:`embedding_bag`) and DLRM's interaction with ``dense``: ``"cat"``
    ``[dense, pooled_0, ...]``, ``"dot"`` the dense row and the pairwise dot products
    (:func:`perfkernels.families.interaction.reference.dot_interaction`)."""
    from perfkernels.families.interaction.reference import dot_interaction

    num_features = len(tables)

    def per_feature(value):
        return list(value) if isinstance(value, (list, tuple)) else [value] * num_features

    weights = per_feature(per_sample_weights)
    pooled = []
    for f, (table, mode, pad, b, d) in enumerate(zip(tables, per_feature(modes),
                                                     per_feature(padding_idx), per_feature(bits),
                                                     per_feature(dims))):
        table = table if b is None else dequantize_rowwise(table, b, d)
        pooled.append(embedding_bag(table, indices[f], offsets[f],
                                    include_last_offset=include_last_offset, mode=mode,
                                    padding_idx=pad, per_sample_weights=weights[f]))
    x = np.asarray(dense, dtype=np.float64)
    if interaction == "cat":
        return Expected(np.concatenate([x] + [p.value for p in pooled], axis=1),
                        np.concatenate([np.abs(x)] + [p.magnitude for p in pooled], axis=1))
    sparse = np.stack([p.value for p in pooled], axis=1)
    got = dot_interaction(x, sparse, pairs=pairs, self_interaction=self_interaction)
    # the pooled rows' own rounding enters every product: bound it by the magnitudes' products
    mag = np.stack([p.magnitude for p in pooled], axis=1)
    bound = dot_interaction(np.abs(x), mag, pairs=pairs, self_interaction=self_interaction)
    return Expected(got.value, np.maximum(got.magnitude, bound.value))
