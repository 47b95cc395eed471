/* Conversion kernels for AVX2 + F16C.  Compiled with -mavx2 -mfma -mf16c (setup.py, this file only). */
#include "perfkernels/convert.h"

#if PK_X86_64
#if !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "convert_avx2.c must be compiled with -mavx2 -mfma -mf16c"
#endif
#include <immintrin.h>
#include "convert_bits.h"
#include "convert_stream.h"

#define ROUND_NEAREST (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

static inline float clip_half(float x)
{
    return x > 65504.0f ? 65504.0f : (x < -65504.0f ? -65504.0f : x);
}

/* Elements before dst reaches `align` bytes (never more than n). */
static inline size_t head_until_aligned(const void *dst, size_t elem, size_t align, size_t n)
{
    size_t mis = (uintptr_t)dst & (align - 1);
    size_t k = mis ? (align - mis) / elem : 0;
    return k < n ? k : n;
}

void pk_float_to_half_avx2(const float *src, uint16_t *dst, size_t n, int clip)
{
    const __m256 hi = _mm256_set1_ps(65504.0f), lo = _mm256_set1_ps(-65504.0f);
    const int stream = PK_SHOULD_STREAM(n);
    size_t i = stream ? head_until_aligned(dst, 2, 16, n) : 0;
    pk_float_to_half_scalar(src, dst, i, clip);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(src + i);
        if (clip) x = _mm256_max_ps(lo, _mm256_min_ps(hi, x)); /* operand order keeps NaN */
        __m128i h = _mm256_cvtps_ph(x, ROUND_NEAREST);
        if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)) != 0, 0)) {
            /* F16C quiets signalling NaNs; NumPy keeps them: redo these 8 exactly */
            uint16_t exact[8];
            for (int k = 0; k < 8; k++) {
                float v = src[i + k];
                exact[k] = pk_f32_to_f16_bits(pk_f32_bits(clip && v == v ? clip_half(v) : v));
            }
            h = _mm_loadu_si128((const __m128i *)exact);
        }
        if (stream) _mm_stream_si128((__m128i *)(dst + i), h);
        else _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    if (stream) _mm_sfence();
    pk_float_to_half_scalar(src + i, dst + i, n - i, clip);
}

void pk_half_to_float_avx2(const uint16_t *src, float *dst, size_t n)
{
    const __m128i abs_mask = _mm_set1_epi16(0x7fff), inf = _mm_set1_epi16(0x7c00);
    const int stream = PK_SHOULD_STREAM(n);
    size_t i = stream ? head_until_aligned(dst, 4, 32, n) : 0;
    pk_half_to_float_scalar(src, dst, i);
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(src + i));
        __m256 x = _mm256_cvtph_ps(h);
        __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(h, abs_mask), inf);
        if (__builtin_expect(_mm_movemask_epi8(nan) != 0, 0)) {
            float exact[8]; /* F16C quiets signalling NaNs; NumPy keeps the payload as is */
            pk_half_to_float_scalar(src + i, exact, 8);
            x = _mm256_loadu_ps(exact);
        }
        if (stream) _mm256_stream_ps(dst + i, x);
        else _mm256_storeu_ps(dst + i, x);
    }
    if (stream) _mm_sfence();
    pk_half_to_float_scalar(src + i, dst + i, n - i);
}

/* 8 floats -> 8 bfloat16 in the low 16 bits of each 32-bit lane (round to nearest even). */
static inline __m256i bf16_round8(__m256 x)
{
    const __m256i b = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i absb = _mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(absb, _mm256_set1_epi32(0x7f800000));
    const __m256i qnan = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x8000)),
                                         _mm256_set1_epi32(0x7fc0));
    return _mm256_blendv_epi8(r, qnan, nan);
}

void pk_float_to_bf16_avx2(const float *src, uint16_t *dst, size_t n)
{
    const int stream = PK_SHOULD_STREAM(n);
    size_t i = stream ? head_until_aligned(dst, 2, 32, n) : 0;
    pk_float_to_bf16_scalar(src, dst, i);
    for (; i + 16 <= n; i += 16) {
        __m256i a = bf16_round8(_mm256_loadu_ps(src + i));
        __m256i b = bf16_round8(_mm256_loadu_ps(src + i + 8));
        /* packus interleaves the 128-bit halves; the permute puts them back in order */
        __m256i h = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
        if (stream) _mm256_stream_si256((__m256i *)(dst + i), h);
        else _mm256_storeu_si256((__m256i *)(dst + i), h);
    }
    if (stream) _mm_sfence();
    pk_float_to_bf16_scalar(src + i, dst + i, n - i);
}

void pk_bf16_to_float_avx2(const uint16_t *src, float *dst, size_t n)
{
    const int stream = PK_SHOULD_STREAM(n);
    size_t i = stream ? head_until_aligned(dst, 4, 32, n) : 0;
    pk_bf16_to_float_scalar(src, dst, i);
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        __m256 x = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
        if (stream) _mm256_stream_ps(dst + i, x);
        else _mm256_storeu_ps(dst + i, x);
    }
    if (stream) _mm_sfence();
    pk_bf16_to_float_scalar(src + i, dst + i, n - i);
}

#endif /* PK_X86_64 */
