"""Coverage-guided fuzzing of every public perfkernels CPU function with atheris (libFuzzer).

Each input is a byte string that :class:`Draw` decodes into one call: which function (every
public CPU function: the single- and multi-table embedding bags, the quantizers, conversions, LSTM
unit, the fused backward + optimizer update, and perfkernels.torch's functional, quantized and LSTM
ops and modules), which ISA level, which ``num_threads=``, and every argument (dtypes, shapes, strides and offsets, alignment, read-only flags, index
values including negative, huge and int32-wrapping ones, bag offsets / lengths, weights, modes,
``out=`` arrays of the wrong shape or dtype, read-only, non-contiguous or overlapping an input).
While decoding, the harness records whether it made the call invalid and which documented
exceptions may follow.  The oracle:

* a valid call returns the float64 reference of ``perfkernels.reference`` within tolerance (bit
  for bit for the conversions), written into ``out=`` when one was given (the in-place update:
  the table and state it leaves), and the same bits as with ``num_threads=1``;
* an invalid call raises one of the documented exceptions and leaves ``out=`` (and a table and
  state updated in place) unchanged, bit for bit; an out-of-range index through perfkernels.torch
  raises ``IndexOutOfRangeError``;
* nothing crashes, hangs or makes the sanitizers report (run it on the sanitizer build).

Run (see docs/reliability.md)::

    python tests/fuzz/fuzz_kernels.py tests/fuzz/corpus -runs=20000 -seed=1     # fuzz
    python tests/fuzz/fuzz_kernels.py --replay tests/fuzz/corpus                 # no atheris needed

The decoder is ours (not atheris' FuzzedDataProvider), so the corpus means the same thing with or
without atheris and tests/test_fuzz_corpus.py replays it in the ordinary test run.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

import perfkernels as pk
from perfkernels import reference as ref

BF16 = np.dtype(ml_dtypes.bfloat16)
ISAS = pk.available_isas()
DIMS = (0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129)
HUGE_INDICES = (-1, -2, -2 ** 31, -2 ** 31 - 1, 2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 32 + 1,
                2 ** 63 - 1, -2 ** 63, 2 ** 62)
#: The signed 4- and 8-byte integer types; np.longlong is int64 under another NumPy type number.
INT_TYPES = (np.int32, np.int64, np.longlong, np.intc, np.int_)
SPECIAL_FLOATS = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 1e-8,
                           6e-8, 1e-40, 3.4e38, -3.4e38, 2.0 ** -24, 1.5], dtype=np.float32)


class Draw:
    """Decodes a byte string into choices; reading past the end yields zeros (the first choice)."""

    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0
        self.errors: set[type] = set()   # exceptions a call is documented to raise for what was drawn
        # set by the targets that need them (see _one_input):
        self.message: str | None = None  # "a|b": an IndexError's message must name one of them
        self.watch: list = []            # arrays updated in place: unchanged after an error
        self.rerun = None                # num_threads -> the result, for the thread-count check
                                         # (False: the result is not repeatable)
        self.result = None               # the call's return value -> what rerun returns

    def u8(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def int(self, lo: int, hi: int) -> int:
        """Uniform-ish in [lo, hi]."""
        span = hi - lo
        if span <= 0:
            return lo
        value = 0
        for _ in range((span.bit_length() + 7) // 8):
            value = (value << 8) | self.u8()
        return lo + value % (span + 1)

    def pick(self, options):
        return options[self.int(0, len(options) - 1)]

    def chance(self, one_in: int) -> bool:
        """True with probability about 1/one_in (decided by one byte)."""
        return self.u8() % one_in == 0

    def invalid(self, one_in: int, *errors: type) -> bool:
        """Decide to make one argument invalid; if so, record the exceptions allowed for it."""
        if self.chance(one_in):
            self.errors.update(errors)
            return True
        return False

    def floats(self, n: int) -> np.ndarray:
        """n float32 values: normal, small integers, special values or raw bit patterns."""
        kind = self.int(0, 3)
        seed = self.int(0, 2 ** 32 - 1)
        rng = np.random.default_rng(seed)
        if kind == 0:
            return rng.standard_normal(n).astype(np.float32) * np.float32(self.pick((1, 100, 1e-3)))
        if kind == 1:
            return rng.integers(-8, 9, n).astype(np.float32)
        if kind == 2:
            return rng.choice(SPECIAL_FLOATS, n)
        return rng.integers(0, 2 ** 32, n, dtype=np.uint32).view(np.float32)


def misaligned(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` one byte past an aligned address (misaligned for any itemsize above 1)."""
    raw = np.zeros(a.nbytes + 1, np.uint8)
    view = raw[1:].view(a.dtype).reshape(a.shape)
    view[...] = a
    return view


def layout(d: Draw, a: np.ndarray) -> np.ndarray:
    """The same values in a layout the caller may legally pass: contiguous, Fortran order, a
    strided view of a bigger array, misaligned, byte-swapped or read-only."""
    kind = d.int(0, 6)
    if a.ndim == 0 and kind in (2, 3):
        kind = 0
    if kind == 1 and a.ndim >= 2:
        a = np.asfortranarray(a)
    elif kind == 2:
        big = np.zeros(tuple(2 * s + 1 for s in a.shape), a.dtype)
        view = big[tuple(slice(1, None, 2) for _ in a.shape)]
        view[...] = a
        a = view
    elif kind == 3 and a.itemsize > 1:
        a = misaligned(a)
    elif kind == 4 and a.dtype != BF16:
        a = a.astype(a.dtype.newbyteorder("S"))
    if d.chance(4):
        a = a.copy() if kind in (0, 1) else a
        a.flags.writeable = False
    return a


def draw_out(d: Draw, shape: tuple, dtype, inputs: list[np.ndarray]):
    """None, or an out= array: right, or wrong in one documented way, or legal but awkward
    (non-contiguous, misaligned, overlapping an input: the kernel must then not misread)."""
    kind = d.int(0, 9)
    if kind <= 2:
        return None
    if kind == 3 and shape:
        big = np.full(tuple(2 * s for s in shape), 5.0, np.float32).astype(dtype)
        return big[tuple(slice(None, None, 2) for _ in shape)]
    if kind == 4 and inputs and shape:
        # overlapping an input: a view of the input's buffer reinterpreted as out's dtype
        src = inputs[d.int(0, len(inputs) - 1)]
        need = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if src.flags.c_contiguous and src.flags.writeable and src.nbytes >= need and need > 0:
            return src.reshape(-1).view(np.uint8)[:need].view(dtype).reshape(shape)
    if kind == 5 and d.invalid(1, ValueError):
        return np.zeros(tuple(s + 1 for s in shape) or (1,), dtype)
    if kind == 6 and d.invalid(1, TypeError):
        return np.zeros(shape, np.float64 if np.dtype(dtype) != np.float64 else np.float32)
    if kind == 7 and d.invalid(1, ValueError):
        o = np.zeros(shape, dtype)
        o.flags.writeable = False
        return o
    if kind == 8 and d.invalid(1, TypeError):
        return [0.0] * (shape[0] if shape else 1)
    return np.full(shape, 3.0, np.float32).astype(dtype)


# --- targets -------------------------------------------------------------------------------------

def offsets_valid(offs: np.ndarray, n: int, include_last: bool) -> bool:
    """PyTorch's rules: offsets[0] == 0, non-decreasing, the last one <= n (== n, and at least one
    offset, with include_last_offset); no offsets at all only when there are no indices."""
    if len(offs) == 0:
        return not include_last and n == 0
    ok = offs[0] == 0 and bool(np.all(np.diff(offs) >= 0))
    return ok and (offs[-1] == n if include_last else offs[-1] <= n)


def draw_bags(d: Draw, rows: int):
    """(indices, offsets, lengths, kwargs, reference kwargs) for a bag lookup over `rows` rows."""
    nbags = d.int(0, 9)
    lens = [d.pick((0, 1, 1, 2, 3, 5, 17)) for _ in range(nbags)]
    n = sum(lens)
    ix_dtype = d.pick(INT_TYPES)
    if d.invalid(24, TypeError):
        ix_dtype = d.pick((np.uint32, np.int16, np.float32, np.uint64, np.int8))
    values = [d.int(0, rows - 1) if rows > 0 else 0 for _ in range(n)]
    bad_index = rows == 0 and n > 0
    if n and d.chance(10):
        values[d.int(0, n - 1)] = d.pick(HUGE_INDICES + (rows, rows + 1, -rows))
        bad_index = True
    for v in values:
        bad_index |= not (0 <= v < rows)
    if bad_index:
        d.errors.add(IndexError)
        if np.dtype(ix_dtype).itemsize == 4:   # a value outside int32 cannot be stored: keep it in range
            values = [v if -2 ** 31 <= v < 2 ** 31 else -1 for v in values]
    indices = np.array(values, dtype=np.int64)
    if np.dtype(ix_dtype).kind in "iu" or ix_dtype == np.float32:
        with np.errstate(all="ignore"):
            indices = indices.astype(ix_dtype)
    kw, ref_kw = {}, {}
    form = d.int(0, 3)
    offsets = np.cumsum([0] + lens[:-1]) if nbags else np.zeros(0, np.int64)
    if form == 0 and nbags and len(set(lens)) == 1 and not d.chance(3):   # 2-D [B, L]
        indices = indices.reshape(nbags, lens[0])
        bag_args = ()
    elif form == 1:                                                      # caffe2 lengths
        lengths = np.array(lens, dtype=d.pick(INT_TYPES))
        if nbags and d.invalid(8, ValueError):
            k = d.int(0, nbags - 1)
            lengths = lengths.astype(np.int64)
            lengths[k] = d.pick((-1, lengths[k] + 1, lengths[k] + 2 ** 32, -2 ** 63, 2 ** 62))
        kw["lengths"] = ref_kw["lengths"] = lengths
        bag_args = ()
    else:                                                                # PyTorch offsets
        offs = np.array(offsets, dtype=np.int64)
        if d.chance(2):
            offs = np.append(offs, n)
            kw["include_last_offset"] = ref_kw["include_last_offset"] = True
        if len(offs) and d.chance(8):
            k = d.int(0, len(offs) - 1)
            offs[k] = d.pick((-1, offs[k] + 1, n + 1, 2 ** 32, -2 ** 31, 2 ** 62))
            if not offsets_valid(offs, n, "include_last_offset" in kw):
                d.errors.add(ValueError)
            else:   # still valid, but the bags changed: positional weights must cover the new ones
                ends = list(offs) if "include_last_offset" in kw else list(offs) + [n]
                lens = [int(e - b) for b, e in zip(ends[:-1], ends[1:])]
        offs = offs.astype(d.pick(INT_TYPES)) if np.abs(offs).max(initial=0) < 2 ** 31 else offs
        bag_args = (layout(d, offs),)
        ref_kw["offsets"] = offs
    if d.invalid(40, ValueError):   # both conventions, or neither for 1-D indices
        if "lengths" in kw:
            bag_args = (offsets,)
        elif bag_args:
            kw["lengths"] = np.array(lens)
        else:
            indices = indices.reshape(-1)
    indices = layout(d, indices)
    mode = d.pick(("sum", "mean"))
    if d.invalid(40, ValueError):
        mode = d.pick(("max", "SUM", "", None))
    kw["mode"] = ref_kw["mode"] = mode
    if rows and d.chance(4):
        pad = d.int(-rows, rows - 1)
        if d.invalid(16, ValueError):
            pad = d.pick((rows, -rows - 1, 2 ** 40, -2 ** 63))
        ref_kw["padding_idx"] = pad
        kw["padding_idx"] = d.pick((pad, np.int64(pad)))   # any integer type
        if d.invalid(30, TypeError):
            kw["padding_idx"] = d.pick((float(pad), str(pad), [pad]))
    if d.chance(3):
        if d.chance(3):   # positional: one weight per position inside a bag
            need = max(lens, default=0)
            size = need + d.int(0, 3)
            if need and d.invalid(6, ValueError):
                size = need - 1
            w = d.floats(size)
            kw["positional_weights"] = ref_kw["positional_weights"] = True
        else:
            w = d.floats(n).reshape(np.shape(indices))
            if d.invalid(12, ValueError):
                w = d.floats(n + 1)
        if d.invalid(24, TypeError):
            w = w.astype(np.float64)
        kw["per_sample_weights"] = layout(d, w)
        ref_kw["per_sample_weights"] = w
    elif d.invalid(40, ValueError):
        kw["positional_weights"] = True
    return indices, bag_args, kw, ref_kw, nbags


def _nonfinite_ok(values: np.ndarray) -> bool:
    return bool(np.isfinite(np.asarray(values, np.float64)).all())


def fuzz_embedding_bag(d: Draw):
    rows, dim = d.int(0, 40), d.pick(DIMS)
    dtype = d.pick((np.float32, np.float16, BF16))
    table = d.floats(rows * dim).astype(dtype).reshape(rows, dim)
    ref_table = table
    table = layout(d, table)
    if d.invalid(30, TypeError):
        table = table.astype(d.pick((np.float64, np.int32, np.uint8)))
    elif d.invalid(40, ValueError):
        table = table.reshape(-1)
    indices, bag_args, kw, ref_kw, nbags = draw_bags(d, rows)
    out = draw_out(d, (nbags, dim), np.float32, [table, indices] + list(bag_args))
    return (pk.embedding_bag, (table, indices) + bag_args, kw, out,
            lambda: ref.embedding_bag(ref_table, indices, **ref_kw), "bags")


def packed_table(d: Draw, rows: int, dim: int, bits: int):
    """(packed [rows, row_bytes] uint8 from the input's bytes, its scale/bias [rows, 2])."""
    row_bytes = ref.packed_row_bytes(dim, bits)
    packed = np.frombuffer(bytes(d.u8() for _ in range(min(rows * row_bytes, 64))) or b"\0", np.uint8)
    packed = np.resize(packed, rows * row_bytes).reshape(rows, row_bytes)
    # scale / bias from the raw bytes can be NaN or inf: keep them finite so the reference is exact
    trailer = 8 if bits == 8 else 4
    meta = np.ascontiguousarray(packed[:, -trailer:]).view("<f4" if bits == 8 else "<f2")
    meta[~np.isfinite(meta)] = 1
    packed[:, -trailer:] = meta.view(np.uint8)
    return packed, meta


def quantized_expected(packed, meta, bits: int, dim: int, indices, **ref_kw) -> ref.Expected:
    """The float64 reference of a quantized lookup, its magnitude widened by the kernel's rounding."""
    want = ref.embedding_bag_quantized(packed, indices, bits=bits, dim=dim, **ref_kw)
    # The kernel adds w*scale*q and w*bias separately: its rounding scales with their sizes,
    # which cancel in the dequantized value the reference sums, so add that bound.
    row_max = np.abs(meta[:, :1].astype(np.float64)) * (2 ** bits - 1) + np.abs(meta[:, 1:2])
    abs_kw = dict(ref_kw)
    if ref_kw.get("per_sample_weights") is not None:
        abs_kw["per_sample_weights"] = np.abs(ref_kw["per_sample_weights"].astype(np.float64))
    bound = ref.embedding_bag(np.repeat(row_max, dim, axis=1), indices, **abs_kw).value
    return ref.Expected(want.value, want.magnitude + bound)


def fuzz_embedding_bag_quantized(d: Draw):
    bits = d.pick((8, 4, 2))
    rows, dim = d.int(0, 40), d.pick(DIMS[1:])
    packed, meta = packed_table(d, rows, dim, bits)
    dim_kw = dim if (dim % (8 // bits) or d.chance(2)) else None
    kw_bits = bits
    if d.invalid(30, ValueError):
        kw_bits = d.pick((1, 3, 16, 0, True))
    elif d.invalid(30, ValueError):
        dim_kw = d.pick((dim + 8, -1, 0, 2 ** 40))
    ref_packed = packed
    packed = layout(d, packed)
    indices, bag_args, kw, ref_kw, nbags = draw_bags(d, rows)
    kw.update(bits=d.pick((kw_bits, np.int64(kw_bits))) if kw_bits is not True else kw_bits,
              dim=dim_kw if dim_kw is None or d.chance(2) else np.int64(dim_kw))
    out = draw_out(d, (nbags, dim), np.float32, [packed, indices] + list(bag_args))
    return (pk.embedding_bag_quantized, (packed, indices) + bag_args, kw, out,
            lambda: quantized_expected(ref_packed, meta, bits, dim, indices, **ref_kw), "qbags")


def fuzz_quantize(d: Draw):
    bits = d.pick((8, 4, 2))
    rows, dim = d.int(0, 12), d.pick(DIMS)
    dtype = d.pick((np.float32, np.float16))
    with np.errstate(all="ignore"):
        w = d.floats(rows * dim).astype(dtype).reshape(rows, dim)
    if dim == 0:
        d.errors.add(ValueError)
    if not _nonfinite_ok(w):
        d.errors.add(ValueError)
    kw_bits = bits
    if d.invalid(30, ValueError):
        kw_bits = d.pick((1, 16, False))
    return (pk.quantize_rowwise, (layout(d, w),), {"bits": kw_bits}, None,
            lambda: ref.quantize_rowwise(w, bits), "bits")


def fuzz_dequantize(d: Draw):
    bits = d.pick((8, 4, 2))
    rows, dim = d.int(0, 12), d.pick(DIMS[1:])
    row_bytes = ref.packed_row_bytes(dim, bits)
    packed = np.frombuffer(bytes(d.u8() for _ in range(rows * row_bytes)).ljust(rows * row_bytes, b"\1"),
                           np.uint8).reshape(rows, row_bytes).copy()
    dim_kw = dim if (dim % (8 // bits) or d.chance(2)) else None
    if d.invalid(20, ValueError):
        dim_kw = d.pick((dim + 9, 0, -3))

    def reference():
        value = ref.dequantize_rowwise(packed, bits, dim)
        trailer = 8 if bits == 8 else 4
        bias = np.ascontiguousarray(packed[:, -trailer // 2:]).view("<f4" if bits == 8 else "<f2")
        bias = bias.astype(np.float64)
        with np.errstate(invalid="ignore"):
            return ref.Expected(value, np.abs(value - bias) + np.abs(bias))   # |q*scale| + |bias|

    return (pk.dequantize_rowwise, (layout(d, packed),), {"bits": bits, "dim": dim_kw}, None,
            reference, "dequantize")


CONVERSIONS = {
    "float_to_half": (np.float32, np.float16),
    "half_to_float": (np.float16, np.float32),
    "float_to_bfloat16": (np.float32, BF16),
    "bfloat16_to_float": (BF16, np.float32),
}


def fuzz_convert(d: Draw):
    name = d.pick(tuple(CONVERSIONS))
    src_t, dst_t = CONVERSIONS[name]
    shape = tuple(d.pick((0, 1, 2, 3, 7, 8, 16, 17, 33, 100)) for _ in range(d.int(0, 3)))
    n = int(np.prod(shape))
    bits = d.floats(n).view(np.uint32)
    x = (bits.astype(np.uint16) if np.dtype(src_t).itemsize == 2 else bits).view(src_t).reshape(shape)
    kw = {}
    if name == "float_to_half" and d.chance(2):
        kw["clip"] = True
    arg = layout(d, x)
    if d.invalid(30, TypeError):
        arg = arg.astype(np.float64)
    out = draw_out(d, shape, dst_t, [arg])
    fn = getattr(pk, name)
    ref_kw = dict(kw)
    return fn, (arg,), kw, out, lambda: getattr(ref, name)(x, **ref_kw), "bits"


def fuzz_lstm(d: Draw):
    backward = d.chance(2)
    n, dim = d.int(0, 9), d.pick(DIMS[:12])
    # Finite and moderate: the gradient's 1 - tanh(c)^2 and o(1 - o) lose float32 precision to
    # cancellation as |x| grows (inherent in the formula), which would measure float32, not the kernel.
    arrays = [np.clip(np.nan_to_num(d.floats(n * dim)), -4, 4).reshape(n, dim) for _ in range(4)]
    gates = np.clip(np.nan_to_num(d.floats(n * 4 * dim)), -4, 4).reshape(n, 4 * dim)
    kw = {}
    if d.chance(2):
        kw["seq_lengths"] = np.array([d.int(0, 4) for _ in range(n)], d.pick(INT_TYPES))
        if d.invalid(20, ValueError):
            kw["seq_lengths"] = kw["seq_lengths"][:-1] if n else np.zeros(1, np.int32)
    if d.chance(2):
        kw["t"] = d.int(0, 5)
        if d.invalid(30, ValueError, TypeError):
            kw["t"] = d.pick((-1, 1.5, True, "0"))
    if d.chance(2):
        kw["forget_bias"] = float(d.pick((0.0, 1.0, -3.5)))
    if d.chance(3):
        kw["drop_states"] = True
    if d.chance(3):
        kw["gate_order"] = "ifgo"
        if d.invalid(20, ValueError):
            kw["gate_order"] = d.pick(("fico", "", "IFOG"))
    if dim and d.invalid(30, ValueError):
        gates = gates[:, 1:]
    inputs = [layout(d, a) for a in arrays[:2]] + [layout(d, gates)]
    names = ("dh_prev", "dc_prev", "dgates") if backward else ("h", "c")
    shapes = [(n, dim), (n, dim), (n, 4 * dim)][:len(names)]
    out = None
    if d.chance(3):
        out = tuple(draw_out(d, s, np.float32, inputs) for s in shapes)
        given = [o for o in out if isinstance(o, np.ndarray) and o.size]
        if any(np.may_share_memory(a, b) for k, a in enumerate(given) for b in given[:k]):
            d.errors.add(ValueError)   # two outputs in one buffer
        if d.invalid(30, TypeError):
            out = out[:-1]
    ref_kw = {k: v for k, v in kw.items()}
    if backward:
        c_prev, c, dh, dc = arrays
        args = (inputs[0], inputs[2], layout(d, c), layout(d, dh), layout(d, dc))
        ref_call = lambda: ref.lstm_unit_backward(c_prev, gates, c, dh, dc, **ref_kw)  # noqa: E731
        return pk.lstm_unit_backward, args, kw, out, ref_call, "lstm"
    h_prev, c_prev = arrays[:2]
    ref_call = lambda: ref.lstm_unit(h_prev, c_prev, gates, **ref_kw)  # noqa: E731
    return pk.lstm_unit, tuple(inputs), kw, out, ref_call, "lstm"


def fuzz_torch_embedding_bag(d: Draw):
    """perfkernels.torch.embedding_bag (torch.nn.functional.embedding_bag's signature) on CPU
    tensors: same float64 reference; the result keeps the table's dtype, as torch's does."""
    torch, pkt = _torch()
    rows, dim = d.int(0, 30), d.pick(DIMS)
    dtype = d.pick((np.float32, np.float16, BF16))
    table = d.floats(rows * dim).astype(dtype).reshape(rows, dim)
    nbags, lens, n, values, ix_t = _torch_bag_values(d, rows, (IndexError, RuntimeError))
    kw, ref_kw = {}, {}
    offsets = np.cumsum([0] + lens[:-1]).astype(np.int64) if nbags else np.zeros(0, np.int64)
    if nbags and len(set(lens)) == 1 and d.chance(2):
        indices, offs = values.reshape(nbags, lens[0]), None
        if lens[0] == 0:
            d.errors.add(RuntimeError)   # torch refuses 2-D input without columns
    else:
        indices, offs = values, offsets
        if d.chance(2):
            offs = np.append(offs, n)
            kw["include_last_offset"] = ref_kw["include_last_offset"] = True
        ref_kw["offsets"] = offs
    mode = d.pick(("sum", "mean"))
    kw["mode"] = ref_kw["mode"] = mode
    if mode == "sum" and d.chance(3):
        # torch takes weights of the table's dtype only
        w_t = torch.from_numpy(d.floats(n).reshape(indices.shape)).to(TORCH_DTYPES[dtype])
        kw["per_sample_weights"] = w_t
        ref_kw["per_sample_weights"] = w_t.float().numpy()
    if rows and d.chance(4):
        pad = d.int(-rows, rows - 1)
        kw["padding_idx"] = ref_kw["padding_idx"] = pad
    args = (torch.from_numpy(indices).to(ix_t), torch.from_numpy(table.view(np.uint16) if dtype == BF16
                                                                  else table))
    if dtype == BF16:
        args = (args[0], args[1].view(torch.bfloat16))
    if offs is not None:
        args += (torch.from_numpy(offs).to(ix_t),)

    def reference():
        want = ref.embedding_bag(table, indices, **ref_kw)
        return want, np.dtype(dtype)

    return pkt.embedding_bag, args, kw, None, reference, "torch"


# --- targets added later (after the corpus above existed: see _pick_target) ----------------------

#: What a multi-table call's feature reads: a float table (its dtype) or a packed one (its bits).
MULTI_KINDS = (np.float32, np.float16, BF16, 8, 4, 2)
#: Batch sizes big enough for the pool to split the (feature, bag) pairs across threads.
LARGE_BATCHES = (1024, 2048, 3000)


def fuzz_embedding_bags_multi(d: Draw):
    """embedding_bags_multi over F mixed tables in TorchRec's KJT layout; the oracle is a loop of
    single-table references, feature by feature, side by side."""
    large = d.chance(12)
    num_features = d.int(1, 2 if large else 4)
    batch = d.pick(LARGE_BATCHES) if large else d.int(0, 6)
    tables, feats = [], []   # feats[f] = (kind, rows, dim, reference table or (packed, meta))
    for f in range(num_features):
        kind = d.pick(MULTI_KINDS)
        rows = d.int(1, 200) if large else d.int(0, 20)
        if isinstance(kind, int):
            dim = 64 if large else d.pick(DIMS[1:])
            packed, meta = packed_table(d, rows, dim, kind)
            tables.append(layout(d, packed))
            feats.append((kind, rows, dim, (packed, meta)))
        else:
            dim = 64 if large else d.pick(DIMS)
            table = d.floats(rows * dim).astype(kind).reshape(rows, dim)
            tables.append(layout(d, table))
            feats.append((kind, rows, dim, table))
    # bits / dims: None where a table is float; dims needed where D is no multiple of 8 // bits
    bits = [k if isinstance(k, int) else None for k, *_ in feats]
    dims = [dim if isinstance(k, int) and (dim % (8 // k) or d.chance(2)) else
            (dim if d.chance(4) else None) for k, _, dim, _ in feats]
    kw = {}
    if any(b is not None for b in bits) or d.chance(3):
        kw["bits"] = bits if d.chance(4) else tuple(bits) if d.chance(2) else list(bits)
    if any(x is not None for x in dims) and (any(isinstance(k, int) and dim % (8 // k)
                                                 for k, _, dim, _ in feats) or d.chance(2)):
        kw["dims"] = dims
    if d.invalid(30, ValueError):
        kw["bits" if d.chance(2) else "dims"] = (bits if d.chance(2) else dims) + [None]
    elif d.invalid(40, TypeError):
        kw[d.pick(("bits", "dims"))] = d.pick((8, "8", np.array(bits, dtype=object)))
    elif d.invalid(30, TypeError, ValueError):   # the wrong kind for one table
        f = d.int(0, num_features - 1)
        wrong = list(bits)
        wrong[f] = None if bits[f] is not None else d.pick((8, 4, 2))
        kw["bits"] = wrong
    elif d.invalid(30, ValueError):              # a wrong D, or a wrong bit width
        f = d.int(0, num_features - 1)
        if bits[f] is None or d.chance(2):
            kw["dims"] = [d.pick((feats[f][2] + 8, -1)) if g == f else x for g, x in enumerate(dims)]
        else:
            kw["bits"] = [d.pick((3, 16, 0)) if g == f else b for g, b in enumerate(bits)]

    # per (feature, sample) bag lengths, feature-major, and the values (a large batch draws them
    # from a generator: the input's bytes would run out)
    rng = np.random.default_rng(d.int(0, 2 ** 32 - 1)) if large else None
    lens, values, bad_features = [], [], set()
    for f, (_, rows, _, _) in enumerate(feats):
        if large:
            lens.append(list(rng.choice((0, 1, 2, 3, 5), batch)))
            part = list(rng.integers(0, rows, sum(lens[f])))
        else:
            lens.append([d.pick((0, 1, 1, 2, 3, 5)) for _ in range(batch)])
            part = [d.int(0, rows - 1) if rows else 0 for _ in range(sum(lens[f]))]
        if part and (rows == 0 or d.chance(12)):
            part[d.int(0, len(part) - 1)] = d.pick(HUGE_INDICES + (rows, rows + 1, -rows - 1))
        if any(not 0 <= v < rows for v in part):
            bad_features.add(f)
        values += part
    n = len(values)
    ix_dtype = d.pick(INT_TYPES)
    if bad_features:
        d.errors.add(IndexError)
        d.message = "|".join(f"feature {f}:" for f in sorted(bad_features))
        if np.dtype(ix_dtype).itemsize == 4:
            values = [v if -2 ** 31 <= v < 2 ** 31 else -1 for v in values]
    indices = np.array(values, dtype=np.int64).astype(ix_dtype)
    if d.invalid(30, TypeError):
        indices = indices.astype(d.pick((np.float32, np.uint64, np.int16)))
    elif d.invalid(40, ValueError):
        indices = indices.reshape(1, -1)
    flat_lens = np.array([x for per in lens for x in per], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(flat_lens)]).astype(np.int64)
    if d.chance(2):
        kjt = flat_lens
        if d.invalid(8, ValueError):
            k = d.int(0, len(kjt))
            kjt = kjt.copy()
            if k == len(kjt):
                kjt = np.append(kjt, 1)        # F * B + 1 entries, or a sum past len(indices)
            else:
                kjt[k] = d.pick((-1, kjt[k] + 1, 2 ** 62, -2 ** 40))
        kw["lengths"] = layout(d, kjt.astype(d.pick(INT_TYPES)) if np.abs(kjt).max(initial=0) < 2 ** 31 else kjt)
    else:
        kjt = offsets
        if d.invalid(8, ValueError):
            k = d.int(0, len(kjt) - 1)
            kjt = kjt.copy()
            kjt[k] = d.pick((-1, n + 1, 2 ** 62)) if k else 1
        kw["offsets"] = layout(d, kjt.astype(d.pick(INT_TYPES)) if np.abs(kjt).max(initial=0) < 2 ** 31 else kjt)
    if d.invalid(40, ValueError):   # neither lengths nor offsets, or both
        if d.chance(2):
            kw.pop("lengths", None)
            kw.pop("offsets", None)
        else:
            kw.update(lengths=flat_lens, offsets=offsets)

    modes = [d.pick(("sum", "mean")) for _ in range(num_features)]
    kw["modes"] = modes if d.chance(2) else modes[0]
    ref_modes = modes if isinstance(kw["modes"], list) else [modes[0]] * num_features
    if d.invalid(30, ValueError):
        kw["modes"] = d.pick((modes + ["sum"], "max", modes[:-1] + ["SUM"]))
    ref_pads = [None] * num_features
    if d.chance(3):
        if d.chance(2):   # one value for every table: it must be in range for each of them
            pad = d.int(-3, 3)
            ref_pads = [pad] * num_features
            kw["padding_idx"] = d.pick((pad, np.int64(pad)))
        else:
            ref_pads = [d.int(-rows, rows - 1) if rows and d.chance(2) else None
                        for _, rows, _, _ in feats]
            kw["padding_idx"] = ref_pads
        if any(p is not None and not -rows <= p < rows for p, (_, rows, _, _) in zip(ref_pads, feats)):
            d.errors.add(ValueError)
        if d.invalid(30, TypeError):
            kw["padding_idx"] = d.pick((1.0, "0", [1.5] * num_features))
        elif d.invalid(30, ValueError):
            kw["padding_idx"] = ref_pads + [None]
    psw = None
    if d.chance(3):
        psw = d.floats(n)
        kw["per_sample_weights"] = layout(d, psw)
        if d.invalid(16, ValueError):
            kw["per_sample_weights"] = d.floats(n + 1)
        elif d.invalid(24, TypeError):
            kw["per_sample_weights"] = psw.astype(np.float64)
    if d.invalid(40, TypeError):
        tables = d.pick((tables[0], {f: t for f, t in enumerate(tables)}))
    elif d.invalid(60, ValueError):
        tables = []
    elif d.chance(2):
        tables = tuple(tables)
    total_d = sum(dim for _, _, dim, _ in feats)
    out = draw_out(d, (batch, total_d), np.float32, [indices] + [t for t in tables if isinstance(t, np.ndarray)])

    def reference():
        parts = []
        for f, (kind, rows, dim, table) in enumerate(feats):
            begin, end = int(offsets[f * batch]), int(offsets[(f + 1) * batch])
            bag_kw = dict(mode=ref_modes[f], padding_idx=ref_pads[f], include_last_offset=True,
                          per_sample_weights=None if psw is None else psw[begin:end])
            ix = np.array(values[begin:end], dtype=np.int64)
            offs = offsets[f * batch:(f + 1) * batch + 1] - begin
            if isinstance(kind, int):
                parts.append(quantized_expected(*table, kind, dim, ix, offsets=offs, **bag_kw))
            else:
                parts.append(ref.embedding_bag(table, ix, offs, **bag_kw))
        return ref.Expected(*(np.concatenate([p[k] for p in parts], axis=1)
                              for k in range(2)))

    return (pk.embedding_bags_multi, (tables, indices), kw, out, reference,
            "qbags" if any(b is not None for b in bits) else "bags")


def moderate(d: Draw, n: int, limit: float = 4.0) -> np.ndarray:
    """n finite float32 values in [-limit, limit] (where float32 rounding stays relative)."""
    return np.clip(np.nan_to_num(d.floats(n)), -limit, limit)


def in_place_layout(d: Draw, a: np.ndarray) -> np.ndarray:
    """``a``'s values in an array the in-place update may write (contiguous, a column slice of a
    wider table, rows further apart) or one it must refuse with ValueError (read-only, misaligned,
    byte-swapped, not unit stride along D); the ValueError is recorded when the result is one."""
    kind = d.int(0, 23)   # 1, 2: legal layouts; 3 to 6: (mostly) refused ones; else contiguous
    if kind == 1 and a.ndim == 2:
        extra = d.int(1, 9)
        wide = np.zeros((a.shape[0], a.shape[1] + extra), a.dtype)
        start = d.int(0, extra)
        a, wide[:, start:start + a.shape[1]] = wide[:, start:start + a.shape[1]], a
    elif kind == 2:
        big = np.zeros((2 * a.shape[0],) + a.shape[1:], a.dtype)
        big[::2] = a
        a = big[::2]
    elif kind == 3:
        a = np.asfortranarray(a)
    elif kind == 4:
        a = misaligned(a)
    elif kind == 5 and a.dtype != BF16:
        a = a.astype(a.dtype.newbyteorder("S"))
    elif kind == 6:
        a = a.copy()
        a.flags.writeable = False
    else:
        a = a.copy()
    unit_d = a.ndim < 2 or a.shape[1] <= 1 or a.strides[1] == a.itemsize
    strides_ok = a.size == 0 or (unit_d and a.strides[0] >= 0 and a.strides[0] % a.itemsize == 0)
    if not (a.flags.writeable and a.flags.aligned and a.dtype.isnative and strides_ok):
        d.errors.add(ValueError)
    return a


OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad")


def large_bags(d: Draw, rows: int):
    """draw_bags' result for 512 to 2000 valid bags (from a generator: the input's bytes would
    run out), with PyTorch offsets or caffe2 lengths, either mode, weights and padding_idx."""
    rng = np.random.default_rng(d.int(0, 2 ** 32 - 1))
    nbags = d.pick((512, 1024, 2000))
    lens = rng.choice((0, 1, 2, 3, 5), nbags)
    indices = rng.integers(0, rows, int(lens.sum())).astype(d.pick(INT_TYPES))
    kw = {"mode": d.pick(("sum", "mean"))}
    if d.chance(2):
        kw["lengths"] = lens
        bag_args = ()
    else:
        bag_args = (np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64),)
    if d.chance(3):
        kw["padding_idx"] = d.int(-rows, rows - 1)
    if d.chance(3):
        kw["per_sample_weights"] = rng.uniform(-2, 2, indices.size).astype(np.float32)
    ref_kw = dict(kw, offsets=bag_args[0]) if bag_args else dict(kw)
    return indices, bag_args, kw, ref_kw, nbags


def fuzz_backward_update(d: Draw):
    """embedding_bag_backward_update: weight and state against the float64 reference of
    perfkernels.reference; an invalid call must leave both untouched, bit for bit."""
    large = d.chance(12)
    optimizer = d.pick(OPTIMIZERS)
    rows, dim = (d.int(50, 400), 64) if large else (d.int(0, 30), d.pick(DIMS))
    dtype = d.pick((np.float32, np.float16, BF16))
    # moderate finite values: the float32 arithmetic then stays within a relative bound
    weight0 = moderate(d, rows * dim, 100.0).astype(dtype).reshape(rows, dim)
    weight = in_place_layout(d, weight0)
    if d.invalid(40, TypeError):
        weight = d.pick((weight0.astype(np.float64), weight0.astype(np.int32), weight0.tolist()))
    elif d.invalid(40, ValueError):
        weight = weight.reshape(-1)
    if large:   # enough entries for the pool to split the sort and the row updates
        indices, bag_args, kw, ref_kw, nbags = large_bags(d, rows)
    else:
        indices, bag_args, kw, ref_kw, nbags = draw_bags(d, rows)
    if "per_sample_weights" in kw:
        w = np.clip(np.nan_to_num(np.asarray(ref_kw["per_sample_weights"], np.float64)), -4, 4)
        ref_kw["per_sample_weights"] = w.astype(np.float32)
        kw["per_sample_weights"] = w.astype(kw["per_sample_weights"].dtype)
    state0 = None
    if optimizer != "sgd":
        shape = (rows, dim) if optimizer == "adagrad" else (rows,)
        state0 = (np.zeros(shape, np.float32) if d.chance(3) else
                  np.abs(moderate(d, int(np.prod(shape)), 10.0)).reshape(shape))
    state = None if state0 is None else in_place_layout(d, state0)
    if d.invalid(30, ValueError):   # a state for sgd, none for adagrad, the wrong shape
        state = (np.zeros(rows, np.float32) if state is None else
                 d.pick((None, np.zeros((rows + 1, dim), np.float32), np.zeros((rows, dim + 1), np.float32))))
    elif state is not None and d.invalid(30, TypeError):
        state = d.pick((state0.astype(np.float64), state0.tolist()))
    elif (optimizer == "adagrad" and dtype == np.float32 and rows and dim and isinstance(weight, np.ndarray)
          and weight.shape == (rows, dim) and d.invalid(20, ValueError)):
        state = weight   # the state may not share memory with the table
    grad0 = moderate(d, nbags * dim, 10.0).reshape(nbags, dim)
    grad = layout(d, grad0)
    if (dtype == np.float32 and nbags * dim and isinstance(weight, np.ndarray) and weight.flags.writeable
            and weight.flags.c_contiguous and weight.size >= nbags * dim and d.chance(8)):
        grad = weight.reshape(-1)[:nbags * dim].reshape(nbags, dim)   # read while the rows are written
        grad0 = np.array(grad)
    if d.invalid(30, ValueError):
        grad = np.zeros((nbags + 1, dim), np.float32)
    elif d.invalid(30, TypeError):
        grad = grad0.astype(np.float64)
    hyper = {"lr": d.pick((0.0, 0.01, 0.1, 1.0)), "eps": d.pick((1e-8, 1e-3, 0.5)),
             "weight_decay": d.pick((0.0, 0.0, 1e-3, 0.1))}
    if d.invalid(20, ValueError):
        hyper[d.pick(tuple(hyper))] = d.pick((-0.5, float("nan"), float("inf"), 1e39))
    elif d.invalid(40, TypeError):
        hyper[d.pick(tuple(hyper))] = d.pick((None, [0.1], 1j))
    kw.update(hyper, grad_output=grad, optimizer=optimizer, state=state)
    if d.invalid(40, ValueError):
        kw["optimizer"] = d.pick(("SGD", "adam", None))
    rounding = dtype != np.float32 and d.chance(3)
    if rounding:
        kw["stochastic_rounding"] = True
    if d.chance(2) or (rounding and d.chance(2)):
        kw["seed"] = d.pick((0, 1, 2 ** 64 + 5, -3, np.int64(7)))
        if d.invalid(30, TypeError):
            kw["seed"] = d.pick((1.5, "1"))
    ref_args = dict(grad_output=grad0, optimizer=optimizer, state=state0, **hyper, **ref_kw)
    d.watch = [a for a in (weight, state) if a is not None]

    def rerun(num_threads):
        w, h = weight0.copy(), None if state0 is None else state0.copy()
        pk.embedding_bag_backward_update(w, indices, *bag_args, **{**kw, "state": h,
                                                                    "num_threads": num_threads})
        return w, h

    # stochastic rounding without a seed draws fresh random bits: not repeatable
    d.rerun = False if rounding and kw.get("seed") is None else rerun
    d.result = lambda _: (weight, state)

    def reference():
        want = ref.embedding_bag_backward_update(weight0, indices, **ref_args)
        return want, (weight0, state0, optimizer, hyper, rounding)

    return pk.embedding_bag_backward_update, (weight, indices) + bag_args, kw, None, reference, "update"


_TORCH = []
#: the torch dtype of each float table dtype (filled on the first _torch() call)
TORCH_DTYPES: dict = {}


def _torch():
    """(torch, perfkernels.torch), imported once: the import takes seconds."""
    if not _TORCH:
        import torch
        import perfkernels.torch as pkt
        _TORCH.extend((torch, pkt))
        TORCH_DTYPES.update({np.float32: torch.float32, np.float16: torch.float16,
                             BF16: torch.bfloat16})
    return _TORCH


def _torch_bag_values(d: Draw, rows: int, errors: tuple):
    """The values of up to 8 bags (lengths 0, 1, 2, 3, 17) for the torch entry points, sometimes
    one out of range (the call may then raise ``errors``), and the index dtype (int32 values that
    do not fit become -1): (nbags, lens, n, values, index dtype)."""
    torch, _ = _torch()
    nbags = d.int(0, 8)
    lens = [d.pick((0, 1, 2, 3, 17)) for _ in range(nbags)]
    n = sum(lens)
    values = np.array([d.int(0, rows - 1) if rows else 0 for _ in range(n)], np.int64)
    if n and (rows == 0 or d.chance(8)):
        values[d.int(0, n - 1)] = d.pick(HUGE_INDICES + (rows,))
        d.errors.update(errors)
    ix_t = d.pick((torch.int32, torch.int64))
    if ix_t == torch.int32:
        values = np.where((values >= 2 ** 31) | (values < -2 ** 31), -1, values)
    return nbags, lens, n, values, ix_t


def torch_bags(d: Draw, rows: int, weights: bool = True):
    """Bags for the torch entry points: (indices, offsets or None, reference kwargs); an
    out-of-range index must raise IndexOutOfRangeError (an IndexError and a RuntimeError)."""
    torch, pkt = _torch()
    nbags, lens, n, values, ix_t = _torch_bag_values(d, rows, (pkt.IndexOutOfRangeError,))
    ref_kw = {"mode": d.pick(("sum", "mean"))}
    if nbags and len(set(lens)) == 1 and d.chance(2):
        indices, offs = values.reshape(nbags, lens[0]), None
    else:
        indices = values
        offs = np.cumsum([0] + lens[:-1]).astype(np.int64) if nbags else np.zeros(0, np.int64)
        if d.chance(2):
            offs = np.append(offs, n)
            ref_kw["include_last_offset"] = True
        ref_kw["offsets"] = offs
    if weights and d.chance(3):
        ref_kw["per_sample_weights"] = d.floats(n).reshape(indices.shape)
    as_t = lambda a: None if a is None else torch.from_numpy(a).to(ix_t)  # noqa: E731
    return indices, as_t(indices), as_t(offs), ref_kw


def _named(fn, name: str):
    fn.__name__ = fn.__qualname__ = name
    return fn


def fuzz_torch_quantized(d: Draw):
    """perfkernels.torch's quantized lookups: the embedding_bag_{byte,4bit,2bit}_rowwise_offsets
    aliases of torch.ops.quantized and QuantizedEmbeddingBag.from_packed(...).forward."""
    torch, pkt = _torch()
    bits = d.pick((8, 4, 2))
    rows = d.int(0, 30)
    dim = (1 if bits == 8 else 8 // bits) * d.int(1, 20)   # what torch's ops infer from a row
    packed, meta = packed_table(d, rows, dim, bits)
    indices, ix_t, offs_t, ref_kw = torch_bags(d, rows)
    psw = ref_kw.get("per_sample_weights")
    psw_t = None if psw is None else torch.from_numpy(psw)
    mode, last = ref_kw["mode"], ref_kw.get("include_last_offset", False)
    if d.chance(2):
        name = {8: "byte", 4: "4bit", 2: "2bit"}[bits]
        op = getattr(pkt, f"embedding_bag_{name}_rowwise_offsets")
        args = (torch.from_numpy(packed), ix_t, offs_t)
        kw = dict(mode=("sum", "mean").index(mode), per_sample_weights=psw_t, include_last_offset=last)
        ref_kw["mode"] = "sum"          # as torch's ops, whatever the mode
    else:
        if rows and d.chance(3):
            ref_kw["padding_idx"] = d.int(-rows, rows - 1)
        module = pkt.QuantizedEmbeddingBag.from_packed(
            torch.from_numpy(packed), bits=bits, dim=dim if d.chance(2) else None, mode=mode,
            include_last_offset=last, padding_idx=ref_kw.get("padding_idx"))
        op = _named(lambda *a: module(*a), "QuantizedEmbeddingBag.forward")
        args, kw = (ix_t, offs_t, psw_t), {}
    call = _named(lambda *a, **k: op(*a, **k).numpy(), op.__name__)
    return (call, args, kw, None,
            lambda: quantized_expected(packed, meta, bits, dim, indices, **ref_kw), "qbags")


def fuzz_torch_module(d: Draw):
    """perfkernels.torch.EmbeddingBag (nn.EmbeddingBag's drop-in) forward, frozen (the direct
    kernel route) or trainable (through autograd)."""
    torch, pkt = _torch()
    rows, dim = d.int(0, 30), d.pick(DIMS)
    dtype = d.pick((np.float32, np.float16, BF16))
    table = d.floats(rows * dim).astype(dtype).reshape(rows, dim)
    indices, ix_t, offs_t, ref_kw = torch_bags(d, rows, weights=False)
    if indices.ndim == 2 and indices.shape[1] == 0:
        d.errors.add(RuntimeError)       # torch refuses 2-D input without columns
    psw = None
    if ref_kw["mode"] == "sum" and d.chance(3):
        # torch takes weights of the table's dtype only
        psw = torch.from_numpy(d.floats(indices.size).reshape(indices.shape)).to(
            TORCH_DTYPES[dtype])
        ref_kw["per_sample_weights"] = psw.float().numpy()
    if rows and d.chance(3):
        ref_kw["padding_idx"] = d.int(-rows, rows - 1)
    weight = torch.from_numpy(table.view(np.uint16)).view(torch.bfloat16) if dtype == BF16 else \
        torch.from_numpy(table)
    module = pkt.EmbeddingBag.from_pretrained(
        weight, freeze=d.chance(2), mode=ref_kw["mode"],
        include_last_offset=ref_kw.get("include_last_offset", False), padding_idx=ref_kw.get("padding_idx"))
    args = (ix_t, offs_t, psw)
    forward = _named(lambda *a: module(*a).detach(), "EmbeddingBag.forward")
    return (forward, args, {}, None,
            lambda: (ref.embedding_bag(table, indices, **ref_kw), np.dtype(dtype)), "torch")


def fuzz_torch_lstm(d: Draw):
    """torch.ops.perfkernels.lstm_unit / lstm_unit_backward against the float64 reference, and
    perfkernels.torch.LSTMCell (forward and its gradients) against torch.nn.LSTMCell."""
    torch, pkt = _torch()
    n, dim = d.int(0, 6), d.pick(DIMS[1:10])
    c_prev, c, dh, dc = (moderate(d, n * dim).reshape(n, dim) for _ in range(4))
    gates = moderate(d, n * 4 * dim).reshape(n, 4 * dim)
    fb = float(d.pick((0.0, 1.0, -2.5)))
    what = d.int(0, 2)
    if what == 0:
        if d.invalid(20, ValueError, RuntimeError):
            gates = gates[:, 1:]
        to_np = _named(lambda *a: tuple(t.numpy() for t in torch.ops.perfkernels.lstm_unit(*a)),
                       "perfkernels::lstm_unit")
        args = (torch.from_numpy(c_prev), torch.from_numpy(gates), fb)
        return to_np, args, {}, None, lambda: ref.lstm_unit(c_prev, c_prev, gates, forget_bias=fb,
                                                             gate_order="ifgo"), "lstm"
    if what == 1:
        if d.invalid(20, ValueError, RuntimeError):
            dh = dh[:, 1:]
        to_np = _named(lambda *a: tuple(t.numpy() for t in torch.ops.perfkernels.lstm_unit_backward(*a)),
                       "perfkernels::lstm_unit_backward")
        args = tuple(torch.from_numpy(a) for a in (c_prev, gates, c, dh, dc)) + (fb,)
        return to_np, args, {}, None, lambda: ref.lstm_unit_backward(
            c_prev, gates, c, dh, dc, forget_bias=fb, gate_order="ifgo")[1:], "lstm"
    in_features = d.int(1, 9)
    torch.manual_seed(d.int(0, 2 ** 16))
    theirs = torch.nn.LSTMCell(in_features, dim)
    ours = pkt.LSTMCell(in_features, dim)
    ours.load_state_dict(theirs.state_dict())
    x = torch.from_numpy(moderate(d, n * in_features).reshape(n, in_features))
    hx = (torch.from_numpy(dh), torch.from_numpy(c_prev)) if d.chance(2) else None

    def step(cell):
        cell.zero_grad()
        h, c_new = cell(x, hx)
        (h * torch.from_numpy(dc) + c_new * torch.from_numpy(c)).sum().backward()
        return (h.detach().numpy(), c_new.detach().numpy(),
                *(p.grad.numpy().copy() for p in (cell.weight_ih, cell.weight_hh, cell.bias_ih)))

    return (_named(lambda: step(ours), "LSTMCell"), (), {}, None,
            lambda: tuple(a.astype(np.float64) for a in step(theirs)), "lstm")


#: The targets in the order the corpus knows them: new ones only ever go at the end.
def fuzz_torch_collection(d: Draw):
    """perfkernels.torch.EmbeddingBagCollection forward on a KeyedJaggedTensor: tables of their own
    widths and pooling, features sharing a table, weighted or not, with or without autograd (the
    one-call multi-table route, or one lookup per table), against a float64 reference per feature;
    an out-of-range value must raise IndexOutOfRangeError."""
    torch, pkt = _torch()
    num_tables = d.int(1, 3)
    cfgs = [pkt.EmbeddingBagConfig(d.int(1, 12), d.pick(DIMS[1:10]), name=f"t{t}",
                                   pooling=d.pick(("sum", "mean"))) for t in range(num_tables)]
    num_features, batch = d.int(1, 4), d.int(0, 4)
    keys = [f"f{f}" for f in range(num_features)]
    table_of = [d.int(0, num_tables - 1) for _ in keys]
    for f, t in enumerate(table_of):
        cfgs[t].feature_names.append(keys[f])
    cfgs = [c for c in cfgs if c.feature_names]
    weighted = d.chance(3)
    ebc = pkt.EmbeddingBagCollection(cfgs, is_weighted=weighted)
    arrays = {}
    with torch.no_grad():
        for c in cfgs:
            w = moderate(d, c.num_embeddings * c.embedding_dim).reshape(c.num_embeddings, -1)
            ebc.embedding_bags[c.name].weight.copy_(torch.from_numpy(w.astype(np.float32)))
            arrays[c.name] = ebc.embedding_bags[c.name].weight.detach().numpy().copy()
    rows_of = {k: int(c.num_embeddings) for c in cfgs for k in c.feature_names}
    lengths = np.array([d.pick((0, 1, 2, 3)) for _ in range(num_features * batch)], np.int64)
    values = np.concatenate([[d.int(0, rows_of[keys[f]] - 1)
                              for _ in range(int(lengths[f * batch:(f + 1) * batch].sum()))]
                             for f in range(num_features)] + [[]]).astype(np.int64)
    if values.size and d.chance(8):
        values[d.int(0, values.size - 1)] = d.pick(HUGE_INDICES + (max(rows_of.values()),))
        if any(values[o] >= rows_of[keys[f]] or values[o] < 0
               for f in range(num_features)
               for o in range(int(lengths[:f * batch].sum()), int(lengths[:(f + 1) * batch].sum()))):
            d.errors.add(pkt.IndexOutOfRangeError)
    psw = moderate(d, values.size) if weighted else None
    grad = d.chance(2)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

    def forward(values, lengths, weights):
        kjt = pkt.KeyedJaggedTensor(keys, values, weights=weights, lengths=lengths)
        with torch.set_grad_enabled(grad):
            return ebc(kjt).values().detach().numpy()

    def reference():
        parts = []
        for c in cfgs:
            for k in c.feature_names:
                f = keys.index(k)
                begin, end = int(offsets[f * batch]), int(offsets[(f + 1) * batch])
                parts.append(ref.embedding_bag(
                    arrays[c.name], values[begin:end], offsets[f * batch:(f + 1) * batch + 1] - begin,
                    include_last_offset=True, mode=_pooling(c.pooling),
                    per_sample_weights=None if psw is None else psw[begin:end]))
        if not parts:
            return ref.Expected(np.zeros((batch, 0)), np.zeros((batch, 0)))
        return ref.Expected(*(np.concatenate([p[k] for p in parts], axis=1) for k in range(2)))

    args = (torch.from_numpy(values), torch.from_numpy(lengths),
            None if psw is None else torch.from_numpy(psw))
    return (_named(forward, "EmbeddingBagCollection.forward"), args, {}, None, reference, "bags")


def _pooling(pooling) -> str:
    return str(getattr(pooling, "name", pooling)).lower()


# --- state between calls, autograd, concurrency, resource limits ---------------------------------

def _as_torch_table(table: np.ndarray):
    torch, _ = _torch()
    if table.dtype == BF16:
        return torch.from_numpy(table.view(np.uint16).copy()).view(torch.bfloat16)
    return torch.from_numpy(table.copy())


def _check_forward(got, table: np.ndarray, indices, ref_kw: dict, out_dtype) -> None:
    """A module's forward against the float64 reference of the table it should have read."""
    _check_result("torch", got.detach(), (ref.embedding_bag(table, indices, **ref_kw),
                                          np.dtype(out_dtype)), None)


def fuzz_torch_stateful(d: Draw):
    """perfkernels.torch.EmbeddingBag through a sequence of state changes between forwards, each
    forward (with autograd, or without: the cached-view inference route) checked against the
    table the module holds then: the weight reassigned (another dtype too), replaced by a
    column-major tensor, transposed (a square table), re-viewed float16 <-> bfloat16, loaded with
    load_state_dict, scaled in place, the module converted again (convert twice), a module shared
    by two names of a parent."""
    torch, pkt = _torch()
    dim = d.pick(DIMS[1:12])
    rows = dim if d.chance(3) else d.int(1, 12)    # square tables can be transposed in place
    dtypes = (np.float32, np.float16, BF16)
    table = d.floats(rows * dim).astype(d.pick(dtypes)).reshape(rows, dim)
    table = np.where(np.isfinite(table.astype(np.float32)), table, 0).astype(table.dtype)
    indices, ix_t, offs_t, ref_kw = torch_bags(d, rows, weights=False)
    if indices.ndim == 2 and indices.shape[1] == 0:   # torch refuses 2-D input without columns
        ref_kw["offsets"] = np.zeros(indices.shape[0], np.int64)
        offs_t = torch.zeros(indices.shape[0], dtype=ix_t.dtype)
        indices, ix_t = indices.reshape(-1), ix_t.reshape(-1)
    holder = torch.nn.Module()
    holder.a = torch.nn.EmbeddingBag(rows, dim, mode=ref_kw["mode"],
                                     include_last_offset=ref_kw.get("include_last_offset", False),
                                     dtype=torch.float32)
    holder.b = holder.a
    with torch.no_grad():
        holder.a.weight.data = _as_torch_table(table)
    steps = [d.int(0, 6) for _ in range(d.int(1, 4))]
    inference = [d.chance(2) for _ in steps]
    converts = [d.pick((None, torch.float16, torch.bfloat16)) for _ in steps]
    news = [d.floats(rows * dim).astype(d.pick(dtypes)).reshape(rows, dim) for _ in steps]
    news = [np.where(np.isfinite(t.astype(np.float32)), t, 0).astype(t.dtype) for t in news]

    def run():
        model, current = pkt.convert(holder), table
        out_dtype = {torch.float32: np.float32, torch.float16: np.float16,
                     torch.bfloat16: BF16}
        for step, dtype, new, no_grad in zip(steps, converts, news, inference):
            m = model.a
            if step == 0:                              # reassign, any dtype
                m.weight.data = _as_torch_table(new)
                current = new
            elif step == 1:                            # the same values, column-major
                m.weight.data = _as_torch_table(new).t().contiguous().t()
                current = new
            elif step == 2 and current.dtype in (np.float16, BF16):   # re-view the 16-bit words
                other = BF16 if current.dtype == np.float16 else np.dtype(np.float16)
                m.weight.data = m.weight.data.view(torch.bfloat16 if other == BF16 else torch.float16)
                current = current.view(other)
                current = np.where(np.isfinite(current.astype(np.float32)), current, 0).astype(other)
                with torch.no_grad():
                    m.weight.copy_(_as_torch_table(current))
            elif step == 3:                            # load_state_dict (cast to the held dtype)
                loaded = _as_torch_table(new).float()
                model.load_state_dict({"a.weight": loaded, "b.weight": loaded})
                held = m.weight.dtype
                current = new.astype(np.float32).astype({torch.float32: np.float32,
                                                         torch.float16: np.float16,
                                                         torch.bfloat16: BF16}[held])
            elif step == 4:                            # scaled in place
                with torch.no_grad():
                    m.weight.mul_(2)
                current = (current.astype(np.float32) * 2).astype(current.dtype)
            elif step == 5:                            # convert again (ours stay as they are)
                model = pkt.convert(model, dtype=dtype)
            elif step == 6 and rows == dim:            # transposed: the same shape, other strides
                m.weight.data = m.weight.data.t()
                current = np.ascontiguousarray(current.T)
            assert model.b is model.a, "a module shared by two names was split"
            m = model.a
            current = current.astype(np.float32).astype(out_dtype[m.weight.dtype])
            finite = np.where(np.isfinite(current.astype(np.float32)), current, 0).astype(current.dtype)
            if finite.tobytes() != current.tobytes():   # keep the sums finite
                current = finite
                with torch.no_grad():
                    m.weight.copy_(_as_torch_table(current))
            with torch.set_grad_enabled(not no_grad):
                got = m(ix_t, offs_t)
            _check_forward(got, current, indices, ref_kw, out_dtype[m.output_dtype or m.weight.dtype])

    return _named(run, "EmbeddingBag (state between calls)"), (), {}, None, lambda: None, "checked"


def fuzz_torch_autograd(d: Draw):
    """Gradients beyond one backward, against torch.nn.EmbeddingBag: autograd.grad on a subset
    (the weight, per_sample_weights or both), a module used twice in one graph, retain_graph
    and a second backward, double backward through per_sample_weights (torch's RuntimeError);
    with a fused sgd optimizer, the table's step and that autograd.grad does not step it."""
    torch, pkt = _torch()
    rows, dim = d.int(1, 10), d.pick(DIMS[1:9])
    table = moderate(d, rows * dim).reshape(rows, dim)
    uses = []
    for _ in range(d.int(1, 2)):
        ix, _, offs_t, _ = torch_bags(d, rows, weights=False)
        if ix.ndim == 2 and ix.shape[1] == 0:     # torch's 2-D path fails on [B, 0] ("step must
            offs_t = torch.zeros(ix.shape[0], dtype=torch.int64)   # be nonzero"): 1-D instead
            ix = ix.reshape(-1)
        uses.append((np.mod(ix, rows), offs_t))   # valid rows: the cases here are about autograd
    d.errors.clear()
    fused = d.chance(3)
    how = d.pick(("backward", "grad_weight", "grad_psw", "grad_both", "retain", "double"))
    lr = 0.25
    ours = pkt.EmbeddingBag(rows, dim, mode="sum",
                            fused_optimizer=("sgd", {"lr": lr}) if fused else None)
    theirs = torch.nn.EmbeddingBag(rows, dim, mode="sum")
    with torch.no_grad():
        ours.weight.copy_(torch.from_numpy(table))
        theirs.weight.copy_(torch.from_numpy(table))
    psws = [moderate(d, ix.size).reshape(ix.shape) for ix, _ in uses]
    coef_seeds = [d.int(0, 2 ** 32 - 1) for _ in uses]

    def graph(module):
        psw = [torch.from_numpy(p.copy()).requires_grad_() for p in psws]
        total = 0
        for (ix, offs_t), p, seed in zip(uses, psw, coef_seeds):
            # torch's 2-D input takes no offsets; ours follows it
            out = module(torch.from_numpy(ix), None if offs_t is None else offs_t.long(), p)
            coef = np.random.default_rng(seed).uniform(-4, 4, tuple(out.shape)).astype(np.float32)
            total = total + (out * torch.from_numpy(coef)).sum()   # gradients: sums of terms <= 16
        return total, psw

    def grads(module):
        loss, psw = graph(module)
        w = module.weight
        if how == "backward":
            loss.backward()
            return [w.grad] + [p.grad for p in psw]
        if how == "retain":
            loss.backward(retain_graph=True)
            loss.backward()
            return [w.grad] + [p.grad for p in psw]
        if how == "double":
            g = torch.autograd.grad(loss, psw, create_graph=True)
            try:
                sum((x ** 2).sum() for x in g).backward()
            except RuntimeError as exc:
                return [str(exc)]
            return ["no error"]
        inputs = {"grad_weight": [w], "grad_psw": psw, "grad_both": [w] + psw}[how]
        return list(torch.autograd.grad(loss, inputs, allow_unused=fused))

    def outcome(module):
        try:
            return grads(module), None
        except RuntimeError as exc:            # e.g. a per_sample_weights unused by the graph
            return None, str(exc).split(".")[0]

    # a gradient element is a float32 sum of at most K terms of at most 16 (coefficients, table
    # and weights in [-4, 4]; K: the entries of both uses, or D), summed in another order than
    # torch's: each partial sum is within 16 K, so the two differ by at most 2 K * 16 K * 2**-24
    terms = max(dim, sum(ix.size for ix, _ in uses), 1)
    atol = 2 * terms * 16 * terms * 2.0 ** -24

    def close(got, want):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=atol)

    def run():
        want, want_error = outcome(theirs)
        before = ours.weight.detach().clone()
        got, got_error = outcome(ours)
        assert got_error == want_error, f"{how}: {got_error!r}, torch: {want_error!r}"
        if want_error is not None:
            return
        if how == "double":
            assert got == want, f"double backward: {got} != torch's {want}"
            return
        weight_grad = how in ("backward", "retain", "grad_weight", "grad_both")
        start = 1 if weight_grad else 0
        # (a fused table's second backward with retain_graph reads the table the first stepped)
        for g, w in zip(got[start:], want[start:] if not (fused and how == "retain") else []):
            close(g, w)
        if not fused:
            if weight_grad:
                close(got[0], want[0])
            return
        assert ours.weight.grad is None
        if how in ("backward", "retain"):       # stepped once per backward: sgd, lr * the gradient
            close(ours.weight.detach(), before - lr * want[0])
        else:                                   # autograd.grad: no step
            assert torch.equal(ours.weight.detach(), before), f"autograd.grad ({how}) stepped the table"

    return _named(run, "EmbeddingBag (autograd)"), (), {}, None, lambda: None, "checked"


def fuzz_concurrent_inputs(d: Draw):
    """One thread rewrites the index array (an entry flips between a valid row and a bad value)
    while this one calls a lookup with out=: each call returns the result of the valid indices,
    or raises IndexError with out= untouched (docs/reliability.md)."""
    import threading
    kind = d.pick(("embedding_bag", "embedding_bag_quantized", "embedding_bags_multi"))
    rows, dim = d.int(1, 40), d.pick((1, 4, 16, 33))
    n = d.pick((300, 5000, 40000))
    rng = np.random.default_rng(d.int(0, 2 ** 32 - 1))
    table = rng.standard_normal((rows, dim)).astype(np.float32)
    packed = pk.quantize_rowwise(table, bits=8)
    ix = rng.integers(0, rows, n).astype(d.pick((np.int32, np.int64)))
    num_bags = max(2, n // d.pick((1, 7, 50)))
    num_bags -= num_bags % 2
    off = np.sort(rng.integers(0, n + 1, num_bags)).astype(np.int64)
    off[0] = 0
    positions = rng.choice(n, d.int(1, 4), replace=False)
    good = ix[positions].copy()
    bad = np.array([d.pick(HUGE_INDICES[:5] + (rows, -rows - 1)) for _ in positions]).astype(ix.dtype)
    threads = d.pick((None, 1, 2, 3))

    def call(out):
        if kind == "embedding_bag":
            return pk.embedding_bag(table, ix, off, out=out, num_threads=threads)
        if kind == "embedding_bag_quantized":
            return pk.embedding_bag_quantized(packed, ix, off, bits=8, out=out, num_threads=threads)
        half = num_bags // 2
        got = pk.embedding_bags_multi([table, table], ix, offsets=np.append(off, n),
                                      out=None if out is None else out.reshape(half, 2 * dim),
                                      num_threads=threads)
        return np.concatenate([got[:, :dim], got[:, dim:]])

    def run():
        expected = call(None)
        stop = threading.Event()

        def mutate():
            while not stop.is_set():
                ix[positions] = bad
                ix[positions] = good

        worker = threading.Thread(target=mutate)
        worker.start()
        out = np.empty((num_bags, dim), np.float32)
        try:
            for _ in range(4):
                out.fill(-7.0)
                try:
                    call(out)
                except IndexError:
                    assert np.all(out == -7.0), f"{kind}: IndexError with out= changed"
                else:
                    got = out if kind != "embedding_bags_multi" else np.concatenate(
                        [out.reshape(num_bags // 2, 2 * dim)[:, :dim],
                         out.reshape(num_bags // 2, 2 * dim)[:, dim:]])
                    assert got.tobytes() == expected.tobytes(), f"{kind}: a mixed result"
        finally:
            stop.set()
            worker.join()
        ix[positions] = good

    return _named(run, f"{kind} (indices rewritten during the call)"), (), {}, None, \
        lambda: None, "checked"


_LIMITED = []   # the helper process running under the resource limits, started once

_LIMITED_SERVER = r"""
import json, os, resource, sys
import numpy as np
import perfkernels as pk
try:
    import perfkernels.torch   # jobs on PyTorch's libgomp team
except ImportError:
    pass
rng = np.random.default_rng(0)
table = rng.standard_normal((64, 64)).astype(np.float32)
# the inputs are made before the limits: the threads a call starts keep their stacks and use up
# the headroom, after which only a clean MemoryError (perfkernels' own allocations) is expected
values = rng.integers(0, 64, 2 * 400_000)
starts = np.arange(0, 2 * 400_000 + 1, 8)
with open("/proc/self/statm") as f:
    vm = int(f.read().split()[0]) * resource.getpagesize()
if os.environ.get("PK_FUZZ_RLIMIT_AS", "1") == "1":     # (ASan cannot run under RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm + (512 << 20),) * 2)
nproc = len(os.listdir("/proc/self/task")) + 16
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
print("ready", flush=True)
for line in sys.stdin:
    n, threads, kind = json.loads(line)
    ix, off = values[:n], starts[:n // 8]
    try:
        if kind == "multi":
            args = ([table, table], values[:2 * n])
            kw = dict(offsets=starts[:2 * n // 8 + 1])
            fn = pk.embedding_bags_multi
        else:
            args, kw, fn = (table, ix, off), {}, pk.embedding_bag
        got = fn(*args, **kw, num_threads=threads)
        same = got.tobytes() == fn(*args, **kw, num_threads=1).tobytes()
        print("ok" if same else "differs", flush=True)
    except MemoryError:
        print("ok", flush=True)   # an allocation refused under the limit is a clean failure
"""


def fuzz_resource_limits(d: Draw):
    """Large thread counts in a process under RLIMIT_AS (an address space a few hundred MB above
    what it uses: a memory-capped container) and RLIMIT_NPROC: every call returns the bits of
    num_threads=1 (the pool runs a job on the threads it could start); the process must never be
    ended by a thread-creation failure (libgomp's exit(1))."""
    import json
    import subprocess
    from perfkernels import _parallel
    threads = d.pick((64, 300, 1024, 4096, _parallel.MAX_THREADS))
    if "libasan" in os.environ.get("LD_PRELOAD", ""):   # no RLIMIT_AS there: keep it modest
        threads = min(threads, 64)
    n = d.pick((2000, 50000, 400000))
    kind = d.pick(("bag", "multi"))

    def run():
        if not _LIMITED or _LIMITED[0].poll() is not None:
            env = dict(os.environ)
            if "libasan" in env.get("LD_PRELOAD", ""):
                env["PK_FUZZ_RLIMIT_AS"] = "0"
            proc = subprocess.Popen([sys.executable, "-c", _LIMITED_SERVER], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
            _LIMITED[:] = [proc]
        proc = _LIMITED[0]
        proc.stdin.write(json.dumps([n, threads, kind]) + "\n")
        proc.stdin.flush()
        answer = proc.stdout.readline().strip()
        if answer != "ok":
            proc.wait(10)
            raise AssertionError(f"{threads} threads under RLIMIT_AS / RLIMIT_NPROC: "
                                 f"{answer or 'the process ended'} (exit {proc.returncode}): "
                                 f"{proc.stderr.read()[-1000:]}")

    return _named(run, "thread counts under resource limits"), (), {}, None, lambda: None, "checked"


TARGETS = (fuzz_embedding_bag, fuzz_embedding_bag_quantized, fuzz_quantize, fuzz_dequantize,
           fuzz_convert, fuzz_lstm, fuzz_torch_embedding_bag,
           fuzz_embedding_bags_multi, fuzz_backward_update, fuzz_torch_quantized, fuzz_torch_module,
           fuzz_torch_lstm, fuzz_torch_collection, fuzz_torch_stateful, fuzz_torch_autograd,
           fuzz_concurrent_inputs, fuzz_resource_limits)
#: The corpus was recorded with 7 targets, picked by ``byte % 7``: bytes below FIRST_NEW_BYTE keep
#: that meaning, the ones from it up pick the targets added since (the stored inputs whose byte was
#: there were rewritten to the same target below it).
OLD_TARGETS, FIRST_NEW_BYTE = 7, 140
#: The targets whose function takes num_threads= (the torch entry points do not).
THREADED = {fuzz_embedding_bag, fuzz_embedding_bag_quantized, fuzz_quantize, fuzz_dequantize,
            fuzz_convert, fuzz_lstm, fuzz_embedding_bags_multi, fuzz_backward_update}
#: num_threads= values: the default, valid counts (compared bit for bit with 1 thread) and
#: invalid ones with their documented exception.
THREAD_COUNTS = ((None, None), (None, None), (None, None), (None, None), (1, None), (2, None),
                 (3, None), (8, None), (np.int64(2), None), (2, None), (0, ValueError),
                 (-1, ValueError), (1.5, TypeError), (True, TypeError), (2 ** 40, ValueError),
                 ("2", TypeError))


#: Targets added later still, each on one byte value of its own from the top down (the stored
#: inputs that had such a byte were rewritten to another with the same target).
LATER_TARGETS = (fuzz_torch_collection, fuzz_torch_stateful, fuzz_torch_autograd,
                 fuzz_concurrent_inputs, fuzz_resource_limits)


def pick_target(d: Draw):
    byte = d.u8()
    if byte < FIRST_NEW_BYTE:
        return TARGETS[byte % OLD_TARGETS]
    if byte > 255 - len(LATER_TARGETS):
        return LATER_TARGETS[255 - byte]
    middle = len(TARGETS) - OLD_TARGETS - len(LATER_TARGETS)
    return TARGETS[OLD_TARGETS + (byte - FIRST_NEW_BYTE) % middle]


# --- the oracle ----------------------------------------------------------------------------------

def _snapshot(out):
    if out is None:
        return None
    if isinstance(out, tuple):
        return tuple(_snapshot(o) for o in out)
    return np.array(out, copy=True) if isinstance(out, np.ndarray) else list(out)


def _same(a, b) -> bool:
    if isinstance(a, tuple):
        if not isinstance(b, tuple) or len(a) != len(b):
            return False
        return all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and a.tobytes() == b.tobytes()
    return a == b


#: Sums whose terms reach this size may overflow float32 (a correct float32 kernel returns inf where
#: float64 does not); such elements, and those whose reference is NaN, are not compared.
FLOAT32_SAFE = 1e37


def _assert_close_where_defined(got, want: ref.Expected, rtol: float, atol: float) -> None:
    value, magnitude = want
    defined = np.isfinite(magnitude) & (magnitude < FLOAT32_SAFE) & np.isfinite(value)
    ref.assert_close(np.where(defined, got, 0.0),
                     ref.Expected(np.where(defined, value, 0.0), np.where(defined, magnitude, 0.0)),
                     rtol=rtol, atol=atol)


def _check_result(kind: str, got, want, out) -> None:
    if kind in ("bags", "qbags"):
        # float32 accumulation of at most 17 terms a bag: error < 17 * 2**-24 of the magnitude;
        # atol covers products that land among the subnormals (quantized: weight * scale rounded
        # there, up to 2**-150, then times a code up to 255)
        _assert_close_where_defined(got, want, rtol=2e-6,
                                    atol=1e-43 if kind == "bags" else 17 * 2 ** 8 * 2.0 ** -150)
    elif kind == "bits":
        ref.assert_same_bits(got, want)
    elif kind == "dequantize":
        # q * scale + bias in float32: at most two roundings of terms that may cancel
        _assert_close_where_defined(got, want, rtol=2.5e-7, atol=1e-43)
    elif kind == "torch":
        (value, magnitude), dtype = want
        assert str(got.dtype).replace("torch.", "") == dtype.name, (got.dtype, dtype)
        out = got.float().numpy()
        # the float32 sum, then one rounding to the table's dtype
        rtol = 2e-6 + float(np.finfo(np.float32 if dtype == np.float32 else np.float16).eps
                            if dtype != BF16 else 2.0 ** -8)
        # sums past the dtype's largest value may round to inf in it: not compared
        fits = magnitude < float(ml_dtypes.finfo(dtype).max) / 2
        _assert_close_where_defined(np.where(fits, out, 0.0),
                                    ref.Expected(np.where(fits, value, 0.0), np.where(fits, magnitude, 0.0)),
                                    rtol=rtol, atol=1e-43 if dtype == np.float32 else 6e-8)
        return
    elif kind == "update":
        expected, (weight0, state0, optimizer, hyper, rounding) = want
        weight, state = got
        ref.assert_update_close(weight, state, weight0, state0, expected, optimizer=optimizer,
                                stochastic=rounding, **hyper)
        return
    elif kind == "lstm":
        # sigmoid/tanh are good to ~1e-6 relative; products with inputs up to 4 scale that
        for g, w in zip(got, want):
            ref.assert_close(g, w, rtol=1e-5, atol=1e-5)
    if out is not None:
        outs = out if isinstance(out, tuple) else (out,)
        gots = got if isinstance(got, tuple) else (got,)
        for o, g in zip(outs, gots):
            if o is not None:
                assert g is o, "the result is not the caller's out= array"


def one_input(data: bytes) -> None:
    """Decode one call from `data`, run it, and check it against the oracle."""
    with np.errstate(all="ignore"):   # the references meet NaN and inf on purpose
        _one_input(data)


def _one_input(data: bytes) -> None:
    d = Draw(data)
    isa = d.pick(ISAS)
    target = pick_target(d)
    fn, args, kw, out, reference, kind = target(d)
    threads, thread_error = THREAD_COUNTS[d.int(0, len(THREAD_COUNTS) - 1)] if target in THREADED \
        else (None, None)
    if threads is not None:
        kw["num_threads"] = threads
    if thread_error:
        d.errors.add(thread_error)
    if out is not None:
        kw["out"] = out
    watched = [out] + d.watch
    before = [_snapshot(a) for a in watched]
    # The reference and the 1-thread run go first: out= may legally overlap an input, which the
    # call then rewrites.
    want = None if d.errors else reference()
    one_thread = None
    if not d.errors and target in THREADED and threads != 1 and d.rerun is not False:
        with pk.use_isa(isa):
            one_thread = (d.rerun or (lambda nt: fn(*args, **{**{k: v for k, v in kw.items()
                                                                 if k != "out"}, "num_threads": nt})))(1)
            one_thread = _snapshot(one_thread if isinstance(one_thread, tuple) else (one_thread,))
    with pk.use_isa(isa):
        try:
            got = fn(*args, **kw)
        except (TypeError, ValueError, IndexError, RuntimeError) as exc:
            if not any(isinstance(exc, e) for e in d.errors):
                raise AssertionError(f"{fn.__name__} raised {type(exc).__name__}: {exc}, "
                                     f"expected {sorted(e.__name__ for e in d.errors) or 'success'}") from exc
            if d.message and isinstance(exc, IndexError) and IndexError in d.errors:
                assert any(m in str(exc) for m in d.message.split("|")), \
                    f"{fn.__name__}: {exc!r} does not name {d.message}"
            for a, b in zip(watched, before):
                assert _same(_snapshot(a), b), f"{fn.__name__} changed its output before raising {exc!r}"
            return
    if d.errors:
        raise AssertionError(f"{fn.__name__} returned although the input drew "
                             f"{sorted(e.__name__ for e in d.errors)}")
    result = (d.result or (lambda g: g))(got)
    if one_thread is not None:
        assert _same(_snapshot(result if isinstance(result, tuple) else (result,)), one_thread), \
            f"{fn.__name__} with num_threads={threads!r} differs from num_threads=1"
    _check_result(kind, result, want, out)


def replay(paths) -> int:
    files = sorted(f for p in paths for f in (Path(p).rglob("*") if Path(p).is_dir() else [Path(p)])
                   if f.is_file())
    for f in files:
        try:
            one_input(f.read_bytes())
        except Exception:
            print(f"failing input: {f}", file=sys.stderr)
            raise
    print(f"replayed {len(files)} inputs")
    return len(files)


def main(argv) -> None:
    if len(argv) > 1 and argv[1] == "--replay":
        replay(argv[2:])
        return
    import atheris
    try:
        with atheris.instrument_imports(include=["perfkernels.torch"]):   # its Python code guides too
            import perfkernels.torch  # noqa: F401
    except ImportError:   # no torch: that target then fails loudly on its first input
        pass
    atheris.instrument_func(one_input)
    atheris.instrument_func(_one_input)
    for target in TARGETS:
        atheris.instrument_func(target)
    for helper in (draw_bags, large_bags, draw_out, layout, packed_table, in_place_layout,
                   torch_bags, pick_target, _check_forward):
        atheris.instrument_func(helper)
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
