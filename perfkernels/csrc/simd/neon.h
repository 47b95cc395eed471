/* SIMD primitives for Arm Advanced SIMD (NEON, baseline Armv8-A / aarch64): 4 float32 lanes in a
 * 128-bit register, 32 registers.  The primitive set and its meaning are listed in simd/avx2.h.
 *
 * The results are those of the x86 levels wherever those are exact: v_min / v_max select like
 * minps / maxps (the second operand when either is NaN, not NEON's NaN-propagating fmin), the
 * float16 conversions are the hardware's (FCVT, round to nearest even, as F16C), bfloat16 goes by
 * shifts, and v_round_u8 turns NaN and values outside int32 into INT_MIN as cvtps2dq does (NEON's
 * FCVTNS saturates and gives 0 for NaN), so the quantizer's non-finite check sees them.
 *
 * NEON has no masked loads or stores: a tail goes through a small buffer (memcpy of exactly the
 * lanes asked for), so nothing past them is read or written.  No non-temporal stores either:
 * v_stream is an ordinary store (the base ISA's STNP is only a hint) and v_stream_fence nothing.
 *
 * simd/sve.h includes this file for the sve level (PK_NEON_AS_SVE): the same primitives, compiled
 * with SVE enabled and exported under the sve suffix. */
#ifndef PK_SIMD_NEON_H
#define PK_SIMD_NEON_H

#include "simd/common.h"

#ifdef PK_NEON_AS_SVE
#define PK_NEON_BUILT_ PK_BUILT_sve
#else
#define PK_NEON_BUILT_ PK_BUILT_neon
#endif

#if PK_NEON_BUILT_
#if !defined(__ARM_NEON) || !defined(__aarch64__)
#error "files including simd/neon.h must be compiled for aarch64 (-march=armv8-a)"
#endif
#include <arm_neon.h>

#ifdef PK_NEON_AS_SVE
#define PK_ISA sve
#else
#define PK_ISA neon
#endif
#define VL 4
#define V_REGS 32

typedef float32x4_t vf;
typedef uint16x4_t vh;
typedef uint8x16_t vb;
typedef int16x8_t vl;
typedef int v_tail; /* the lane count */

PK_INLINE vf v_zero(void) { return vdupq_n_f32(0.0f); }
PK_INLINE vf v_set1(float a) { return vdupq_n_f32(a); }
PK_INLINE vf v_add(vf a, vf b) { return vaddq_f32(a, b); }
PK_INLINE vf v_sub(vf a, vf b) { return vsubq_f32(a, b); }
PK_INLINE vf v_mul(vf a, vf b) { return vmulq_f32(a, b); }
PK_INLINE vf v_div(vf a, vf b) { return vdivq_f32(a, b); }
PK_INLINE vf v_fmadd(vf a, vf b, vf c) { return vfmaq_f32(c, a, b); }
PK_INLINE vf v_fnmadd(vf a, vf b, vf c) { return vfmsq_f32(c, a, b); }
/* a < b ? a : b lane by lane: the second operand when either is NaN or both are zeros, as minps */
PK_INLINE vf v_min(vf a, vf b) { return vbslq_f32(vcltq_f32(a, b), a, b); }
PK_INLINE vf v_max(vf a, vf b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
PK_INLINE vf v_round(vf a) { return vrndnq_f32(a); }
PK_INLINE vf v_abs(vf a) { return vabsq_f32(a); }
PK_INLINE vf v_copysign(vf mag, vf sign)
{
    return vbslq_f32(vdupq_n_u32(0x80000000u), sign, mag);
}

/* cvtps2dq's conversion: round to nearest even, INT_MIN for NaN and for |x| >= 2^31 */
PK_INLINE int32x4_t v_cvt_x86_(vf x)
{
    return vbslq_s32(vcaltq_f32(x, vdupq_n_f32(2147483648.0f)), vcvtnq_s32_f32(x),
                     vdupq_n_s32(INT32_MIN));
}

/* 2^n straight into the exponent bits (128 gives +inf); as simd/avx2.h */
PK_INLINE vf v_pow2(vf n)
{
    const int32x4_t ni = v_cvt_x86_(n);
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(ni, vdupq_n_s32(127)), 23));
}

/* p * 2^(n/2) * 2^(n - n/2): two exact power-of-two factors, as simd/avx2.h */
PK_INLINE vf v_ldexp(vf p, vf n)
{
    const int32x4_t ni = v_cvt_x86_(n);
    const int32x4_t n1 = vshrq_n_s32(ni, 1);
    const int32x4_t n2 = vsubq_s32(ni, n1);
    const int32x4_t bias = vdupq_n_s32(127);
    const vf s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n1, bias), 23));
    const vf s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, bias), 23));
    return vmulq_f32(vmulq_f32(p, s1), s2);
}

PK_INLINE vf v_load(const float *p) { return vld1q_f32(p); }
PK_INLINE void v_store(float *p, vf x) { vst1q_f32(p, x); }
PK_INLINE void v_stream(float *p, vf x) { vst1q_f32(p, x); }
PK_INLINE void v_stream_fence(void) {}

PK_INLINE v_tail v_tail_of(size_t n) { return (int)n; }
PK_INLINE int v_tail_len(v_tail t) { return t; }
PK_INLINE vf v_load_tail(const float *p, v_tail t)
{
    float buf[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    memcpy(buf, p, (size_t)t * sizeof(float));
    return vld1q_f32(buf);
}
PK_INLINE void v_store_tail(float *p, vf x, v_tail t)
{
    float buf[4];
    vst1q_f32(buf, x);
    memcpy(p, buf, (size_t)t * sizeof(float));
}
PK_INLINE int v_any_nan(vf x) { return vminvq_u32(vceqq_f32(x, x)) == 0; }

PK_INLINE vh vh_load(const uint16_t *p) { return vld1_u16(p); }
PK_INLINE void vh_store(uint16_t *p, vh h) { vst1_u16(p, h); }
PK_INLINE void vh_stream(uint16_t *p, vh h) { vst1_u16(p, h); }
PK_INLINE vh vh_load_tail(const uint16_t *p, v_tail t)
{
    uint16_t buf[4] = {0, 0, 0, 0};
    memcpy(buf, p, (size_t)t * 2);
    return vld1_u16(buf);
}
PK_INLINE void vh_store_tail(uint16_t *p, vh h, v_tail t)
{
    uint16_t buf[4];
    vst1_u16(buf, h);
    memcpy(p, buf, (size_t)t * 2);
}

/* FCVT: exact widening (a signalling NaN comes out quiet, payload kept, as vcvtph2ps); narrowing
 * rounds to nearest even under the default FPCR, as vcvtps2ph with _MM_FROUND_TO_NEAREST_INT */
PK_INLINE vf v_from_f16(vh h) { return vcvt_f32_f16(vreinterpret_f16_u16(h)); }
PK_INLINE vh v_to_f16(vf x) { return vreinterpret_u16_f16(vcvt_f16_f32(x)); }
PK_INLINE int vh_any_f16_nan(vh h)
{
    return vmaxv_u16(vcgt_u16(vand_u16(h, vdup_n_u16(0x7fff)), vdup_n_u16(0x7c00))) != 0;
}
PK_INLINE vf v_from_bf16(vh h) { return vreinterpretq_f32_u32(vshll_n_u16(h, 16)); }
/* bfloat16 bits of x rounded to nearest even, in the low half of each lane (as simd/avx2.h) */
PK_INLINE uint32x4_t v_bf16_round_(uint32x4_t b)
{
    const uint32x4_t lsb = vandq_u32(vshrq_n_u32(b, 16), vdupq_n_u32(1));
    return vshrq_n_u32(vaddq_u32(b, vaddq_u32(lsb, vdupq_n_u32(0x7fff))), 16);
}
PK_INLINE vh v_to_bf16_no_nan(vf x) { return vmovn_u32(v_bf16_round_(vreinterpretq_u32_f32(x))); }
PK_INLINE vh v_to_bf16(vf x)
{
    const uint32x4_t b = vreinterpretq_u32_f32(x);
    const uint32x4_t r = v_bf16_round_(b);
    const uint32x4_t nan = vcgtq_u32(vandq_u32(b, vdupq_n_u32(0x7fffffff)), vdupq_n_u32(0x7f800000));
    const uint32x4_t qnan = vorrq_u32(vandq_u32(vshrq_n_u32(b, 16), vdupq_n_u32(0x8000)), vdupq_n_u32(0x7fc0));
    return vmovn_u32(vbslq_u32(nan, qnan, r));
}
PK_INLINE uint16_t s_to_f16(float f)
{
    return vget_lane_u16(vreinterpret_u16_f16(vcvt_f16_f32(vdupq_n_f32(f))), 0);
}
PK_INLINE float s_from_f16(uint16_t h)
{
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

/* 8-bit codes: 4 bytes widened to 32-bit lanes */
PK_INLINE vf v_u8x4_to_f_(uint32_t bytes)
{
    const uint8x8_t b = vreinterpret_u8_u32(vdup_n_u32(bytes));
    return vcvtq_f32_u32(vmovl_u16(vget_low_u16(vmovl_u8(b))));
}
PK_INLINE vf v_load_u8(const uint8_t *p)
{
    uint32_t b;
    memcpy(&b, p, 4);
    return v_u8x4_to_f_(b);
}
/* 4-bit codes, low nibble first: bytes b0 b1 -> b0 & 15, b0 >> 4, b1 & 15, b1 >> 4 */
PK_INLINE vf v_u4_to_f_(uint32_t b0, uint32_t b1)
{
    const uint32_t lanes[4] = {b0, b0, b1, b1};
    const int32_t shifts[4] = {0, -4, 0, -4};
    const uint32x4_t q = vshlq_u32(vld1q_u32(lanes), vld1q_s32(shifts));
    return vcvtq_f32_u32(vandq_u32(q, vdupq_n_u32(15)));
}
/* 2-bit codes, low bits first: one byte b -> b & 3, (b >> 2) & 3, (b >> 4) & 3, b >> 6 */
PK_INLINE vf v_u2_to_f_(uint32_t b)
{
    const int32_t shifts[4] = {0, -2, -4, -6};
    const uint32x4_t q = vshlq_u32(vdupq_n_u32(b), vld1q_s32(shifts));
    return vcvtq_f32_u32(vandq_u32(q, vdupq_n_u32(3)));
}
PK_INLINE vf v_load_u4(const uint8_t *p) { return v_u4_to_f_(p[0], p[1]); }
PK_INLINE vf v_load_u2(const uint8_t *p) { return v_u2_to_f_(p[0]); }
PK_INLINE vf v_load_u8_tail(const uint8_t *p, v_tail t)
{
    uint8_t buf[4] = {0, 0, 0, 0};
    memcpy(buf, p, (size_t)t);
    return v_load_u8(buf);
}
PK_INLINE vf v_load_u4_tail(const uint8_t *p, v_tail t)
{
    /* t < 4 codes: one byte for t <= 2, two for t = 3 */
    return v_u4_to_f_(p[0], t > 2 ? p[1] : 0);
}
PK_INLINE vf v_load_u2_tail(const uint8_t *p, v_tail t)
{
    (void)t; /* t < 4 codes: all in the first byte */
    return v_u2_to_f_(p[0]);
}
PK_INLINE void v_load_u4_pairs(const uint8_t *p, vf *lo, vf *hi)
{
    uint32_t b;
    memcpy(&b, p, 4);
    const uint32x4_t bytes = vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(b)))));
    *lo = vcvtq_f32_u32(vandq_u32(bytes, vdupq_n_u32(15)));
    *hi = vcvtq_f32_u32(vshrq_n_u32(bytes, 4));
}
PK_INLINE void v_zip(vf a, vf b, vf *x, vf *y)
{
    *x = vzip1q_f32(a, b);
    *y = vzip2q_f32(a, b);
}

PK_INLINE vf v_sqrt(vf a) { return vsqrtq_f32(a); }
/* (x0 + x1) + (x2 + x3): FADDP's pairs */
PK_INLINE float v_hsum(vf x) { return vaddvq_f32(x); }
/* lanes i and i + 2, then 0 and 1, through v_min / v_max (minps's choice on NaN and zeros) */
PK_INLINE float v_hmin(vf x)
{
    const vf a = v_min(x, vextq_f32(x, x, 2));
    return vgetq_lane_f32(v_min(a, vdupq_laneq_f32(a, 1)), 0);
}
PK_INLINE float v_hmax(vf x)
{
    const vf a = v_max(x, vextq_f32(x, x, 2));
    return vgetq_lane_f32(v_max(a, vdupq_laneq_f32(a, 1)), 0);
}

PK_INLINE vl vl_init(void) { return vdupq_n_s16(0); }
PK_INLINE int vl_at_floor(vl low) { return vmaxvq_u16(vceqq_s16(low, vdupq_n_s16(INT16_MIN))) != 0; }
PK_INLINE vb v_round_u8(vf x0, vf x1, vf x2, vf x3, vl *low)
{
    /* as packssdw then packuswb: saturate to int16, then to [0, 255] */
    const int16x8_t ab = vcombine_s16(vqmovn_s32(v_cvt_x86_(x0)), vqmovn_s32(v_cvt_x86_(x1)));
    const int16x8_t cd = vcombine_s16(vqmovn_s32(v_cvt_x86_(x2)), vqmovn_s32(v_cvt_x86_(x3)));
    *low = vminq_s16(*low, vminq_s16(ab, cd));
    return vcombine_u8(vqmovun_s16(ab), vqmovun_s16(cd));
}
PK_INLINE void vb_store_bits(int bits, vb q, uint8_t *dst)
{
    if (bits == 8) {
        vst1q_u8(dst, q);
    } else if (bits == 4) {
        q = vminq_u8(q, vdupq_n_u8(15));
        const uint8x8_t even = vget_low_u8(vuzp1q_u8(q, q)), odd = vget_low_u8(vuzp2q_u8(q, q));
        vst1_u8(dst, vorr_u8(even, vshl_n_u8(odd, 4)));
    } else {
        q = vminq_u8(q, vdupq_n_u8(3));
        const uint16x8_t w = vreinterpretq_u16_u8(q); /* q0 | q1 << 8 */
        const uint16x8_t pairs = vorrq_u16(vandq_u16(w, vdupq_n_u16(0xff)), vshlq_n_u16(vshrq_n_u16(w, 8), 2));
        const uint32x4_t d = vreinterpretq_u32_u16(pairs); /* p0 | p1 << 16 */
        const uint32x4_t quads = vorrq_u32(vandq_u32(d, vdupq_n_u32(0xffff)), vshlq_n_u32(vshrq_n_u32(d, 16), 4));
        const uint8x8_t bytes = vmovn_u16(vcombine_u16(vmovn_u32(quads), vdup_n_u16(0)));
        const uint32_t out = vget_lane_u32(vreinterpret_u32_u8(bytes), 0);
        memcpy(dst, &out, 4);
    }
}

#endif /* PK_NEON_BUILT_ */
#endif
