/* The training update loops (training.h step 2), written once over the SIMD primitive layer
 * (the generated per-level files include simd/<isa>.h, then this).
 *
 * A row's gradient is summed column block by column block: up to MAX_VECS vectors (plus a tail
 * vector) held in registers while the row's entries are walked in index order,
 * acc = fma(coef, G[bag], acc).  sgd and adagrad then update that block of the row and its state at
 * once; rowwise_adagrad first needs the whole row's mean of g^2, so it parks g in the scratch row
 * and makes a second, short pass.  adam, adamw and momentum update a block of the row and its
 * state rows at once; rowwise_adam updates m in the first pass and reads it back in the second.  A block's vector count is a compile-time constant at every call
 * (a switch over 1 .. MAX_VECS), so the accumulators stay in registers.  The next rows (weight and
 * state) are prefetched a few groups ahead: they are the random DRAM accesses of the kernel.
 * Stochastic rounding writes the new float32 row to scratch and rounds it element by element.
 */
#ifndef PK_TRAINING_BODY_H
#define PK_TRAINING_BODY_H

#include "training/row.h"

/* accumulators per column block: half the vector registers (D = 64 in one walk on AVX2, 128 on
 * AVX-512), the rest for the coefficient and the loads */
#define MAX_VECS (V_REGS / 2 > 8 ? 8 : V_REGS / 2)

/* Table elements at col as floats, and back (nearest even); tails touch only their lanes. */
#include "common/float_rows.h"   /* the table types are its formats */
#define load_table pk_load_float_row
#define load_table_tail pk_load_float_row_tail
_Static_assert((int)TRAIN_F32 == (int)PK_ROW_F32 && (int)TRAIN_F16 == (int)PK_ROW_F16
               && (int)TRAIN_BF16 == (int)PK_ROW_BF16,
               "the table types are float_rows.h's formats");

PK_INLINE void store_table(char *row, int64_t col, vf x, const int type)
{
    if (type == TRAIN_F32) v_store((float *)row + col, x);
    else vh_store((uint16_t *)row + col, type == TRAIN_F16 ? v_to_f16(x) : v_to_bf16(x));
}

PK_INLINE void store_table_tail(char *row, int64_t col, vf x, v_tail t, const int type)
{
    if (type == TRAIN_F32) v_store_tail((float *)row + col, x, t);
    else vh_store_tail((uint16_t *)row + col, type == TRAIN_F16 ? v_to_f16(x) : v_to_bf16(x), t);
}

/* Groups ahead whose weight / state rows are prefetched. */
#ifndef TRAIN_PREFETCH_GROUPS
#define TRAIN_PREFETCH_GROUPS 8
#endif

typedef struct row_ctx {
    const pk_training_work *work;
    const float *grad;
    int64_t grad_stride;
    char *row;          /* the table row */
    float *h;           /* adagrad: the state row; rowwise_adagrad: the row's scalar state;
                           adam family: m; momentum: the momentum buffer */
    float *v;           /* adam family: v (rowwise_adam: the row's scalar) */
    int64_t k0, k1;     /* the group's keys */
    vf lr, eps, wd;
    vf b1, c1, c2, step, decay, mu;   /* adam family: beta1, 1 - beta1, 1 - beta2, step_size,
                                         decay; momentum: mu */
    int has_wd, nesterov;
    float *g;           /* scratch: g (rowwise_adagrad) */
    float *wout;        /* scratch: the new row before stochastic rounding, or NULL */
} row_ctx;

/* n: 0 for a full vector, else the tail's lane count */
PK_INLINE vf load_part(const float *p, const int n)
{
    return n ? v_load_tail(p, v_tail_of((size_t)n)) : v_load(p);
}

PK_INLINE void store_part(float *p, vf x, const int n)
{
    if (n) v_store_tail(p, x, v_tail_of((size_t)n)); else v_store(p, x);
}

PK_INLINE vf load_w(const row_ctx *c, int64_t col, const int n, const int type)
{
    return n ? load_table_tail(c->row, col, v_tail_of((size_t)n), type)
             : load_table(c->row, col, type);
}

PK_INLINE void store_w(const row_ctx *c, int64_t col, vf x, const int n, const int type)
{
    if (c->wout) store_part(c->wout + col, x, n);
    else if (n) store_table_tail(c->row, col, x, v_tail_of((size_t)n), type);
    else store_table(c->row, col, x, type);
}

/* Columns [col, col + nv * VL + tail) of one row: sum the gradient, then update (sgd, adagrad) or
 * park g and add its squares to ss (rowwise_adagrad).  nv and optim are compile-time constants. */
PK_INLINE vf row_block(const row_ctx *c, int64_t col, const int nv, const int tail,
                           const int type, const int optim, vf ss)
{
    vf acc[MAX_VECS + 1];
    const pk_training_work *work = c->work;
    PK_UNROLL(MAX_VECS + 1)
    for (int v = 0; v <= nv; v++) acc[v] = v_zero();
    for (int64_t k = c->k0; k < c->k1; k++) {
        float coef;
        const float *G = entry_grad(work, work->keys[k], c->grad, c->grad_stride, &coef) + col;
        const vf cf = v_set1(coef);
        PK_UNROLL(MAX_VECS)
        for (int v = 0; v < nv; v++) acc[v] = v_fmadd(cf, v_load(G + v * VL), acc[v]);
        if (tail) acc[nv] = v_fmadd(cf, load_part(G + nv * VL, tail), acc[nv]);
    }
    PK_UNROLL(MAX_VECS + 1)
    for (int v = 0; v <= nv; v++) {
        const int n = v == nv ? tail : 0;
        if (v == nv && !tail) break;
        const int64_t cv = col + v * VL;
        if (optim == PK_OPT_ROWWISE_ADAGRAD) {
            vf gd = acc[v];
            if (c->has_wd) gd = v_fmadd(c->wd, load_w(c, cv, n, type), gd);
            ss = v_fmadd(gd, gd, ss);          /* tail lanes are 0 */
            store_part(c->g + cv, gd, n);
        } else if (optim == PK_OPT_ADAM || optim == PK_OPT_ADAMW) {
            vf w = load_w(c, cv, n, type);
            vf gd = acc[v];
            if (optim == PK_OPT_ADAMW) w = v_mul(c->decay, w);
            else if (c->has_wd) gd = v_fmadd(c->wd, w, gd);
            vf m = load_part(c->h + cv, n);
            m = v_fmadd(c->c1, v_sub(gd, m), m);
            store_part(c->h + cv, m, n);
            vf s2 = load_part(c->v + cv, n);
            s2 = v_fmadd(c->c2, v_sub(v_mul(gd, gd), s2), s2);
            store_part(c->v + cv, s2, n);
            store_w(c, cv, v_fnmadd(c->step, v_div(m, v_add(v_sqrt(s2), c->eps)), w), n, type);
        } else if (optim == PK_OPT_ROWWISE_ADAM) {
            const vf gd = acc[v];
            ss = v_fmadd(gd, gd, ss);          /* tail lanes are 0 */
            const vf m = v_fmadd(c->b1, load_part(c->h + cv, n), v_mul(c->c1, gd));
            store_part(c->h + cv, m, n);
        } else if (optim == PK_OPT_MOMENTUM) {
            const vf w = load_w(c, cv, n, type);
            const vf gd = v_fmadd(c->wd, w, acc[v]);
            const vf b = v_fmadd(c->mu, load_part(c->h + cv, n), gd);
            store_part(c->h + cv, b, n);
            const vf u = c->nesterov ? v_fmadd(c->mu, b, gd) : b;
            store_w(c, cv, v_fnmadd(c->lr, u, w), n, type);
        } else if (optim == PK_OPT_SGD) {
            const vf w = load_w(c, cv, n, type);
            store_w(c, cv, v_fnmadd(c->lr, v_fmadd(c->wd, w, acc[v]), w), n, type);
        } else {
            const vf w = load_w(c, cv, n, type);
            const vf gd = v_fmadd(c->wd, w, acc[v]);
            const vf h = v_fmadd(gd, gd, load_part(c->h + cv, n));
            store_part(c->h + cv, h, n);
            store_w(c, cv, v_sub(w, v_div(v_mul(c->lr, gd), v_add(v_sqrt(h), c->eps))), n, type);
        }
    }
    return ss;
}

/* A block of nv full vectors (nv a run-time value 1 .. MAX_VECS, made a constant by the switch). */
PK_INLINE vf row_block_n(const row_ctx *c, int64_t col, int nv, const int tail, const int type,
                             const int optim, vf ss)
{
    switch (nv) {
#define PK_TRAIN_CASE(k) case k: return row_block(c, col, (k) <= MAX_VECS ? (k) : MAX_VECS, tail, type, optim, ss);
    PK_TRAIN_CASE(1) PK_TRAIN_CASE(2) PK_TRAIN_CASE(3) PK_TRAIN_CASE(4)
    PK_TRAIN_CASE(5) PK_TRAIN_CASE(6) PK_TRAIN_CASE(7)
#undef PK_TRAIN_CASE
    default: return row_block(c, col, MAX_VECS, tail, type, optim, ss);
    }
}

PK_INLINE void prefetch_row(const char *p, size_t nbytes)
{
    for (size_t off = 0; off < nbytes; off += 64) pk_prefetch_t0(p + off);
    pk_prefetch_t0(p + nbytes - 1);
}

PK_INLINE void update_rows(const pk_training_work *work, int64_t g_begin, int64_t g_end,
                               const float *grad, int64_t grad_stride, void *table, int64_t dim,
                               int64_t row_stride, const pk_sparse_optim *opt, float *scratch,
                               const int type, const int optim)
{
    const int64_t full = dim / VL;
    const int tail = (int)(dim % VL);
    const size_t row_bytes = (size_t)dim * (type == TRAIN_F32 ? 4u : 2u);
    row_ctx c;
    c.work = work;
    c.grad = grad;
    c.grad_stride = grad_stride;
    c.lr = v_set1(opt->lr);
    c.eps = v_set1(opt->eps);
    c.wd = v_set1(opt->weight_decay);
    c.has_wd = opt->weight_decay != 0.0f;
    c.b1 = v_set1(opt->beta1);
    c.c1 = v_set1(1.0f - opt->beta1);
    c.c2 = v_set1(1.0f - opt->beta2);
    c.step = v_set1(opt->step_size);
    c.decay = v_set1(opt->decay);
    c.mu = v_set1(opt->momentum);
    c.nesterov = opt->nesterov;
    c.v = NULL;
    c.g = scratch;
    c.wout = (opt->stochastic_rounding && type != TRAIN_F32) ? scratch + dim : NULL;
    for (int64_t u = g_begin; u < g_end; u++) {
        if (u + TRAIN_PREFETCH_GROUPS < g_end) {
            const int64_t pr = group_row(work, u + TRAIN_PREFETCH_GROUPS);
            prefetch_row(table_row(table, pr, row_stride, type), row_bytes);
            if (optim == PK_OPT_ADAGRAD || optim == PK_OPT_MOMENTUM || optim == PK_OPT_ADAM
                    || optim == PK_OPT_ADAMW || optim == PK_OPT_ROWWISE_ADAM)
                prefetch_row((const char *)(opt->state + pr * opt->state_stride), (size_t)dim * 4u);
            else if (optim == PK_OPT_ROWWISE_ADAGRAD)
                pk_prefetch_t0(opt->state + pr * opt->state_stride);
            if (optim == PK_OPT_ADAM || optim == PK_OPT_ADAMW)
                prefetch_row((const char *)(opt->state2 + pr * opt->state2_stride), (size_t)dim * 4u);
            else if (optim == PK_OPT_ROWWISE_ADAM)
                pk_prefetch_t0(opt->state2 + pr * opt->state2_stride);
        }
        const int64_t r = group_row(work, u);
        c.row = table_row(table, r, row_stride, type);
        c.h = optim == PK_OPT_SGD ? NULL : opt->state + r * opt->state_stride;
        if (optim == PK_OPT_ADAM || optim == PK_OPT_ADAMW || optim == PK_OPT_ROWWISE_ADAM)
            c.v = opt->state2 + r * opt->state2_stride;
        c.k0 = work->group_start[u];
        c.k1 = work->group_start[u + 1];
        vf ss = v_zero();
        int64_t col = 0;
        for (int64_t left = full; left > 0;) {
            const int nv = left > MAX_VECS ? MAX_VECS : (int)left;
            left -= nv;
            if (left == 0 && tail) ss = row_block_n(&c, col, nv, tail, type, optim, ss);
            else ss = row_block_n(&c, col, nv, 0, type, optim, ss);
            col += (int64_t)nv * VL;
        }
        if (full == 0) ss = row_block(&c, 0, 0, tail, type, optim, ss);
        if (optim == PK_OPT_ROWWISE_ADAGRAD) {
            *c.h += v_hsum(ss) / (float)dim;
            const vf step = v_set1(opt->lr / (sqrtf(*c.h) + opt->eps));
            for (col = 0; col + VL <= dim; col += VL)
                store_w(&c, col, v_fnmadd(step, v_load(c.g + col), load_w(&c, col, 0, type)), 0, type);
            if (tail)
                store_w(&c, col, v_fnmadd(step, load_part(c.g + col, tail),
                                          load_w(&c, col, tail, type)), tail, type);
        }
        if (optim == PK_OPT_ROWWISE_ADAM) {
            *c.v = opt->beta2 * *c.v + (1.0f - opt->beta2) * (v_hsum(ss) / (float)dim);
            const vf a = v_set1(opt->lr / (opt->bias1 * (sqrtf(*c.v / opt->bias2) + opt->eps)));
            const vf lwd = v_set1(opt->lr * opt->weight_decay);
            for (col = 0; col + VL <= dim; col += VL) {
                const vf w = load_w(&c, col, 0, type);
                store_w(&c, col, v_fnmadd(lwd, w, v_fnmadd(a, v_load(c.h + col), w)), 0, type);
            }
            if (tail) {
                const vf w = load_w(&c, col, tail, type);
                store_w(&c, col, v_fnmadd(lwd, w, v_fnmadd(a, load_part(c.h + col, tail), w)),
                        tail, type);
            }
        }
        if (c.wout)
            for (int64_t d = 0; d < dim; d++) store_element(c.row, d, c.wout[d], type, opt, r);
    }
}

#define PK_TRAINING_VECTOR(name, type)                                                            \
    void name(const pk_training_work *work, int64_t g_begin, int64_t g_end, const float *grad,   \
              int64_t grad_stride, void *table, int64_t dim, int64_t row_stride,                  \
              const pk_sparse_optim *opt, float *scratch)                                         \
    {                                                                                             \
        if (opt->optimizer == PK_OPT_SGD)                                                         \
            update_rows(work, g_begin, g_end, grad, grad_stride, table, dim, row_stride, opt,    \
                        scratch, type, PK_OPT_SGD);                                               \
        else if (opt->optimizer == PK_OPT_ADAGRAD)                                                \
            update_rows(work, g_begin, g_end, grad, grad_stride, table, dim, row_stride, opt,    \
                        scratch, type, PK_OPT_ADAGRAD);                                           \
        else if (opt->optimizer == PK_OPT_ROWWISE_ADAGRAD)                                        \
            update_rows(work, g_begin, g_end, grad, grad_stride, table, dim, row_stride, opt,    \
                        scratch, type, PK_OPT_ROWWISE_ADAGRAD);                                   \
        else if (opt->optimizer == PK_OPT_ADAM)                                                   \
            update_rows(work, g_begin, g_end, grad, grad_stride, table, dim, row_stride, opt,    \
                        scratch, type, PK_OPT_ADAM);                                              \
        else if (opt->optimizer == PK_OPT_ADAMW)                                                  \
            update_rows(work, g_begin, g_end, grad, grad_stride, table, dim, row_stride, opt,    \
                        scratch, type, PK_OPT_ADAMW);                                             \
        else if (opt->optimizer == PK_OPT_ROWWISE_ADAM)                                           \
            update_rows(work, g_begin, g_end, grad, grad_stride, table, dim, row_stride, opt,    \
                        scratch, type, PK_OPT_ROWWISE_ADAM);                                      \
        else                                                                                      \
            update_rows(work, g_begin, g_end, grad, grad_stride, table, dim, row_stride, opt,    \
                        scratch, type, PK_OPT_MOMENTUM);                                          \
    }

PK_TRAINING_VECTOR(PK_ISA_FN(pk_training_update_f32), TRAIN_F32)
PK_TRAINING_VECTOR(PK_ISA_FN(pk_training_update_f16), TRAIN_F16)
PK_TRAINING_VECTOR(PK_ISA_FN(pk_training_update_bf16), TRAIN_BF16)

#endif
