/* SIMD primitives for AVX-512 F + BW + DQ + VL (with FMA and F16C): 16 float32 lanes in a zmm
 * register.  The primitive set and its meaning are listed in simd/avx2.h; tails are mask registers
 * here, so partial vectors are single masked instructions. */
#ifndef PK_SIMD_AVX512_H
#define PK_SIMD_AVX512_H

#include "simd/common.h"

#if PK_BUILT_avx512
#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__) \
      && defined(__FMA__) && defined(__F16C__))
#error "files including simd/avx512.h must be compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl -mfma -mf16c"
#endif
#include <immintrin.h>

#define PK_ISA avx512
#define VL 16
#define V_REGS 32

typedef __m512 vf;
typedef __m256i vh;
typedef __m512i vb;
typedef __m512i vl;
typedef __mmask16 v_tail;

PK_INLINE vf v_zero(void) { return _mm512_setzero_ps(); }
PK_INLINE vf v_set1(float a) { return _mm512_set1_ps(a); }
PK_INLINE vf v_add(vf a, vf b) { return _mm512_add_ps(a, b); }
PK_INLINE vf v_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
PK_INLINE vf v_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
/* vdivps: as fast on AMD Zen 4 as vrcp14ps + one Newton step (on Intel parts with a slower
 * divider the estimate may win). */
PK_INLINE vf v_div(vf a, vf b) { return _mm512_div_ps(a, b); }
PK_INLINE vf v_fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
PK_INLINE vf v_fnmadd(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
PK_INLINE vf v_min(vf a, vf b) { return _mm512_min_ps(a, b); }
PK_INLINE vf v_max(vf a, vf b) { return _mm512_max_ps(a, b); }
PK_INLINE vf v_round(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
PK_INLINE vf v_abs(vf a) { return _mm512_abs_ps(a); }
PK_INLINE vf v_copysign(vf mag, vf sign)
{
    return _mm512_or_ps(mag, _mm512_and_ps(_mm512_set1_ps(-0.0f), sign));
}
/* vscalefps handles overflow to inf and gradual underflow itself. */
PK_INLINE vf v_pow2(vf n) { return _mm512_scalef_ps(_mm512_set1_ps(1.0f), n); }
PK_INLINE vf v_ldexp(vf p, vf n) { return _mm512_scalef_ps(p, n); }

PK_INLINE vf v_load(const float *p) { return _mm512_loadu_ps(p); }
PK_INLINE void v_store(float *p, vf x) { _mm512_storeu_ps(p, x); }
PK_INLINE void v_stream(float *p, vf x) { _mm512_stream_ps(p, x); }

PK_INLINE v_tail v_tail_of(size_t n) { return (__mmask16)((1u << n) - 1u); }
PK_INLINE int v_tail_len(v_tail t) { return __builtin_popcount(t); }
PK_INLINE vf v_load_tail(const float *p, v_tail t) { return _mm512_maskz_loadu_ps(t, p); }
PK_INLINE void v_store_tail(float *p, vf x, v_tail t) { _mm512_mask_storeu_ps(p, t, x); }
PK_INLINE int v_any_nan(vf x) { return _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) != 0; }

/* orders the non-temporal stores before whatever follows */
PK_INLINE void v_stream_fence(void) { _mm_sfence(); }

PK_INLINE vh vh_load(const uint16_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
PK_INLINE void vh_store(uint16_t *p, vh h) { _mm256_storeu_si256((__m256i *)p, h); }
PK_INLINE void vh_stream(uint16_t *p, vh h) { _mm256_stream_si256((__m256i *)p, h); }
PK_INLINE vh vh_load_tail(const uint16_t *p, v_tail t) { return _mm256_maskz_loadu_epi16(t, p); }
PK_INLINE void vh_store_tail(uint16_t *p, vh h, v_tail t) { _mm256_mask_storeu_epi16(p, t, h); }

PK_INLINE vf v_from_f16(vh h) { return _mm512_cvtph_ps(h); }
PK_INLINE vh v_to_f16(vf x) { return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
PK_INLINE int vh_any_f16_nan(vh h)
{
    return _mm256_cmpgt_epi16_mask(_mm256_and_si256(h, _mm256_set1_epi16(0x7fff)), _mm256_set1_epi16(0x7c00)) != 0;
}
PK_INLINE vf v_from_bf16(vh h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
/* bfloat16 bits of x rounded to nearest even, in the low half of each lane; right for every x
 * but NaN (inf stays inf, a float past bfloat16's largest rounds to inf). */
PK_INLINE __m512i v_bf16_round_(__m512i b)
{
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    return _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
}
/* x to bfloat16 where no lane is NaN */
PK_INLINE vh v_to_bf16_no_nan(vf x) { return _mm512_cvtepi32_epi16(v_bf16_round_(_mm512_castps_si512(x))); }
PK_INLINE vh v_to_bf16(vf x)
{
    const __m512i b = _mm512_castps_si512(x);
    const __m512i r = v_bf16_round_(b);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    const __m512i qnan = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x8000)),
                                         _mm512_set1_epi32(0x7fc0));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, qnan));
}
PK_INLINE uint16_t s_to_f16(float f) { return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
PK_INLINE float s_from_f16(uint16_t h) { return _cvtsh_ss(h); }

PK_INLINE vf v_load_u8(const uint8_t *p)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
PK_INLINE vf v_load_u8_tail(const uint8_t *p, v_tail t)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(t, p)));
}
/* 4- and 2-bit codes: bm selects the bytes holding the codes of mask t */
PK_INLINE vf v_load_u4_masked_(const uint8_t *p, v_tail t, __mmask16 bm)
{
    const __m128i b = _mm_maskz_loadu_epi8(bm, p);
    const __m512i rep = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(b, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)));
    const __m512i q = _mm512_srlv_epi32(rep, _mm512_set4_epi32(4, 0, 4, 0));
    return _mm512_cvtepi32_ps(_mm512_maskz_and_epi32(t, q, _mm512_set1_epi32(15)));
}
PK_INLINE vf v_load_u2_masked_(const uint8_t *p, v_tail t, __mmask16 bm)
{
    const __m128i b = _mm_maskz_loadu_epi8(bm, p);
    const __m512i rep = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(b, _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)));
    const __m512i q = _mm512_srlv_epi32(rep, _mm512_set4_epi32(6, 4, 2, 0));
    return _mm512_cvtepi32_ps(_mm512_maskz_and_epi32(t, q, _mm512_set1_epi32(3)));
}
PK_INLINE vf v_load_u4(const uint8_t *p) { return v_load_u4_masked_(p, 0xffff, 0xff); }
PK_INLINE vf v_load_u2(const uint8_t *p) { return v_load_u2_masked_(p, 0xffff, 0xf); }
PK_INLINE vf v_load_u4_tail(const uint8_t *p, v_tail t)
{
    return v_load_u4_masked_(p, t, (__mmask16)((1u << ((__builtin_popcount(t) + 1) / 2)) - 1u));
}
PK_INLINE vf v_load_u2_tail(const uint8_t *p, v_tail t)
{
    return v_load_u2_masked_(p, t, (__mmask16)((1u << ((__builtin_popcount(t) + 3) / 4)) - 1u));
}
PK_INLINE void v_load_u4_pairs(const uint8_t *p, vf *lo, vf *hi)
{
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    *lo = _mm512_cvtepi32_ps(_mm512_and_si512(bytes, _mm512_set1_epi32(15)));
    *hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4));
}
PK_INLINE void v_zip(vf a, vf b, vf *x, vf *y)
{
    const __m512i even = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i odd = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    *x = _mm512_permutex2var_ps(a, even, b);
    *y = _mm512_permutex2var_ps(a, odd, b);
}

PK_INLINE vf v_sqrt(vf a) { return _mm512_sqrt_ps(a); }
PK_INLINE float v_hsum(vf x) { return _mm512_reduce_add_ps(x); }
PK_INLINE float v_hmin(vf x)
{
    const __m256 a = _mm256_min_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1));
    __m128 a4 = _mm_min_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    a4 = _mm_min_ps(a4, _mm_movehl_ps(a4, a4));
    return _mm_cvtss_f32(_mm_min_ss(a4, _mm_movehdup_ps(a4)));
}
PK_INLINE float v_hmax(vf x)
{
    const __m256 a = _mm256_max_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1));
    __m128 a4 = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    a4 = _mm_max_ps(a4, _mm_movehl_ps(a4, a4));
    return _mm_cvtss_f32(_mm_max_ss(a4, _mm_movehdup_ps(a4)));
}

PK_INLINE vl vl_init(void) { return _mm512_setzero_si512(); }
PK_INLINE int vl_at_floor(vl low) { return _mm512_cmpeq_epi16_mask(low, _mm512_set1_epi16(INT16_MIN)) != 0; }
PK_INLINE vb v_round_u8(vf x0, vf x1, vf x2, vf x3, vl *low)
{
    const __m512i a = _mm512_cvtps_epi32(x0), b = _mm512_cvtps_epi32(x1);
    const __m512i c = _mm512_cvtps_epi32(x2), d = _mm512_cvtps_epi32(x3);
    const __m512i ab = _mm512_packs_epi32(a, b), cd = _mm512_packs_epi32(c, d);
    *low = _mm512_min_epi16(*low, _mm512_min_epi16(ab, cd));
    /* packs work per 128-bit lane k: dwords 4k..4k+3 come out as a_k b_k c_k d_k */
    return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15),
                                    _mm512_packus_epi16(ab, cd));
}
PK_INLINE void vb_store_bits(int bits, vb q, uint8_t *dst)
{
    if (bits == 8) {
        _mm512_storeu_si512(dst, q);
    } else if (bits == 4) {
        q = _mm512_min_epu8(q, _mm512_set1_epi8(15));
        const __m512i pairs = _mm512_maddubs_epi16(q, _mm512_set1_epi16(0x1001)); /* lo + 16 * hi */
        _mm256_storeu_si256((__m256i *)dst, _mm512_cvtepi16_epi8(pairs));
    } else {
        q = _mm512_min_epu8(q, _mm512_set1_epi8(3));
        const __m512i pairs = _mm512_maddubs_epi16(q, _mm512_set1_epi16(0x0401)); /* q0 + 4 * q1 */
        const __m512i quads = _mm512_madd_epi16(pairs, _mm512_set1_epi32(0x00100001));
        _mm_storeu_si128((__m128i *)dst, _mm512_cvtepi32_epi8(quads));
    }
}

#endif /* PK_BUILT_avx512 */
#endif
