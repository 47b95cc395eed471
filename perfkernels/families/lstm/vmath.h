/* exp, sigmoid and tanh on float32 vectors, written once for every ISA (scalar: vectors of one).
 *
 * Written over the SIMD primitives (simd/<isa>.h, included first); everything here is static too
 * (see simd/common.h).
 *
 * Maximum relative error against float64, measured over 2e6 evenly spaced points of [-30, 30],
 * +-logspace(1e-40, 30) and the extremes (test_elementwise_accuracy asserts exp <= 2.5e-7,
 * sigmoid and tanh <= 3e-7); the same on AVX2, AVX-512 and the scalar instantiation:
 *   exp      8.4e-8  (where the result is a normal float; below, the error is < FLT_MIN absolute)
 *   sigmoid  1.5e-7
 *   tanh     1.6e-7  (also near 0, down to the smallest subnormal)
 * Saturation: exp -> +inf above ln(FLT_MAX), gradual underflow to 0 below; sigmoid -> exactly 0
 * (x < -88.7) and 1 (x > 17.4); tanh -> exactly +-1 (|x| > 9.1).  No NaN for any finite or
 * infinite input; NaN in gives NaN out.
 */
#ifndef PK_LSTM_VMATH_H
#define PK_LSTM_VMATH_H

/* Inputs are clamped first, so n = round(x / ln2) is bounded and v_ldexp never sees garbage; the
 * operand order keeps NaN (vmin/vmax return the second operand when one is NaN). */
#define PK_EXP_HI 89.0f
#define PK_EXP_LO (-104.0f)

static inline vf v_clamp(vf x, float lo, float hi)
{
    return v_min(v_set1(hi), v_max(v_set1(lo), x));
}

/* The shared first half of e^x and e^x - 1: x = n ln2 + r, r in [-ln2/2, ln2/2] (Cody-Waite split
 * of ln2 with FMA); returns n and e^r - 1 = r + r^2 P(r), P of degree 4 fitted (weighted least
 * squares iterated towards minimax) for the relative error of e^r - 1 on that interval: 1.3e-8
 * before float32 rounding, and relative accuracy as r -> 0, so it serves expm1 too. */
static inline vf v_expm1_reduced(vf x, vf *n)
{
    *n = v_round(v_mul(x, v_set1(1.44269504088896341f)));
    vf r = v_fnmadd(*n, v_set1(0.693145751953125f), x);
    r = v_fnmadd(*n, v_set1(1.428606765330187e-06f), r);
    vf p = v_set1(1.3882522471249104e-3f);
    p = v_fmadd(p, r, v_set1(8.36651399731636e-3f));
    p = v_fmadd(p, r, v_set1(4.166720062494278e-2f));
    p = v_fmadd(p, r, v_set1(1.666654348373413e-1f));
    p = v_fmadd(p, r, v_set1(4.999999701976776e-1f));
    return v_fmadd(p, v_mul(r, r), r);
}

/* e^x for x already clamped to [PK_EXP_LO, PK_EXP_HI]; v_ldexp copes with any n there. */
static inline vf v_exp_clamped(vf x)
{
    vf n;
    const vf em1 = v_expm1_reduced(x, &n);
    return v_ldexp(v_add(em1, v_set1(1.0f)), n);
}

/* e^x for x in [-87, 89]: 2^n is a normal float or, for n = 128, +inf (the cheaper scaling). */
static inline vf v_exp_normal_range(vf x)
{
    vf n;
    const vf em1 = v_expm1_reduced(x, &n);
    return v_mul(v_add(em1, v_set1(1.0f)), v_pow2(n));
}

/* e^x: +inf above ln(FLT_MAX), gradual underflow to 0 below ln(FLT_TRUE_MIN). */
static inline vf v_exp(vf x) { return v_exp_clamped(v_clamp(x, PK_EXP_LO, PK_EXP_HI)); }

/* 1 / (1 + e^-x): no cancellation on either side (for x < 0 the quotient keeps e^x's relative
 * accuracy); e^-x < 2^-25 gives exactly 1, and e^-x = +inf (x < -88.7; the true value is below
 * FLT_MIN) gives exactly 0. */
static inline vf v_sigmoid(vf x)
{
    const vf e = v_exp_normal_range(v_clamp(v_sub(v_set1(0.0f), x), -87.0f, PK_EXP_HI));
    return v_div(v_set1(1.0f), v_add(v_set1(1.0f), e));
}

/* tanh|x| = w / (2 - w) with w = 1 - e^{-2|x|} in [0, 1): one exp-like evaluation, one division,
 * no branch and no cancellation.  w keeps relative accuracy near 0 (w = -(r + r^2 P(r)) when n = 0;
 * for n < 0, w = (1 - 2^n) - 2^n (e^r - 1) where 1 - 2^n is exact and the sum cannot cancel), so
 * tanh does too, down to the smallest subnormal.  -2|x| is clamped at -87: w = 1 exactly there,
 * tanh = 1 exactly (from |x| >= 9.1 on).  x's sign is put back last: tanh is odd, -0 stays -0. */
static inline vf v_tanh(vf x)
{
    const vf a = v_abs(x);
    vf n;
    const vf em1 = v_expm1_reduced(v_max(v_set1(-87.0f), v_mul(a, v_set1(-2.0f))), &n);
    const vf two_n = v_pow2(n);
    const vf w = v_fnmadd(two_n, em1, v_sub(v_set1(1.0f), two_n));
    return v_copysign(v_div(w, v_sub(v_set1(2.0f), w)), x);
}

#endif
