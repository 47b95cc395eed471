/* The bag kernels of every table format as one pk_bags_call of the bag splitter
 * (common/bags_parallel.h): float rows (the kernel of the table's dtype, row stride in elements)
 * and packed 8/4/2-bit rows (row stride in bytes) under one argument struct, built by
 * pk_table_bags_float or pk_table_bags_packed.  Header-only, baseline flags; C and C++. */
#ifndef PERFKERNELS_BAGS_CALL_H
#define PERFKERNELS_BAGS_CALL_H

#include "common/bags_parallel.h"
#include "perfkernels/embedding.h"
#include "perfkernels/quantized.h"

typedef struct pk_table_bags_args {
    pk_embedding_bag_fn float_fn;               /* float rows; NULL for packed rows */
    pk_embedding_bag_quantized_fn packed_fn;    /* packed rows; NULL for float rows */
    int bits;                                   /* packed rows: 8, 4 or 2 */
    const void *table;
    int64_t rows, dim, row_stride;
} pk_table_bags_args;

static inline pk_table_bags_args pk_table_bags_float(pk_embedding_bag_fn fn, const void *table,
                                                     int64_t rows, int64_t dim, int64_t row_stride)
{
    pk_table_bags_args a = {fn, NULL, 0, table, rows, dim, row_stride};
    return a;
}

static inline pk_table_bags_args pk_table_bags_packed(pk_embedding_bag_quantized_fn fn, int bits,
                                                      const void *packed, int64_t rows,
                                                      int64_t row_bytes, int64_t dim)
{
    pk_table_bags_args a = {NULL, fn, bits, packed, rows, dim, row_bytes};
    return a;
}

static pk_status pk_table_bags_call(const void *args, const pk_bags *bags, int64_t *bad_pos)
{
    const pk_table_bags_args *a = (const pk_table_bags_args *)args;
    if (a->packed_fn != NULL)
        return a->packed_fn(a->bits, bags, (const uint8_t *)a->table, a->rows, a->row_stride,
                            a->dim, bad_pos);
    return a->float_fn(bags, a->table, a->rows, a->dim, a->row_stride, bad_pos);
}

#endif
