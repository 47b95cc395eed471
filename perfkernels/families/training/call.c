/* One call of the fused backward + optimizer step (training.h step 3): the workspace plan, the
 * grouping and the row updates split across the pool.  Portable C, baseline flags: it only
 * schedules; the arithmetic is in the update kernels of each level.  The NumPy API
 * (_training.pyx) and the native torch op (perfkernels/torch/native/ops.cpp) both run a call
 * through here, so the two cannot drift apart. */
#include <math.h>

#include "perfkernels/training.h"

enum { KEYS, KEYS_TMP, GROUP_START, HISTOGRAM, ENTRY_BAG, COEF, SCRATCH, TASK_GROUP, PARTS };

static int64_t round64(int64_t bytes) { return (bytes + 63) / 64 * 64; }

/* The byte size of each part of the workspace. */
static void part_sizes(const pk_training_call *call, int chunks, int64_t sizes[PARTS])
{
    const int64_t n = call->bags->n_indices, dim = call->dim;
    const int weighted = call->bags->weights != NULL;
    sizes[KEYS] = 8 * n;
    sizes[KEYS_TMP] = 8 * n;
    sizes[GROUP_START] = 8 * (n + 1);
    sizes[HISTOGRAM] = 8 * pk_training_histogram(chunks);
    sizes[ENTRY_BAG] = weighted ? 8 * n : 0;
    sizes[COEF] = weighted ? 4 * n : 4 * call->bags->num_bags;   /* entry_coef or bag_scale */
    sizes[SCRATCH] = 4 * (2 * dim + 16) * chunks;                 /* a scratch row per task */
    sizes[TASK_GROUP] = 8 * ((int64_t)chunks + 1);                /* each task's first group */
}

void pk_training_plan_call(const pk_training_call *call, int n_threads, pk_training_plan *plan)
{
    /* threads: worth it only when each gets enough memory traffic (keys sorted, G rows read,
     * table and state rows read and written); chunks: slices of the sort and the update, one
     * block of the pool each */
    const int k = pk_parallel_threads_for(call->bags->n_indices * (32 + 8 * call->dim), n_threads);
    int64_t sizes[PARTS], total = 64;   /* 64: room to align the start */
    plan->threads = k;
    plan->chunks = k > 1 ? k * PK_PARALLEL_BLOCKS_PER_THREAD : 1;
    part_sizes(call, plan->chunks, sizes);
    for (int i = 0; i < PARTS; i++) total += round64(sizes[i]);
    plan->workspace_bytes = total;
}

/* Cut the groups into at most `tasks` ranges of about equal entry counts (a Zipf-hot row is one
 * group however many entries it has); returns the number of non-empty ranges.  Each row is
 * updated by one task, so the split changes the speed, never the result. */
static int64_t split_groups(const pk_training_work *work, int64_t tasks, int64_t *task_group)
{
    const int64_t m = work->num_entries, groups = work->num_groups;
    int64_t u = 0, count = 0;
    if (tasks > groups) tasks = groups;
    task_group[0] = 0;
    for (int64_t t = 1; t < tasks; t++) {
        const int64_t target = m / tasks * t + m % tasks * t / tasks;
        int64_t lo = u, hi = groups;
        while (lo < hi) {   /* the first group starting at or after target */
            const int64_t mid = lo + (hi - lo) / 2;
            if (work->group_start[mid] < target)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo > task_group[count]) {
            task_group[++count] = lo;
            u = lo;
        }
    }
    if (groups > task_group[count]) count++;
    task_group[count] = groups;
    return count;
}

typedef struct update_ctx {
    const pk_training_call *call;
    const pk_training_work *work;
    const int64_t *task_group;   /* task t updates groups [task_group[t], task_group[t + 1]) */
    float *scratch;              /* a scratch row per task (a task runs on one thread) */
    int64_t scratch_stride;
} update_ctx;

static void update_tasks(void *vctx, int64_t t0, int64_t t1)
{
    const update_ctx *c = (const update_ctx *)vctx;
    const pk_training_call *a = c->call;
    for (int64_t t = t0; t < t1; t++)
        a->update(c->work, c->task_group[t], c->task_group[t + 1], a->grad, a->grad_stride,
                  a->table, a->dim, a->row_stride, a->opt, c->scratch + t * c->scratch_stride);
}

pk_status pk_training_run(const pk_training_call *call, const pk_training_plan *plan,
                          void *workspace, const pk_parallel_api *pool, int64_t *bad_pos)
{
    int64_t sizes[PARTS];
    char *parts[PARTS];
    char *base = (char *)workspace;
    base += (64 - (uintptr_t)base % 64) % 64;
    part_sizes(call, plan->chunks, sizes);
    for (int i = 0; i < PARTS; i++) {
        parts[i] = base;
        base += round64(sizes[i]);
    }
    pk_training_work work;
    work.keys = (uint64_t *)parts[KEYS];
    work.keys_tmp = (uint64_t *)parts[KEYS_TMP];
    work.group_start = (int64_t *)parts[GROUP_START];
    work.histogram = (int64_t *)parts[HISTOGRAM];
    work.entry_bag = (int64_t *)parts[ENTRY_BAG];
    work.entry_coef = (float *)parts[COEF];
    work.bag_scale = (float *)parts[COEF];
    const pk_status status = pk_training_group(call->bags, call->rows, &work, bad_pos, pool,
                                               plan->threads, plan->chunks);
    if (status != PK_OK || call->dim == 0 || work.num_groups == 0) return status;
    update_ctx uc = {call, &work, (int64_t *)parts[TASK_GROUP], (float *)parts[SCRATCH],
                     2 * call->dim + 16};
    const int64_t tasks = split_groups(&work, plan->chunks, (int64_t *)parts[TASK_GROUP]);
    if (tasks > 1 && pool != NULL)
        pool->parallel_for(tasks, plan->threads, update_tasks, &uc);
    else
        update_tasks(&uc, 0, tasks);
    return PK_OK;
}

void pk_sparse_optim_adam(pk_sparse_optim *opt, double lr, double weight_decay, int64_t step,
                          double beta1, double beta2, int adamw)
{
    /* in float64, as torch computes them, then float32 */
    const double t = step < ((int64_t)1 << 53) ? (double)step : 9007199254740992.0;
    const double bias1 = 1.0 - pow(beta1, t), bias2 = 1.0 - pow(beta2, t);
    opt->beta1 = (float)beta1;
    opt->beta2 = (float)beta2;
    opt->bias1 = (float)bias1;
    opt->bias2 = (float)bias2;
    opt->step_size = (float)(lr * sqrt(bias2) / bias1);
    opt->decay = adamw ? (float)(1.0 - lr * weight_decay) : 1.0f;
}
