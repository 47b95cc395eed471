/* Training updates (training.h step 2), portable C (any architecture): the reference reading of
 * the formulas, one element at a time.  g accumulates in the caller's scratch row. */
#include "training/levels.h"
#include "training/row.h"

static inline void update_scalar(const pk_training_work *work, int64_t g_begin, int64_t g_end,
                                 const float *grad, int64_t grad_stride, void *table, int64_t dim,
                                 int64_t row_stride, const pk_sparse_optim *opt, float *g,
                                 const int type)
{
    const float lr = opt->lr, eps = opt->eps, wd = opt->weight_decay;
    for (int64_t u = g_begin; u < g_end; u++) {
        const int64_t r = group_row(work, u);
        char *row = table_row(table, r, row_stride, type);
        for (int64_t d = 0; d < dim; d++) g[d] = 0.0f;
        for (int64_t k = work->group_start[u]; k < work->group_start[u + 1]; k++) {
            float c;
            const float *G = entry_grad(work, work->keys[k], grad, grad_stride, &c);
            for (int64_t d = 0; d < dim; d++) g[d] += c * G[d];
        }
        if (opt->optimizer == PK_OPT_SGD) {
            for (int64_t d = 0; d < dim; d++) {
                const float w = load_element(row, d, type);
                store_element(row, d, w - lr * (g[d] + wd * w), type, opt, r);
            }
        } else if (opt->optimizer == PK_OPT_ADAGRAD) {
            float *h = opt->state + r * opt->state_stride;
            for (int64_t d = 0; d < dim; d++) {
                const float w = load_element(row, d, type);
                const float gd = g[d] + wd * w;
                h[d] += gd * gd;
                store_element(row, d, w - lr * gd / (sqrtf(h[d]) + eps), type, opt, r);
            }
        } else if (opt->optimizer == PK_OPT_ADAM || opt->optimizer == PK_OPT_ADAMW) {
            float *m = opt->state + r * opt->state_stride;
            float *v = opt->state2 + r * opt->state2_stride;
            const int adamw = opt->optimizer == PK_OPT_ADAMW;
            const float c1 = 1.0f - opt->beta1, c2 = 1.0f - opt->beta2;
            for (int64_t d = 0; d < dim; d++) {
                float w = load_element(row, d, type);
                float gd = g[d];
                if (adamw) w *= opt->decay;
                else gd += wd * w;
                m[d] += c1 * (gd - m[d]);
                v[d] += c2 * (gd * gd - v[d]);
                store_element(row, d, w - opt->step_size * (m[d] / (sqrtf(v[d]) + eps)), type, opt, r);
            }
        } else if (opt->optimizer == PK_OPT_ROWWISE_ADAM) {
            float *m = opt->state + r * opt->state_stride;
            float *v = opt->state2 + r * opt->state2_stride;
            const float c1 = 1.0f - opt->beta1;
            float sum = 0.0f;
            for (int64_t d = 0; d < dim; d++) {
                sum += g[d] * g[d];
                m[d] = opt->beta1 * m[d] + c1 * g[d];
            }
            *v = opt->beta2 * *v + (1.0f - opt->beta2) * (sum / (float)dim);
            const float a = lr / (opt->bias1 * (sqrtf(*v / opt->bias2) + eps));
            const float lwd = lr * wd;
            for (int64_t d = 0; d < dim; d++) {
                const float w = load_element(row, d, type);
                store_element(row, d, w - a * m[d] - lwd * w, type, opt, r);
            }
        } else if (opt->optimizer == PK_OPT_MOMENTUM) {
            float *b = opt->state + r * opt->state_stride;
            const float mu = opt->momentum;
            for (int64_t d = 0; d < dim; d++) {
                const float w = load_element(row, d, type);
                const float gd = g[d] + wd * w;
                b[d] = mu * b[d] + gd;
                store_element(row, d, w - lr * (opt->nesterov ? gd + mu * b[d] : b[d]), type, opt, r);
            }
        } else {
            float sum = 0.0f;
            for (int64_t d = 0; d < dim; d++) {
                if (wd != 0.0f) g[d] += wd * load_element(row, d, type);
                sum += g[d] * g[d];
            }
            float *h = opt->state + r * opt->state_stride;
            *h += sum / (float)dim;
            const float step = lr / (sqrtf(*h) + eps);
            for (int64_t d = 0; d < dim; d++)
                store_element(row, d, load_element(row, d, type) - step * g[d], type, opt, r);
        }
    }
}

#define PK_TRAINING_SCALAR(suffix, type)                                                          \
    void pk_training_update_##suffix##_scalar(const pk_training_work *work, int64_t g_begin,     \
                                              int64_t g_end, const float *grad,                   \
                                              int64_t grad_stride, void *table, int64_t dim,      \
                                              int64_t row_stride, const pk_sparse_optim *opt,     \
                                              float *scratch)                                     \
    {                                                                                             \
        update_scalar(work, g_begin, g_end, grad, grad_stride, table, dim, row_stride, opt,      \
                      scratch, type);                                                             \
    }

PK_TRAINING_SCALAR(f32, TRAIN_F32)
PK_TRAINING_SCALAR(f16, TRAIN_F16)
PK_TRAINING_SCALAR(bf16, TRAIN_BF16)
