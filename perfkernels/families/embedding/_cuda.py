"""Host side of the embedding-bag kernels: argument checks (as the CPU API), launch configuration,
and turning the device's error slots into exceptions."""
from __future__ import annotations

import math
import operator

import numpy as np

from ...cuda import _runtime as rt
from ..quantized.layout import check_bits, packed_dim

FILE = "embedding_bag.cu"
F32, F16, BF16, Q8, Q4, Q2 = range(6)
#: bits per element and the load widths (bytes) each format may use, widest first.  Widths are
#: capped so that one load holds at most 16 elements (the accumulator stays in registers).
FORMATS = {
    F32: (32, (16, 4)),
    F16: (16, (16, 2)),
    BF16: (16, (16, 2)),
    Q8: (8, (16, 8, 4, 1)),
    Q4: (4, (8, 4, 1)),
    Q2: (2, (4, 1)),
}
LANE_CHOICES = (4, 8, 16, 32)
MAX_VPL = 4
THREADS = 256
INDEX_TYPES = {"int32": "int", "int64": "long long"}


def launch_config(fmt: int, dim: int, align: int) -> tuple[int, int, int, int]:
    """(W, LANES, VPL, column chunks) for a table format, D and the alignment of the rows."""
    bits, widths = FORMATS[fmt]
    width = rt.largest_alignment(align, choices=widths)
    per_load = width * 8 // bits
    units = -(-dim // per_load)
    lanes = next((n for n in LANE_CHOICES if n >= units), LANE_CHOICES[-1])
    vpl = min(MAX_VPL, max(1, -(-units // lanes)))
    chunks = -(-units // (lanes * vpl)) if units else 0
    return width, lanes, vpl, chunks


def bag_kernel_name(fmt: int, width: int, index_type: str, lanes: int, vpl: int) -> str:
    return f"pk_embedding_bag<{fmt}, {width}, {INDEX_TYPES[index_type]}, {lanes}, {vpl}>"


def prepare_kernel_name(index_type: str, offsets_type: str) -> str:
    return f"pk_bags_prepare<{INDEX_TYPES[index_type]}, {INDEX_TYPES[offsets_type]}>"


def _index_array(x, name: str, allow_2d: bool = False):
    g = rt.as_gpu(x, name)
    rt.check_dtype(g, name, ("int32", "int64"), "int32 or int64")
    if g.a.ndim != 1 and not (allow_2d and g.a.ndim == 2):
        raise ValueError(f"{name} must be {'1-D or 2-D' if allow_2d else '1-D'}; got {g.a.ndim}-D")
    return rt.contiguous(g.a)


def _explain_offsets(offsets_host: np.ndarray, n: int, include_last_offset: bool, lengths: bool):
    """The ValueError the CPU API raises for these offsets (or lengths), word for word; called only
    after the device found them invalid, so it re-scans on the host to name the values."""
    o = offsets_host.astype(np.int64)
    if lengths:
        neg = np.flatnonzero(o < 0)
        first_neg = int(neg[0]) if neg.size else o.size
        # lengths before the first negative one are >= 0 and < 2**63: their uint64 running sum
        # cannot wrap before it first exceeds n.
        total = np.cumsum(o[:first_neg].astype(np.uint64))
        over = np.flatnonzero(total > np.uint64(n))
        if over.size:
            i = int(over[0])
            return ValueError(f"lengths[:{i + 1}] sum to {int(total[i])} > len(indices) = {n}: "
                              "sum(lengths) must equal len(indices)")
        if neg.size:
            return ValueError(f"lengths[{first_neg}] = {o[first_neg]} is negative: lengths must be >= 0")
        return ValueError(f"sum(lengths) = {int(total[-1]) if total.size else 0} != len(indices) = "
                          f"{n}: sum(lengths) must equal len(indices)")
    if o.size == 0:
        return ValueError(f"offsets is empty (no bags) but there are {n} indices")
    if o[0] != 0:
        return ValueError(f"offsets[0] = {o[0]}: the first offset must be 0")
    dec = np.flatnonzero(np.diff(o) < 0)
    if dec.size:
        j = int(dec[0]) + 1
        return ValueError(f"offsets[{j}] = {o[j]} < offsets[{j - 1}] = {o[j - 1]}: "
                          "offsets must be non-decreasing")
    last = o.size - 1
    if include_last_offset:
        return ValueError(f"offsets[{last}] = {o[last]} != len(indices) = {n}: with "
                          "include_last_offset=True the last offset must equal len(indices)")
    return ValueError(f"offsets[{last}] = {o[last]} > len(indices) = {n}: "
                      "offsets must not exceed the number of indices")


def _positional_error(entries: int, longest: int) -> ValueError:
    return ValueError(f"positional per_sample_weights has {entries} entries but the longest bag has "
                      f"{longest}: it needs one per position")


def run(table, fmt: int, rows: int, dim: int, row_bytes: int, meta_off: int, indices, offsets,
        lengths, per_sample_weights, mode, include_last_offset, padding_idx, positional_weights,
        out, inputs_for_overlap):
    """Validate the bag arguments and run prepare + bag kernels.  ``table`` is a 2-D CuPy array
    whose rows are ``row_bytes`` bytes of payload with unit stride inside a row."""
    cp = rt.cupy_or_raise()
    if mode not in ("sum", "mean"):
        raise ValueError(f"mode must be 'sum' or 'mean'; got {mode!r}")
    idx = _index_array(indices, "indices", allow_2d=True)
    n = int(idx.size)
    fixed_len = 0
    offs = lens = None
    offsets_mode = 0
    if idx.ndim == 2:
        if offsets is not None or lengths is not None:
            raise ValueError(f"indices is 2-D {tuple(idx.shape)} (one bag per row): "
                             "offsets and lengths must be None")
        num_bags, fixed_len = int(idx.shape[0]), int(idx.shape[1])
    elif offsets is not None and lengths is not None:
        raise ValueError("give either offsets (PyTorch convention) or lengths (caffe2 "
                         "convention), not both")
    elif offsets is not None:
        offs = _index_array(offsets, "offsets")
        if include_last_offset:
            if offs.size == 0:
                raise ValueError("offsets is empty: with include_last_offset=True it needs at least "
                                 "one entry (the end of the last bag, len(indices))")
            num_bags, offsets_mode = int(offs.size) - 1, 2
        else:
            num_bags, offsets_mode = int(offs.size), 1
    elif lengths is not None:
        lens = _index_array(lengths, "lengths")
        num_bags, offsets_mode = int(lens.size), 3
        offs = cp.cumsum(lens, dtype=cp.int64)
    else:
        raise ValueError("1-D indices need offsets or lengths to say where the bags are "
                         "(or pass 2-D indices [num_bags, bag_length])")

    if padding_idx is None:
        pad = -1
    else:
        try:
            pad = operator.index(padding_idx)
        except TypeError:
            raise TypeError(f"padding_idx must be an integer or None; got "
                            f"{type(padding_idx).__name__}") from None
        if not -rows <= pad < rows:
            raise ValueError(f"padding_idx = {pad} is out of range for a table of {rows} rows "
                             f"(valid: -{rows} <= padding_idx < {rows})")
        pad = pad + rows if pad < 0 else pad

    weights = None
    weight_mode = 0
    positional_limit = -1
    if per_sample_weights is not None:
        g = rt.as_gpu(per_sample_weights, "per_sample_weights")
        rt.check_dtype(g, "per_sample_weights", ("float32",), "float32")
        weights = rt.contiguous(g.a).reshape(-1)
        if positional_weights:
            if g.a.ndim != 1:
                raise ValueError(f"positional per_sample_weights must be 1-D (one weight per position "
                                 f"in a bag); got shape {tuple(g.a.shape)}")
            weight_mode = 2
            positional_limit = int(weights.size)
            if idx.ndim == 2 and num_bags and fixed_len > weights.size:
                raise _positional_error(int(weights.size), fixed_len)
        else:
            weight_mode = 1
            if tuple(g.a.shape) != tuple(idx.shape):
                raise ValueError(f"per_sample_weights must have the shape of indices "
                                 f"{tuple(idx.shape)}; got {tuple(g.a.shape)}")
    elif positional_weights:
        raise ValueError("positional_weights=True needs per_sample_weights")

    # out= sharing memory with any input (the table, indices, offsets or lengths, weights) goes
    # through a temporary: bags are written while other bags still read their inputs.
    inputs = tuple(inputs_for_overlap) + tuple(
        a for a in (idx, offs, lens, weights) if a is not None)
    dst, user_out = rt.check_out(out, (num_bags, dim), np.float32, "float32", inputs)

    index_type = str(idx.dtype)
    errors = rt.error_slots(cp)
    starts = None
    if offsets_mode:
        starts = cp.empty(num_bags + 1, dtype=cp.int64)
        offsets_type = "int64" if offsets_mode == 3 else str(offs.dtype)
    else:
        offsets_type = "int64"
    total = max(n, num_bags + 1) if offsets_mode else n
    if total:
        prep = rt.kernel(FILE, prepare_kernel_name(index_type, offsets_type))
        prep((rt.grid_for(total),), (256,),
             (idx, np.int64(n), np.int64(rows), offs if offs is not None else np.uint64(0),
              np.int32(offsets_mode), np.int64(num_bags),
              starts if starts is not None else np.uint64(0), np.int64(positional_limit), errors))

    align = math.gcd(table.data.ptr % 16 or 16, row_bytes or 16)
    if rows > 1:
        align = math.gcd(align, int(table.strides[0]))
    width, lanes, vpl, chunks = launch_config(fmt, dim, align)
    if num_bags and chunks:
        bags_per_block = THREADS // lanes
        fn = rt.kernel(FILE, bag_kernel_name(fmt, width, index_type, lanes, vpl))
        out_vec = int(dst.data.ptr % 16 == 0 and dim % 4 == 0)
        fn((-(-num_bags // bags_per_block), chunks), (THREADS,),
           (table, np.int64(rows), np.int64(table.strides[0] if rows > 1 else row_bytes),
            np.int32(dim), np.int32(meta_off), idx,
            starts if starts is not None else np.uint64(0), np.int64(fixed_len),
            np.int64(num_bags), weights if weights is not None else np.uint64(0),
            np.int32(weight_mode), np.int32(mode == "mean"), np.int64(pad), dst,
            np.int64(dim), np.int32(out_vec), errors))
    elif num_bags:
        dst[...] = 0

    err = errors.get()                                   # the one synchronisation of a call
    if rt.found(err[1]):
        raise _explain_offsets(
            (lens if offsets_mode == 3 else offs).get(), n, offsets_mode == 2, offsets_mode == 3)
    if rt.found(err[2]):
        raise _positional_error(positional_limit, int(np.diff(starts.get()).max()))
    if rt.found(err[0]):
        j = int(err[0])
        value = int(idx.reshape(-1)[j].get())
        raise IndexError(f"indices[{j}] = {value} is out of range for a table of {rows} rows")
    return rt.finish_out(dst, user_out)


def float_table(weight):
    g = rt.as_gpu(weight, "weight")
    rt.check_dtype(g, "weight", ("float32", "float16", "bfloat16"),
                   "float32, float16 or bfloat16 (ml_dtypes.bfloat16)")
    a = g.a
    if a.ndim != 2:
        raise ValueError(f"weight must be 2-D [rows, D]; got shape {tuple(a.shape)}")
    if a.shape[1] > 1 and a.strides[1] != a.itemsize or a.strides[0] < 0:
        a = rt.contiguous(a)
    fmt = BF16 if g.bf16 else (F32 if a.dtype == np.float32 else F16)
    return a, fmt


def quantized_table(packed, bits: int, dim):
    """(2-D uint8 table with unit stride inside rows, format, D, byte offset of scale and bias)."""
    bits = check_bits(bits)
    g = rt.as_gpu(packed, "packed")
    rt.check_dtype(g, "packed", ("uint8",), "uint8")
    a = g.a
    if a.ndim != 2:
        raise ValueError(f"packed must be 2-D (rows x row bytes); got {a.ndim}-D with shape "
                         f"{tuple(a.shape)}")
    if a.shape[1] > 1 and a.strides[1] != 1 or a.strides[0] < 0:
        a = rt.contiguous(a)
    row_bytes = int(a.shape[1])
    d = packed_dim(row_bytes, bits, dim)
    fmt = {8: Q8, 4: Q4, 2: Q2}[bits]
    return a, fmt, d, (d if bits == 8 else row_bytes - 4)


def instantiations(full: bool = False) -> list[str]:
    """Template instantiations for the nvcc compile test: by default every format with every
    load width, each LANES and each VPL at least once and both index types; ``full``: all."""
    names = [prepare_kernel_name(i, o) for i in INDEX_TYPES for o in INDEX_TYPES]
    combos = []
    for fmt, (_, widths) in FORMATS.items():
        for w in widths:
            for it in INDEX_TYPES:
                for lanes in LANE_CHOICES:
                    for vpl in range(1, MAX_VPL + 1):
                        combos.append((fmt, w, it, lanes, vpl))
    if not full:
        picked, k = [], 0
        for fmt, (_, widths) in FORMATS.items():
            for w in widths:
                lanes = LANE_CHOICES[k % len(LANE_CHOICES)]
                vpl = 1 + k % MAX_VPL
                it = list(INDEX_TYPES)[k % 2]
                picked.append((fmt, w, it, lanes, vpl))
                k += 1
        picked += [(F32, 16, "int64", 32, 1), (F16, 16, "int32", 16, 1), (Q8, 8, "int64", 32, 1)]
        combos = picked
    return names + [bag_kernel_name(*c) for c in combos]
