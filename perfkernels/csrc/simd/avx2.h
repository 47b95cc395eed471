/* SIMD primitives for AVX2 + FMA + F16C: 8 float32 lanes in a ymm register.
 *
 * The primitive set is the same in every simd/<isa>.h; a family body (perfkernels/csrc/<family>/
 * body.h) is written once over it.  Names and meaning:
 *
 *   VL, V_REGS           float lanes per vector; vector registers of the ISA
 *   vf                   VL float32 lanes
 *   v_zero, v_set1, v_add, v_sub, v_mul, v_div (correctly rounded), v_fmadd (a*b+c),
 *   v_fnmadd (c-a*b), v_min / v_max (the second operand when either is NaN, as minps),
 *   v_round (to nearest even), v_abs, v_copysign(mag, sign), v_pow2(n) (2^n, integral n in
 *   [-126, 128]), v_ldexp(p, n) (p * 2^n, integral n in [-150, 129], gradual underflow)
 *   v_load, v_store, v_stream (non-temporal; dst aligned to VL * 4 bytes), v_stream_fence()
 *   v_tail, v_tail_of(n), v_tail_len(t)   the first n lanes, 0 < n < VL
 *   v_load_tail, v_store_tail             those lanes only: nothing past them is read or written
 *                                         (other lanes load as 0)
 *   v_any_nan(x)                          nonzero if a lane is NaN
 *   vh                   VL 16-bit lanes (float16 or bfloat16 bits, half a vector register)
 *   vh_load, vh_store, vh_stream (dst aligned to VL * 2 bytes), vh_load_tail, vh_store_tail
 *   v_from_f16(h)        float16 -> float32 (exact; a signalling NaN comes out quiet)
 *   v_to_f16(x)          float32 -> float16, round to nearest even (NaN comes out quiet)
 *   vh_any_f16_nan(h)    nonzero if a lane is a float16 NaN
 *   v_from_bf16(h)       bfloat16 -> float32 (exact)
 *   v_to_bf16(x)         float32 -> bfloat16, round to nearest even; NaN -> quiet NaN 0x7fc0 | sign
 *   s_to_f16, s_from_f16 one float32 <-> float16 (round to nearest even)
 *   v_load_u8(p)         VL unsigned bytes as floats
 *   v_load_u4(p), v_load_u2(p)   VL unsigned 4- / 2-bit codes (low bits of a byte first) from
 *                        VL/2, VL/4 bytes, as floats
 *   v_load_u8_tail(p, t), v_load_u4_tail(p, t), v_load_u2_tail(p, t)   the first n codes only,
 *                        reading only the bytes that hold them (other lanes: finite, unspecified)
 *   v_load_u4_pairs(p, &lo, &hi) 2*VL 4-bit codes from VL bytes: even codes in lo, odd in hi
 *   v_zip(a, b, &x, &y)  lanes a0 b0 a1 b1 ... (first VL in x, the rest in y)
 *   v_hmin, v_hmax       minimum / maximum over the lanes (any order)
 *   v_sqrt               square root (correctly rounded); v_hsum: sum of the lanes (a fixed order)
 *   vb                   4*VL bytes (one vector register)
 *   v_round_u8(x0, x1, x2, x3, &low)  the 4*VL lanes rounded to nearest even and saturated to
 *                        [0, 255], in order; `low` (a vl, start vl_init()) keeps the lane-wise
 *                        minimum of the values saturated to int16, vl_at_floor(low) is nonzero
 *                        when some value was at or below -32768 (a NaN converts to INT_MIN)
 *   vb_store_bits(bits, q, dst)  the 4*VL codes (clamped to 2^bits - 1) packed low bits first:
 *                        4*VL*bits/8 bytes at dst
 */
#ifndef PK_SIMD_AVX2_H
#define PK_SIMD_AVX2_H

#include "simd/common.h"

#if PK_BUILT_avx2
#if !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "files including simd/avx2.h must be compiled with -mavx2 -mfma -mf16c"
#endif
#include <immintrin.h>

#define PK_ISA avx2
#define VL 8
#define V_REGS 16

typedef __m256 vf;
typedef __m128i vh;
typedef __m256i vb;
typedef __m256i vl;
typedef int v_tail; /* the lane count: AVX2 has no mask registers */

PK_INLINE vf v_zero(void) { return _mm256_setzero_ps(); }
PK_INLINE vf v_set1(float a) { return _mm256_set1_ps(a); }
PK_INLINE vf v_add(vf a, vf b) { return _mm256_add_ps(a, b); }
PK_INLINE vf v_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
PK_INLINE vf v_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
/* vdivps, not vrcpps (~11.6 bits, two Newton steps to be exact): measured faster on AMD Zen 4. */
PK_INLINE vf v_div(vf a, vf b) { return _mm256_div_ps(a, b); }
PK_INLINE vf v_fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
PK_INLINE vf v_fnmadd(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
PK_INLINE vf v_min(vf a, vf b) { return _mm256_min_ps(a, b); }
PK_INLINE vf v_max(vf a, vf b) { return _mm256_max_ps(a, b); }
PK_INLINE vf v_round(vf a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
PK_INLINE vf v_abs(vf a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
PK_INLINE vf v_copysign(vf mag, vf sign)
{
    return _mm256_or_ps(mag, _mm256_and_ps(_mm256_set1_ps(-0.0f), sign));
}

/* 2^n straight into the exponent bits (128 gives +inf). */
PK_INLINE vf v_pow2(vf n)
{
    const __m256i ni = _mm256_cvtps_epi32(n);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23));
}

/* p * 2^(n/2) * 2^(n - n/2): two exact power-of-two factors, each a normal float, so the product
 * over- or underflows gracefully. */
PK_INLINE vf v_ldexp(vf p, vf n)
{
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1);
    const __m256i n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const vf s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const vf s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

PK_INLINE vf v_load(const float *p) { return _mm256_loadu_ps(p); }
PK_INLINE void v_store(float *p, vf x) { _mm256_storeu_ps(p, x); }
PK_INLINE void v_stream(float *p, vf x) { _mm256_stream_ps(p, x); }

PK_INLINE v_tail v_tail_of(size_t n) { return (int)n; }
PK_INLINE int v_tail_len(v_tail t) { return t; }
PK_INLINE __m256i v_tail_mask_(v_tail t)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(t), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
PK_INLINE vf v_load_tail(const float *p, v_tail t) { return _mm256_maskload_ps(p, v_tail_mask_(t)); }
PK_INLINE void v_store_tail(float *p, vf x, v_tail t) { _mm256_maskstore_ps(p, v_tail_mask_(t), x); }
PK_INLINE int v_any_nan(vf x) { return _mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)); }

/* orders the non-temporal stores before whatever follows */
PK_INLINE void v_stream_fence(void) { _mm_sfence(); }

PK_INLINE vh vh_load(const uint16_t *p) { return _mm_loadu_si128((const __m128i *)p); }
PK_INLINE void vh_store(uint16_t *p, vh h) { _mm_storeu_si128((__m128i *)p, h); }
PK_INLINE void vh_stream(uint16_t *p, vh h) { _mm_stream_si128((__m128i *)p, h); }
/* No 16-bit masked loads or stores before AVX-512: through a buffer. */
PK_INLINE vh vh_load_tail(const uint16_t *p, v_tail t)
{
    uint16_t buf[8] = {0};
    memcpy(buf, p, (size_t)t * 2);
    return _mm_loadu_si128((const __m128i *)buf);
}
PK_INLINE void vh_store_tail(uint16_t *p, vh h, v_tail t)
{
    uint16_t buf[8];
    _mm_storeu_si128((__m128i *)buf, h);
    memcpy(p, buf, (size_t)t * 2);
}

PK_INLINE vf v_from_f16(vh h) { return _mm256_cvtph_ps(h); }
PK_INLINE vh v_to_f16(vf x) { return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
PK_INLINE int vh_any_f16_nan(vh h)
{
    return _mm_movemask_epi8(_mm_cmpgt_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)),
                                             _mm_set1_epi16(0x7c00)));
}
PK_INLINE vf v_from_bf16(vh h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
/* bfloat16 bits of x rounded to nearest even, in the low half of each lane; right for every x
 * but NaN (inf stays inf, a float past bfloat16's largest rounds to inf). */
PK_INLINE __m256i v_bf16_round_(__m256i b)
{
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    return _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
}
PK_INLINE vh v_pack_u32_u16_(__m256i w)
{
    return _mm_packus_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
}
/* x to bfloat16 where no lane is NaN */
PK_INLINE vh v_to_bf16_no_nan(vf x) { return v_pack_u32_u16_(v_bf16_round_(_mm256_castps_si256(x))); }
PK_INLINE vh v_to_bf16(vf x)
{
    const __m256i b = _mm256_castps_si256(x);
    const __m256i r = v_bf16_round_(b);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i qnan = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x8000)),
                                         _mm256_set1_epi32(0x7fc0));
    return v_pack_u32_u16_(_mm256_blendv_epi8(r, qnan, nan));
}
PK_INLINE uint16_t s_to_f16(float f) { return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
PK_INLINE float s_from_f16(uint16_t h) { return _cvtsh_ss(h); }

PK_INLINE vf v_load_u8(const uint8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
PK_INLINE vf v_load_u4(const uint8_t *p)
{
    int32_t b;
    memcpy(&b, p, 4);
    const __m128i rep = _mm_shuffle_epi8(_mm_cvtsi32_si128(b), _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0));
    const __m256i q = _mm256_srlv_epi32(_mm256_cvtepu8_epi32(rep), _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
    return _mm256_cvtepi32_ps(_mm256_and_si256(q, _mm256_set1_epi32(15)));
}
PK_INLINE vf v_load_u2(const uint8_t *p)
{
    uint16_t b;
    memcpy(&b, p, 2);
    const __m128i rep = _mm_shuffle_epi8(_mm_cvtsi32_si128(b), _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
    const __m256i q = _mm256_srlv_epi32(_mm256_cvtepu8_epi32(rep), _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
    return _mm256_cvtepi32_ps(_mm256_and_si256(q, _mm256_set1_epi32(3)));
}
PK_INLINE vf v_load_u8_tail(const uint8_t *p, v_tail t)
{
    uint8_t buf[8] = {0};
    memcpy(buf, p, (size_t)t);
    return v_load_u8(buf);
}
PK_INLINE vf v_load_u4_tail(const uint8_t *p, v_tail t)
{
    uint8_t buf[4] = {0};
    memcpy(buf, p, (size_t)(t + 1) / 2);
    return v_load_u4(buf);
}
PK_INLINE vf v_load_u2_tail(const uint8_t *p, v_tail t)
{
    uint8_t buf[2] = {0};
    memcpy(buf, p, (size_t)(t + 3) / 4);
    return v_load_u2(buf);
}
PK_INLINE void v_load_u4_pairs(const uint8_t *p, vf *lo, vf *hi)
{
    const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    *lo = _mm256_cvtepi32_ps(_mm256_and_si256(bytes, _mm256_set1_epi32(15)));
    *hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4));
}
PK_INLINE void v_zip(vf a, vf b, vf *x, vf *y)
{
    const vf l = _mm256_unpacklo_ps(a, b); /* a0 b0 a1 b1 | a4 b4 a5 b5 */
    const vf h = _mm256_unpackhi_ps(a, b); /* a2 b2 a3 b3 | a6 b6 a7 b7 */
    *x = _mm256_permute2f128_ps(l, h, 0x20);
    *y = _mm256_permute2f128_ps(l, h, 0x31);
}

PK_INLINE vf v_sqrt(vf a) { return _mm256_sqrt_ps(a); }
PK_INLINE float v_hsum(vf x)
{
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}
PK_INLINE float v_hmin(vf x)
{
    __m128 a = _mm_min_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    a = _mm_min_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_min_ss(a, _mm_movehdup_ps(a)));
}
PK_INLINE float v_hmax(vf x)
{
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_max_ss(a, _mm_movehdup_ps(a)));
}

PK_INLINE vl vl_init(void) { return _mm256_setzero_si256(); }
PK_INLINE int vl_at_floor(vl low) { return _mm256_movemask_epi8(_mm256_cmpeq_epi16(low, _mm256_set1_epi16(INT16_MIN))); }
PK_INLINE vb v_round_u8(vf x0, vf x1, vf x2, vf x3, vl *low)
{
    const __m256i a = _mm256_cvtps_epi32(x0), b = _mm256_cvtps_epi32(x1);
    const __m256i c = _mm256_cvtps_epi32(x2), d = _mm256_cvtps_epi32(x3);
    const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    *low = _mm256_min_epi16(*low, _mm256_min_epi16(ab, cd));
    /* packs work per 128-bit lane: dwords come out as a0 b0 c0 d0 a1 b1 c1 d1 */
    return _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
PK_INLINE void vb_store_bits(int bits, vb q, uint8_t *dst)
{
    if (bits == 8) {
        _mm256_storeu_si256((__m256i *)dst, q);
    } else if (bits == 4) {
        q = _mm256_min_epu8(q, _mm256_set1_epi8(15));
        const __m256i pairs = _mm256_maddubs_epi16(q, _mm256_set1_epi16(0x1001)); /* lo + 16 * hi */
        _mm_storeu_si128((__m128i *)dst, _mm_packus_epi16(_mm256_castsi256_si128(pairs),
                                                          _mm256_extracti128_si256(pairs, 1)));
    } else {
        q = _mm256_min_epu8(q, _mm256_set1_epi8(3));
        const __m256i pairs = _mm256_maddubs_epi16(q, _mm256_set1_epi16(0x0401)); /* q0 + 4 * q1 */
        const __m256i quads = _mm256_madd_epi16(pairs, _mm256_set1_epi32(0x00100001));
        const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(quads), _mm256_extracti128_si256(quads, 1));
        _mm_storel_epi64((__m128i *)dst, _mm_packus_epi16(w, w));
    }
}

#endif /* PK_BUILT_avx2 */
#endif
