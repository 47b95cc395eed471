/* perfkernels: fused embedding-bag backward + sparse optimizer step (training).
 *
 * For bags over a table W with upstream gradient G (num_bags x D float32), row r's gradient is
 *
 *     g[r] = sum over entries j with indices[j] == r (padding skipped), in index order, of
 *            scale_b(j) * w_j * G[b(j)]
 *
 * (scale_b: 1 for sum, 1/count_b for mean; w_j: the per-sample or positional weight).  Every touched
 * row is then updated once ("exact" optimizers, FBGEMM's EXACT_*), in float32:
 *
 *     sgd:              w -= lr * (g + weight_decay * w)
 *     adagrad:          g += weight_decay * w;  h += g * g (element-wise);   w -= lr * g / (sqrt(h) + eps)
 *     rowwise_adagrad:  g += weight_decay * w;  h += mean_d(g * g) (scalar); w -= lr * g / (sqrt(h) + eps)
 *
 * and the Adam family and momentum, "lazy" (touched rows only; t is the table's step count, kept
 * by the caller, which passes the per-step constants below):
 *
 *     adam:          g += weight_decay * w;  m += (1 - b1) (g - m);  v += (1 - b2) (g^2 - v);
 *                    w -= step_size * m / (sqrt(v) + eps)      (torch.optim.SparseAdam)
 *     adamw:         w *= decay; then adam's update without the L2 term   (torch.optim.AdamW order)
 *     rowwise_adam:  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) mean_d(g^2) (scalar);
 *                    w -= lr * (m / bias1 / (sqrt(v / bias2) + eps) + weight_decay * w)
 *                    (FBGEMM PARTIAL_ROWWISE_ADAM)
 *     momentum:      g += weight_decay * w;  b = momentum b + g;  w -= lr * b
 *                    (nesterov: w -= lr * (g + momentum b))       (torch.optim.SGD, dampening 0)
 *
 * and rounded back to the table type (nearest-even, or stochastically for 16-bit tables).
 *
 * Three steps:
 *   1. pk_training_group (portable C, any ISA): reads every entry once, checks its index
 *      (PK_ERR_INDEX with *bad_pos, before anything is written), and groups the entries by row with
 *      a stable LSD radix sort of packed (row << payload_bits | payload) keys, so each row's entries
 *      stay in index order.  The payload says where the entry's gradient comes from: without
 *      weights its bag b (coefficient bag_scale[b]: 1, or 1 / count_b for mean), so a row's walk
 *      reads only the keys, a tiny per-bag array and G; with weights the entry number m (bag and
 *      coefficient in entry_bag[m], entry_coef[m]).  Writes only the caller's workspace.
 *      Given the thread pool, the sort and the group scan run on it over `chunks` contiguous
 *      slices of the keys (per-slice digit histograms, prefix-summed bucket-major, so the sort
 *      stays stable): a stable sort has one possible result, whatever the slicing.
 *   2. an update kernel (one per ISA and table type) updates the rows of groups [g_begin, g_end).
 *      Each row belongs to exactly one group, so disjoint group ranges may run on different threads
 *      and the result does not depend on how the groups are split.
 *
 *   3. pk_training_run: a whole call (steps 1 and 2 on the pool) in a workspace sized by
 *      pk_training_plan_call, what both the NumPy API and the native torch op run.
 *
 * Nothing here allocates: the wrapper sizes and passes the workspace.
 */
#ifndef PERFKERNELS_TRAINING_H
#define PERFKERNELS_TRAINING_H

#include "perfkernels/bags.h"
#include "perfkernels/parallel.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pk_optimizer {
    PK_OPT_SGD = 0,
    PK_OPT_ADAGRAD = 1,          /* state: rows x state_stride float32, D used per row */
    PK_OPT_ROWWISE_ADAGRAD = 2,  /* state: one float32 per row, row r at state[r * state_stride] */
    PK_OPT_ADAM = 3,             /* state: m, rows x state_stride; state2: v, rows x state2_stride */
    PK_OPT_ROWWISE_ADAM = 4,     /* state: m, rows x state_stride; state2: v, one float32 per row */
    PK_OPT_ADAMW = 5,            /* as PK_OPT_ADAM */
    PK_OPT_MOMENTUM = 6          /* sgd with momentum; state: the momentum buffer, rows x state_stride */
} pk_optimizer;

typedef struct pk_sparse_optim {
    int optimizer;               /* pk_optimizer */
    float lr, eps, weight_decay;
    int stochastic_rounding;     /* 16-bit tables: round the new row stochastically */
    uint64_t seed;               /* stochastic rounding: bits are a hash of (seed, row, column) */
    float *state;                /* NULL for sgd */
    int64_t state_stride;        /* floats between the state of row r and row r + 1 */
    /* the Adam family and momentum (unused by the others) */
    float *state2;               /* adam family: the second moment v */
    int64_t state2_stride;       /* floats between v of row r and row r + 1 */
    float beta1, beta2;          /* adam family */
    float bias1, bias2;          /* rowwise_adam: 1 - beta1^t, 1 - beta2^t (t: the step count) */
    float step_size;             /* adam, adamw: lr * sqrt(1 - beta2^t) / (1 - beta1^t) */
    float decay;                 /* adamw: 1 - lr * weight_decay */
    float momentum;              /* momentum */
    int nesterov;                /* momentum: Nesterov's form */
} pk_sparse_optim;

/* The workspace of one call, n = bags->n_indices entries (sizes in elements). */
typedef struct pk_training_work {
    uint64_t *keys;        /* n: sorted packed keys (row << payload_bits | payload) on return */
    uint64_t *keys_tmp;    /* n: the radix sort's other buffer */
    int64_t *entry_bag;    /* n (weighted calls only): bag of entry m (m counts the non-padding
                              entries in index order) */
    float *entry_coef;     /* n (weighted calls only): scale_b * w_j of entry m */
    float *bag_scale;      /* num_bags: 1, or 1 / count_b for mean (unweighted calls) */
    int64_t *group_start;  /* n + 1: group u is keys[group_start[u] : group_start[u + 1]] */
    int64_t *histogram;    /* pk_training_histogram(chunks) entries */
    int per_entry;         /* payload is m (weighted), else b (set by pk_training_group) */
    int payload_bits;      /* bits of the payload in a key (set by pk_training_group) */
    int64_t num_entries;   /* non-padding entries (set by pk_training_group) */
    int64_t num_groups;    /* distinct rows touched (set by pk_training_group) */
} pk_training_work;

/* Radix digits of at most 11 bits (a 16 KiB histogram per pass stays in L1), at most 6 passes. */
#define PK_TRAINING_RADIX_BITS 11
#define PK_TRAINING_HISTOGRAM (6 * (1 << PK_TRAINING_RADIX_BITS))

/* Histogram entries pk_training_group needs when it splits the work into `chunks` slices:
 * every pass's histogram at once (one slice), or one pass's histogram per slice. */
static inline int64_t pk_training_histogram(int64_t chunks)
{
    const int64_t per_slice = chunks * ((int64_t)1 << PK_TRAINING_RADIX_BITS);
    return chunks > 1 && per_slice > PK_TRAINING_HISTOGRAM ? per_slice : PK_TRAINING_HISTOGRAM;
}

/* Bits needed to hold values 0 .. x (0 for x == 0). */
static inline int pk_bit_length(uint64_t x)
{
    int n = 0;
    while (x) { n++; x >>= 1; }
    return n;
}

/* Whether a call's keys fit a 64-bit word: bits(rows - 1) + bits(max(n_indices, num_bags) - 1)
 * <= 64. */
static inline int pk_training_fits(int64_t rows, int64_t n_indices, int64_t num_bags)
{
    const int64_t payloads = n_indices > num_bags ? n_indices : num_bags;
    return pk_bit_length(rows > 0 ? (uint64_t)(rows - 1) : 0)
         + pk_bit_length(payloads > 0 ? (uint64_t)(payloads - 1) : 0) <= 64;
}

/* Step 1.  pool: the thread pool (NULL: all on the calling thread); threads: how many of its
 * threads the call may use; chunks: slices of the keys (1, or at most PK_PARALLEL_BLOCKS_PER_THREAD
 * * threads, each one block of the pool); work->histogram holds pk_training_histogram(chunks). */
pk_status pk_training_group(const pk_bags *bags, int64_t rows, pk_training_work *work,
                            int64_t *bad_pos, const pk_parallel_api *pool, int threads,
                            int chunks);

/* Update the rows of groups [g_begin, g_end).  grad: G, num_bags rows of grad_stride floats.
 * table: rows of row_stride elements.  scratch: dim floats (one per concurrent caller). */
typedef void (*pk_training_update_fn)(const pk_training_work *work, int64_t g_begin, int64_t g_end,
                                      const float *grad, int64_t grad_stride, void *table,
                                      int64_t dim, int64_t row_stride, const pk_sparse_optim *opt,
                                      float *scratch);

/* The kernels of one level: member x is the function pk_x_<level> (the build declares it for
 * every level and fills the table from this struct; perfkernels/_codegen.py). */
typedef struct pk_training_kernels {
    pk_training_update_fn training_update_f32;
    pk_training_update_fn training_update_f16;
    pk_training_update_fn training_update_bf16;
} pk_training_kernels;

/* The kernels of one level, or NULL when this build does not contain that level. */
const pk_training_kernels *pk_training_table(int isa);

/* Step 3, one whole call (call.c): the grouping of step 1 and the updates of step 2, the groups
 * cut into ranges of about equal entry counts, one pool task each. */
typedef struct pk_training_call {
    const pk_bags *bags;           /* the bags, checked as for the forward, except their indices */
    int64_t rows;                  /* rows of the table */
    const float *grad;             /* G: num_bags rows of grad_stride floats */
    int64_t grad_stride;
    void *table;                   /* rows of row_stride elements of the table type */
    int64_t dim;
    int64_t row_stride;
    pk_training_update_fn update;  /* the kernel of the table type, at the level to run */
    const pk_sparse_optim *opt;
} pk_training_call;

typedef struct pk_training_plan {
    int threads;                   /* pool threads the call uses */
    int chunks;                    /* slices of the sort and of the updates */
    int64_t workspace_bytes;       /* what pk_training_run needs, at any alignment */
} pk_training_plan;

/* The plan of `call` when it may use n_threads threads; the keys must fit (pk_training_fits). */
void pk_training_plan_call(const pk_training_call *call, int n_threads, pk_training_plan *plan);

/* Run `call` with `plan` in `workspace` (plan->workspace_bytes bytes; nothing else is allocated).
 * PK_ERR_INDEX with *bad_pos (the flattened position of the first bad index) before anything is
 * written; else every touched row (and its state) updated.  pool: NULL runs all on the caller. */
pk_status pk_training_run(const pk_training_call *call, const pk_training_plan *plan,
                          void *workspace, const pk_parallel_api *pool, int64_t *bad_pos);

/* The Adam family's per-step constants of opt (beta1, beta2, bias1, bias2, step_size, decay),
 * computed in float64 as torch does, then rounded to float32.  step: the table's step count t
 * including this update (>= 1); adamw: decoupled decay (decay = 1 - lr * weight_decay, else 1). */
void pk_sparse_optim_adam(pk_sparse_optim *opt, double lr, double weight_decay, int64_t step,
                          double beta1, double beta2, int adamw);

#ifdef __cplusplus
}
#endif
#endif
