/* perfkernels: feature interaction, the pairwise dot products of DLRM's "dot" interaction.
 *
 *     out[p] = sum over d < dim of z[li[p] * dim + d] * z[lj[p] * dim + d],   p < n_pairs
 *
 * z is one sample's n feature rows of `dim` floats, back to back (DLRM: the dense row, then the
 * F pooled embedding rows); li and lj list the pairs in the order the output holds them (the
 * order of the model's own code: facebookresearch DLRM's lower triangle, TorchRec's upper one).
 * Every li[p], lj[p] is in [0, n): the caller checks them once per call.  Accumulation is
 * float32 (FMA on the vector paths), in an order fixed by dim and the level.
 *
 * Its gradient, for one sample: with S = G + G^T, G[li[p], lj[p]] = sum of the grad[p] of that pair,
 *
 *     dz[i * dim + d] = sum over j < n of S[i, j] * z[j * dim + d],   i < n
 *
 * summed in the order of j (`s` is an [n, n] float workspace the kernel overwrites).
 */
#ifndef PERFKERNELS_INTERACTION_H
#define PERFKERNELS_INTERACTION_H

#include "perfkernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*pk_interaction_dot_fn)(const float *z, int64_t dim, const int32_t *li,
                                      const int32_t *lj, int64_t n_pairs, float *out);
typedef void (*pk_interaction_dot_backward_fn)(const float *z, int64_t n, int64_t dim,
                                               const int32_t *li, const int32_t *lj,
                                               int64_t n_pairs, const float *grad, float *s,
                                               float *dz);

/* The kernels of one level: member x is the function pk_x_<level> (the build declares it for
 * every level and fills the table from this struct; perfkernels/_codegen.py). */
typedef struct pk_interaction_kernels {
    pk_interaction_dot_fn interaction_dot;
    pk_interaction_dot_backward_fn interaction_dot_backward;
} pk_interaction_kernels;

/* The kernels of one level, or NULL when this build does not contain that level. */
const pk_interaction_kernels *pk_interaction_table(int isa);

#ifdef __cplusplus
}
#endif
#endif
