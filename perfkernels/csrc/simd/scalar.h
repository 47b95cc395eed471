/* SIMD primitives for portable C (any architecture, baseline flags): "vectors" of one float.
 *
 * It provides the float arithmetic, loads and stores of simd/avx2.h (where the set is listed) for
 * bodies that are instantiated on every level (the LSTM unit); the embedding-bag, quantized and
 * conversion families keep plain loops at this level instead, which the compiler vectorises with
 * the baseline SSE2 / NEON and which serve as the reference the vector bodies are tested against.
 *
 * No fmaf (a slow library call without hardware FMA): v_fmadd rounds a*b+c twice here.  No libm
 * calls on the hot path.  The build has no -ffast-math, so the compiler keeps every rounding.
 */
#ifndef PK_SIMD_SCALAR_H
#define PK_SIMD_SCALAR_H

#include <math.h>

#include "simd/common.h"
#include "common/half_bits.h"

#define PK_ISA scalar
#define VL 1
#define V_REGS 16

typedef float vf;
typedef int v_tail;

PK_INLINE vf v_zero(void) { return 0.0f; }
PK_INLINE vf v_set1(float a) { return a; }
PK_INLINE vf v_add(vf a, vf b) { return a + b; }
PK_INLINE vf v_sub(vf a, vf b) { return a - b; }
PK_INLINE vf v_mul(vf a, vf b) { return a * b; }
PK_INLINE vf v_div(vf a, vf b) { return a / b; }
PK_INLINE vf v_fmadd(vf a, vf b, vf c) { return a * b + c; }
PK_INLINE vf v_fnmadd(vf a, vf b, vf c) { return c - a * b; }
/* the operand order of x86's minps/maxps: the second operand when either is NaN */
PK_INLINE vf v_min(vf a, vf b) { return a < b ? a : b; }
PK_INLINE vf v_max(vf a, vf b) { return a > b ? a : b; }
PK_INLINE vf v_sqrt(vf a) { return sqrtf(a); }
PK_INLINE float v_hsum(vf x) { return x; }
/* round to nearest even for |a| < 2^22 (callers clamp far below that), without a libm call */
PK_INLINE vf v_round(vf a) { return (a + 12582912.0f) - 12582912.0f; }
PK_INLINE vf v_abs(vf a) { return fabsf(a); }
PK_INLINE vf v_copysign(vf mag, vf sign) { return copysignf(mag, sign); }

PK_INLINE vf v_pow2(vf n)
{
    n = n == n ? n : 0.0f; /* no undefined NaN -> int conversion; the NaN is in p already */
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

PK_INLINE vf v_ldexp(vf p, vf n) /* in two exact steps, as simd/avx2.h */
{
    n = n == n ? n : 0.0f;
    const int32_t ni = (int32_t)n, n1 = ni >> 1;
    return p * v_pow2((float)n1) * v_pow2((float)(ni - n1));
}

PK_INLINE vf v_load(const float *p) { return *p; }
PK_INLINE void v_store(float *p, vf x) { *p = x; }
/* VL = 1: a tail is never partial */
PK_INLINE v_tail v_tail_of(size_t n) { return (int)n; }
PK_INLINE int v_tail_len(v_tail t) { return t; }
PK_INLINE vf v_load_tail(const float *p, v_tail t) { (void)t; return *p; }
PK_INLINE void v_store_tail(float *p, vf x, v_tail t) { (void)t; *p = x; }
PK_INLINE int v_any_nan(vf x) { return x != x; }

PK_INLINE uint16_t s_to_f16(float f) { return pk_f32_to_f16_bits(pk_f32_bits(f)); }
PK_INLINE float s_from_f16(uint16_t h) { return pk_bits_f32(pk_f16_to_f32_bits(h)); }

#endif
