/* quantize_rowwise for AVX2 + FMA + F16C (quantized_prepack_body.h over 8-lane vectors).
 * Compiled with -mavx2 -mfma -mf16c (setup.py, this file only). */
#include "perfkernels/quantized.h"

#if PK_X86_64
#if !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "quantized_prepack_avx2.c must be compiled with -mavx2 -mfma -mf16c"
#endif
#include <immintrin.h>

#define PKQ_W 8
#define PKQ_KERNEL pk_quantize_rowwise_avx2
typedef __m256 pkq_vf;
typedef __m256i pkq_vb;
typedef __m256i pkq_vl;

static inline __attribute__((always_inline)) __m256 pkq_load(const void *row, int half, size_t c)
{
    if (half) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + c)));
    return _mm256_loadu_ps((const float *)row + c);
}

#define pkq_set1 _mm256_set1_ps
#define pkq_min _mm256_min_ps
#define pkq_max _mm256_max_ps

static inline __attribute__((always_inline)) void pkq_reduce(__m256 vmn, __m256 vmx, float *mn, float *mx)
{
    __m128 a = _mm_min_ps(_mm256_castps256_ps128(vmn), _mm256_extractf128_ps(vmn, 1));
    __m128 b = _mm_max_ps(_mm256_castps256_ps128(vmx), _mm256_extractf128_ps(vmx, 1));
    a = _mm_min_ps(a, _mm_movehl_ps(a, a));
    b = _mm_max_ps(b, _mm_movehl_ps(b, b));
    a = _mm_min_ss(a, _mm_movehdup_ps(a));
    b = _mm_max_ss(b, _mm_movehdup_ps(b));
    *mn = _mm_cvtss_f32(a);
    *mx = _mm_cvtss_f32(b);
}

static inline __attribute__((always_inline)) __m256i pkq_codes(__m256 x0, __m256 x1, __m256 x2, __m256 x3,
                                                               __m256 sub, __m256 inv, __m256i *low)
{
    __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(x0, sub), inv));
    __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(x1, sub), inv));
    __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(x2, sub), inv));
    __m256i d = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(x3, sub), inv));
    __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    *low = _mm256_min_epi16(*low, _mm256_min_epi16(ab, cd));
    /* packs work per 128-bit lane: dwords come out as a0 b0 c0 d0 a1 b1 c1 d1 */
    return _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

#define pkq_low_init() _mm256_setzero_si256()
#define pkq_hit_floor(low) \
    _mm256_movemask_epi8(_mm256_cmpeq_epi16((low), _mm256_set1_epi16(INT16_MIN)))

static inline __attribute__((always_inline)) void pkq_store(int bits, __m256i q, uint8_t *dst)
{
    if (bits == 8) {
        _mm256_storeu_si256((__m256i *)dst, q);
    } else if (bits == 4) {
        q = _mm256_min_epu8(q, _mm256_set1_epi8(15));
        __m256i pairs = _mm256_maddubs_epi16(q, _mm256_set1_epi16(0x1001));   /* lo + 16 * hi */
        __m128i out = _mm_packus_epi16(_mm256_castsi256_si128(pairs), _mm256_extracti128_si256(pairs, 1));
        _mm_storeu_si128((__m128i *)dst, out);
    } else {
        q = _mm256_min_epu8(q, _mm256_set1_epi8(3));
        __m256i pairs = _mm256_maddubs_epi16(q, _mm256_set1_epi16(0x0401));   /* q0 + 4 * q1 */
        __m256i quads = _mm256_madd_epi16(pairs, _mm256_set1_epi32(0x00100001));
        __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(quads), _mm256_extracti128_si256(quads, 1));
        _mm_storel_epi64((__m128i *)dst, _mm_packus_epi16(w, w));
    }
}

#include "quantized_prepack_body.h"

#endif
