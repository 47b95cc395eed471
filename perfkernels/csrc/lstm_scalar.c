/* LSTM unit kernels, portable C (any architecture, baseline flags).
 *
 * The same exp / sigmoid / tanh algorithm as the vector files (lstm_vmath.h), instantiated on plain
 * floats: libm's expf/tanhf made this path ~10x slower than NumPy, and one algorithm on every level
 * means one set of measured error bounds.  No fmaf (a slow library call without hardware FMA):
 * a*b+c is rounded twice here, which the error bounds in lstm_vmath.h already cover. */
#include <math.h>
#include <string.h>
#include "perfkernels/lstm.h"

typedef float vf;
#define VW 1

static inline vf v_set1(float a) { return a; }
static inline vf v_add(vf a, vf b) { return a + b; }
static inline vf v_sub(vf a, vf b) { return a - b; }
static inline vf v_mul(vf a, vf b) { return a * b; }
static inline vf v_fmadd(vf a, vf b, vf c) { return a * b + c; }
static inline vf v_fnmadd(vf a, vf b, vf c) { return c - a * b; }
/* the operand order of x86's minps/maxps: the second operand when either is NaN */
static inline vf v_min(vf a, vf b) { return a < b ? a : b; }
static inline vf v_max(vf a, vf b) { return a > b ? a : b; }
/* round to nearest even for |a| < 2^22 (inputs here are clamped far below), no libm call; the
 * build has no -ffast-math, so the compiler keeps the rounding add */
static inline vf v_round(vf a) { return (a + 12582912.0f) - 12582912.0f; }
static inline vf v_abs(vf a) { return fabsf(a); }
static inline vf v_copysign(vf mag, vf sign) { return copysignf(mag, sign); }
static inline vf v_div(vf a, vf b) { return a / b; }

static inline vf v_pow2(vf n) /* 2^n for integral n in [-126, 128] (128 gives +inf) */
{
    n = n == n ? n : 0.0f; /* no undefined NaN -> int conversion; the NaN is in p already */
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

static inline vf v_ldexp(vf p, vf n) /* p * 2^n for integral n in [-150, 129], in two exact steps */
{
    n = n == n ? n : 0.0f;
    const int32_t ni = (int32_t)n, n1 = ni >> 1;
    return p * v_pow2((float)n1) * v_pow2((float)(ni - n1));
}

static inline vf v_load(const float *p) { return *p; }
static inline void v_store(float *p, vf v) { *p = v; }
static inline vf v_load_n(const float *p, size_t m) { (void)m; return *p; }
static inline void v_store_n(float *p, vf v, size_t m) { (void)m; *p = v; }

#define LSTM_FWD_BLOCK 4
#define LSTM_ISA scalar
#include "lstm_body.h"

void pk_lstm_math_scalar(int fn, const float *x, float *y, size_t n) { lstm_math(fn, x, y, n); }
