/* Training updates for AVX-512 F + BW + DQ + VL.  Compiled with the AVX-512 flags (setup.py, this
 * file only).  The loops are training_body.h; this file gives it 16-float zmm vectors and masked
 * tails. */
#include "perfkernels/training.h"

#if PK_X86_64
#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__F16C__))
#error "training_avx512.c must be compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl -mf16c"
#endif
#include <immintrin.h>

#include "training/row.h"

typedef __m512 vf;
#define VL 16
#define MAX_VECS 8     /* accumulators per block: D <= 128 in one walk over a row's entries */

ALWAYS_INLINE vf v_zero(void) { return _mm512_setzero_ps(); }
ALWAYS_INLINE vf v_set1(float a) { return _mm512_set1_ps(a); }
ALWAYS_INLINE vf v_add(vf a, vf b) { return _mm512_add_ps(a, b); }
ALWAYS_INLINE vf v_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
ALWAYS_INLINE vf v_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
ALWAYS_INLINE vf v_div(vf a, vf b) { return _mm512_div_ps(a, b); }
ALWAYS_INLINE vf v_sqrt(vf a) { return _mm512_sqrt_ps(a); }
ALWAYS_INLINE vf v_fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
ALWAYS_INLINE vf v_fnmadd(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
ALWAYS_INLINE vf v_loadu(const float *p) { return _mm512_loadu_ps(p); }
ALWAYS_INLINE void v_storeu(float *p, vf x) { _mm512_storeu_ps(p, x); }
ALWAYS_INLINE float v_hsum(vf x) { return _mm512_reduce_add_ps(x); }

ALWAYS_INLINE __mmask16 tail_mask(int n) { return (__mmask16)((1u << n) - 1u); }
ALWAYS_INLINE vf v_load_tail(const float *p, int n) { return _mm512_maskz_loadu_ps(tail_mask(n), p); }
ALWAYS_INLINE void v_store_tail(float *p, vf x, int n) { _mm512_mask_storeu_ps(p, tail_mask(n), x); }

ALWAYS_INLINE vf widen(__m256i h, const int type)
{
    if (type == TRAIN_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* float32 -> 16-bit, nearest even (bfloat16: NaN -> quiet NaN with the sign, as convert_bits.h). */
ALWAYS_INLINE __m256i narrow(vf x, const int type)
{
    if (type == TRAIN_F16) return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i b = _mm512_castps_si512(x);
    const __m512i hi = _mm512_srli_epi32(b, 16);
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)),
                                 _mm512_and_si512(hi, _mm512_set1_epi32(1)));
    r = _mm512_srli_epi32(r, 16);
    const __m512i qnan = _mm512_or_si512(_mm512_and_si512(hi, _mm512_set1_epi32(0x8000)),
                                         _mm512_set1_epi32(0x7fc0));
    r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), r, qnan);
    return _mm512_cvtepi32_epi16(r);
}

ALWAYS_INLINE vf load_table(const char *row, int64_t col, const int type)
{
    if (type == TRAIN_F32) return _mm512_loadu_ps((const float *)row + col);
    return widen(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + col)), type);
}

ALWAYS_INLINE vf load_table_tail(const char *row, int64_t col, int n, const int type)
{
    if (type == TRAIN_F32) return v_load_tail((const float *)row + col, n);
    return widen(_mm256_maskz_loadu_epi16(tail_mask(n), (const uint16_t *)row + col), type);
}

ALWAYS_INLINE void store_table(char *row, int64_t col, vf x, const int type)
{
    if (type == TRAIN_F32) _mm512_storeu_ps((float *)row + col, x);
    else _mm256_storeu_si256((__m256i *)((uint16_t *)row + col), narrow(x, type));
}

ALWAYS_INLINE void store_table_tail(char *row, int64_t col, vf x, int n, const int type)
{
    if (type == TRAIN_F32) v_store_tail((float *)row + col, x, n);
    else _mm256_mask_storeu_epi16((uint16_t *)row + col, tail_mask(n), narrow(x, type));
}

#define TRAINING_UPDATE_F32 pk_training_update_f32_avx512
#define TRAINING_UPDATE_F16 pk_training_update_f16_avx512
#define TRAINING_UPDATE_BF16 pk_training_update_bf16_avx512
#include "training/body.h"

#endif /* PK_X86_64 */
