/* Embedding-bag kernels for AVX2 + FMA + F16C.  Compiled with -mavx2 -mfma -mf16c (setup.py, this
 * file only).  The loops are embedding_body.h; this file gives it 8-float ymm vectors.
 *
 * D = 16, 32, 64 are single passes with NV = 2, 4, 8 (8 of the 16 ymm hold the row, the rest the
 * weight and the loads); D = 128, 256 are 2 and 4 passes of 8 over the bag (its rows stay in L1
 * between passes); any other D is cut into blocks of 8, 4, 2, 1 vectors and a tail (a masked load
 * for float rows, a bounded copy for 16-bit rows, never touching memory past the row). */
#include "perfkernels/embedding.h"

#if PK_X86_64
#if !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "embedding_avx2.c must be compiled with -mavx2 -mfma -mf16c"
#endif
#include <immintrin.h>
#include <string.h>

#include "embedding_vec.h"

typedef __m256 vf;
#define VL 8           /* floats per vector */
#define MAX_VECS 8     /* accumulators per pass: 8 of the 16 ymm, the rest for weight and loads */

ALWAYS_INLINE vf v_zero(void) { return _mm256_setzero_ps(); }
ALWAYS_INLINE vf v_set1(float a) { return _mm256_set1_ps(a); }
ALWAYS_INLINE vf v_add(vf a, vf b) { return _mm256_add_ps(a, b); }
ALWAYS_INLINE vf v_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
ALWAYS_INLINE vf v_fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
ALWAYS_INLINE void v_storeu(float *p, vf x) { _mm256_storeu_ps(p, x); }

ALWAYS_INLINE vf widen_bf16(__m128i h)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

ALWAYS_INLINE vf widen(__m128i h, const int type)
{
    return type == TABLE_F16 ? _mm256_cvtph_ps(h) : widen_bf16(h);
}

/* 8 elements of a row starting at element col, as floats. */
ALWAYS_INLINE vf load_row(const void *row, int64_t col, const int type)
{
    if (type == TABLE_F32) return _mm256_loadu_ps((const float *)row + col);
    return widen(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + col)), type);
}

/* A tail is its element count, 1..7. */
typedef int tail_t;
ALWAYS_INLINE tail_t make_tail(int64_t dim) { return (int)(dim % VL); }
ALWAYS_INLINE int tail_len(tail_t tail) { return tail; }

/* The first `tail` elements at col; the rest of the vector is 0 and nothing past them is read. */
ALWAYS_INLINE vf load_row_tail(const void *row, int64_t col, tail_t tail, const int type)
{
    if (type == TABLE_F32) {
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(tail), lane);
        return _mm256_maskload_ps((const float *)row + col, mask);
    }
    uint16_t buf[8] = {0};  /* AVX2 has no 16-bit masked load */
    memcpy(buf, (const uint16_t *)row + col, (size_t)tail * 2);
    return widen(_mm_loadu_si128((const __m128i *)buf), type);
}

ALWAYS_INLINE void store_tail(float *p, vf x, tail_t tail)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_maskstore_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(tail), lane), x);
}

#define EMBEDDING_BAG_F32 pk_embedding_bag_f32_avx2
#define EMBEDDING_BAG_F16 pk_embedding_bag_f16_avx2
#define EMBEDDING_BAG_BF16 pk_embedding_bag_bf16_avx2
#include "embedding_body.h"

#endif /* PK_X86_64 */
