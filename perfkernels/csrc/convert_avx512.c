/* Conversion kernels for AVX-512 (F + BW + VL).  Compiled with -mavx512f -mavx512bw -mavx512dq
 * -mavx512vl (setup.py, this file only).  Tails use masked loads and stores. */
#include "perfkernels/convert.h"

#if PK_X86_64
#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__F16C__))
#error "convert_avx512.c must be compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl -mf16c"
#endif
#include <immintrin.h>
#include "convert_stream.h"

#define ROUND_NEAREST (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

static inline __mmask16 tail_mask(size_t left) { return (__mmask16)((1u << left) - 1u); }

/* Elements before dst reaches `align` bytes (the width of the streaming store; at most 15 here). */
static inline size_t head_until_aligned(const void *dst, size_t elem, size_t align, size_t n)
{
    size_t mis = (uintptr_t)dst & (align - 1);
    size_t k = mis ? (align - mis) / elem : 0;
    return k < n ? k : n;
}

/* 16 floats -> 16 halves; NaN lanes rebuilt the way NumPy does (payload truncated, sNaN kept). */
static inline __m256i f32_to_f16_x16(__m512 x, int clip)
{
    if (clip) /* operand order: vminps/vmaxps return the second operand when one is NaN */
        x = _mm512_max_ps(_mm512_set1_ps(-65504.0f), _mm512_min_ps(_mm512_set1_ps(65504.0f), x));
    __m256i h = _mm512_cvtps_ph(x, ROUND_NEAREST);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    if (__builtin_expect(nan != 0, 0)) {
        __m512i b = _mm512_castps_si512(x);
        __m512i sign = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x8000));
        __m512i payload = _mm512_srli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x7fffff)), 13);
        payload = _mm512_max_epu32(payload, _mm512_set1_epi32(1));
        __m512i fix = _mm512_or_si512(_mm512_or_si512(sign, payload), _mm512_set1_epi32(0x7c00));
        h = _mm256_mask_blend_epi16(nan, h, _mm512_cvtepi32_epi16(fix));
    }
    return h;
}

/* 16 halves -> 16 floats; NaN lanes keep their payload unquieted, as NumPy does. */
static inline __m512 f16_to_f32_x16(__m256i h)
{
    __m512 x = _mm512_cvtph_ps(h);
    __mmask16 nan = _mm256_cmpgt_epi16_mask(_mm256_and_si256(h, _mm256_set1_epi16(0x7fff)),
                                            _mm256_set1_epi16(0x7c00));
    if (__builtin_expect(nan != 0, 0)) {
        __m512i w = _mm512_cvtepu16_epi32(h);
        __m512i fix = _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(w, _mm512_set1_epi32(0x8000)), 16),
                                      _mm512_or_si512(_mm512_set1_epi32(0x7f800000),
                                                      _mm512_slli_epi32(_mm512_and_si512(w, _mm512_set1_epi32(0x3ff)), 13)));
        x = _mm512_mask_blend_ps(nan, x, _mm512_castsi512_ps(fix));
    }
    return x;
}

static inline __m256i f32_to_bf16_x16(__m512 x)
{
    __m512i b = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i qnan = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x8000)),
                                   _mm512_set1_epi32(0x7fc0));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, qnan));
}

static inline __m512 bf16_to_f32_x16(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Narrowing: 16 floats in (64 B), 16 x 16-bit out (32 B).  A masked head brings dst to 64-byte
 * alignment when streaming, then full vectors, then a masked tail. */
#define NARROW_LOOP(CONVERT)                                                                   \
    const int stream = PK_SHOULD_STREAM(n);                                      \
    size_t i = 0;                                                                              \
    if (stream) {                                                                              \
        size_t head = head_until_aligned(dst, 2, 32, n);                                       \
        if (head) {                                                                            \
            __mmask16 m = tail_mask(head);                                                     \
            _mm256_mask_storeu_epi16(dst, m, CONVERT(_mm512_maskz_loadu_ps(m, src)));          \
            i = head;                                                                          \
        }                                                                                      \
    }                                                                                          \
    for (; i + 16 <= n; i += 16) {                                                             \
        __m256i h = CONVERT(_mm512_loadu_ps(src + i));                                         \
        if (stream) _mm256_stream_si256((__m256i *)(dst + i), h);                              \
        else _mm256_storeu_si256((__m256i *)(dst + i), h);                                     \
    }                                                                                          \
    if (stream) _mm_sfence();                                                                  \
    if (i < n) {                                                                               \
        __mmask16 m = tail_mask(n - i);                                                        \
        _mm256_mask_storeu_epi16(dst + i, m, CONVERT(_mm512_maskz_loadu_ps(m, src + i)));      \
    }

/* Widening: 16 x 16-bit in (32 B), 16 floats out (64 B). */
#define WIDEN_LOOP(CONVERT)                                                                    \
    const int stream = PK_SHOULD_STREAM(n);                                      \
    size_t i = 0;                                                                              \
    if (stream) {                                                                              \
        size_t head = head_until_aligned(dst, 4, 64, n);                                          \
        if (head) {                                                                            \
            __mmask16 m = tail_mask(head);                                                     \
            _mm512_mask_storeu_ps(dst, m, CONVERT(_mm256_maskz_loadu_epi16(m, src)));          \
            i = head;                                                                          \
        }                                                                                      \
    }                                                                                          \
    for (; i + 16 <= n; i += 16) {                                                             \
        __m512 x = CONVERT(_mm256_loadu_si256((const __m256i *)(src + i)));                    \
        if (stream) _mm512_stream_ps(dst + i, x);                                              \
        else _mm512_storeu_ps(dst + i, x);                                                     \
    }                                                                                          \
    if (stream) _mm_sfence();                                                                  \
    if (i < n) {                                                                               \
        __mmask16 m = tail_mask(n - i);                                                        \
        _mm512_mask_storeu_ps(dst + i, m, CONVERT(_mm256_maskz_loadu_epi16(m, src + i)));      \
    }

#define F2H_CLIP(x) f32_to_f16_x16((x), 1)
#define F2H_NOCLIP(x) f32_to_f16_x16((x), 0)

void pk_float_to_half_avx512(const float *src, uint16_t *dst, size_t n, int clip)
{
    if (clip) {
        NARROW_LOOP(F2H_CLIP)
    } else {
        NARROW_LOOP(F2H_NOCLIP)
    }
}

void pk_half_to_float_avx512(const uint16_t *src, float *dst, size_t n) { WIDEN_LOOP(f16_to_f32_x16) }

void pk_float_to_bf16_avx512(const float *src, uint16_t *dst, size_t n) { NARROW_LOOP(f32_to_bf16_x16) }

void pk_bf16_to_float_avx512(const uint16_t *src, float *dst, size_t n) { WIDEN_LOOP(bf16_to_f32_x16) }

#endif /* PK_X86_64 */
