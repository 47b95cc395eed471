/* quantize_rowwise for AVX-512 F/BW/DQ/VL (quantized_prepack_body.h over 16-lane vectors).
 * Compiled with the AVX-512 flags (setup.py, this file only). */
#include "perfkernels/quantized.h"

#if PK_X86_64
#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__))
#error "quantized_prepack_avx512.c must be compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl"
#endif
#include <immintrin.h>

#define PKQ_W 16
#define PKQ_KERNEL pk_quantize_rowwise_avx512
typedef __m512 pkq_vf;
typedef __m512i pkq_vb;
typedef __m512i pkq_vl;

static inline __attribute__((always_inline)) __m512 pkq_load(const void *row, int half, size_t c)
{
    if (half) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + c)));
    return _mm512_loadu_ps((const float *)row + c);
}

#define pkq_set1 _mm512_set1_ps
#define pkq_min _mm512_min_ps
#define pkq_max _mm512_max_ps

static inline __attribute__((always_inline)) void pkq_reduce(__m512 vmn, __m512 vmx, float *mn, float *mx)
{
    __m256 a = _mm256_min_ps(_mm512_castps512_ps256(vmn), _mm512_extractf32x8_ps(vmn, 1));
    __m256 b = _mm256_max_ps(_mm512_castps512_ps256(vmx), _mm512_extractf32x8_ps(vmx, 1));
    __m128 a4 = _mm_min_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 b4 = _mm_max_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
    a4 = _mm_min_ps(a4, _mm_movehl_ps(a4, a4));
    b4 = _mm_max_ps(b4, _mm_movehl_ps(b4, b4));
    a4 = _mm_min_ss(a4, _mm_movehdup_ps(a4));
    b4 = _mm_max_ss(b4, _mm_movehdup_ps(b4));
    *mn = _mm_cvtss_f32(a4);
    *mx = _mm_cvtss_f32(b4);
}

static inline __attribute__((always_inline)) __m512i pkq_codes(__m512 x0, __m512 x1, __m512 x2, __m512 x3,
                                                               __m512 sub, __m512 inv, __m512i *low)
{
    __m512i a = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(x0, sub), inv));
    __m512i b = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(x1, sub), inv));
    __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(x2, sub), inv));
    __m512i d = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(x3, sub), inv));
    __m512i ab = _mm512_packs_epi32(a, b), cd = _mm512_packs_epi32(c, d);
    *low = _mm512_min_epi16(*low, _mm512_min_epi16(ab, cd));
    /* packs work per 128-bit lane k: dwords 4k..4k+3 come out as a_k b_k c_k d_k */
    return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15),
                                    _mm512_packus_epi16(ab, cd));
}

#define pkq_low_init() _mm512_setzero_si512()
#define pkq_hit_floor(low) _mm512_cmpeq_epi16_mask((low), _mm512_set1_epi16(INT16_MIN))

static inline __attribute__((always_inline)) void pkq_store(int bits, __m512i q, uint8_t *dst)
{
    if (bits == 8) {
        _mm512_storeu_si512(dst, q);
    } else if (bits == 4) {
        q = _mm512_min_epu8(q, _mm512_set1_epi8(15));
        __m512i pairs = _mm512_maddubs_epi16(q, _mm512_set1_epi16(0x1001));   /* lo + 16 * hi */
        _mm256_storeu_si256((__m256i *)dst, _mm512_cvtepi16_epi8(pairs));
    } else {
        q = _mm512_min_epu8(q, _mm512_set1_epi8(3));
        __m512i pairs = _mm512_maddubs_epi16(q, _mm512_set1_epi16(0x0401));   /* q0 + 4 * q1 */
        __m512i quads = _mm512_madd_epi16(pairs, _mm512_set1_epi32(0x00100001));
        _mm_storeu_si128((__m128i *)dst, _mm512_cvtepi32_epi8(quads));
    }
}

#include "quantized_prepack_body.h"

#endif
