"""Benchmark of embedding_bags_multi: the 26 tables of the DLRM example in one call.

Criteo Kaggle's cardinalities capped at 1M rows, D 64, batch 2048, bag lengths uniform in
[1, 100], Zipf indices, float32 tables, in TorchRec's KeyedJaggedTensor layout.  The baseline is what
a PyTorch model runs without a batched kernel: a Python loop of ``torch.nn.functional.embedding_bag``
over the tables (inputs already split per feature) and ``torch.cat`` of the pooled rows.
"""
from __future__ import annotations

import numpy as np

from ..._variants import MULTI_SHAPE, QUICK_MULTI_SHAPE, MultiShape
from ...benchsuite import Case, torch_or_none, zipf_indices
from ..embedding.bench import random_table


def make_inputs(seed: int, shape: MultiShape) -> dict:
    """Tables, KJT values and lengths (feature-major) of one multi-table batch."""
    rng = np.random.default_rng(seed)
    rows = [min(r, shape.max_rows) for r in shape.rows]
    tables = [random_table(rng, r, shape.dim, np.float32) for r in rows]
    lengths = rng.integers(shape.min_len, shape.max_len + 1, len(rows) * shape.batch)
    per_feature = lengths.reshape(len(rows), shape.batch).sum(axis=1)
    values = np.concatenate([zipf_indices(rng, r, int(n)) for r, n in zip(rows, per_feature)])
    return {"tables": tables, "indices": values, "lengths": lengths.astype(np.int64),
            "out": np.empty((shape.batch, shape.dim * len(rows)), np.float32)}


def multi_case(seed: int, shape: MultiShape) -> Case:
    import perfkernels as pk
    x = make_inputs(seed, shape)
    tables, indices, lengths, out = x["tables"], x["indices"], x["lengths"], x["out"]
    nbytes = (indices.size * (shape.dim * 4 + 8) + lengths.nbytes + out.nbytes)

    def ours():
        return pk.embedding_bags_multi(tables, indices, lengths=lengths, out=out)

    baselines = {}
    torch = torch_or_none()
    if torch is not None:
        B = shape.batch
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        per_feature = []
        for f, table in enumerate(tables):
            lo, hi = offsets[f * B], offsets[(f + 1) * B]
            per_feature.append((torch.from_numpy(indices[lo:hi]), torch.from_numpy(table),
                                torch.from_numpy(offsets[f * B:(f + 1) * B] - lo)))

        def torch_loop():
            return torch.cat([torch.nn.functional.embedding_bag(i, w, o, mode="sum")
                              for i, w, o in per_feature], dim=1)

        baselines["torch loop"] = torch_loop
    return Case("multi", f"{shape.name} D={shape.dim} B={shape.batch} "
                f"L={shape.min_len}-{shape.max_len} zipf", nbytes, ours, baselines, scaling=True)


def cases(quick: bool) -> list[Case]:
    return [multi_case(7, QUICK_MULTI_SHAPE if quick else MULTI_SHAPE)]
