/* perfkernels: embedding bags on float32 / float16 / bfloat16 tables.
 *
 *     out[b, :D] = scale_b * sum over j in bag b, indices[j] != padding_idx, of w_j * float(table[indices[j], :])
 *
 * scale_b is 1, or for mean 1/count_b (count_b: the bag's non-padding entries; empty bag -> zeros).
 * The bags, weights and out are described by a pk_bags (bags.h).  The table is `rows` rows of
 * `dim` elements, row r starting `row_stride` elements after row r - 1; rows may be unaligned at
 * element granularity.  Accumulation is float32 (FMA on the vector paths), one bag's output row
 * held in registers.  Every index is checked before its row is read: on an out-of-range index the
 * kernel returns PK_ERR_INDEX with *bad_pos = its flattened position (out may be partly written).
 */
#ifndef PERFKERNELS_EMBEDDING_H
#define PERFKERNELS_EMBEDDING_H

#include "perfkernels/bags.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef pk_status (*pk_embedding_bag_fn)(const pk_bags *bags, const void *table, int64_t rows,
                                         int64_t dim, int64_t row_stride, int64_t *bad_pos);

/* The kernels of one level: member x is the function pk_x_<level> (the build declares it for
 * every level and fills the table from this struct; perfkernels/_codegen.py). */
typedef struct pk_embedding_kernels {
    pk_embedding_bag_fn embedding_bag_f32;   /* table of float */
    pk_embedding_bag_fn embedding_bag_f16;   /* table of IEEE half (uint16_t bits) */
    pk_embedding_bag_fn embedding_bag_bf16;  /* table of bfloat16 (uint16_t bits) */
} pk_embedding_kernels;

/* The kernels of one level, or NULL when this build does not contain that level. */
const pk_embedding_kernels *pk_embedding_table(int isa);

#ifdef __cplusplus
}
#endif
#endif
