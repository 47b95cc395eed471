/* perfkernels: the LSTM unit, forward and backward (caffe2 LSTMUnit / LSTMUnitGradient).
 *
 * Shapes: h_prev, c_prev, h, c, dh, dc, dh_prev, dc_prev are [n, d]; gates and dgates are [n, 4d];
 * every array is C-contiguous float32 (element alignment is enough; no vector alignment needed).
 * Row r is valid when seq_lengths is absent or t < seq_lengths[r].  One pass over memory per call;
 * rows are independent, so a call is safe to run beside any other call on other outputs.
 */
#ifndef PERFKERNELS_LSTM_H
#define PERFKERNELS_LSTM_H

#include "perfkernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pk_lstm_gate_order {
    PK_LSTM_IFOG = 0, /* caffe2: input, forget, output, cell candidate */
    PK_LSTM_IFGO = 1  /* PyTorch LSTMCell: input, forget, cell candidate, output */
} pk_lstm_gate_order;

typedef struct pk_lstm_params {
    size_t n, d;
    const int32_t *seq_lengths32; /* at most one of the two is non-NULL; both NULL: every row valid */
    const int64_t *seq_lengths64;
    int64_t t;
    float forget_bias;
    int drop_states;              /* invalid rows: 1 -> zeros, 0 -> carry the previous state through */
    int gate_order;               /* pk_lstm_gate_order */
} pk_lstm_params;

typedef void (*pk_lstm_forward_fn)(const pk_lstm_params *p, const float *h_prev,
                                   const float *c_prev, const float *gates, float *h, float *c);
typedef void (*pk_lstm_backward_fn)(const pk_lstm_params *p, const float *c_prev,
                                    const float *gates, const float *c, const float *dh,
                                    const float *dc, float *dh_prev, float *dc_prev, float *dgates);

/* The elementwise functions the kernels use, exposed so tests can measure their error. */
typedef enum pk_lstm_math_fn { PK_MATH_EXP = 0, PK_MATH_SIGMOID = 1, PK_MATH_TANH = 2 } pk_lstm_math_fn;
typedef void (*pk_lstm_math_fn_t)(int fn, const float *x, float *y, size_t n);

/* The kernels of one level: member x is the function pk_x_<level> (the build declares it for
 * every level and fills the table from this struct; perfkernels/_codegen.py). */
typedef struct pk_lstm_kernels {
    pk_lstm_forward_fn lstm_forward;
    pk_lstm_backward_fn lstm_backward;
    pk_lstm_math_fn_t lstm_math;
} pk_lstm_kernels;

/* The kernels of one level, or NULL when this build does not contain that level. */
const pk_lstm_kernels *pk_lstm_table(int isa);

/* Row r of a call is valid: no seq_lengths, or t < seq_lengths[r]. */
static inline int pk_lstm_row_valid(const pk_lstm_params *p, size_t r)
{
    if (p->seq_lengths32) return p->t < (int64_t)p->seq_lengths32[r];
    if (p->seq_lengths64) return p->t < p->seq_lengths64[r];
    return 1;
}

/* Offsets of the four gate blocks inside one row of `gates`, in units of d. */
static inline void pk_lstm_gate_blocks(int gate_order, size_t *oi, size_t *of, size_t *oo, size_t *og)
{
    *oi = 0;
    *of = 1;
    *oo = gate_order == PK_LSTM_IFGO ? 3 : 2;
    *og = gate_order == PK_LSTM_IFGO ? 2 : 3;
}

#ifdef __cplusplus
}
#endif
#endif
