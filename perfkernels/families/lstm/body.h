/* The LSTM unit, written once over the SIMD primitives (simd/<isa>.h; scalar: VL = 1).  Each ISA
 * file includes its primitive header, then this; it defines pk_lstm_forward / _backward / _math
 * with the level's suffix. */
#ifndef PK_LSTM_BODY_H
#define PK_LSTM_BODY_H

#include "lstm/vmath.h"
#include "lstm/rows.h"

typedef struct lstm_fwd_out { vf h, c; } lstm_fwd_out;

/* The forward step in two stages: the gates give o and c, then h = o * tanh(c).  tanh(c) depends
 * on everything before it, so one vector at a time is a ~100-cycle latency chain; the row loop
 * below runs stage 1 for LSTM_FWD_BLOCK vectors before stage 2 so that the chains overlap. */
static inline void lstm_forward_gates(vf xi, vf xf, vf xo, vf xg, vf c_prev, vf fb, vf *o, vf *c)
{
    const vf i = v_sigmoid(xi), f = v_sigmoid(v_add(xf, fb)), g = v_tanh(xg);
    *o = v_sigmoid(xo);
    *c = v_fmadd(f, c_prev, v_mul(i, g));
}

static inline lstm_fwd_out lstm_forward_vec(vf xi, vf xf, vf xo, vf xg, vf c_prev, vf fb)
{
    lstm_fwd_out r;
    vf o;
    lstm_forward_gates(xi, xf, xo, xg, c_prev, fb, &o, &r.c);
    r.h = v_mul(o, v_tanh(r.c));
    return r;
}

#ifndef LSTM_FWD_BLOCK
#define LSTM_FWD_BLOCK 4
#endif

static void forward_row(const lstm_row *r, float forget_bias, size_t d)
{
    const vf fb = v_set1(forget_bias);
    size_t k = 0;
    for (; k + LSTM_FWD_BLOCK * VL <= d; k += LSTM_FWD_BLOCK * VL) {
        vf o[LSTM_FWD_BLOCK], c[LSTM_FWD_BLOCK];
        for (int u = 0; u < LSTM_FWD_BLOCK; u++) {
            const size_t j = k + (size_t)u * VL;
            lstm_forward_gates(v_load(r->xi + j), v_load(r->xf + j), v_load(r->xo + j),
                               v_load(r->xg + j), v_load(r->c_prev + j), fb, &o[u], &c[u]);
            v_store(r->c + j, c[u]);
        }
        for (int u = 0; u < LSTM_FWD_BLOCK; u++)
            v_store(r->h + k + (size_t)u * VL, v_mul(o[u], v_tanh(c[u])));
    }
    for (; k + VL <= d; k += VL) {
        lstm_fwd_out y = lstm_forward_vec(v_load(r->xi + k), v_load(r->xf + k), v_load(r->xo + k),
                                          v_load(r->xg + k), v_load(r->c_prev + k), fb);
        v_store(r->c + k, y.c);
        v_store(r->h + k, y.h);
    }
    if (k < d) {
        const v_tail t = v_tail_of(d - k);
        lstm_fwd_out y = lstm_forward_vec(v_load_tail(r->xi + k, t), v_load_tail(r->xf + k, t),
                                          v_load_tail(r->xo + k, t), v_load_tail(r->xg + k, t),
                                          v_load_tail(r->c_prev + k, t), fb);
        v_store_tail(r->c + k, y.c, t);
        v_store_tail(r->h + k, y.h, t);
    }
}

typedef struct lstm_bwd_out { vf dc_prev, di, df, do_, dg; } lstm_bwd_out;

/* In caffe2's order of operations (LSTMUnitGradient). */
static inline lstm_bwd_out lstm_backward_vec(vf xi, vf xf, vf xo, vf xg, vf c_prev, vf c, vf dh,
                                             vf dc, vf fb)
{
    const vf one = v_set1(1.0f);
    const vf i = v_sigmoid(xi), f = v_sigmoid(v_add(xf, fb)), o = v_sigmoid(xo), g = v_tanh(xg);
    const vf tc = v_tanh(c);
    const vf dct = v_fmadd(v_mul(dh, o), v_fnmadd(tc, tc, one), dc);
    lstm_bwd_out r;
    r.dc_prev = v_mul(dct, f);
    r.di = v_mul(v_mul(v_mul(dct, g), i), v_sub(one, i));
    r.df = v_mul(v_mul(v_mul(dct, c_prev), f), v_sub(one, f));
    r.do_ = v_mul(v_mul(v_mul(dh, tc), o), v_sub(one, o));
    r.dg = v_mul(v_mul(dct, i), v_fnmadd(g, g, one));
    return r;
}

static void backward_row(const lstm_row *r, float forget_bias, size_t d)
{
    const vf fb = v_set1(forget_bias);
    size_t k = 0;
    for (; k + VL <= d; k += VL) {
        lstm_bwd_out y = lstm_backward_vec(v_load(r->xi + k), v_load(r->xf + k), v_load(r->xo + k),
                                           v_load(r->xg + k), v_load(r->c_prev + k),
                                           v_load(r->c_out + k), v_load(r->dh + k),
                                           v_load(r->dc + k), fb);
        v_store(r->dc_prev + k, y.dc_prev);
        v_store(r->di + k, y.di);
        v_store(r->df + k, y.df);
        v_store(r->do_ + k, y.do_);
        v_store(r->dg + k, y.dg);
    }
    if (k < d) {
        const v_tail t = v_tail_of(d - k);
        lstm_bwd_out y = lstm_backward_vec(v_load_tail(r->xi + k, t), v_load_tail(r->xf + k, t),
                                           v_load_tail(r->xo + k, t), v_load_tail(r->xg + k, t),
                                           v_load_tail(r->c_prev + k, t), v_load_tail(r->c_out + k, t),
                                           v_load_tail(r->dh + k, t), v_load_tail(r->dc + k, t), fb);
        v_store_tail(r->dc_prev + k, y.dc_prev, t);
        v_store_tail(r->di + k, y.di, t);
        v_store_tail(r->df + k, y.df, t);
        v_store_tail(r->do_ + k, y.do_, t);
        v_store_tail(r->dg + k, y.dg, t);
    }
}

/* The elementwise functions alone, exported for the accuracy tests. */
void PK_ISA_FN(pk_lstm_math)(int fn, const float *x, float *y, size_t n)
{
    for (size_t k = 0; k < n; k += VL) {
        const size_t m = n - k < VL ? n - k : VL;
        const v_tail t = v_tail_of(m);
        const vf v = m == VL ? v_load(x + k) : v_load_tail(x + k, t);
        const vf out = fn == PK_MATH_EXP ? v_exp(v) : fn == PK_MATH_SIGMOID ? v_sigmoid(v) : v_tanh(v);
        if (m == VL) v_store(y + k, out);
        else v_store_tail(y + k, out, t);
    }
}

#endif
