"""Benchmarks of the row-wise quantized family beside PyTorch's quantized ops (FBGEMM).

Lookups: the bag shapes of ``perfkernels._variants`` with 8-bit and 4-bit tables, uniform and Zipf indices,
against ``torch.ops.quantized.embedding_bag_{byte,4bit}_rowwise_offsets``.  Quantize: a
200,000 x 128 float32 table against ``embedding_bag_byte_prepack``.

Placement, two views: ours and ``torch`` read the same packed table, placed by
``perfkernels.empty_table`` (2 MiB-aligned, huge pages); ``torch-own`` is torch's op on a copy in
memory torch allocated (its default placement), for tables of at most :data:`OWN_COPY_MAX_BYTES`.
"""
from __future__ import annotations

import numpy as np

from ..._variants import (BAG_SHAPES, BENCH_BITS, QUANTIZE_SHAPE, QUICK_BAG_SHAPES,
                         QUICK_QUANTIZE_SHAPE, QUICK_ZIPF_BAG_SHAPE, ZIPF_BAG_SHAPE)
from ...benchsuite import Case, torch_or_none, zipf_indices
from .layout import packed_row_bytes

_TORCH_LOOKUP = {8: "embedding_bag_byte_rowwise_offsets", 4: "embedding_bag_4bit_rowwise_offsets",
                 2: "embedding_bag_2bit_rowwise_offsets"}


#: the largest packed table that also gets a copy in torch's own memory (``torch-own``)
OWN_COPY_MAX_BYTES = 256 << 20


def packed_table(rng: np.random.Generator, rows: int, dim: int, bits: int) -> np.ndarray:
    """A random packed table in placed memory (``perfkernels.empty_table``), quantized in chunks
    (a 4M x 256 float32 table would need 4 GiB)."""
    import perfkernels as pk
    table = pk.empty_table(rows, packed_row_bytes(dim, bits), np.uint8)
    for start in range(0, rows, 250_000):
        n = min(250_000, rows - start)
        table[start:start + n] = pk.quantize_rowwise(
            rng.standard_normal((n, dim), dtype=np.float32), bits=bits)
    return table


def lookup_case(rng, name, rows, dim, num_bags, bag_len, bits, dist="uniform") -> Case:
    import perfkernels as pk
    packed = packed_table(rng, rows, dim, bits)
    n = num_bags * bag_len
    if dist == "zipf":
        indices = zipf_indices(rng, rows, n)
    else:
        indices = rng.integers(0, rows, n, dtype=np.int64)
    offsets = np.arange(num_bags, dtype=np.int64) * bag_len
    row_bytes = packed.shape[1]
    nbytes = n * row_bytes + indices.nbytes + offsets.nbytes + num_bags * dim * 4
    baselines = {}
    torch = torch_or_none()
    if torch is not None:
        op = getattr(torch.ops.quantized, _TORCH_LOOKUP[bits])
        tp, ti, to = (torch.from_numpy(a) for a in (packed, indices, offsets))
        baselines["torch"] = lambda: op(tp, ti, to, mode=0, include_last_offset=False)
        if packed.nbytes <= OWN_COPY_MAX_BYTES:
            own = tp.clone()                  # where torch's allocator puts it
            baselines["torch-own"] = lambda: op(own, ti, to, mode=0, include_last_offset=False)
    return Case("quantized", f"bag {bits}-bit {name} B={num_bags} L={bag_len} {dist}", nbytes,
                # a new output, as torch's op returns (see embedding/bench.py on out=)
                lambda: pk.embedding_bag_quantized(packed, indices, offsets, bits=bits),
                baselines)


def quantize_case(rng, rows, dim, bits=8) -> Case:
    import perfkernels as pk
    weight = rng.standard_normal((rows, dim), dtype=np.float32)
    nbytes = weight.nbytes + rows * packed_row_bytes(dim, bits)
    baselines = {}
    torch = torch_or_none()
    if torch is not None:
        prepack = {8: torch.ops.quantized.embedding_bag_byte_prepack,
                   4: torch.ops.quantized.embedding_bag_4bit_prepack}[bits]
        tw = torch.from_numpy(weight)
        baselines["torch"] = lambda: prepack(tw)
    return Case("quantized", f"quantize {bits}-bit {rows} x {dim} float32", nbytes,
                lambda: pk.quantize_rowwise(weight, bits=bits), baselines)


def cases(quick: bool) -> list[Case]:
    rng = np.random.default_rng(2026)
    shapes = QUICK_BAG_SHAPES if quick else BAG_SHAPES
    out = []
    for bits in BENCH_BITS:
        for name, rows, dim, num_bags, bag_len in shapes:
            out.append(lookup_case(rng, name, rows, dim, num_bags, bag_len, bits))
        if not quick:
            name, rows, dim, num_bags, bag_len = ZIPF_BAG_SHAPE
            out.append(lookup_case(rng, name, rows, dim, num_bags, bag_len, bits, "zipf"))
    rows, dim = QUICK_QUANTIZE_SHAPE if quick else QUANTIZE_SHAPE
    for bits in BENCH_BITS:
        out.append(quantize_case(rng, rows, dim, bits))
    return out


def scaling_cases(quick: bool) -> list[Case]:
    """The thread-scaling view: 8-bit lookups on DLRM's shape (uniform and Zipf) and 8-bit
    quantization, built alone (``cases`` builds every table of every shape)."""
    rng = np.random.default_rng(2026)
    name, rows, dim, num_bags, bag_len = QUICK_ZIPF_BAG_SHAPE if quick else ZIPF_BAG_SHAPE
    out = [lookup_case(rng, name, rows, dim, num_bags, bag_len, 8, dist)
           for dist in ("uniform", "zipf")]
    out.append(quantize_case(rng, *(QUICK_QUANTIZE_SHAPE if quick else QUANTIZE_SHAPE), 8))
    return out
