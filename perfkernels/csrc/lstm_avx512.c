/* LSTM unit kernels for AVX-512 F (+ DQ/VL).  Compiled with -mavx512f -mavx512bw -mavx512dq
 * -mavx512vl (setup.py, this file only).  Tails use masked loads and stores. */
#include "perfkernels/lstm.h"

#if PK_X86_64
#if !(defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512VL__) && defined(__FMA__))
#error "lstm_avx512.c must be compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl -mfma"
#endif
#include <immintrin.h>

typedef __m512 vf;
#define VW 16

static inline vf v_set1(float a) { return _mm512_set1_ps(a); }
static inline vf v_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf v_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf v_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf v_fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf v_fnmadd(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
static inline vf v_min(vf a, vf b) { return _mm512_min_ps(a, b); }
static inline vf v_max(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf v_round(vf a)
{
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline vf v_abs(vf a) { return _mm512_abs_ps(a); }
static inline vf v_copysign(vf mag, vf sign)
{
    return _mm512_or_ps(mag, _mm512_and_ps(_mm512_set1_ps(-0.0f), sign));
}
/* Division, correctly rounded.  For 1/d on the AMD EPYC (Zen 4) machines we measure on, vdivps is as fast here
 * as vrcp14ps + one Newton step; on Intel parts with a slower divider the estimate may win. */
static inline vf v_div(vf a, vf b) { return _mm512_div_ps(a, b); }
/* p * 2^n in one instruction; vscalefps handles overflow to inf and gradual underflow itself. */
static inline vf v_ldexp(vf p, vf n) { return _mm512_scalef_ps(p, n); }

/* 2^n for integral n in [-126, 128] (128 gives +inf). */
static inline vf v_pow2(vf n) { return _mm512_scalef_ps(_mm512_set1_ps(1.0f), n); }

static inline vf v_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void v_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline __mmask16 lanes_below(size_t m) { return (__mmask16)((1u << m) - 1u); }
static inline vf v_load_n(const float *p, size_t m) { return _mm512_maskz_loadu_ps(lanes_below(m), p); }
static inline void v_store_n(float *p, vf v, size_t m) { _mm512_mask_storeu_ps(p, lanes_below(m), v); }

#define LSTM_ISA avx512
#include "lstm_body.h"

void pk_lstm_math_avx512(int fn, const float *x, float *y, size_t n) { lstm_math(fn, x, y, n); }

#endif /* PK_X86_64 */
