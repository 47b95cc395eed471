"""The float64 NumPy reference of the quantized family (row-wise quantization bit-exact with
PyTorch / FBGEMM, dequantization, bags over packed rows).  See perfkernels/reference.py."""
from __future__ import annotations

import numpy as np

from perfkernels._reference_base import Expected
from perfkernels.families.embedding.reference import embedding_bag
# the packed-row layout (bytes of a row, codes per byte), shared with the kernels' frontends
from perfkernels.families.quantized.layout import codes_per_byte as _codes_per_byte
from perfkernels.families.quantized.layout import packed_row_bytes
from perfkernels.families.quantized.layout import packed_dim as _packed_dim
from perfkernels.families.quantized.layout import trailer_bytes as _trailer_bytes

__all__ = ["quantize_rowwise", "dequantize_rowwise", "embedding_bag_quantized", "packed_row_bytes"]


def _row_min_max(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's (min, max) as ``[rows, 1]`` float32, reduced in FBGEMM's order.

    The order only decides which zero a row whose min (max) is 0 reports, +0.0 or -0.0, but that
    sign is stored in the packed bias (and an 8-bit scale), so PyTorch's bytes depend on it:
    8 lanes ``m = m < x ? m : x`` over columns ``l, l+8, ...`` of the first ``D // 8 * 8``
    columns, the lanes folded in order with ``m = lane < m ? lane : m``, then the remaining
    columns one by one the same way (max mirrored).
    """
    rows, dim = x.shape
    big = np.finfo(np.float32).max
    body = dim // 8 * 8
    lane_mn = np.full((rows, 8), big, np.float32)
    lane_mx = np.full((rows, 8), -big, np.float32)
    for c in range(0, body, 8):
        block = x[:, c:c + 8]
        lane_mn = np.where(lane_mn < block, lane_mn, block)
        lane_mx = np.where(lane_mx > block, lane_mx, block)
    mn = np.full(rows, big, np.float32)
    mx = np.full(rows, -big, np.float32)
    for col in [lane_mn[:, l] for l in range(8)] if body else []:
        mn = np.where(col < mn, col, mn)
    for col in [lane_mx[:, l] for l in range(8)] if body else []:
        mx = np.where(mx < col, col, mx)
    for c in range(body, dim):
        mn = np.where(x[:, c] < mn, x[:, c], mn)
        mx = np.where(mx < x[:, c], x[:, c], mx)
    return mn[:, None], mx[:, None]


def quantize_rowwise(weight, bits: int = 8) -> np.ndarray:
    """Pack a float32/float16 table row by row, bit-exact with PyTorch's
    ``torch.ops.quantized.embedding_bag_{byte,4bit,2bit}_prepack``.

    ``min`` and ``max`` are the row's, the sign of a zero one as FBGEMM's reduction order gives
    it (:func:`_row_min_max`).
    8-bit row: ``D`` uint8 codes, float32 scale, float32 bias (little-endian), where ``bias =
    min``, ``scale = (max - min) / 255`` and ``q = round_half_even((x - min) * (255 / (max - min +
    1e-8)))``, every operation rounded to float32 as the format does.
    4/2-bit row: ``ceil(D / (8/bits))`` bytes of codes, code ``c`` in byte ``c // (8/bits)`` at bit
    ``(c % (8/bits)) * bits`` (zero codes pad the last byte), then float16 scale and float16
    bias: ``bias = half(min)``, ``scale = half((max - bias) / (2**bits - 1))`` (1 when the range is
    0, or when the fp16 scale is 0 or its reciprocal overflows), ``q = clamp(round_half_even((x -
    bias) * (1 / scale)), 0, 2**bits - 1)``.  A row holding NaN or inf is a ``ValueError``.
    """
    per = _codes_per_byte(bits)
    x = np.asarray(weight).astype(np.float32)
    rows, dim = x.shape
    finite = np.isfinite(x).all(axis=1)
    if not finite.all():
        raise ValueError(f"row {int(np.argmin(finite))} of weight holds NaN or inf")
    f32 = np.float32
    mn, mx = _row_min_max(x)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if bits == 8:
            span = (mx - mn).astype(f32)
            scale = (span / f32(255)).astype(f32)
            inv = (f32(255) / (span + f32(1e-8))).astype(f32)
            codes = np.rint(((x - mn) * inv).astype(f32))
            codes = np.nan_to_num(codes, nan=0.0).astype(np.uint8)
            meta = np.concatenate([scale, mn], axis=1).astype("<f4").view(np.uint8)
            return np.concatenate([codes, meta], axis=1).reshape(rows, dim + 8)
        qmax = (1 << bits) - 1
        bias_h = mn.astype(np.float16)
        bias = bias_h.astype(f32)
        span = (mx - bias).astype(f32)
        scale_h = np.where(span == 0, f32(1), span / f32(qmax)).astype(f32).astype(np.float16)
        scale = scale_h.astype(f32)
        inv = (f32(1) / scale).astype(f32)
        degenerate = (scale == 0) | np.isinf(inv)
        scale_h = np.where(degenerate, np.float16(1), scale_h)
        inv = np.where(degenerate, f32(1), inv)
        codes = np.clip(np.rint(((x - bias) * inv).astype(f32)), 0, qmax)
        codes = np.nan_to_num(codes, nan=0.0).astype(np.uint8)
    nbytes = -(-dim // per)
    padded = np.zeros((rows, nbytes * per), np.uint8)
    padded[:, :dim] = codes
    packed = np.zeros((rows, nbytes), np.uint8)
    for k in range(per):
        packed |= padded[:, k::per] << (k * bits)
    meta = np.concatenate([scale_h, bias_h], axis=1).astype("<f2").view(np.uint8)
    return np.concatenate([packed, meta], axis=1).reshape(rows, nbytes + 4)


def _unpack(packed, bits: int, dim: int | None):
    """(codes as float64 [rows, dim], scale [rows, 1], bias [rows, 1]) of a packed table."""
    per = _codes_per_byte(bits)
    p = np.ascontiguousarray(np.asarray(packed, dtype=np.uint8))
    meta_bytes = _trailer_bytes(bits)
    if dim is None:
        dim = _packed_dim(p.shape[1], bits)
    nbytes = packed_row_bytes(dim, bits) - meta_bytes
    meta = p[:, nbytes:nbytes + meta_bytes].copy().view("<f4" if bits == 8 else "<f2")
    meta = meta.astype(np.float64)
    if bits == 8:
        codes = p[:, :dim].astype(np.float64)
    else:
        c = np.arange(dim)
        codes = ((p[:, c // per] >> ((c % per) * bits)) & ((1 << bits) - 1)).astype(np.float64)
    return codes, meta[:, :1], meta[:, 1:2]


def dequantize_rowwise(packed, bits: int = 8, dim: int | None = None) -> np.ndarray:
    """``x = q * scale + bias`` in float64, ``[rows, dim]``.

    ``dim`` defaults to every code the row holds (for 4/2-bit tables whose D is not a multiple of
    ``8/bits``, pass the real D).
    """
    codes, scale, bias = _unpack(packed, bits, dim)
    return codes * scale + bias


def embedding_bag_quantized(packed, indices, offsets=None, *, bits: int = 8, dim: int | None = None,
                            **kwargs) -> Expected:
    """:func:`embedding_bag` over the dequantized table (every keyword of it applies)."""
    return embedding_bag(dequantize_rowwise(packed, bits, dim), indices, offsets, **kwargs)
