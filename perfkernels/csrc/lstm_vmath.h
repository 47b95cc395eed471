/* exp, sigmoid and tanh on float32 vectors, written once for every vector ISA.
 *
 * The including ISA file defines the vector type `vf` and the primitives used below as
 * `static inline` functions (v_set1, v_add, v_sub, v_mul, v_fmadd = a*b+c, v_fnmadd = c-a*b,
 * v_min, v_max, v_round, v_abs, v_copysign, v_lt -> vm, v_select, v_ldexp = p * 2^n,
 * v_rcp_estimate = 1/d to >= 11 bits), then includes
 * this header.  Everything here is `static inline` too: compiled with -mavx512f in one file, a
 * non-static helper could be picked by the linker for the AVX2 file as well (numpy#25274).
 *
 * Measured against float64 over 2e6 points of [-30, 30] plus the extremes (tests/test_lstm.py,
 * which asserts these bounds; see docs in perfkernels/_lstm.pyx):
 *   exp      relative error <= 3e-7 where the result is a normal float
 *   sigmoid  relative error <= 3e-7
 *   tanh     relative error <= 3e-7, odd, exact 0 at 0, relative accuracy kept near 0
 * Saturation: exp -> +inf above ln(FLT_MAX), gradual underflow to 0 below; sigmoid -> exactly 0 and
 * 1, tanh -> exactly +-1.  No NaN for any finite or infinite input; NaN in gives NaN out.
 */
#ifndef PK_LSTM_VMATH_H
#define PK_LSTM_VMATH_H

/* Inputs are clamped first, so n = round(x / ln2) is bounded and v_ldexp never sees garbage; the
 * operand order keeps NaN (vmin/vmax return the second operand when one is NaN). */
#define PK_EXP_HI 89.0f
#define PK_EXP_LO (-104.0f)
/* sigmoid and tanh clamp e^x's argument lower, so 1 + e^x stays finite for the reciprocal. */
#define PK_EXP_HI_FINITE 88.0f

static inline vf v_clamp(vf x, float lo, float hi)
{
    return v_min(v_set1(hi), v_max(v_set1(lo), x));
}

/* e^x for x already clamped: 2^n * e^r, r = x - n ln2 in [-ln2/2, ln2/2] (Cody-Waite split of ln2
 * with FMA), e^r by the Cephes degree-7 polynomial, 2^n applied by v_ldexp. */
static inline vf v_exp_clamped(vf x)
{
    const vf n = v_round(v_mul(x, v_set1(1.44269504088896341f)));
    vf r = v_fnmadd(n, v_set1(0.693145751953125f), x);
    r = v_fnmadd(n, v_set1(1.428606765330187e-06f), r);
    vf p = v_set1(1.9875691500e-4f);
    p = v_fmadd(p, r, v_set1(1.3981999507e-3f));
    p = v_fmadd(p, r, v_set1(8.3334519073e-3f));
    p = v_fmadd(p, r, v_set1(4.1665795894e-2f));
    p = v_fmadd(p, r, v_set1(1.6666665459e-1f));
    p = v_fmadd(p, r, v_set1(5.0000001201e-1f));
    p = v_fmadd(p, v_mul(r, r), v_add(r, v_set1(1.0f)));
    return v_ldexp(p, n);
}

/* e^x: +inf above ln(FLT_MAX), gradual underflow to 0 below ln(FLT_TRUE_MIN). */
static inline vf v_exp(vf x) { return v_exp_clamped(v_clamp(x, PK_EXP_LO, PK_EXP_HI)); }

/* 1/d for finite d >= 1: the hardware estimate and one Newton step (no divider on the hot path).
 * A result below FLT_MIN may come back as 0. */
static inline vf v_recip(vf d)
{
    const vf r = v_rcp_estimate(d);
    return v_fmadd(r, v_fnmadd(d, r, v_set1(1.0f)), r);
}

/* 1 / (1 + e^-x): no cancellation on either side (for x < 0 the quotient keeps e^x's relative
 * accuracy); e^-x < 2^-25 gives exactly 1, and x < -88 gives exactly 0 (the true value is below
 * 6.1e-39 < FLT_MIN; the reciprocal estimate would otherwise leave a constant subnormal there). */
static inline vf v_sigmoid(vf x)
{
    const vf e = v_exp_clamped(v_clamp(v_sub(v_set1(0.0f), x), PK_EXP_LO, PK_EXP_HI_FINITE));
    const vf s = v_recip(v_add(v_set1(1.0f), e));
    return v_select(v_lt(x, v_set1(-PK_EXP_HI_FINITE)), v_set1(0.0f), s);
}

#define PK_TANH_SMALL 0.625f

/* |x| < 0.625: |x| + |x|^3 P(x^2), an odd near-minimax polynomial fitted for relative error (so
 * tanh keeps relative accuracy down to the smallest subnormal).  Otherwise 1 - 2 / (e^{2|x|} + 1):
 * there e^{2|x|} >= 3.49, the subtraction loses less than one bit, and |x| >= 9.1 gives exactly 1.
 * x's sign is put back last, so tanh is odd and -0 stays -0. */
static inline vf v_tanh(vf x)
{
    const vf one = v_set1(1.0f);
    const vf a = v_abs(x);
    const vf y = v_mul(a, a);
    vf p = v_set1(0.002094207564368844f);
    p = v_fmadd(p, y, v_set1(-0.008122863247990608f));
    p = v_fmadd(p, y, v_set1(0.021678192541003227f));
    p = v_fmadd(p, y, v_set1(-0.05394259840250015f));
    p = v_fmadd(p, y, v_set1(0.13333173096179962f));
    p = v_fmadd(p, y, v_set1(-0.3333333134651184f));
    const vf small = v_fmadd(v_mul(a, y), p, a);
    const vf e = v_exp_clamped(v_min(v_set1(PK_EXP_HI_FINITE), v_add(a, a)));
    const vf big = v_fnmadd(v_set1(2.0f), v_recip(v_add(e, one)), one);
    return v_copysign(v_select(v_lt(a, v_set1(PK_TANH_SMALL)), small, big), x);
}

#endif
