/* LSTM unit kernels for AVX2 + FMA.  Compiled with -mavx2 -mfma -mf16c (setup.py, this file only).
 * Tails use vmaskmovps: lanes past the row are neither read nor written. */
#include "perfkernels/lstm.h"

#if PK_X86_64
#if !(defined(__AVX2__) && defined(__FMA__))
#error "lstm_avx2.c must be compiled with -mavx2 -mfma"
#endif
#include <immintrin.h>

typedef __m256 vf;
#define VW 8

static inline vf v_set1(float a) { return _mm256_set1_ps(a); }
static inline vf v_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf v_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf v_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf v_fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf v_fnmadd(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
static inline vf v_min(vf a, vf b) { return _mm256_min_ps(a, b); }
static inline vf v_max(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf v_round(vf a)
{
    return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline vf v_abs(vf a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
static inline vf v_copysign(vf mag, vf sign)
{
    return _mm256_or_ps(mag, _mm256_and_ps(_mm256_set1_ps(-0.0f), sign));
}
/* Division, correctly rounded.  For 1/d, vrcpps has only ~11.6 bits and needs two Newton steps; vdivps measured
 * faster on the AMD EPYC (Zen 4) machines we measure on. */
static inline vf v_div(vf a, vf b) { return _mm256_div_ps(a, b); }

/* p * 2^n, n an integral float in [-150, 128]: two exact power-of-two factors 2^(n/2) * 2^(n-n/2),
 * each a normal float, so the product over- or underflows gracefully. */
static inline vf v_ldexp(vf p, vf n)
{
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1);
    const __m256i n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const vf s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const vf s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

/* 2^n for integral n in [-126, 128], straight into the exponent bits (128 gives +inf). */
static inline vf v_pow2(vf n)
{
    const __m256i ni = _mm256_cvtps_epi32(n);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23));
}

static inline vf v_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void v_store(float *p, vf v) { _mm256_storeu_ps(p, v); }
static inline __m256i lanes_below(size_t m)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vf v_load_n(const float *p, size_t m) { return _mm256_maskload_ps(p, lanes_below(m)); }
static inline void v_store_n(float *p, vf v, size_t m) { _mm256_maskstore_ps(p, lanes_below(m), v); }

#define LSTM_ISA avx2
#include "lstm_body.h"

void pk_lstm_math_avx2(int fn, const float *x, float *y, size_t n) { lstm_math(fn, x, y, n); }

#endif /* PK_X86_64 */
