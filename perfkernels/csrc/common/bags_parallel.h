/* Running bag kernels on several threads: the split lives here, outside the ISA kernels.
 *
 * A call is a list of parts (one table each: embedding_bag has one, embedding_bags_multi one per
 * feature).  Each part names its kernel through a pk_bags_call adapter and its bags through a
 * pk_bags.  The (part, bag) sequence is cut into k contiguous chunks of about equal cost (bytes
 * touched: indices * (row + index bytes) + bags * output bytes), k = PK_PARALLEL_BLOCKS_PER_THREAD
 * chunks per thread of pk_parallel_threads_for(cost, n_threads); each chunk runs on one thread
 * (claimed from the pool), calling the part's kernel on a copy of its pk_bags with
 * offsets + b0, num_bags = b1 - b0 and out + b0 * out_stride.  Every bag is therefore summed by one
 * thread with the same kernel and in the same order as a single-threaded call: the bits do not
 * depend on the thread count.  n_indices is left whole, so a kernel's per-call choices (prefetch
 * mode) and its bad positions (flattened, into the caller's index array) are unchanged.
 *
 * Errors: each chunk stops at its first bad index; chunks are in (part, bag) order, so the first
 * chunk that failed holds the first bad position of the call, which is what is reported.  With a
 * `snapshot` buffer (the kernels write a caller's out= directly, which must not be half-written on
 * an error) every chunk first copies its indices into the snapshot and checks the copy
 * (pk_bags_copy_first_bad_in), and the kernels run, on the copy, only when no chunk found a bad
 * one: the copy and check are split across the same threads as the work.  Reading the caller's
 * indices once is what makes this safe when another thread writes them during the call: a check
 * followed by a second read of the caller's array could pass and then see a bad index.
 *
 * Header-only (static functions, baseline flags): included by the Cython modules of both bag
 * families and of the multi-table lookup.  It knows no table format: the one adapter of the bag
 * kernels of every format (its pk_bags_call and argument struct) is common/bags_call.h.
 */
#ifndef PERFKERNELS_BAGS_PARALLEL_H
#define PERFKERNELS_BAGS_PARALLEL_H

#include <stdlib.h>

#include "perfkernels/bags.h"
#include "perfkernels/parallel.h"

/* Runs one family's kernel, with its own arguments `args`, on `bags`. */
typedef pk_status (*pk_bags_call)(const void *args, const pk_bags *bags, int64_t *bad_pos);

typedef struct pk_bags_part {
    pk_bags bags;
    pk_bags_call call;
    const void *args;
    int64_t index_cost;  /* bytes touched per index: the row read + the index itself */
    int64_t bag_cost;    /* bytes touched per bag: the output row + its offset */
    int64_t rows;        /* rows of the part's table (for the snapshot check) */
} pk_bags_part;

static inline int64_t pk_bags_part_cost(const pk_bags_part *p, int64_t b)
{
    return (p->bags.offsets[b] - p->bags.offsets[0]) * p->index_cost + b * p->bag_cost;
}

typedef struct pk_bags_run_ctx {
    const pk_bags_part *parts;
    int n_parts;
    const int *start_part;      /* chunk c starts at bag start_bag[c] of part start_part[c] ... */
    const int64_t *start_bag;   /* ... and ends where chunk c + 1 starts (k + 1 entries) */
    pk_status *status;          /* per chunk */
    int64_t *bad_pos;
    int *bad_part;
    void *snapshot;             /* NULL, or the private copy of the indices the kernels read */
    int scan;                   /* 1: only copy and check the chunk's indices, 0: run kernels */
} pk_bags_run_ctx;

/* Copy the indices of bags [b0, b1) of a part into `snapshot` and check the copy: PK_ERR_INDEX
 * with the first bad position, or PK_OK. */
static pk_status pk_bags_scan(const pk_bags_part *part, int64_t b0, int64_t b1, void *snapshot,
                              int64_t *bad_pos)
{
    const int64_t bad = pk_bags_copy_first_bad_in(&part->bags, b0, b1, part->rows, snapshot);
    if (bad < 0) return PK_OK;
    *bad_pos = bad;
    return PK_ERR_INDEX;
}

static void pk_bags_run_chunks(void *vctx, int64_t c0, int64_t c1)
{
    const pk_bags_run_ctx *ctx = (const pk_bags_run_ctx *)vctx;
    for (int64_t c = c0; c < c1; c++) {
        ctx->status[c] = PK_OK;
        const int p_end = ctx->start_part[c + 1];
        for (int p = ctx->start_part[c]; p <= p_end && p < ctx->n_parts; p++) {
            const pk_bags_part *part = &ctx->parts[p];
            const int64_t b0 = p == ctx->start_part[c] ? ctx->start_bag[c] : 0;
            const int64_t b1 = p == p_end ? ctx->start_bag[c + 1] : part->bags.num_bags;
            if (b0 >= b1) continue;
            pk_status s;
            if (ctx->scan) {
                s = pk_bags_scan(part, b0, b1, ctx->snapshot, &ctx->bad_pos[c]);
            } else {
                pk_bags slice = part->bags;
                if (ctx->snapshot) slice.indices = ctx->snapshot;
                slice.offsets += b0;
                slice.num_bags = b1 - b0;
                slice.out += b0 * slice.out_stride;
                s = part->call(part->args, &slice, &ctx->bad_pos[c]);
            }
            if (s != PK_OK) {
                ctx->status[c] = s;
                ctx->bad_part[c] = p;
                break;
            }
        }
    }
}

/* The first failed chunk's status, position and part (chunks are in index order), or PK_OK. */
static pk_status pk_bags_first_error(const pk_bags_run_ctx *ctx, int k, int64_t *bad_pos,
                                     int *bad_part)
{
    for (int c = 0; c < k; c++)
        if (ctx->status[c] != PK_OK) {
            *bad_pos = ctx->bad_pos[c];
            *bad_part = ctx->bad_part[c];
            return ctx->status[c];
        }
    return PK_OK;
}

/* Run every part's bags on up to n_threads threads of `pool` (see the top of this file).  On an
 * error returns its status with the first bad position in *bad_pos and its part in *bad_part.
 * `snapshot`: NULL, or room for a copy of the index list every part's bags.indices points to (the
 * parts share one index array): the kernels then run on that copy, checked before any starts. */
static pk_status pk_bags_run(const pk_parallel_api *pool, int n_threads, const pk_bags_part *parts,
                             int n_parts, void *snapshot, int64_t *bad_pos, int *bad_part)
{
    int64_t total = 0, bags = 0;
    for (int p = 0; p < n_parts; p++) {
        total += pk_bags_part_cost(&parts[p], parts[p].bags.num_bags);
        bags += parts[p].bags.num_bags;
    }
    const int threads = pk_parallel_threads_for(total, n_threads);
    int k = threads > 1 ? threads * PK_PARALLEL_BLOCKS_PER_THREAD : 1;   /* chunks */
    if ((int64_t)k > bags) k = (int)bags;

    enum { STACK_CHUNKS = 64 };
    int start_part_s[STACK_CHUNKS + 1], bad_part_s[STACK_CHUNKS];
    int64_t start_bag_s[STACK_CHUNKS + 1], bad_pos_s[STACK_CHUNKS];
    pk_status status_s[STACK_CHUNKS];
    void *heap = NULL;
    int *start_part = start_part_s, *bad_parts = bad_part_s;
    int64_t *start_bag = start_bag_s, *bad_poss = bad_pos_s;
    pk_status *status = status_s;
    if (k > STACK_CHUNKS) {
        const size_t kk = (size_t)k;
        heap = malloc((kk + 1) * sizeof(int64_t) + kk * sizeof(int64_t) + kk * sizeof(pk_status)
                      + (kk + 1) * sizeof(int) + kk * sizeof(int));
        if (heap) {
            start_bag = (int64_t *)heap;
            bad_poss = start_bag + kk + 1;
            status = (pk_status *)(bad_poss + kk);
            start_part = (int *)(status + kk);
            bad_parts = start_part + kk + 1;
        } else {
            k = STACK_CHUNKS;
        }
    }

    if (k <= 1) {
        free(heap);
        for (int p = 0; snapshot && p < n_parts; p++)
            if (pk_bags_scan(&parts[p], 0, parts[p].bags.num_bags, snapshot, bad_pos) != PK_OK) {
                *bad_part = p;
                return PK_ERR_INDEX;
            }
        for (int p = 0; p < n_parts; p++) {
            pk_bags bags = parts[p].bags;
            if (snapshot) bags.indices = snapshot;
            const pk_status s = parts[p].call(parts[p].args, &bags, bad_pos);
            if (s != PK_OK) { *bad_part = p; return s; }
        }
        return PK_OK;
    }

    /* chunk c starts where the cumulative cost first reaches c/k of the total */
    int p = 0;
    int64_t before = 0;  /* cost of the parts before p */
    start_part[0] = 0;
    start_bag[0] = 0;
    for (int c = 1; c < k; c++) {
        const int64_t target = (int64_t)((double)total * c / k);
        while (p < n_parts - 1 && before + pk_bags_part_cost(&parts[p], parts[p].bags.num_bags) < target) {
            before += pk_bags_part_cost(&parts[p], parts[p].bags.num_bags);
            p++;
        }
        int64_t lo = 0, hi = parts[p].bags.num_bags;  /* first b with cost(b) >= target - before */
        while (lo < hi) {
            const int64_t mid = lo + (hi - lo) / 2;
            if (before + pk_bags_part_cost(&parts[p], mid) < target) lo = mid + 1;
            else hi = mid;
        }
        start_part[c] = p;
        start_bag[c] = lo;
    }
    start_part[k] = n_parts - 1;
    start_bag[k] = parts[n_parts - 1].bags.num_bags;

    pk_bags_run_ctx ctx = {parts, n_parts, start_part, start_bag, status, bad_poss, bad_parts,
                           snapshot, 0};
    pk_status result = PK_OK;
    if (snapshot) {
        ctx.scan = 1;
        pool->parallel_for(k, threads, pk_bags_run_chunks, &ctx);
        result = pk_bags_first_error(&ctx, k, bad_pos, bad_part);
        ctx.scan = 0;
    }
    if (result == PK_OK) {
        pool->parallel_for(k, threads, pk_bags_run_chunks, &ctx);
        result = pk_bags_first_error(&ctx, k, bad_pos, bad_part);
    }
    free(heap);
    return result;
}

#endif
