"""The NumPy reference of the sequence family (unpooled lookups, ``torch.nn.Embedding``).  See
perfkernels/reference.py for what a reference is and how it is compared."""
from __future__ import annotations

import numpy as np

from perfkernels._reference_base import Expected

from perfkernels.families.quantized.layout import codes_per_byte as _codes_per_byte
from perfkernels.families.quantized.layout import packed_dim as _packed_dim
from perfkernels.families.quantized.layout import trailer_bytes as _trailer_bytes

__all__ = ["embedding", "embedding_quantized"]


def _checked(indices, rows: int) -> np.ndarray:
    ix = np.asarray(indices)
    flat = ix.reshape(-1)
    bad = np.flatnonzero((flat < 0) | (flat >= rows))
    if bad.size:
        j = int(bad[0])
        raise IndexError(f"indices[{j}] = {int(flat[j])} is out of range for a table of "
                         f"{rows} rows")
    return ix


def embedding(weight, indices, padding_idx=None) -> np.ndarray:
    """``weight[indices]``: shape ``indices.shape + (D,)``, the table's dtype, every row as stored
    (the same bits); ``padding_idx`` rows are returned as stored (only their gradient is zero).
    An index out of ``[0, rows)`` raises IndexError (no wrap-around of negative indices)."""
    w = np.asarray(weight)
    ix = _checked(indices, w.shape[0])
    return w[ix]


def embedding_quantized(packed, indices, bits: int = 8, dim=None) -> Expected:
    """The rows ``indices`` of a row-wise quantized table, dequantised in float64:
    ``q * scale + bias`` (``indices.shape + (D,)``), with the magnitude ``|q * scale| + |bias|``
    (a float32 kernel's rounding error is bounded by a multiple of it, not of the result, when
    the two terms cancel)."""
    p = np.asarray(packed, dtype=np.uint8)
    d = _packed_dim(p.shape[1], bits, dim)
    ix = _checked(indices, p.shape[0])
    per = _codes_per_byte(bits)
    codes_bytes = p.shape[1] - _trailer_bytes(bits)
    rows = p[ix.reshape(-1)]
    if bits == 8:
        q = rows[:, :d].astype(np.float64)
        scale = rows[:, codes_bytes:codes_bytes + 4].copy().view("<f4").astype(np.float64)
        bias = rows[:, codes_bytes + 4:codes_bytes + 8].copy().view("<f4").astype(np.float64)
    else:
        c = np.arange(d)
        q = ((rows[:, c // per] >> ((c % per) * bits)) & ((1 << bits) - 1)).astype(np.float64)
        scale = rows[:, codes_bytes:codes_bytes + 2].copy().view("<f2").astype(np.float64)
        bias = rows[:, codes_bytes + 2:codes_bytes + 4].copy().view("<f2").astype(np.float64)
    shape = ix.shape + (d,)
    return Expected((q * scale + bias).reshape(shape),
                    (np.abs(q * scale) + np.abs(bias)).reshape(shape))
