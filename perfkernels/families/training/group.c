/* Grouping the entries of a call by table row (training.h step 1).  Portable C, baseline flags:
 * the work is integer loads, stores and counting, bound by memory rather than arithmetic.
 *
 * Each non-padding entry m (in index order) becomes the key (row << payload_bits) | payload, the
 * payload its bag b (unweighted calls) or m (weighted calls).  A stable LSD radix sort on the row
 * bits only (digits of at most PK_TRAINING_RADIX_BITS bits, all histograms
 * counted in one read) leaves the keys ordered by row and, within a row, by m, i.e. in index order.
 * That order makes each row's gradient sum the same whatever thread later updates the row. */
#include "perfkernels/training.h"

static void radix_sort(pk_training_work *work, int64_t n, int row_bits)
{
    const int shift0 = work->payload_bits;
    const int passes = (row_bits + PK_TRAINING_RADIX_BITS - 1) / PK_TRAINING_RADIX_BITS;
    const int digit = passes ? (row_bits + passes - 1) / passes : 0;
    const uint64_t mask = ((uint64_t)1 << digit) - 1u;
    const int64_t buckets = (int64_t)1 << digit;
    int64_t *hist = work->histogram;
    uint64_t *src = work->keys, *dst = work->keys_tmp;

    for (int64_t i = 0; i < passes * buckets; i++) hist[i] = 0;
    for (int64_t k = 0; k < n; k++) {
        const uint64_t row = src[k] >> shift0;
        for (int p = 0; p < passes; p++) hist[p * buckets + (int64_t)((row >> (p * digit)) & mask)]++;
    }
    for (int p = 0; p < passes; p++) {
        int64_t *h = hist + p * buckets;
        int single = 0;   /* every key has the same digit: the pass would copy in order, skip it */
        for (int64_t b = 0; b < buckets; b++)
            if (h[b] == n) { single = 1; break; }
        if (single) continue;
        int64_t sum = 0;
        for (int64_t b = 0; b < buckets; b++) { const int64_t c = h[b]; h[b] = sum; sum += c; }
        const int shift = shift0 + p * digit;
        for (int64_t k = 0; k < n; k++) {
            const uint64_t key = src[k];
            dst[h[(key >> shift) & mask]++] = key;
        }
        uint64_t *t = src; src = dst; dst = t;
    }
    work->keys = src;       /* the sorted keys, whichever buffer they ended in */
    work->keys_tmp = dst;
}

/* The parallel form: `chunks` contiguous slices of the keys, each a task of the pool.  Per pass, every
 * slice counts its digits, the counts are prefix-summed bucket-major then slice-minor (so a key of
 * slice c lands after every equal digit of slices before c: the sort stays stable), and every slice
 * scatters its keys.  Being a stable sort, its result does not depend on `chunks`. */
typedef struct sort_ctx {
    const uint64_t *src;
    uint64_t *dst;
    int64_t n, buckets;
    int64_t *hist;          /* chunks x buckets: counts, then each slice's next position per digit */
    int chunks, shift, row_shift;
    uint64_t mask;
    int64_t *bounds;        /* group scan: boundaries found per slice, then where each slice's go */
    int64_t *group_start;
} sort_ctx;

static int64_t slice_begin(int64_t n, int chunks, int64_t c)
{
    return n / chunks * c + n % chunks * c / chunks;
}

static void count_task(void *vctx, int64_t c0, int64_t c1)
{
    const sort_ctx *x = (const sort_ctx *)vctx;
    for (int64_t c = c0; c < c1; c++) {
        int64_t *h = x->hist + c * x->buckets;
        for (int64_t b = 0; b < x->buckets; b++) h[b] = 0;
        const int64_t end = slice_begin(x->n, x->chunks, c + 1);
        for (int64_t k = slice_begin(x->n, x->chunks, c); k < end; k++)
            h[(x->src[k] >> x->shift) & x->mask]++;
    }
}

static void scatter_task(void *vctx, int64_t c0, int64_t c1)
{
    const sort_ctx *x = (const sort_ctx *)vctx;
    for (int64_t c = c0; c < c1; c++) {
        int64_t *h = x->hist + c * x->buckets;
        const int64_t end = slice_begin(x->n, x->chunks, c + 1);
        for (int64_t k = slice_begin(x->n, x->chunks, c); k < end; k++) {
            const uint64_t key = x->src[k];
            x->dst[h[(key >> x->shift) & x->mask]++] = key;
        }
    }
}

static void radix_sort_parallel(pk_training_work *work, int64_t n, int row_bits,
                                const pk_parallel_api *pool, int threads, int chunks)
{
    const int passes = (row_bits + PK_TRAINING_RADIX_BITS - 1) / PK_TRAINING_RADIX_BITS;
    const int digit = passes ? (row_bits + passes - 1) / passes : 0;
    sort_ctx x;
    x.n = n;
    x.chunks = chunks;
    x.buckets = (int64_t)1 << digit;
    x.mask = ((uint64_t)1 << digit) - 1u;
    x.hist = work->histogram;
    uint64_t *src = work->keys, *dst = work->keys_tmp;
    for (int p = 0; p < passes; p++) {
        x.src = src;
        x.dst = dst;
        x.shift = work->payload_bits + p * digit;
        pool->parallel_for(chunks, threads, count_task, &x);
        int64_t sum = 0;
        int single = 0;   /* every key has the same digit: the pass would copy in order, skip it */
        for (int64_t b = 0; b < x.buckets && !single; b++) {
            int64_t total = 0;
            for (int c = 0; c < chunks; c++) {
                int64_t *h = x.hist + c * x.buckets + b;
                const int64_t count = *h;
                *h = sum;
                sum += count;
                total += count;
            }
            single = total == n;
        }
        if (single) continue;
        pool->parallel_for(chunks, threads, scatter_task, &x);
        uint64_t *t = src; src = dst; dst = t;
    }
    work->keys = src;
    work->keys_tmp = dst;
}

/* Group boundaries: key k > 0 starts a group when its row differs from key k - 1's. */
static void bounds_count_task(void *vctx, int64_t c0, int64_t c1)
{
    const sort_ctx *x = (const sort_ctx *)vctx;
    for (int64_t c = c0; c < c1; c++) {
        int64_t count = 0;
        const int64_t end = slice_begin(x->n, x->chunks, c + 1);
        for (int64_t k = slice_begin(x->n, x->chunks, c); k < end; k++)
            count += k > 0 && (x->src[k] >> x->row_shift) != (x->src[k - 1] >> x->row_shift);
        x->bounds[c] = count;
    }
}

static void bounds_write_task(void *vctx, int64_t c0, int64_t c1)
{
    const sort_ctx *x = (const sort_ctx *)vctx;
    for (int64_t c = c0; c < c1; c++) {
        int64_t u = x->bounds[c];
        const int64_t end = slice_begin(x->n, x->chunks, c + 1);
        for (int64_t k = slice_begin(x->n, x->chunks, c); k < end; k++)
            if (k > 0 && (x->src[k] >> x->row_shift) != (x->src[k - 1] >> x->row_shift))
                x->group_start[++u] = k;
    }
}

static int64_t find_groups(pk_training_work *work, int64_t m, const pk_parallel_api *pool,
                           int threads, int chunks)
{
    const uint64_t *keys = work->keys;
    const int shift = work->payload_bits;
    if (m == 0) return 0;
    work->group_start[0] = 0;
    int64_t u = 0;
    if (pool == NULL || chunks <= 1) {
        for (int64_t k = 1; k < m; k++)
            if ((keys[k] >> shift) != (keys[k - 1] >> shift)) work->group_start[++u] = k;
    } else {
        sort_ctx x;
        x.src = keys;
        x.n = m;
        x.chunks = chunks;
        x.row_shift = shift;
        x.bounds = work->histogram;   /* free again once the sort is done */
        x.group_start = work->group_start;
        pool->parallel_for(chunks, threads, bounds_count_task, &x);
        for (int c = 0; c < chunks; c++) {
            const int64_t count = x.bounds[c];
            x.bounds[c] = u;
            u += count;
        }
        pool->parallel_for(chunks, threads, bounds_write_task, &x);
    }
    work->group_start[++u] = m;
    return u;
}

/* The key of each entry, as pk_bag_entries visits them (m counts the non-padding entries). */
typedef struct key_ctx {
    pk_training_work *work;
    int payload_bits;
    int64_t bag, m;
} key_ctx;

static inline void key_of_bag(void *ctx, int64_t j, int64_t idx, float w)
{
    key_ctx *k = (key_ctx *)ctx;
    (void)j, (void)w;
    k->work->keys[k->m++] = ((uint64_t)idx << k->payload_bits) | (uint64_t)k->bag;
}

static inline void key_of_entry(void *ctx, int64_t j, int64_t idx, float w)
{
    key_ctx *k = (key_ctx *)ctx;
    (void)j;
    k->work->keys[k->m] = ((uint64_t)idx << k->payload_bits) | (uint64_t)k->m;
    k->work->entry_bag[k->m] = k->bag;
    k->work->entry_coef[k->m++] = w;
}

pk_status pk_training_group(const pk_bags *bags, int64_t rows, pk_training_work *work,
                            int64_t *bad_pos, const pk_parallel_api *pool, int threads,
                            int chunks)
{
    const int64_t n_indices = bags->n_indices;
    const int per_entry = bags->weights != NULL;
    const int64_t payloads = per_entry ? n_indices : bags->num_bags;
    const int payload_bits = pk_bit_length(payloads > 0 ? (uint64_t)(payloads - 1) : 0);
    const int row_bits = pk_bit_length(rows > 0 ? (uint64_t)(rows - 1) : 0);
    if (payload_bits + row_bits > 64) return PK_ERR_VALUE;
    work->payload_bits = payload_bits;
    work->per_entry = per_entry;

    /* every entry read once, every index checked, before anything outside the workspace is written */
    key_ctx k = {work, payload_bits, 0, 0};
    int64_t m = 0;
    for (int64_t b = 0; b < bags->num_bags; b++) {
        const int64_t first = m;
        k.bag = b;
        const int64_t count = per_entry ? pk_bag_entries(bags, b, rows, bad_pos, key_of_entry, &k)
                                        : pk_bag_entries(bags, b, rows, bad_pos, key_of_bag, &k);
        if (count < 0) return PK_ERR_INDEX;
        m = k.m;
        /* mode mean scales the bag by 1 / count, as the forward does */
        const float scale = (bags->mean && m > first) ? 1.0f / (float)(m - first) : 1.0f;
        if (per_entry) {
            if (scale != 1.0f)
                for (int64_t e = first; e < m; e++) work->entry_coef[e] *= scale;
        } else {
            work->bag_scale[b] = scale;
        }
    }
    work->num_entries = m;

    if (pool != NULL && chunks > 1 && m >= chunks)
        radix_sort_parallel(work, m, row_bits, pool, threads, chunks);
    else
        radix_sort(work, m, row_bits);
    work->num_groups = find_groups(work, m, pool, m >= chunks ? threads : 1, m >= chunks ? chunks : 1);
    return PK_OK;
}
