"""fp16 / bf16 conversion: bit-exact with NumPy's astype and ml_dtypes' casts on every ISA path.

The oracles are independent implementations: NumPy's own float<->half casts and ml_dtypes' bfloat16
casts (through perfkernels.reference, which adds clip=True's saturation), plus PyTorch's for finite
values.  Comparisons are on the bit patterns.
"""
import threading

import numpy as np
import pytest

import perfkernels as pk
from conftest import CONVERSIONS as CONVERSION_TABLE
from conftest import readonly, unaligned
from perfkernels import _variants, reference as ref
from perfkernels.reference import assert_same_bits

BF16 = _variants.BFLOAT16


def bits(a):
    return a.view(np.uint16 if a.itemsize == 2 else np.uint32)


def reference(name, x):
    """The reference conversion of perfkernels.reference with the same name."""
    return getattr(ref, name)(x)


# the family's declaration, shared with the benchmarks
INPUT_DTYPE = {c.name: c.src for c in CONVERSION_TABLE}
CONVERSIONS = list(INPUT_DTYPE)


def float_edge_cases():
    """float32 values around every place where rounding to half or bfloat16 can go wrong."""
    specials = np.array([0x00000000, 0x80000000, 0x3f800000, 0xbf800000, 0x7f7fffff, 0xff7fffff,
                         0x00800000, 0x00000001, 0x807fffff, 0x7f800000, 0xff800000,
                         0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001, 0x7fa00000, 0x7fbfffff,
                         0x7f802000, 0x7f801fff, 0x7fffffff, 0xffffffff, 0x7fc00001],
                        dtype=np.uint32)
    # every half value, and the float midpoint to the next half value, +-1 float ulp
    h = np.arange(0, 0x7c00, dtype=np.uint32)
    lo = h.astype(np.uint16).view(np.float16).astype(np.float64)
    hi = (h + 1).astype(np.uint16).view(np.float16).astype(np.float64)
    mid = ((lo + hi) / 2).astype(np.float32).view(np.uint32)   # exact: halves have 11 bits
    half_ties = np.concatenate([mid - 1, mid, mid + 1, lo.astype(np.float32).view(np.uint32)])
    # every bfloat16 value's tie point with the next, +-1 ulp (upper 16 bits + 0x8000)
    b = np.arange(0, 0x7f80, dtype=np.uint32) << 16
    bf_ties = np.concatenate([b | 0x7fff, b | 0x8000, b | 0x8001, b])
    # around the half overflow threshold (65504 .. 65536) and the subnormal boundary
    around = np.concatenate([np.arange(0x477fe000, 0x47800100, 7, dtype=np.uint32),
                             np.arange(0x32fff000, 0x33001000, 1, dtype=np.uint32),
                             np.arange(0x387ff000, 0x38801000, 1, dtype=np.uint32)])
    pos = np.concatenate([specials, half_ties, bf_ties, around]).astype(np.uint32)
    return np.concatenate([pos, pos ^ 0x80000000]).view(np.float32)


def test_every_half_pattern_to_float(isa):
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    # the reference, not astype: NumPy on aarch64 quiets signalling NaNs (FCVT), the kernels do not
    assert_same_bits(pk.half_to_float(h), reference("half_to_float", h))


def test_every_bfloat16_pattern_to_float(isa):
    b = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(BF16)
    assert_same_bits(pk.bfloat16_to_float(b), b.astype(np.float32))


def test_every_half_pattern_round_trips(isa):
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    f = reference("half_to_float", h)               # signalling NaNs kept (see above)
    assert_same_bits(pk.float_to_half(f), reference("float_to_half", f))
    assert_same_bits(pk.float_to_half(f), h)        # NaN payloads included


@pytest.mark.parametrize("name", ["float_to_half", "float_to_bfloat16"])
def test_float_edge_cases(isa, name):
    x = float_edge_cases()
    assert_same_bits(getattr(pk, name)(x), reference(name, x))


@pytest.mark.parametrize("name", CONVERSIONS)
def test_a_million_random_bit_patterns(isa, name, rng):
    width = 32 if INPUT_DTYPE[name] == np.float32 else 16
    raw = rng.integers(0, 1 << width, size=1_000_003, dtype=np.uint64)
    x = raw.astype(np.uint32 if width == 32 else np.uint16).view(INPUT_DTYPE[name])
    assert_same_bits(getattr(pk, name)(x), reference(name, x))


@pytest.mark.parametrize("name", CONVERSIONS)
def test_every_length_0_to_70_and_odd_large(isa, name, rng):
    for n in list(range(71)) + [1023, 4097, 100_003]:
        x = (rng.standard_normal(n) * 1000).astype(np.float32).astype(INPUT_DTYPE[name])
        assert_same_bits(getattr(pk, name)(x), reference(name, x))


@pytest.mark.parametrize("name", CONVERSIONS)
def test_streaming_size_with_unaligned_output_start(isa, name, rng):
    # large enough for non-temporal stores; the output view starts at an odd element so the
    # kernel's alignment head is exercised, and a guard element after it must stay untouched
    n = (24 << 20) // 6 + 37
    x = rng.standard_normal(n).astype(np.float32).astype(INPUT_DTYPE[name])
    want = reference(name, x)
    buf = np.zeros(n + 2, dtype=want.dtype)
    guard = np.array([1.5, -2.5], dtype=np.float32).astype(want.dtype)
    buf[0], buf[-1] = guard
    out = buf[1:-1]
    assert getattr(pk, name)(x, out=out) is out
    assert_same_bits(out, want)
    assert_same_bits(buf[[0, -1]], guard)


@pytest.mark.parametrize("name, kw", [("float_to_half", {}), ("float_to_half", {"clip": True}),
                                      ("half_to_float", {}), ("float_to_bfloat16", {})])
def test_one_nan_anywhere_in_a_block_and_false_alarms(isa, name, kw, rng):
    """The float16 kernels and float_to_bfloat16 test blocks of four vectors for NaN at once (the
    sum of their float32 side): a signalling NaN at every position of a 160-element array converts
    as the reference says (float16 keeps its bits), and inf with -inf in the same lane of two
    vectors of a block (a NaN sum, no NaN) converts as the reference does."""
    dtype = INPUT_DTYPE[name]
    base = (rng.standard_normal(160) * 100).astype(dtype)
    snan = 0x7f800001 if dtype == np.float32 else 0x7c01
    for k in range(len(base)):
        x = base.copy()
        bits(x)[k] = snan
        assert_same_bits(getattr(pk, name)(x, **kw), getattr(ref, name)(x, **kw))
    x = base.copy()
    x[0::32], x[16::32] = np.inf, -np.inf      # 16 lanes apart: one lane of two vectors
    x[::7] = np.inf                              # and inf beside -inf elsewhere too
    assert_same_bits(getattr(pk, name)(x, **kw), getattr(ref, name)(x, **kw))


def test_clip_saturates_and_keeps_nan(isa):
    x = np.array([65504, 65519, 65520, 70000, 1e30, np.inf, -np.inf, -70000, 1.0, np.nan, -np.nan,
                  6e-8, -0.0] * 5, dtype=np.float32)
    x[-1] = np.array(0x7f800001, np.uint32).view(np.float32)     # a signalling NaN
    assert_same_bits(pk.float_to_half(x, clip=True), ref.float_to_half(x, clip=True))
    assert np.isinf(pk.float_to_half(x, clip=False)[5])


@pytest.mark.parametrize("shape", [(0,), (3, 0, 2), (), (5, 7), (2, 3, 4, 5)])
def test_any_shape(isa, shape, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    y = pk.float_to_half(x)
    assert y.shape == x.shape
    assert_same_bits(y, x.astype(np.float16))
    assert_same_bits(pk.half_to_float(y), y.astype(np.float32))


@pytest.mark.parametrize("name", CONVERSIONS)
def test_unaligned_readonly_and_strided_inputs(isa, name, rng):
    x = (rng.standard_normal(1001) * 100).astype(np.float32).astype(INPUT_DTYPE[name])
    want = reference(name, x)
    fn = getattr(pk, name)
    assert_same_bits(fn(unaligned(x)), want)
    assert_same_bits(fn(readonly(x)), want)
    big = np.repeat(x, 3)
    assert_same_bits(fn(big[::3]), want)
    assert_same_bits(fn(x.reshape(7, 143).T), reference(name, x.reshape(7, 143).T))
    if x.dtype == np.float32:
        swapped = x.astype(x.dtype.newbyteorder(">"))
        assert_same_bits(fn(swapped), want)


@pytest.mark.parametrize("name", CONVERSIONS)
def test_out_is_written_in_place(isa, name, rng):
    x = rng.standard_normal((4, 33)).astype(np.float32).astype(INPUT_DTYPE[name])
    want = reference(name, x)
    out = np.empty_like(want)
    assert getattr(pk, name)(x, out=out) is out
    assert_same_bits(out, want)
    # a non-contiguous or unaligned out is filled through a temporary
    big = np.zeros((4, 66), dtype=want.dtype)
    assert getattr(pk, name)(x, out=big[:, ::2]) is not None
    assert_same_bits(np.ascontiguousarray(big[:, ::2]), want)
    ua = unaligned(np.zeros_like(want))
    getattr(pk, name)(x, out=ua)
    assert_same_bits(np.ascontiguousarray(ua), want)


def test_out_overlapping_the_input():
    buf = np.arange(64, dtype=np.float32)
    h = pk.float_to_half(buf[:32])
    pk.half_to_float(h, out=buf[16:48])          # no overlap with h: direct
    wide = np.zeros(64, dtype=np.float32)
    wide[:32] = np.arange(32)
    as_half = wide.view(np.float16)               # 128 halves sharing memory with `wide`
    src = as_half[:32].copy()
    pk.half_to_float(as_half[:32], out=wide[8:40])
    assert_same_bits(wide[8:40], src.astype(np.float32))


@pytest.mark.parametrize("name", CONVERSIONS)
def test_wrong_dtypes_and_out_are_errors(name):
    fn = getattr(pk, name)
    good = np.ones(8, dtype=INPUT_DTYPE[name])
    wrong = np.ones(8, dtype=np.float64)
    with pytest.raises(TypeError, match=r"must have dtype .*got float64"):
        fn(wrong)
    out_dtype = reference(name, good).dtype
    with pytest.raises(TypeError, match="out must have dtype"):
        fn(good, out=np.empty(8, dtype=np.int8))
    with pytest.raises(ValueError, match=r"out has shape \(9,\); expected \(8,\)"):
        fn(good, out=np.empty(9, dtype=out_dtype))
    ro = np.empty(8, dtype=out_dtype)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        fn(good, out=ro)
    with pytest.raises(TypeError, match="out must be a numpy.ndarray"):
        fn(good, out=[0.0] * 8)


def test_error_leaves_out_untouched():
    out = np.full(8, 7, dtype=np.float16)
    with pytest.raises(ValueError):
        pk.float_to_half(np.ones(9, np.float32), out=out)
    assert (out == 7).all()


def test_lists_are_accepted_when_their_dtype_fits():
    with pytest.raises(TypeError, match="float64"):
        pk.float_to_half([1.0, 2.0])                  # NumPy makes float64 of a list
    assert_same_bits(pk.half_to_float(np.float16([1, 2])), np.float32([1, 2]))


def test_agrees_with_pytorch_on_finite_values(rng):
    torch = pytest.importorskip("torch")
    x = (rng.standard_normal(100_000) * np.exp(rng.uniform(-20, 12, 100_000))).astype(np.float32)
    t = torch.from_numpy(x)
    assert_same_bits(pk.float_to_half(x), t.half().numpy())
    got = pk.float_to_bfloat16(x).view(np.uint16)
    want = t.bfloat16().view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(got, want)


def test_many_threads_at_once(rng):
    xs = [rng.standard_normal(200_000 + i).astype(np.float32) for i in range(8)]
    wants = [x.astype(np.float16) for x in xs]
    errors = []

    def work(i):
        for _ in range(5):
            if not np.array_equal(bits(pk.float_to_half(xs[i])), bits(wants[i])):
                errors.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
