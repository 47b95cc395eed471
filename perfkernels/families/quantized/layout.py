"""The packed-row layout of the row-wise quantized tables, and its checks: written once, for the
NumPy, CUDA and torch frontends and the reference (the C side is ``pk_quantized_row_bytes`` in
include/perfkernels/quantized.h; tests/test_quantized.py checks that the two agree).

A packed row is its codes, then its scale and bias: ``D`` uint8 codes and two float32 for 8-bit
rows (``D + 8`` bytes); ``ceil(D / (8 // bits))`` bytes of 4- or 2-bit codes (lowest bits first)
and two float16 for 4- and 2-bit rows (``+ 4`` bytes).  Pure Python, imports nothing compiled.
"""
from __future__ import annotations

import numpy as np

BITS: tuple[int, ...] = (8, 4, 2)
#: codes per byte and bytes of scale + bias (two float32 for 8-bit rows, two float16 otherwise)
_PER = {8: 1, 4: 2, 2: 4}
_TRAILER = {8: 8, 4: 4, 2: 4}
#: the largest array size (Py_ssize_t)
_SIZE_MAX = 2 ** 63 - 1


def check_bits(bits) -> int:
    """``bits`` as an int, or ValueError naming it."""
    if isinstance(bits, bool) or bits not in _PER:
        raise ValueError(f"bits must be 8, 4 or 2; got {bits!r}")
    return int(bits)


def codes_per_byte(bits) -> int:
    return _PER[check_bits(bits)]


def trailer_bytes(bits) -> int:
    """Bytes of a row's scale and bias."""
    return _TRAILER[check_bits(bits)]


def packed_row_bytes(dim: int, bits) -> int:
    """Bytes of one packed row of ``dim`` values."""
    bits = check_bits(bits)
    return -(-dim // _PER[bits]) + _TRAILER[bits]


def _layout(bits: int) -> str:
    return ("D uint8 codes + float32 scale + float32 bias" if bits == 8 else
            f"ceil(D/{_PER[bits]}) bytes of {bits}-bit codes + float16 scale + float16 bias")


def packed_dim(width: int, bits, dim=None) -> int:
    """The embedding dimension D of packed rows ``width`` bytes wide: ``dim`` when given (checked
    against the width), else the largest D the width holds.  ValueError naming the bad value."""
    bits = check_bits(bits)
    trailer = _TRAILER[bits]
    if width <= trailer:
        raise ValueError(f"packed rows of {width} bytes are too short for {bits}-bit rows "
                         f"({_layout(bits)})")
    if (width - trailer) * _PER[bits] > _SIZE_MAX:   # D past any array (a C size would overflow)
        raise ValueError(f"packed rows of {width} bytes hold more than {_SIZE_MAX} {bits}-bit "
                         f"values: too wide for a {bits}-bit table")
    if dim is None:
        return (width - trailer) * _PER[bits]
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise ValueError(f"dim must be a positive integer; got {dim!r}")
    d = int(dim)
    expected = packed_row_bytes(d, bits)
    if expected != width:
        raise ValueError(f"packed rows of {width} bytes do not hold dim={d} with bits={bits} "
                         f"(expected {expected} bytes: {_layout(bits)})")
    return d
