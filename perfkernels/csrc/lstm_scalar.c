/* LSTM unit kernels, portable C (any architecture).  sigmoid and tanh come from libm. */
#include <math.h>
#include "perfkernels/lstm.h"

#define LSTM_ISA scalar
#include "lstm_rows.h"

static inline float sigmoid_scalar(float x) { return 1.0f / (1.0f + expf(-x)); }

static void forward_row(const lstm_row *r, float forget_bias, size_t d)
{
    for (size_t k = 0; k < d; k++) {
        const float i = sigmoid_scalar(r->xi[k]);
        const float f = sigmoid_scalar(r->xf[k] + forget_bias);
        const float o = sigmoid_scalar(r->xo[k]);
        const float g = tanhf(r->xg[k]);
        const float c = f * r->c_prev[k] + i * g;
        r->c[k] = c;
        r->h[k] = o * tanhf(c);
    }
}

static void backward_row(const lstm_row *r, float forget_bias, size_t d)
{
    for (size_t k = 0; k < d; k++) {
        const float i = sigmoid_scalar(r->xi[k]);
        const float f = sigmoid_scalar(r->xf[k] + forget_bias);
        const float o = sigmoid_scalar(r->xo[k]);
        const float g = tanhf(r->xg[k]);
        const float tc = tanhf(r->c_out[k]);
        const float dh = r->dh[k];
        const float dct = r->dc[k] + dh * o * (1.0f - tc * tc);
        r->dc_prev[k] = dct * f;
        r->di[k] = dct * g * i * (1.0f - i);
        r->df[k] = dct * r->c_prev[k] * f * (1.0f - f);
        r->do_[k] = dh * tc * o * (1.0f - o);
        r->dg[k] = dct * i * (1.0f - g * g);
    }
}

void pk_lstm_math_scalar(int fn, const float *x, float *y, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        switch (fn) {
        case PK_MATH_EXP: y[k] = expf(x[k]); break;
        case PK_MATH_SIGMOID: y[k] = sigmoid_scalar(x[k]); break;
        default: y[k] = tanhf(x[k]); break;
        }
    }
}
