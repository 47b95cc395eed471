/* The portable (scalar) bag kernel, written once for every table format.
 *
 * A format supplies one function, add_row(table, idx, w, out, dim): out[0:dim] += w * row idx of
 * the table (`table` is the format's own description of it: its memory, row size, bits), in float32, in its own order of operations (the float formats widen each element;
 * the row-wise quantized ones dequantise with the row's scale and bias).  Everything else, the bags,
 * the index checks, padding, the output rows (any row stride) and mode "mean", is here.  The
 * vector levels are the families' body.h; this is the reference they match. */
#ifndef PK_COMMON_BAGS_SCALAR_H
#define PK_COMMON_BAGS_SCALAR_H

#include "perfkernels/bags.h"

typedef void (*pk_scalar_add_row_fn)(const void *table, int64_t idx, float w, float *out,
                                     int64_t dim);

typedef struct pk_scalar_bag {
    pk_scalar_add_row_fn add_row;
    const void *table;
    float *out;
    int64_t dim;
} pk_scalar_bag;

__attribute__((always_inline)) static inline void pk_scalar_bag_visit(void *ctx, int64_t j, int64_t idx, float w)
{
    const pk_scalar_bag *s = (const pk_scalar_bag *)ctx;
    (void)j;
    s->add_row(s->table, idx, w, s->out, s->dim);
}

/* Every bag of `bags` over a table of `rows` rows of `dim` columns, each bag's row of bags->out
 * zeroed, summed with add_row, then scaled for mean.  PK_ERR_INDEX with *bad_pos at the first
 * out-of-range index (the bags before it are written). */
__attribute__((always_inline)) static inline pk_status pk_bags_scalar(const pk_bags *bags, int64_t rows, int64_t dim,
                                       int64_t *bad_pos, pk_scalar_add_row_fn add_row,
                                       const void *table)
{
    for (int64_t b = 0; b < bags->num_bags; b++) {
        pk_scalar_bag s = {add_row, table, bags->out + b * bags->out_stride, dim};
        for (int64_t d = 0; d < dim; d++) s.out[d] = 0.0f;
        const int64_t count = pk_bag_entries(bags, b, rows, bad_pos, pk_scalar_bag_visit, &s);
        if (count < 0) return PK_ERR_INDEX;
        pk_bags_finish_mean(bags, s.out, dim, count);
    }
    return PK_OK;
}

#endif
