/* Embedding lookups fused with DLRM's dot interaction: per sample, the pooled rows of every
 * feature go into a small per-chunk scratch (never the whole [B, F, D]), then the pairwise dot
 * products go straight into the output row.
 *
 *     z = [dense[b], pooled_0[b], ..., pooled_{F-1}[b]]            (F + 1 rows of dim floats)
 *     out[b, 0:dim] = dense[b];  out[b, dim + p] = dot(z[li[p]], z[lj[p]])   (p < n_pairs)
 *
 * Plain C over plain pointers (baseline flags): the lookups are the embedding / quantized
 * families' kernels through their pk_bags_call adapters (one part per feature, bags.num_bags = B,
 * its own indices and offsets), the dot products the interaction family's kernel.  Each sample is
 * computed by one thread with the same kernels in the same order, so the bits do not depend on the
 * thread count.  The caller has checked every index (pk_bags_first_bad_in, feature by feature) and
 * every pair; a kernel that still fails (an index changed meanwhile) stops its chunk and its status
 * is returned.
 */
#ifndef PK_MULTI_FUSED_H
#define PK_MULTI_FUSED_H

#include <stdlib.h>
#include <string.h>

#include "common/bags_parallel.h"
#include "perfkernels/interaction.h"

typedef struct pk_dot_interaction_job {
    const pk_bags_part *parts;   /* one per feature; bags.out / out_stride unused */
    int n_parts;
    const float *dense;          /* B rows of dim floats, dense_stride apart */
    int64_t dense_stride;
    int64_t dim;
    const int32_t *li, *lj;
    int64_t n_pairs;
    pk_interaction_dot_fn dot;
    float *out;                  /* B rows, out_stride apart: dim dense values, then the pairs */
    int64_t out_stride;
    float *pooled;               /* NULL, or B rows pooled_stride apart: each sample's n_parts
                                  * pooled rows as they entered the pairs (for a backward) */
    int64_t pooled_stride;
    int64_t n_samples, n_chunks;
    pk_status *status;           /* per chunk */
    int64_t *bad_pos;
    int *bad_part;
} pk_dot_interaction_job;

/* Samples [b0, b1) with the scratch z ((n_parts + 1) * dim floats). */
static pk_status pk_dot_interaction_samples(const pk_dot_interaction_job *job, int64_t b0,
                                            int64_t b1, float *z, int64_t *bad_pos, int *bad_part)
{
    const int64_t dim = job->dim;
    for (int64_t b = b0; b < b1; b++) {
        memcpy(z, job->dense + b * job->dense_stride, (size_t)dim * sizeof(float));
        for (int f = 0; f < job->n_parts; f++) {
            const pk_bags_part *part = &job->parts[f];
            pk_bags one = part->bags;
            one.offsets += b;
            one.num_bags = 1;
            one.out = z + (int64_t)(f + 1) * dim;
            one.out_stride = dim;
            const pk_status s = part->call(part->args, &one, bad_pos);
            if (s != PK_OK) { *bad_part = f; return s; }
        }
        float *row = job->out + b * job->out_stride;
        memcpy(row, z, (size_t)dim * sizeof(float));
        if (job->pooled != NULL)
            memcpy(job->pooled + b * job->pooled_stride, z + dim,
                   (size_t)job->n_parts * (size_t)dim * sizeof(float));
        job->dot(z, dim, job->li, job->lj, job->n_pairs, row + dim);
    }
    return PK_OK;
}

static void pk_dot_interaction_chunks(void *vjob, int64_t c0, int64_t c1)
{
    const pk_dot_interaction_job *job = (const pk_dot_interaction_job *)vjob;
    enum { STACK_FLOATS = 4096 };
    float stack[STACK_FLOATS];
    const size_t need = (size_t)(job->n_parts + 1) * (size_t)job->dim;   /* malloc failure: PK_ERR_VALUE */
    float *z = need <= STACK_FLOATS ? stack : (float *)malloc(need * sizeof(float));
    for (int64_t c = c0; c < c1; c++) {
        const int64_t b0 = job->n_samples * c / job->n_chunks;
        const int64_t b1 = job->n_samples * (c + 1) / job->n_chunks;
        job->status[c] = z == NULL ? PK_ERR_VALUE
                         : pk_dot_interaction_samples(job, b0, b1, z, &job->bad_pos[c],
                                                      &job->bad_part[c]);
    }
    if (z != stack) free(z);
}

/* Run the job on up to n_threads threads of `pool` (chunks of samples, about 16 KiB of output
 * each at least); PK_OK, or the first failed chunk's status with its position and part. */
static pk_status pk_dot_interaction_run(const pk_parallel_api *pool, int n_threads,
                                        pk_dot_interaction_job *job, int64_t *bad_pos,
                                        int *bad_part)
{
    if (job->n_samples == 0) return PK_OK;
    int64_t index_bytes = 0;
    for (int f = 0; f < job->n_parts; f++)
        index_bytes += pk_bags_part_cost(&job->parts[f], job->parts[f].bags.num_bags);
    const int64_t bytes = index_bytes + job->n_samples * (job->dim + job->n_pairs) * 8;
    const int threads = pk_parallel_threads_for(bytes, n_threads);
    int64_t k = threads > 1 ? (int64_t)threads * PK_PARALLEL_BLOCKS_PER_THREAD : 1;
    if (k > job->n_samples) k = job->n_samples;
    enum { STACK_CHUNKS = 64 };
    pk_status status_s[STACK_CHUNKS];
    int64_t bad_pos_s[STACK_CHUNKS];
    int bad_part_s[STACK_CHUNKS];
    if (k > STACK_CHUNKS) k = STACK_CHUNKS;
    job->n_chunks = k;
    job->status = status_s;
    job->bad_pos = bad_pos_s;
    job->bad_part = bad_part_s;
    if (k == 1) pk_dot_interaction_chunks(job, 0, 1);
    else pool->parallel_for(k, threads, pk_dot_interaction_chunks, job);
    for (int64_t c = 0; c < k; c++)
        if (status_s[c] != PK_OK) {
            *bad_pos = bad_pos_s[c];
            *bad_part = bad_part_s[c];
            return status_s[c];
        }
    return PK_OK;
}

#endif
