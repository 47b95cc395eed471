"""perfkernels.cuda: the kernels of perfkernels on the GPU (CUDA C++, compiled at first use with
NVRTC through CuPy; ``pip install perfkernels[cuda]``).

The same functions, semantics and errors as the CPU API, on GPU arrays: CuPy arrays and anything
with ``__cuda_array_interface__`` or ``__dlpack__`` (PyTorch CUDA tensors are read without a copy;
bfloat16 tensors too).  Results are CuPy arrays (``torch.from_dlpack(result)`` gives a tensor
without a copy).  Every kernel runs on CuPy's current stream (``cupy.cuda.get_current_stream()``);
to share PyTorch's stream, wrap calls in
``with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):``.

Functions that check indices or offsets (the embedding bags) synchronise the stream once, to raise
``IndexError`` / ``ValueError`` on the host; nothing outside the arrays is ever read and ``out=`` is
left untouched on error.  The others are asynchronous.

bfloat16: arrays of dtype ``ml_dtypes.bfloat16`` when this CuPy supports that dtype; otherwise
``float_to_bfloat16`` returns (and ``bfloat16_to_float`` accepts) uint16 arrays of the bits.

This module always imports; :func:`is_available` says whether a kernel can run here, and a kernel
called without CuPy or a device raises ``RuntimeError`` saying which is missing.
"""
from __future__ import annotations

from . import _runtime

__all__ = [
    "is_available", "unavailable_reason",
    "embedding_bag", "embedding_bag_quantized", "quantize_rowwise", "dequantize_rowwise",
    "float_to_half", "half_to_float", "float_to_bfloat16", "bfloat16_to_float",
    "lstm_unit", "lstm_unit_backward",
]


def is_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device (never raises)."""
    return _runtime.is_available()


def unavailable_reason() -> str:
    """Why :func:`is_available` is False (no CuPy, CuPy broken, no driver or no device), else ""."""
    return _runtime.unavailable_reason()


def embedding_bag(weight, indices, offsets=None, *, lengths=None, per_sample_weights=None,
                  mode="sum", include_last_offset=False, padding_idx=None,
                  positional_weights=False, out=None):
    """Sum (or mean) of table rows per bag on the GPU: ``out[b] = sum_j w_j * weight[indices[j]]``.

    Same semantics and errors as :func:`perfkernels.embedding_bag` (docs/semantics.md).  A warp,
    or a part of one for small D, handles a bag: it loads the bag's indices cooperatively,
    broadcasts them with warp shuffles and gathers rows with 16-byte loads, accumulating in
    float32.

    Parameters
    ----------
    weight : GPU array [rows, D] of float32, float16 or bfloat16
    indices : GPU array of int32 or int64, 1-D (with offsets or lengths) or 2-D [B, L]
    offsets : GPU array of int32 or int64 [B] (or [B + 1] with include_last_offset), optional
        PyTorch's convention: bag b is ``indices[offsets[b]:offsets[b + 1]]``.
    lengths : GPU array of int32 or int64 [B], optional
        caffe2's convention: bag b is the next ``lengths[b]`` indices.
    per_sample_weights : GPU array of float32, optional
        One weight per index (indices' shape), or with ``positional_weights=True`` one per
        position inside a bag (at least the longest bag's length).
    mode : "sum" or "mean"
        "mean" multiplies the sum by 1 / (number of non-padding entries), as caffe2 does;
        an empty bag is a row of zeros in every mode.
    include_last_offset : bool
    padding_idx : int, optional
        Entries equal to it are skipped and not counted by "mean" (negative counts from the end).
    out : GPU array of float32 [B, D], optional
        Written in place and returned; left untouched on any error.

    Returns
    -------
    cupy.ndarray of float32 [B, D]

    Raises
    ------
    TypeError for a wrong dtype or a host array; ValueError for bad shapes, offsets or lengths;
    IndexError naming the first out-of-range position and its value; RuntimeError without a GPU.
    """
    from ..families.embedding import _cuda as _bags
    table, fmt = _bags.float_table(weight)
    rows, dim = int(table.shape[0]), int(table.shape[1])
    return _bags.run(table, fmt, rows, dim, dim * table.itemsize, 0, indices, offsets, lengths,
                     per_sample_weights, mode, include_last_offset, padding_idx,
                     positional_weights, out, (table,))


def embedding_bag_quantized(packed, indices, offsets=None, *, bits=8, dim=None, lengths=None,
                            per_sample_weights=None, mode="sum", include_last_offset=False,
                            padding_idx=None, positional_weights=False, out=None):
    """:func:`embedding_bag` on a row-wise quantized table made by :func:`quantize_rowwise`.

    8-bit rows are D codes + float32 scale + float32 bias; 4- and 2-bit rows are packed codes +
    float16 scale + float16 bias (docs/semantics.md).  Each row adds ``(w*scale) * q + (w*bias)``
    to the float32 accumulator, as FBGEMM does.  Same semantics, keywords and errors as
    :func:`perfkernels.embedding_bag_quantized`.

    Parameters
    ----------
    packed : GPU array of uint8 [rows, row bytes]
    bits : 8, 4 or 2
    dim : int, optional
        D, for 4- and 2-bit tables whose last byte is padding (default: every code slot is used).
    (the other parameters as :func:`embedding_bag`)

    Returns
    -------
    cupy.ndarray of float32 [B, D]
    """
    from ..families.embedding import _cuda as _bags
    table, fmt, d, meta_off = _bags.quantized_table(packed, bits, dim)
    rows = int(table.shape[0])
    return _bags.run(table, fmt, rows, d, int(table.shape[1]), meta_off, indices, offsets,
                     lengths, per_sample_weights, mode, include_last_offset, padding_idx,
                     positional_weights, out, (table,))


def quantize_rowwise(weight, bits=8):
    """Quantize each row of a float32 or float16 table to ``bits`` (8, 4 or 2) on the GPU.

    Bit-exact with :func:`perfkernels.quantize_rowwise` and with
    ``torch.ops.quantized.embedding_bag_{byte,4bit,2bit}_prepack``.

    Returns
    -------
    cupy.ndarray of uint8 [rows, D + 8] (8-bit) or [rows, ceil(D * bits / 8) + 4] (4-, 2-bit)
    """
    from ..families.quantized import _cuda as _quantize
    return _quantize.quantize(weight, bits)


def dequantize_rowwise(packed, bits=8, *, dim=None):
    """Expand a packed table back to float32: ``x = q * scale + bias`` (one FMA).

    Parameters
    ----------
    packed : GPU array of uint8 [rows, row bytes]
    bits : 8, 4 or 2
    dim : int, optional
        D for 4- and 2-bit rows whose last byte is padding.

    Returns
    -------
    cupy.ndarray of float32 [rows, D]
    """
    from ..families.quantized import _cuda as _quantize
    return _quantize.dequantize(packed, bits, dim)


def float_to_half(x, out=None, *, clip=False):
    """float32 -> float16 on the GPU, bit-exact with ``x.astype(numpy.float16)`` for every input
    (round to nearest even, subnormals kept, NaN payload as NumPy); ``clip=True`` saturates to
    +-65504 (infinities included) as FBGEMM's ``do_clip``.  ``out`` (float16, x's shape) is written
    in place and returned.  Returns a cupy.ndarray of float16."""
    from ..families.convert import _cuda as _convert
    return _convert.narrow(x, out, _convert.FLOAT_TO_HALF, clip)


def half_to_float(h, out=None):
    """float16 -> float32 on the GPU, exact for all 65,536 bit patterns (NaN payloads kept).
    Returns a cupy.ndarray of float32 of h's shape."""
    from ..families.convert import _cuda as _convert
    return _convert.widen(h, out, _convert.HALF_TO_FLOAT)


def float_to_bfloat16(x, out=None):
    """float32 -> bfloat16 on the GPU, round to nearest even, NaN -> the quiet NaN with x's sign;
    bit-exact with ``x.astype(ml_dtypes.bfloat16)``.  Returns a cupy.ndarray of
    ``ml_dtypes.bfloat16`` where CuPy supports that dtype, else of uint16 holding the bits."""
    from ..families.convert import _cuda as _convert
    return _convert.narrow(x, out, _convert.FLOAT_TO_BF16)


def bfloat16_to_float(b, out=None):
    """bfloat16 -> float32 on the GPU, exactly.  ``b``: a GPU array of ``ml_dtypes.bfloat16``, a
    PyTorch bfloat16 CUDA tensor, or uint16 bits.  Returns a cupy.ndarray of float32."""
    from ..families.convert import _cuda as _convert
    return _convert.widen(b, out, _convert.BF16_TO_FLOAT)


def lstm_unit(h_prev, c_prev, gates, *, seq_lengths=None, t=0, forget_bias=0.0,
              drop_states=False, gate_order="ifog"):
    """The LSTM cell's pointwise step on the GPU (caffe2 LSTMUnit; docs/semantics.md).

    ``h_prev, c_prev``: [N, D] float32; ``gates``: [N, 4D] float32 in ``gate_order`` ("ifog",
    caffe2's, or "ifgo", PyTorch LSTMCell's).  Rows with ``t >= seq_lengths[n]`` carry
    ``(h_prev, c_prev)`` through, or zeros with ``drop_states``.  sigmoid and tanh are CUDA's
    ``expf`` / ``tanhf`` (2 ulp), never NaN for finite inputs.

    Returns
    -------
    (h, c) : cupy.ndarray of float32 [N, D]
    """
    from ..families.lstm import _cuda as _lstm
    return _lstm.forward(h_prev, c_prev, gates, seq_lengths, t, forget_bias, drop_states, gate_order)


def lstm_unit_backward(c_prev, gates, c, dh, dc, *, seq_lengths=None, t=0, forget_bias=0.0,
                       drop_states=False, gate_order="ifog"):
    """Gradient of :func:`lstm_unit` (caffe2 LSTMUnitGradient; docs/semantics.md) on the GPU.

    Returns
    -------
    (dh_prev, dc_prev, dgates) : cupy.ndarray of float32 [N, D], [N, D], [N, 4D]
        ``dh_prev`` is zero for valid rows (h_prev's gradient flows through the gates' FC).
    """
    from ..families.lstm import _cuda as _lstm
    return _lstm.backward(c_prev, gates, c, dh, dc, seq_lengths, t, forget_bias, drop_states,
                          gate_order)
