"""Benchmarks of embedding_bag on float32 / float16 / bfloat16 tables beside NumPy and PyTorch.

The bag shapes of ``perfkernels._variants`` (FBGEMM's own 4M-row tables, DLRM's 1M x 64, a cache-resident
20k x 128 table and the tiny 1-bag-of-1 call) for every table dtype, uniform indices, plus Zipf
indices on the DLRM shape.  NumPy: ``np.add.reduceat(weight[indices], offsets, axis=0,
dtype=float32)``; PyTorch: ``torch.nn.functional.embedding_bag`` (FBGEMM's JIT kernels).

The 4M-row tables are large (4M x 256 float32 is 4 GiB), so inputs are built when a case first
runs and only the most recent case's inputs are kept (a case's closures hold them in a
holder list that the next case empties).

Placement, two views: ours, NumPy and ``torch`` read the same table, placed by
``perfkernels.empty_table`` (2 MiB-aligned, huge pages: kernel against kernel on one placement);
``torch-own`` is PyTorch on a copy in memory torch allocated (its default placement: what a user
gets), for tables of at most :data:`OWN_COPY_MAX_BYTES`.

Every side returns a new output array, as PyTorch's functions do (PyTorch has no ``out=`` for
bags).  Ours into a preallocated ``out=`` first takes a checked copy of the index list (so that
``out=`` is never half-written, even when another thread rewrites the indices during the call):
one more pass over the indices, which costs 3-14% of a call on the cache-resident shape
(``benchmarks/ceiling/cache_bag.py --out``); asv's suite times that form.
"""
from __future__ import annotations

import numpy as np

from ..._variants import (BAG_SHAPES, QUICK_BAG_SHAPES, QUICK_ZIPF_BAG_SHAPE, TABLE_DTYPES,
                         ZIPF_BAG_SHAPE)
from ...benchsuite import Case, torch_or_none, zipf_indices

_live: list[list] = []   # the holders filled now (one case's inputs alive at a time)
_wrapped: list[dict] = []   # the torch views (and torch-own copies) of those inputs
#: the largest table that also gets a copy in torch's own memory (the "torch-own" baseline)
OWN_COPY_MAX_BYTES = 1 << 30


def random_table(rng: np.random.Generator, rows: int, dim: int, dtype) -> np.ndarray:
    """A random table in placed memory (``perfkernels.empty_table``), converted in chunks (no
    float32 copy of a whole 16-bit table)."""
    from ..._placement import empty_table
    table = empty_table(rows, dim, dtype)
    for start in range(0, rows, 250_000):
        stop = min(rows, start + 250_000)
        table[start:stop] = rng.standard_normal((stop - start, dim), dtype=np.float32)
    return table


def make_inputs(seed: int, rows: int, dim: int, num_bags: int, bag_len: int, dtype,
                dist: str = "uniform") -> dict:
    """Seeded inputs of one case: table, int64 indices and offsets, an output-shaped array."""
    rng = np.random.default_rng(seed)
    n = num_bags * bag_len
    indices = (zipf_indices(rng, rows, n) if dist == "zipf"
               else rng.integers(0, rows, n, dtype=np.int64))
    return {"weight": random_table(rng, rows, dim, dtype), "indices": indices,
            "offsets": np.arange(num_bags, dtype=np.int64) * bag_len,
            "out": np.empty((num_bags, dim), np.float32)}


def _fill(holder: list, *args) -> tuple:
    """Build a case's inputs into its holder, first emptying every other holder."""
    for h in _live:
        h.clear()
    _live.clear()
    for t in _wrapped:   # a case's torch views and copies would keep its inputs alive
        t.clear()
    _wrapped.clear()
    x = make_inputs(*args)
    holder.append((x["weight"], x["indices"], x["offsets"], x["out"]))
    _live.append(holder)
    return holder[0]


def bag_case(seed, name, rows, dim, num_bags, bag_len, dtype_name, dist="uniform") -> Case:
    import perfkernels as pk
    dtype = TABLE_DTYPES[dtype_name]
    n = num_bags * bag_len
    nbytes = n * dim * dtype.itemsize + n * 8 + num_bags * 8 + num_bags * dim * 4
    holder: list = []
    args = (seed, rows, dim, num_bags, bag_len, dtype, dist)

    def ours():   # a new output, as torch.nn.functional.embedding_bag returns (see the module doc)
        w, i, o, _ = holder[0] if holder else _fill(holder, *args)
        return pk.embedding_bag(w, i, o)

    def numpy():
        w, i, o, _ = holder[0] if holder else _fill(holder, *args)
        return np.add.reduceat(w[i], o, axis=0, dtype=np.float32)

    baselines = {"numpy": numpy}
    torch = torch_or_none()
    if torch is not None:
        tensors: dict = {}

        def torch_tensors():
            x = holder[0] if holder else _fill(holder, *args)
            w, i, o, _ = x
            if tensors.get("key") is not x:   # wrap once per inputs (no copy)
                # torch has no ml_dtypes: view bfloat16 bits as torch.bfloat16 (no copy)
                tw = (torch.from_numpy(w.view(np.int16)).view(torch.bfloat16)
                      if w.dtype == TABLE_DTYPES["bfloat16"] else torch.from_numpy(w))
                tensors.clear()
                tensors.update(key=x, t=(tw, torch.from_numpy(i), torch.from_numpy(o)))
                _wrapped.append(tensors)
            return tensors["t"]

        def torch_bag():
            tw, ti, to = torch_tensors()
            return torch.nn.functional.embedding_bag(ti, tw, to, mode="sum")

        def torch_own():
            tw, ti, to = torch_tensors()
            if "own" not in tensors:          # a copy where torch's allocator puts it
                tensors["own"] = tw.clone()
            return torch.nn.functional.embedding_bag(ti, tensors["own"], to, mode="sum")

        baselines["torch"] = torch_bag
        if rows * dim * dtype.itemsize <= OWN_COPY_MAX_BYTES:
            baselines["torch-own"] = torch_own
    return Case("embedding", f"bag {dtype_name} {name} B={num_bags} L={bag_len} {dist}", nbytes,
                ours, baselines, scaling=dtype_name == "float32" and num_bags >= 256)


def cases(quick: bool) -> list[Case]:
    out = []
    for dtype_name in TABLE_DTYPES:
        for seed, (name, rows, dim, num_bags, bag_len) in enumerate(QUICK_BAG_SHAPES if quick
                                                                    else BAG_SHAPES):
            out.append(bag_case(seed, name, rows, dim, num_bags, bag_len, dtype_name))
        name, rows, dim, num_bags, bag_len = QUICK_ZIPF_BAG_SHAPE if quick else ZIPF_BAG_SHAPE
        out.append(bag_case(99, name, rows, dim, num_bags, bag_len, dtype_name, "zipf"))
    return out
