/* Row-level control of the LSTM body: which rows are valid, what invalid rows get, and where the
 * gate blocks of a row are.  lstm/body.h defines the two vector loops
 *     static void forward_row(const lstm_row *r, float forget_bias, size_t d);
 *     static void backward_row(const lstm_row *r, float forget_bias, size_t d);
 * and this header the exported pk_lstm_forward_<isa> / pk_lstm_backward_<isa> around them.
 * Everything else here is static: nothing leaks across ISA files. */
#ifndef PK_LSTM_ROWS_H
#define PK_LSTM_ROWS_H

#include <string.h>
#include "perfkernels/lstm.h"

/* One row's pointers: inputs first, outputs after. */
typedef struct lstm_row {
    const float *xi, *xf, *xo, *xg; /* pre-activation gates */
    const float *h_prev, *c_prev;   /* forward */
    float *h, *c;
    const float *c_out, *dh, *dc;   /* backward */
    float *dh_prev, *dc_prev, *di, *df, *do_, *dg;
} lstm_row;

static void forward_row(const lstm_row *r, float forget_bias, size_t d);
static void backward_row(const lstm_row *r, float forget_bias, size_t d);

static inline void lstm_row_gates(const pk_lstm_params *p, const float *base, const float **xi,
                                  const float **xf, const float **xo, const float **xg)
{
    size_t oi, of, oo, og;
    pk_lstm_gate_blocks(p->gate_order, &oi, &of, &oo, &og);
    *xi = base + oi * p->d;
    *xf = base + of * p->d;
    *xo = base + oo * p->d;
    *xg = base + og * p->d;
}

/* Invalid row: zeros with drop_states, else the input copied through. */
static inline void lstm_pass_through(float *dst, const float *src, size_t d, int drop)
{
    if (drop) memset(dst, 0, d * sizeof(float));
    else memcpy(dst, src, d * sizeof(float));
}

void PK_ISA_FN(pk_lstm_forward)(const pk_lstm_params *p, const float *h_prev,
                                const float *c_prev, const float *gates, float *h, float *c)
{
    const size_t d = p->d;
    for (size_t n = 0; n < p->n; n++) {
        const size_t off = n * d;
        if (!pk_lstm_row_valid(p, n)) {
            lstm_pass_through(h + off, h_prev + off, d, p->drop_states);
            lstm_pass_through(c + off, c_prev + off, d, p->drop_states);
            continue;
        }
        lstm_row r = {0};
        lstm_row_gates(p, gates + 4 * off, &r.xi, &r.xf, &r.xo, &r.xg);
        r.c_prev = c_prev + off;
        r.h = h + off;
        r.c = c + off;
        forward_row(&r, p->forget_bias, d);
    }
}

void PK_ISA_FN(pk_lstm_backward)(const pk_lstm_params *p, const float *c_prev,
                                 const float *gates, const float *c, const float *dh,
                                 const float *dc, float *dh_prev, float *dc_prev,
                                 float *dgates)
{
    const size_t d = p->d;
    for (size_t n = 0; n < p->n; n++) {
        const size_t off = n * d;
        if (!pk_lstm_row_valid(p, n)) {
            memset(dgates + 4 * off, 0, 4 * d * sizeof(float));
            lstm_pass_through(dh_prev + off, dh + off, d, p->drop_states);
            lstm_pass_through(dc_prev + off, dc + off, d, p->drop_states);
            continue;
        }
        lstm_row r = {0};
        lstm_row_gates(p, gates + 4 * off, &r.xi, &r.xf, &r.xo, &r.xg);
        const float *dxi, *dxf, *dxo, *dxg;
        lstm_row_gates(p, dgates + 4 * off, &dxi, &dxf, &dxo, &dxg);
        r.di = (float *)dxi;
        r.df = (float *)dxf;
        r.do_ = (float *)dxo;
        r.dg = (float *)dxg;
        r.c_prev = c_prev + off;
        r.c_out = c + off;
        r.dh = dh + off;
        r.dc = dc + off;
        r.dh_prev = dh_prev + off;
        r.dc_prev = dc_prev + off;
        memset(r.dh_prev, 0, d * sizeof(float)); /* caffe2: h_prev's gradient flows through the FC */
        backward_row(&r, p->forget_bias, d);
    }
}

#endif
