/* Embedding-bag kernels for AVX-512 (F + BW + VL; F16C for half rows).  Compiled with the AVX-512
 * flags (setup.py, this file only).  The loops are embedding_body.h; this file gives it 16-float
 * zmm vectors.
 *
 * D = 16, 32, 64, 128, 256 are single passes with NV = 1, 2, 4, 8, 16 (16 of the 32 zmm hold the
 * row, the rest the loads); any other D is cut into blocks of 16, 8, 4, 2, 1 vectors and a masked
 * tail (masked loads never touch memory past the row). */
#include "perfkernels/embedding.h"

#if PK_X86_64
#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__F16C__) && defined(__FMA__))
#error "embedding_avx512.c must be compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl -mf16c -mfma"
#endif
#include <immintrin.h>

#include "embedding_vec.h"

typedef __m512 vf;
#define VL 16          /* floats per vector */
#define MAX_VECS 16    /* accumulators per pass: 16 of the 32 zmm, the rest for loads */

ALWAYS_INLINE vf v_zero(void) { return _mm512_setzero_ps(); }
ALWAYS_INLINE vf v_set1(float a) { return _mm512_set1_ps(a); }
ALWAYS_INLINE vf v_add(vf a, vf b) { return _mm512_add_ps(a, b); }
ALWAYS_INLINE vf v_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
ALWAYS_INLINE vf v_fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
ALWAYS_INLINE void v_storeu(float *p, vf x) { _mm512_storeu_ps(p, x); }

ALWAYS_INLINE vf widen_bf16(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 elements of a row starting at element col, as floats. */
ALWAYS_INLINE vf load_row(const void *row, int64_t col, const int type)
{
    if (type == TABLE_F32) return _mm512_loadu_ps((const float *)row + col);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + col));
    return type == TABLE_F16 ? _mm512_cvtph_ps(h) : widen_bf16(h);
}

/* A tail is the mask of its lanes. */
typedef __mmask16 tail_t;
ALWAYS_INLINE tail_t make_tail(int64_t dim) { return (__mmask16)((1u << (dim % VL)) - 1u); }
ALWAYS_INLINE int tail_len(tail_t tail) { return __builtin_popcount(tail); }

ALWAYS_INLINE vf load_row_tail(const void *row, int64_t col, tail_t m, const int type)
{
    if (type == TABLE_F32) return _mm512_maskz_loadu_ps(m, (const float *)row + col);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + col);
    return type == TABLE_F16 ? _mm512_cvtph_ps(h) : widen_bf16(h);
}

ALWAYS_INLINE void store_tail(float *p, vf x, tail_t m) { _mm512_mask_storeu_ps(p, m, x); }

#define EMBEDDING_BAG_F32 pk_embedding_bag_f32_avx512
#define EMBEDDING_BAG_F16 pk_embedding_bag_f16_avx512
#define EMBEDDING_BAG_BF16 pk_embedding_bag_bf16_avx512
#include "embedding_body.h"

#endif /* PK_X86_64 */
