/* float32 <-> float16 / bfloat16 conversion, written once over the SIMD primitives of the vector
 * levels (the generated per-level file includes simd/<isa>.h, then this); bit-exact with the scalar level
 * (convert/scalar.c), which is NumPy's and ml_dtypes' conversion.
 *
 * Full vectors in the loop, a partial vector (masked, or through a buffer where the ISA has no
 * 16-bit masks) before it, when a streamed destination needs aligning, and after it.  The hardware
 * float16 conversions quiet a signalling NaN where NumPy keeps it (and keeps its payload): a vector
 * holding a NaN is redone element by element, off the hot path. */
#ifndef PK_CONVERT_BODY_H
#define PK_CONVERT_BODY_H

#include "perfkernels/convert.h"
#include "common/half_bits.h"
#include "convert/stream.h"

enum narrow_kind { TO_F16, TO_F16_CLIP, TO_BF16 };
enum widen_kind { FROM_F16, FROM_BF16 };

/* Elements before dst reaches `align` bytes (never more than n). */
PK_INLINE size_t head_until_aligned(const void *dst, size_t elem, size_t align, size_t n)
{
    size_t mis = (uintptr_t)dst & (align - 1);
    size_t k = mis ? (align - mis) / elem : 0;
    return k < n ? k : n;
}

static __attribute__((noinline, cold)) vh f16_exact(vf x)
{
    float f[VL];
    uint16_t h[VL];
    v_store(f, x);
    for (int k = 0; k < VL; k++) h[k] = pk_f32_to_f16_bits(pk_f32_bits(f[k]));
    return vh_load(h);
}

static __attribute__((noinline, cold)) vf f16_exact_widen(vh x)
{
    uint16_t h[VL];
    float f[VL];
    vh_store(h, x);
    for (int k = 0; k < VL; k++) f[k] = pk_bits_f32(pk_f16_to_f32_bits(h[k]));
    return v_load(f);
}

/* x clamped to float16's finite range for TO_F16_CLIP (a NaN stays NaN), else x. */
PK_INLINE vf clip_for(vf x, const int kind)
{
    if (kind != TO_F16_CLIP) return x;
    /* operand order: min/max return the second operand when one is NaN */
    return v_max(v_set1(-65504.0f), v_min(v_set1(65504.0f), x));
}

PK_INLINE vh narrow(vf x, const int kind)
{
    if (kind == TO_BF16) return v_to_bf16(x);
    x = clip_for(x, kind);
    const vh h = v_to_f16(x);
    return __builtin_expect(v_any_nan(x) != 0, 0) ? f16_exact(x) : h;
}

/* x converted where no lane is NaN: float16's vcvtps2ph, or bfloat16's rounding without the
 * lanes' NaN test and blend. */
PK_INLINE vh narrow_no_nan(vf x, const int kind)
{
    return kind == TO_BF16 ? v_to_bf16_no_nan(x) : v_to_f16(x);
}

/* Four vectors with one NaN test: their sum is NaN where any of them holds a NaN (and where inf
 * meets -inf, a false alarm), and then each is converted on its own, checked.  A test per vector
 * costs AVX2 a compare, a mask test and a branch per 8 floats (for bfloat16 also a blend), which
 * an L2-resident conversion pays in full (64Ki floats to float16: 0.99x PyTorch's unchecked
 * vcvtps2ph before, AMD EPYC, both held to AVX2). */
PK_INLINE void narrow_x4(const float *src, uint16_t *dst, const int stream, const int kind)
{
    const vf x0 = clip_for(v_load(src), kind), x1 = clip_for(v_load(src + VL), kind);
    const vf x2 = clip_for(v_load(src + 2 * VL), kind), x3 = clip_for(v_load(src + 3 * VL), kind);
    vh h0, h1, h2, h3;
    if (__builtin_expect(v_any_nan(v_add(v_add(x0, x1), v_add(x2, x3))) != 0, 0)) {
        h0 = narrow(x0, kind), h1 = narrow(x1, kind), h2 = narrow(x2, kind), h3 = narrow(x3, kind);
    } else {
        h0 = narrow_no_nan(x0, kind), h1 = narrow_no_nan(x1, kind);
        h2 = narrow_no_nan(x2, kind), h3 = narrow_no_nan(x3, kind);
    }
    if (stream) {
        vh_stream(dst, h0), vh_stream(dst + VL, h1);
        vh_stream(dst + 2 * VL, h2), vh_stream(dst + 3 * VL, h3);
    } else {
        vh_store(dst, h0), vh_store(dst + VL, h1), vh_store(dst + 2 * VL, h2), vh_store(dst + 3 * VL, h3);
    }
}

PK_INLINE vf widen(vh h, const int kind)
{
    if (kind == FROM_BF16) return v_from_bf16(h);
    const vf x = v_from_f16(h);
    return __builtin_expect(vh_any_f16_nan(h) != 0, 0) ? f16_exact_widen(h) : x;
}

/* Four vectors of float16 to float32 with one NaN test, on the sum of the results: a NaN lane
 * (which the conversion quiets, and NumPy keeps as it is) makes the sum NaN, as does inf beside
 * -inf (a false alarm); then each vector is widened on its own, checked. */
PK_INLINE void widen_f16_x4(const uint16_t *src, float *dst, const int stream)
{
    const vh h0 = vh_load(src), h1 = vh_load(src + VL), h2 = vh_load(src + 2 * VL);
    const vh h3 = vh_load(src + 3 * VL);
    vf x0 = v_from_f16(h0), x1 = v_from_f16(h1), x2 = v_from_f16(h2), x3 = v_from_f16(h3);
    if (__builtin_expect(v_any_nan(v_add(v_add(x0, x1), v_add(x2, x3))) != 0, 0)) {
        x0 = widen(h0, FROM_F16), x1 = widen(h1, FROM_F16);
        x2 = widen(h2, FROM_F16), x3 = widen(h3, FROM_F16);
    }
    if (stream) {
        v_stream(dst, x0), v_stream(dst + VL, x1), v_stream(dst + 2 * VL, x2);
        v_stream(dst + 3 * VL, x3);
    } else {
        v_store(dst, x0), v_store(dst + VL, x1), v_store(dst + 2 * VL, x2), v_store(dst + 3 * VL, x3);
    }
}

PK_INLINE void narrow_part(const float *src, uint16_t *dst, size_t n, const int kind)
{
    const v_tail t = v_tail_of(n);
    vh_store_tail(dst, narrow(v_load_tail(src, t), kind), t);
}

PK_INLINE void widen_part(const uint16_t *src, float *dst, size_t n, const int kind)
{
    const v_tail t = v_tail_of(n);
    v_store_tail(dst, widen(vh_load_tail(src, t), kind), t);
}

PK_INLINE void narrow_all(const float *src, uint16_t *dst, size_t n, const int kind)
{
    const int stream = PK_SHOULD_STREAM(n);
    size_t i = stream ? head_until_aligned(dst, 2, sizeof(vh), n) : 0;
    if (i) narrow_part(src, dst, i, kind);
    for (; i + 4 * VL <= n; i += 4 * VL) narrow_x4(src + i, dst + i, stream, kind);
    for (; i + VL <= n; i += VL) {
        const vh h = narrow(v_load(src + i), kind);
        if (stream) vh_stream(dst + i, h);
        else vh_store(dst + i, h);
    }
    if (stream) v_stream_fence();
    if (i < n) narrow_part(src + i, dst + i, n - i, kind);
}

PK_INLINE void widen_all(const uint16_t *src, float *dst, size_t n, const int kind)
{
    const int stream = PK_SHOULD_STREAM(n);
    size_t i = stream ? head_until_aligned(dst, 4, sizeof(vf), n) : 0;
    if (i) widen_part(src, dst, i, kind);
    if (kind == FROM_F16)
        for (; i + 4 * VL <= n; i += 4 * VL) widen_f16_x4(src + i, dst + i, stream);
    for (; i + VL <= n; i += VL) {
        const vf x = widen(vh_load(src + i), kind);
        if (stream) v_stream(dst + i, x);
        else v_store(dst + i, x);
    }
    if (stream) v_stream_fence();
    if (i < n) widen_part(src + i, dst + i, n - i, kind);
}

void PK_ISA_FN(pk_float_to_half)(const float *src, uint16_t *dst, size_t n, int clip)
{
    if (clip) narrow_all(src, dst, n, TO_F16_CLIP);
    else narrow_all(src, dst, n, TO_F16);
}

void PK_ISA_FN(pk_half_to_float)(const uint16_t *src, float *dst, size_t n)
{
    widen_all(src, dst, n, FROM_F16);
}

void PK_ISA_FN(pk_float_to_bf16)(const float *src, uint16_t *dst, size_t n)
{
    narrow_all(src, dst, n, TO_BF16);
}

void PK_ISA_FN(pk_bf16_to_float)(const uint16_t *src, float *dst, size_t n)
{
    widen_all(src, dst, n, FROM_BF16);
}

#endif
