"""Benchmarks of the unpooled lookups (``torch.nn.Embedding``'s) beside NumPy and PyTorch.

12,800 IDs (a batch of 256 sequences of 50) on a 1M x 64 and a 100K x 128 table, float32,
float16 and bfloat16; and 8-bit packed rows against torch's 8-bit lookup with bags of one
(``torch.ops.quantized.embedding_bag_byte_rowwise_offsets``; ``benchmarks/sequence_lookup.py``
times ``torch.ao.nn.quantized.Embedding`` itself).  NumPy: ``weight[indices]``; PyTorch:
``torch.nn.functional.embedding`` on the same memory.  Every side returns a new output.
"""
from __future__ import annotations

import numpy as np

from ...benchsuite import Case, torch_or_none

#: (name, rows, D, batch, sequence length)
SHAPES = (("1M x 64", 1_000_000, 64, 256, 50), ("100K x 128", 100_000, 128, 256, 50))
QUICK_SHAPES = (("20K x 64", 20_000, 64, 64, 50),)


def _table(rng, rows, dim, dtype):
    from ..embedding.bench import random_table
    return random_table(rng, rows, dim, dtype)


def lookup_case(rng, name, rows, dim, batch, seq, dtype_name, dtype) -> Case:
    import perfkernels as pk
    weight = _table(rng, rows, dim, dtype)
    indices = rng.integers(0, rows, (batch, seq), dtype=np.int64)
    nbytes = indices.size * (dim * weight.itemsize * 2 + 8)
    baselines = {"numpy": lambda: weight[indices]}
    torch = torch_or_none()
    if torch is not None:
        tw = (torch.from_numpy(weight.view(np.int16)).view(torch.bfloat16)
              if dtype_name == "bfloat16" else torch.from_numpy(weight))
        ti = torch.from_numpy(indices)
        baselines["torch"] = lambda: torch.nn.functional.embedding(ti, tw)
    return Case("sequence", f"embedding {dtype_name} {name} {batch}x{seq}", nbytes,
                lambda: pk.embedding(weight, indices), baselines)


def quantized_case(rng, name, rows, dim, batch, seq) -> Case:
    import perfkernels as pk
    from ..quantized.bench import packed_table
    packed = packed_table(rng, rows, dim, 8)
    indices = rng.integers(0, rows, (batch, seq), dtype=np.int64)
    nbytes = indices.size * (packed.shape[1] + dim * 4 + 8)
    baselines = {}
    torch = torch_or_none()
    if torch is not None:
        tp = torch.from_numpy(packed)
        ti = torch.from_numpy(indices.reshape(-1))
        # torch.ao's quantized Embedding: embedding_bag_byte_rowwise_offsets with bags of one
        offsets = torch.arange(ti.numel(), dtype=torch.int64)
        op = torch.ops.quantized.embedding_bag_byte_rowwise_offsets
        baselines["torch"] = lambda: op(tp, ti, offsets, mode=0, include_last_offset=False)
    return Case("sequence", f"embedding 8-bit {name} {batch}x{seq}", nbytes,
                lambda: pk.embedding_quantized(packed, indices), baselines)


def cases(quick: bool) -> list[Case]:
    from ..._variants import TABLE_DTYPES
    rng = np.random.default_rng(2026)
    out = []
    for name, rows, dim, batch, seq in (QUICK_SHAPES if quick else SHAPES):
        for dtype_name, dtype in TABLE_DTYPES.items():
            out.append(lookup_case(rng, name, rows, dim, batch, seq, dtype_name, dtype))
        out.append(quantized_case(rng, name, rows, dim, batch, seq))
    return out
