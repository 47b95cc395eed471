"""Reading torchao's weight-only quantized embedding tables into perfkernels' packed rows.

torchao (``quantize_`` with ``IntxWeightOnlyConfig`` or ``Int8WeightOnlyConfig``) replaces a
module's ``weight`` with a tensor subclass holding int8 codes ``qdata``, float ``scale`` and int8
``zero_point`` per block (``block_size``; torchao 0.17 and older: an ``AffineQuantizedTensor``
whose ``tensor_impl.get_plain()`` gives them), and dequantizes it as
``(qdata - zero_point) * scale`` in the weight's dtype.  Nothing here imports torchao: the
tensors are read through those attributes, so torchao stays an optional package.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import Tensor

from ..families.quantized.layout import check_bits, codes_per_byte

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def is_torchao_weight(weight) -> bool:
    """Whether ``weight`` is one of torchao's quantized tensor subclasses (by its module name, so
    that torchao need not be imported)."""
    return isinstance(weight, Tensor) and type(weight).__module__.split(".")[0] == "torchao"


def _granularity(block_size, shape) -> str:
    rows, dim = shape
    b0, b1 = block_size
    if b1 == dim:
        return "PerTensor()" if b0 == rows else "PerAxis(0)"
    return f"PerGroup({b1})" if b0 == 1 else f"block_size={tuple(block_size)}"


_INT_BOUNDS = {torch.int8: (-128, 127), torch.uint8: (0, 255)}


def _qrange(weight: Tensor, codes: Tensor) -> tuple[int, int]:
    """The code range [qmin, qmax]: the target dtype's (torch.int1 ... torch.int8) of the
    tensors of torchao's ``quantize_`` API, ``quant_min`` / ``quant_max`` (default: the codes'
    dtype's range) of an ``AffineQuantizedTensor``."""
    kind = type(weight).__name__
    target = getattr(weight, "target_dtype", None)
    if target is not None:
        bits = {getattr(torch, f"int{n}", None): n for n in range(1, 9)}.get(target)
        if bits is None:
            raise ValueError(f"torchao weight of {kind} has target dtype {target}; perfkernels "
                             f"reads torch.int1 ... torch.int8 codes")
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    default = _INT_BOUNDS.get(codes.dtype)
    qmin, qmax = getattr(weight, "quant_min", None), getattr(weight, "quant_max", None)
    if default is None and (qmin is None or qmax is None):
        raise ValueError(f"torchao weight of {kind} holds {codes.dtype} codes without a range")
    qmin = default[0] if qmin is None else int(qmin)
    qmax = default[1] if qmax is None else int(qmax)
    if not 0 < qmax - qmin <= 255:
        raise ValueError(f"torchao weight of {kind} has codes in [{qmin}, {qmax}]; perfkernels "
                         f"reads at most 8-bit codes")
    return qmin, qmax


def _parts(weight: Tensor):
    """(codes, scale, zero_point or None, block_size) of one of torchao's quantized tensors:
    the attributes of the ``quantize_`` API's tensors (``IntxUnpackedToInt8Tensor``,
    ``Int8Tensor``), or ``tensor_impl.get_plain()`` of an ``AffineQuantizedTensor`` (torchao's
    older configs) in its plain layout with integer zero points."""
    kind = type(weight).__name__
    if not is_torchao_weight(weight):
        raise TypeError(f"expected a weight quantized by torchao (IntxUnpackedToInt8Tensor, "
                        f"Int8Tensor, AffineQuantizedTensor); got {kind}")
    impl = getattr(weight, "tensor_impl", None)
    if impl is not None and hasattr(impl, "get_plain"):
        layout = type(getattr(weight, "_layout", None)).__name__
        if layout != "PlainLayout":
            raise ValueError(f"torchao weight of {kind} has layout {layout}; perfkernels reads "
                             f"the plain layout (codes, scale and zero point per block)")
        domain = getattr(getattr(weight, "zero_point_domain", None), "name", "INT")
        if domain == "FLOAT":
            raise ValueError(f"torchao weight of {kind} has float zero points "
                             f"(ZeroPointDomain.FLOAT); perfkernels reads integer zero points")
        codes, scale, zero_point = impl.get_plain()
        return codes, scale, None if domain == "NONE" else zero_point, weight.block_size
    if not all(hasattr(weight, a) for a in ("qdata", "scale", "block_size")):
        raise TypeError(f"expected a weight quantized by torchao with qdata / scale / "
                        f"zero_point / block_size; got {kind}")
    return weight.qdata, weight.scale, getattr(weight, "zero_point", None), weight.block_size


def read_torchao_weight(weight: Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """The codes (int64 [rows, D]), per-row float32 scales and int64 zero points of a torchao
    quantized 2-D table with one scale per row (or per tensor), and its code range.

    ValueError naming the problem for anything else: a granularity finer than a row
    (``PerGroup``), float zero points, a packed layout, a non-2-D weight.  (Activation
    quantization settings are ignored, as torchao's embedding ignores them: it dequantizes the
    weight.)"""
    kind = type(weight).__name__
    qdata, scale, zero_point, block = _parts(weight)
    if qdata.dim() != 2 or qdata.dtype not in _INT_BOUNDS:
        raise ValueError(f"torchao weight of {kind} must hold 2-D int8 or uint8 codes (an "
                         f"embedding table); got {qdata.dtype} of shape {tuple(qdata.shape)}")
    rows, dim = qdata.shape
    block = tuple(int(b) for b in block)
    if len(block) != 2 or block[1] != dim or block[0] < 1 or rows % block[0]:
        raise ValueError(
            f"torchao weight of {kind} is quantized with granularity "
            f"{_granularity(block, (rows, dim))} (block_size={block} for a {rows} x {dim} "
            f"table): perfkernels' rows hold one scale and bias per row; quantize with "
            f"granularity=PerAxis(0) (IntxWeightOnlyConfig) or PerRow() (Int8WeightOnlyConfig)")
    scale = scale.detach().cpu()
    if scale.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"torchao weight of {kind} has {scale.dtype} scales; expected float")
    scale = scale.float().reshape(-1).numpy()             # exact: fp16 / bf16 widen to float32
    if zero_point is None:
        zp = np.zeros(scale.shape, np.int64)
    else:
        zero_point = zero_point.detach().cpu().reshape(-1)
        # float zero points holding integers (AffineQuantizedTensor's symmetric zeros) are read
        # as the integers they hold; others are not codes' offsets
        if zero_point.dtype.is_floating_point and not torch.equal(zero_point,
                                                                   zero_point.round()):
            raise ValueError(f"torchao weight of {kind} has non-integer float zero points "
                             f"({zero_point.dtype}); perfkernels reads integer zero points "
                             f"(torchao's default IntxChooseQParamsAlgorithm.AFFINE)")
        zp = zero_point.to(torch.int64).numpy()
    if scale.shape[0] * block[0] != rows or zp.shape != scale.shape:
        raise ValueError(f"torchao weight of {kind} has {scale.shape[0]} scales and "
                         f"{zp.shape[0]} zero points for {rows} rows in blocks of {block[0]}")
    scale = np.repeat(scale, block[0])
    zp = np.repeat(zp, block[0])
    qmin, qmax = _qrange(weight, qdata)
    codes = qdata.detach().cpu().to(torch.int64).numpy()
    return codes, scale, zp, qmin, qmax


def _pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned codes [rows, D] in our byte layout (lowest bits first, the last byte padded with
    zero codes)."""
    rows, dim = codes.shape
    per = codes_per_byte(bits)
    padded = np.zeros((rows, -(-dim // per) * per), np.uint8)
    padded[:, :dim] = codes
    padded = padded.reshape(rows, -1, per)
    out = np.zeros(padded.shape[:2], np.uint8)
    for j in range(per):
        out |= padded[:, :, j] << np.uint8(j * bits)
    return out


def check_module(mod: torch.nn.Module) -> None:
    """ValueError for a module whose forward the quantized modules would not reproduce
    (``max_norm`` renormalises the rows it looks up)."""
    if getattr(mod, "max_norm", None) is not None:
        raise ValueError(f"{type(mod).__name__} has max_norm={mod.max_norm}, which renormalises "
                         f"the rows it looks up; the quantized modules return rows as stored")


def packed_from_torchao(weight: Tensor, bits: Optional[int] = None) -> tuple[Tensor, int]:
    """torchao's quantized table as packed uint8 rows, and their bit width.

    ``bits=8`` (the default): 8-bit rows with float32 scale and bias, for any torchao width
    (int1 ... int8).  The codes are stored as ``q - zero_point + k`` with ``bias = -k * scale``;
    ``k`` is a power of two (or 0) wherever the row's range allows one, so the bias is exact and
    ``code * scale + bias`` (one FMA) is torchao's ``(q - zero_point) * scale`` bit for bit.
    Only 8-bit codes quantized asymmetrically use all 256 codes and force ``k = zero_point + 128``;
    then the bias is rounded to float32.

    ``bits=4`` or ``2``: our compact rows, for codes of at most that many bits (codes
    ``q - qmin``): the scale and the bias ``(qmin - zero_point) * scale`` are rounded to float16,
    so the values move by up to float16's rounding of them (ValueError if either overflows)."""
    codes, scale, zp, qmin, qmax = read_torchao_weight(weight)
    rows, dim = codes.shape
    width = (qmax - qmin).bit_length()
    bits = 8 if bits is None else check_bits(bits)
    if bits == 8:
        kmin = zp - qmin                    # the smallest k with q - zp + k >= 0
        kmax = 255 - (qmax - zp)            # the largest with q - zp + k <= 255
        pow2 = np.where(kmin <= 0, 0, 2.0 ** np.ceil(np.log2(np.maximum(kmin, 1)))).astype(
            np.int64)
        k = np.where(pow2 <= kmax, pow2, kmin)
        q = codes - zp[:, None] + k[:, None]
        if q.size and (q.min() < 0 or q.max() > 255):
            raise ValueError("torchao weight holds codes outside its target dtype's range "
                             f"[{qmin}, {qmax}]")
        bias = -(k.astype(np.float32) * scale)          # float32: exact when k is 2**n or 0
        tail = np.stack([scale, bias], axis=1).astype(np.float32)
        packed = np.concatenate([q.astype(np.uint8), tail.view(np.uint8)], axis=1)
    else:
        if width > bits:
            raise ValueError(f"torchao weight holds {width}-bit codes (range [{qmin}, {qmax}]); "
                             f"bits={bits} rows hold at most {bits}-bit codes: use bits=8, or "
                             f"quantize with weight_dtype=torch.int{bits}")
        q = codes - qmin
        if q.size and (q.min() < 0 or q.max() > qmax - qmin):
            raise ValueError("torchao weight holds codes outside its target dtype's range "
                             f"[{qmin}, {qmax}]")
        bias64 = (qmin - zp).astype(np.float64) * scale.astype(np.float64)
        with np.errstate(over="ignore"):
            tail = np.stack([scale, bias64], axis=1).astype(np.float16)
        if not np.isfinite(tail).all():
            raise ValueError(f"torchao weight's scales or biases overflow float16 (bits={bits} "
                             f"rows store them as float16; use bits=8)")
        packed = np.concatenate([_pack_codes(q, bits), tail.view(np.uint8)], axis=1)
    return torch.from_numpy(np.ascontiguousarray(packed).reshape(rows, -1)), bits
