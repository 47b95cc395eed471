/* Training updates for AVX2 + FMA + F16C.  Compiled with -mavx2 -mfma -mf16c (setup.py, this file
 * only).  The loops are training_body.h; this file gives it 8-float ymm vectors. */
#include "perfkernels/training.h"

#if PK_X86_64
#if !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "training_avx2.c must be compiled with -mavx2 -mfma -mf16c"
#endif
#include <immintrin.h>
#include <string.h>

#include "training/row.h"

typedef __m256 vf;
#define VL 8
#define MAX_VECS 8     /* accumulators per block: 8 of the 16 ymm */

ALWAYS_INLINE vf v_zero(void) { return _mm256_setzero_ps(); }
ALWAYS_INLINE vf v_set1(float a) { return _mm256_set1_ps(a); }
ALWAYS_INLINE vf v_add(vf a, vf b) { return _mm256_add_ps(a, b); }
ALWAYS_INLINE vf v_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
ALWAYS_INLINE vf v_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
ALWAYS_INLINE vf v_div(vf a, vf b) { return _mm256_div_ps(a, b); }
ALWAYS_INLINE vf v_sqrt(vf a) { return _mm256_sqrt_ps(a); }
ALWAYS_INLINE vf v_fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
ALWAYS_INLINE vf v_fnmadd(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
ALWAYS_INLINE vf v_loadu(const float *p) { return _mm256_loadu_ps(p); }
ALWAYS_INLINE void v_storeu(float *p, vf x) { _mm256_storeu_ps(p, x); }

ALWAYS_INLINE float v_hsum(vf x)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

ALWAYS_INLINE __m256i tail_mask(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

ALWAYS_INLINE vf v_load_tail(const float *p, int n) { return _mm256_maskload_ps(p, tail_mask(n)); }
ALWAYS_INLINE void v_store_tail(float *p, vf x, int n) { _mm256_maskstore_ps(p, tail_mask(n), x); }

ALWAYS_INLINE vf widen(__m128i h, const int type)
{
    if (type == TRAIN_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* float32 -> 16-bit, nearest even (bfloat16: NaN -> quiet NaN with the sign, as convert_bits.h). */
ALWAYS_INLINE __m128i narrow(vf x, const int type)
{
    if (type == TRAIN_F16) return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i b = _mm256_castps_si256(x);
    const __m256i hi = _mm256_srli_epi32(b, 16);
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)),
                                 _mm256_and_si256(hi, _mm256_set1_epi32(1)));
    r = _mm256_srli_epi32(r, 16);
    const __m256i qnan = _mm256_or_si256(_mm256_and_si256(hi, _mm256_set1_epi32(0x8000)),
                                         _mm256_set1_epi32(0x7fc0));
    r = _mm256_blendv_epi8(r, qnan, _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
}

ALWAYS_INLINE vf load_table(const char *row, int64_t col, const int type)
{
    if (type == TRAIN_F32) return _mm256_loadu_ps((const float *)row + col);
    return widen(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + col)), type);
}

ALWAYS_INLINE vf load_table_tail(const char *row, int64_t col, int n, const int type)
{
    if (type == TRAIN_F32) return v_load_tail((const float *)row + col, n);
    uint16_t buf[8] = {0};   /* AVX2 has no 16-bit masked load */
    memcpy(buf, (const uint16_t *)row + col, (size_t)n * 2);
    return widen(_mm_loadu_si128((const __m128i *)buf), type);
}

ALWAYS_INLINE void store_table(char *row, int64_t col, vf x, const int type)
{
    if (type == TRAIN_F32) _mm256_storeu_ps((float *)row + col, x);
    else _mm_storeu_si128((__m128i *)((uint16_t *)row + col), narrow(x, type));
}

ALWAYS_INLINE void store_table_tail(char *row, int64_t col, vf x, int n, const int type)
{
    if (type == TRAIN_F32) { v_store_tail((float *)row + col, x, n); return; }
    uint16_t buf[8];
    _mm_storeu_si128((__m128i *)buf, narrow(x, type));
    memcpy((uint16_t *)row + col, buf, (size_t)n * 2);
}

#define TRAINING_UPDATE_F32 pk_training_update_f32_avx2
#define TRAINING_UPDATE_F16 pk_training_update_f16_avx2
#define TRAINING_UPDATE_BF16 pk_training_update_bf16_avx2
#include "training/body.h"

#endif /* PK_X86_64 */
