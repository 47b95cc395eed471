"""Reference implementations of every perfkernels kernel, in plain NumPy.

These are the oracles the tests (CPU and CUDA) and ``python -m perfkernels check`` compare the
kernels with.  They are written from the kernels' documented semantics (docs/semantics.md), not
from the kernels, and import nothing but NumPy, ml_dtypes and the pure-Python packed-row layout
(``perfkernels/families/quantized/layout.py``), so they can be read, and trusted,
on their own:

- sums are taken in float64 and returned with the sum of the absolute values of their terms
  (:class:`Expected`), because a float32 kernel's rounding error is bounded by a multiple of that
  magnitude, not of the result (a sum of large terms that cancel is only known to that precision);
- where a format is shared with PyTorch bit for bit (row-wise quantization, fp16/bf16 conversion)
  the reference reproduces those bits, computing in float32 exactly where the format rounds in
  float32.

Inputs are assumed valid (the kernels' argument checks are tested separately), except that an
out-of-range index raises the kernels' ``IndexError`` instead of wrapping around as NumPy's
indexing would.

Adding a reference for a new kernel: one function here named like the public function, taking the
same arguments (minus ``out=`` and thread options), returning float64 arrays (or :class:`Expected`
for sums) or exact arrays for bit-exact formats, with a docstring stating the semantics; reuse
:func:`bag_bounds` / :func:`embedding_bag` for anything bag-shaped, and compare with
:func:`assert_close` / :func:`assert_same_bits`.
"""
from __future__ import annotations

from typing import NamedTuple

import ml_dtypes
import numpy as np

# the packed-row layout (bytes of a row, codes per byte), shared with the kernels' frontends
from .families.quantized.layout import codes_per_byte as _codes_per_byte
from .families.quantized.layout import packed_row_bytes
from .families.quantized.layout import packed_dim as _packed_dim
from .families.quantized.layout import trailer_bytes as _trailer_bytes

__all__ = [
    "Expected", "bag_bounds", "embedding_bag",
    "quantize_rowwise", "dequantize_rowwise", "embedding_bag_quantized", "packed_row_bytes",
    "embedding_bags_multi",
    "float_to_half", "half_to_float", "float_to_bfloat16", "bfloat16_to_float",
    "lstm_unit", "lstm_unit_backward",
    "TableUpdate", "embedding_bag_table_gradient", "embedding_bag_backward_update",
    "tolerance", "max_excess", "assert_close", "assert_same_bits",
]

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


class Expected(NamedTuple):
    """A float64 result and, element by element, the sum of the absolute values of its terms.

    Unpacks as ``value, magnitude = reference.embedding_bag(...)``; :func:`assert_close` takes it
    whole and scales its tolerance by ``magnitude``.
    """
    value: np.ndarray
    magnitude: np.ndarray


# ---------------------------------------------------------------------------------------------
# embedding bags
# ---------------------------------------------------------------------------------------------

def bag_bounds(num_indices: int, offsets=None, lengths=None, include_last_offset: bool = False,
               shape2d: tuple[int, int] | None = None) -> list[tuple[int, int]]:
    """``[(begin, end), ...]``: the half-open range of (flattened) indices of each bag.

    Exactly one convention applies: ``shape2d = (B, L)`` (2-D indices: B bags of L), ``lengths``
    (caffe2: bag b is the next ``lengths[b]`` indices) or ``offsets`` (PyTorch: bag b is
    ``[offsets[b], offsets[b+1])``, the last bag ending at ``num_indices`` unless
    ``include_last_offset``, where the last offset is that end and is not a bag).
    """
    if shape2d is not None:
        num_bags, length = shape2d
        return [(b * length, (b + 1) * length) for b in range(num_bags)]
    if lengths is not None:
        ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
        begins = ends - np.asarray(lengths, dtype=np.int64)
        return [(int(b), int(e)) for b, e in zip(begins, ends)]
    bounds = [int(o) for o in np.asarray(offsets).reshape(-1)]
    if not include_last_offset:
        bounds.append(num_indices)
    return list(zip(bounds[:-1], bounds[1:]))


def _check_indices(flat: np.ndarray, rows: int) -> None:
    bad = np.flatnonzero((flat < 0) | (flat >= rows))
    if bad.size:
        j = int(bad[0])
        raise IndexError(f"indices[{j}] = {int(flat[j])} is out of range for a table of {rows} rows")


def embedding_bag(weight, indices, offsets=None, *, lengths=None, per_sample_weights=None,
                  mode: str = "sum", include_last_offset: bool = False, padding_idx=None,
                  positional_weights: bool = False) -> Expected:
    """Pooled rows of ``weight`` (any float dtype, or a float64 table): ``Expected([B, D], ...)``.

    ``out[b] = sum over j in bag b of w_j * weight[indices[j]]`` in float64, where ``w_j`` is 1,
    ``per_sample_weights[j]`` or, with ``positional_weights``, ``per_sample_weights[j - begin of
    the bag]``.  Entries equal to ``padding_idx`` (negative: counted from the end) are skipped and
    not counted; ``mode="mean"`` divides a bag by its count of remaining entries, and an empty bag
    is zeros in every mode.  2-D ``indices`` without offsets or lengths are ``B`` bags of ``L``.
    """
    table = np.asarray(weight).astype(np.float64)
    rows, dim = table.shape
    idx = np.asarray(indices)
    shape2d = idx.shape if idx.ndim == 2 and offsets is None and lengths is None else None
    flat = idx.reshape(-1).astype(np.int64)
    _check_indices(flat, rows)
    bounds = bag_bounds(flat.size, offsets, lengths, include_last_offset, shape2d)
    pad = None if padding_idx is None else int(padding_idx) + (rows if padding_idx < 0 else 0)
    psw = (None if per_sample_weights is None
           else np.asarray(per_sample_weights, dtype=np.float64).reshape(-1))

    value = np.zeros((len(bounds), dim))
    magnitude = np.zeros((len(bounds), dim))
    for b, (begin, end) in enumerate(bounds):
        entries = np.arange(begin, end)
        entries = entries[flat[entries] != pad] if pad is not None else entries
        if entries.size == 0:
            continue
        if psw is None:
            w = np.ones(entries.size)
        else:
            w = psw[entries - begin] if positional_weights else psw[entries]
        terms = w[:, None] * table[flat[entries]]
        value[b] = terms.sum(axis=0)
        magnitude[b] = np.abs(terms).sum(axis=0)
        if mode == "mean":
            value[b] /= entries.size
            magnitude[b] /= entries.size
    return Expected(value, magnitude)


# ---------------------------------------------------------------------------------------------
# row-wise quantized tables (the caffe2 / FBGEMM "fused rowwise" layouts)
# ---------------------------------------------------------------------------------------------



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


# ---------------------------------------------------------------------------------------------
# fp16 / bf16 conversion: round to nearest even, NaN stays NaN (NumPy's and ml_dtypes' casts)
# ---------------------------------------------------------------------------------------------

def float_to_half(x, clip: bool = False) -> np.ndarray:
    """float32 -> float16 as NumPy's ``astype`` (NaN payloads as NumPy keeps them); ``clip=True``
    saturates finite overflow and infinities to +-65504 instead of +-inf."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(all="ignore"):
        if clip:
            x = np.where(np.isnan(x), x, np.clip(x, np.float32(-65504), np.float32(65504)))
        return x.astype(np.float16)


def half_to_float(h) -> np.ndarray:
    """float16 -> float32, exact for every bit pattern."""
    return np.asarray(h, dtype=np.float16).astype(np.float32)


def float_to_bfloat16(x) -> np.ndarray:
    """float32 -> ``ml_dtypes.bfloat16``, round to nearest even on the upper 16 bits."""
    with np.errstate(all="ignore"):
        return np.asarray(x, dtype=np.float32).astype(BFLOAT16)


def bfloat16_to_float(b) -> np.ndarray:
    """``ml_dtypes.bfloat16`` -> float32, exact."""
    return np.asarray(b, dtype=BFLOAT16).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# LSTM unit (caffe2 LSTMUnit / LSTMUnitGradient)
# ---------------------------------------------------------------------------------------------

GATE_ORDERS = ("ifog", "ifgo")


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _activations(gates, forget_bias, gate_order):
    """(i, f, o, g) in float64: sigmoid of the input/forget/output blocks, tanh of the candidate."""
    if gate_order not in GATE_ORDERS:
        raise ValueError(f"gate_order must be one of {GATE_ORDERS}; got {gate_order!r}")
    gates = np.asarray(gates, dtype=np.float64)
    d = gates.shape[1] // 4
    block = {name: gates[:, k * d:(k + 1) * d] for k, name in enumerate(gate_order)}
    fb = float(np.float32(forget_bias))           # the kernels take forget_bias as float32
    return (_sigmoid(block["i"]), _sigmoid(block["f"] + fb), _sigmoid(block["o"]),
            np.tanh(block["g"]))


def _valid_rows(n: int, seq_lengths, t: int) -> np.ndarray:
    if seq_lengths is None:
        return np.ones((n, 1), bool)
    return (int(t) < np.asarray(seq_lengths, dtype=np.int64).reshape(-1))[:, None]


def lstm_unit(h_prev, c_prev, gates, *, seq_lengths=None, t: int = 0, forget_bias: float = 0.0,
              drop_states: bool = False, gate_order: str = "ifog") -> tuple[np.ndarray, np.ndarray]:
    """``(h, c)`` in float64.

    Gate blocks of ``gates [N, 4D]`` in ``gate_order`` (caffe2 ``"ifog"``, PyTorch LSTMCell
    ``"ifgo"``): ``i, f, o = sigmoid(X_i), sigmoid(X_f + forget_bias), sigmoid(X_o)``,
    ``g = tanh(X_g)``, ``c = f * c_prev + i * g``, ``h = o * tanh(c)`` for valid rows (``t <
    seq_lengths[n]``, or every row without ``seq_lengths``); invalid rows carry ``h_prev, c_prev``
    through, or are zeros with ``drop_states``.
    """
    h_prev, c_prev = (np.asarray(a, dtype=np.float64) for a in (h_prev, c_prev))
    i, f, o, g = _activations(gates, forget_bias, gate_order)
    c = f * c_prev + i * g
    h = o * np.tanh(c)
    valid = _valid_rows(len(h_prev), seq_lengths, t)
    keep_h, keep_c = (np.zeros_like(h), np.zeros_like(c)) if drop_states else (h_prev, c_prev)
    return np.where(valid, h, keep_h), np.where(valid, c, keep_c)


def lstm_unit_backward(c_prev, gates, c, dh, dc, *, seq_lengths=None, t: int = 0,
                       forget_bias: float = 0.0, drop_states: bool = False,
                       gate_order: str = "ifog") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dh_prev, dc_prev, dgates)`` in float64, caffe2's LSTMUnitGradient.

    Valid rows: ``tc = tanh(c)``, ``dct = dc + dh * o * (1 - tc^2)``, ``dc_prev = dct * f``,
    ``dh_prev = 0`` (h_prev's gradient flows through the gates' FC layer), and ``dgates`` in
    ``gate_order``: ``di = dct * g * i(1-i)``, ``df = dct * c_prev * f(1-f)``,
    ``do = dh * tc * o(1-o)``, ``dg = dct * i * (1-g^2)``.  Invalid rows: ``dgates = 0`` and
    ``(dh_prev, dc_prev) = (dh, dc)``, or zeros with ``drop_states``.
    """
    c_prev, c, dh, dc = (np.asarray(a, dtype=np.float64) for a in (c_prev, c, dh, dc))
    i, f, o, g = _activations(gates, forget_bias, gate_order)
    tc = np.tanh(c)
    dct = dc + dh * o * (1 - tc * tc)
    grads = {"i": dct * g * i * (1 - i), "f": dct * c_prev * f * (1 - f),
             "o": dh * tc * o * (1 - o), "g": dct * i * (1 - g * g)}
    dgates = np.concatenate([grads[name] for name in gate_order], axis=1)
    valid = _valid_rows(len(c_prev), seq_lengths, t)
    zeros = np.zeros_like(dh)
    keep_dh, keep_dc = (zeros, zeros) if drop_states else (dh, dc)
    return (np.where(valid, zeros, keep_dh), np.where(valid, dct * f, keep_dc),
            np.where(valid, dgates, 0.0))


# ---------------------------------------------------------------------------------------------
# training: embedding-bag backward fused with a sparse optimizer step
# ---------------------------------------------------------------------------------------------

def embedding_bag_table_gradient(rows: int, dim: int, indices, offsets=None, *, grad_output,
                                 lengths=None, per_sample_weights=None, mode: str = "sum",
                                 include_last_offset: bool = False, padding_idx=None,
                                 positional_weights: bool = False) -> tuple[Expected, np.ndarray]:
    """``(Expected([rows, dim], ...), touched)``: the gradient of an embedding bag's table and the
    boolean mask of the rows some non-padding entry names.

    ``g[r] = sum over entries j with indices[j] == r of scale_b * w_j * grad_output[b]``, ``b`` the
    bag of entry j, ``scale_b`` 1 (``"sum"``) or ``1 / count_b`` (``"mean"``, count_b the bag's
    non-padding entries), ``w_j`` as in :func:`embedding_bag`; padding entries contribute nothing.
    """
    idx = np.asarray(indices)
    shape2d = idx.shape if idx.ndim == 2 and offsets is None and lengths is None else None
    flat = idx.reshape(-1).astype(np.int64)
    _check_indices(flat, rows)
    pad = None if padding_idx is None else int(padding_idx) + (rows if padding_idx < 0 else 0)
    psw = (None if per_sample_weights is None
           else np.asarray(per_sample_weights, dtype=np.float64).reshape(-1))
    G = np.asarray(grad_output, dtype=np.float64)
    value = np.zeros((rows, dim))
    magnitude = np.zeros((rows, dim))
    touched = np.zeros(rows, dtype=bool)
    for b, (begin, end) in enumerate(bag_bounds(flat.size, offsets, lengths, include_last_offset,
                                                shape2d)):
        entries = np.arange(begin, end)
        entries = entries[flat[entries] != pad] if pad is not None else entries
        if entries.size == 0:
            continue
        scale = 1.0 / entries.size if mode == "mean" else 1.0
        for j in entries:
            wj = 1.0 if psw is None else (psw[j - begin] if positional_weights else psw[j])
            term = scale * wj * G[b]
            value[flat[j]] += term
            magnitude[flat[j]] += np.abs(term)
            touched[flat[j]] = True
    return Expected(value, magnitude), touched


class TableUpdate(NamedTuple):
    """The result of :func:`embedding_bag_backward_update`: the new table and state (float64),
    the mask of updated rows, and the table gradient (:class:`Expected`, before weight decay)."""
    weight: np.ndarray
    state: np.ndarray | None
    touched: np.ndarray
    grad: Expected


def embedding_bag_backward_update(weight, indices, offsets=None, *, grad_output,
                                  optimizer: str = "sgd", state=None, lr: float,
                                  eps: float = 1e-8, weight_decay: float = 0.0,
                                  **bags) -> TableUpdate:
    """One fused backward + sparse optimizer step, in float64 (the inputs are not modified).

    With ``g`` from :func:`embedding_bag_table_gradient` (duplicates summed first), every touched
    row r is updated once; other rows and their state are unchanged:

    - ``"sgd"``: ``w -= lr * (g + weight_decay * w)``
    - ``"adagrad"``: ``g += weight_decay * w; h += g * g; w -= lr * g / (sqrt(h) + eps)``
    - ``"rowwise_adagrad"``: ``g += weight_decay * w; h += mean(g * g); w -= lr * g / (sqrt(h) + eps)``
      (``h`` one value per row)
    """
    w = np.asarray(weight).astype(np.float64)
    rows, dim = w.shape
    grad, touched = embedding_bag_table_gradient(rows, dim, indices, offsets,
                                                 grad_output=grad_output, **bags)
    h = None if state is None else np.asarray(state).astype(np.float64)
    r = np.flatnonzero(touched)
    g = grad.value[r] + weight_decay * w[r]
    if optimizer == "sgd":
        w[r] -= lr * g
    elif optimizer == "adagrad":
        h[r] += g * g
        w[r] -= lr * g / (np.sqrt(h[r]) + eps)
    elif optimizer == "rowwise_adagrad":
        if dim:
            h[r] += np.mean(g * g, axis=1)
        w[r] -= lr * g / (np.sqrt(h[r]) + eps)[:, None]
    else:
        raise ValueError(f"unknown optimizer {optimizer!r}")
    return TableUpdate(w, h, touched, grad)


#: Half a unit in the last place, relative, of a value stored in a table of each dtype.
_TABLE_EPS = {np.dtype(np.float32): 0.0, np.dtype(np.float16): 2.0 ** -11, BFLOAT16: 2.0 ** -8}
#: Half the spacing of each dtype's subnormals (the absolute rounding near zero).
_TABLE_TINY = {np.dtype(np.float32): 2.0 ** -150, np.dtype(np.float16): 2.0 ** -25,
               BFLOAT16: 2.0 ** -134}


def assert_update_close(weight, state, weight0, state0, expected: TableUpdate, *, optimizer: str,
                        lr: float, eps: float, weight_decay: float, rtol: float = 2e-5,
                        stochastic: bool = False) -> None:
    """Check a table and state updated in place (``weight``, ``state``; ``weight0``, ``state0``
    before the step) against :func:`embedding_bag_backward_update`'s ``expected``.

    The tolerance follows the float32 arithmetic: ``rtol`` of the terms (the old value plus the
    step computed from the gradient's magnitude), plus the rounding to the table's dtype (half an
    ulp, or a whole one with stochastic rounding).  Untouched rows must be unchanged, bit for bit.
    """
    exp_w, exp_h, touched, (_, gabs) = expected
    weight0 = np.asarray(weight0)
    rows, dim = weight0.shape
    w0 = np.abs(weight0.astype(np.float64))
    gabs = gabs + weight_decay * w0
    if optimizer == "sgd":
        step = lr * gabs
    elif optimizer == "adagrad":
        step = lr * gabs / (np.sqrt(exp_h) + eps)
        h_tol = rtol * (state0.astype(np.float64) + 4 * gabs ** 2)
        assert np.all(np.abs(state - exp_h) <= h_tol + 1e-30), "adagrad state"
    else:
        step = lr * gabs / (np.sqrt(exp_h) + eps)[:, None]
        h_tol = rtol * (state0.astype(np.float64) + (4 * np.mean(gabs ** 2, axis=1) if dim else 0))
        assert np.all(np.abs(state - exp_h) <= h_tol + 1e-30), "rowwise state"
    ulps = 2 if stochastic else 1
    dtype = weight0.dtype
    tol = (rtol * (w0 + step) + ulps * (_TABLE_EPS[dtype] * np.abs(exp_w) * 1.001 + _TABLE_TINY[dtype])
           + 1e-30)
    err = np.abs(np.asarray(weight).astype(np.float64) - exp_w)
    assert np.all(err <= tol), (f"max error {err.max()} at "
                                f"{np.unravel_index(np.argmax(err - tol), err.shape)}")
    assert np.array_equal(np.asarray(weight)[~touched].view(np.uint8),
                          weight0[~touched].view(np.uint8)), "a row not in the batch changed"
    if state is not None:
        assert np.array_equal(np.asarray(state)[~touched], np.asarray(state0)[~touched]), \
            "the state of a row not in the batch changed"


# ---------------------------------------------------------------------------------------------
# comparing a kernel's result with a reference
# ---------------------------------------------------------------------------------------------

def tolerance(expected, magnitude=None, *, rtol: float = 1e-5, atol: float = 0.0) -> np.ndarray:
    """The allowed absolute error per element: ``atol + rtol * magnitude``.

    ``expected`` may be an :class:`Expected` (its magnitude is used) or an array (then
    ``magnitude`` defaults to ``|expected|``: an ordinary relative tolerance).
    """
    if isinstance(expected, Expected):
        expected, magnitude = expected
    if magnitude is None:
        magnitude = np.abs(np.asarray(expected, dtype=np.float64))
    return atol + rtol * np.asarray(magnitude, dtype=np.float64)


def max_excess(got, expected, magnitude=None, *, rtol: float = 1e-5, atol: float = 0.0) -> float:
    """max over elements of ``|got - expected| / tolerance`` (<= 1 passes; NaN in ``got`` where
    the reference has none counts as infinitely wrong).  Shapes must match."""
    bound = tolerance(expected, magnitude, rtol=rtol, atol=atol)
    want = np.asarray(expected.value if isinstance(expected, Expected) else expected, np.float64)
    got = np.asarray(got, dtype=np.float64)
    if got.shape != want.shape:
        raise AssertionError(f"shape {got.shape} != expected {want.shape}")
    if got.size == 0:
        return 0.0
    both_nan = np.isnan(got) & np.isnan(want)
    err = np.where(both_nan, 0.0, np.abs(got - want))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err == 0, 0.0, err / bound)
    ratio = np.where(np.isnan(ratio), np.inf, ratio)
    return float(ratio.max())


def assert_close(got, expected, magnitude=None, *, rtol: float = 1e-5, atol: float = 0.0,
                 err_msg: str = "") -> None:
    """Assert ``|got - expected| <= atol + rtol * magnitude`` everywhere (see :func:`tolerance`)."""
    bound = tolerance(expected, magnitude, rtol=rtol, atol=atol)
    want = np.asarray(expected.value if isinstance(expected, Expected) else expected, np.float64)
    got64 = np.asarray(got, dtype=np.float64)
    assert got64.shape == want.shape, f"shape {got64.shape} != expected {want.shape} {err_msg}"
    err = np.abs(got64 - want)
    bad = ~(err <= bound) & ~(np.isnan(got64) & np.isnan(want))
    if bad.any():
        k = np.unravel_index(int(np.argmax(np.where(bad, err - bound, -np.inf))), bad.shape)
        raise AssertionError(
            f"{int(bad.sum())} of {bad.size} elements off; worst at {tuple(map(int, k))}: "
            f"got {got64[k]!r}, expected {want[k]!r}, allowed error {bound[k]:.3g} {err_msg}")


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])


def assert_same_bits(got, want, err_msg: str = "") -> None:
    """Assert equal dtype, shape and bit patterns (NaN payloads and signed zeros included)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (
        f"got {got.dtype}{got.shape}, want {want.dtype}{want.shape} {err_msg}")
    gb, wb = _bits(got).ravel(), _bits(want).ravel()
    bad = np.flatnonzero(gb != wb)
    assert bad.size == 0, (f"{bad.size} mismatches; first at {bad[0]}: got {gb[bad[0]]:#x}, "
                           f"want {wb[bad[0]]:#x} {err_msg}")

