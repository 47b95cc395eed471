/* The embedding family's adapter for the bag splitter (common/bags_parallel.h): its kernel, with
 * its own arguments, as a pk_bags_call.  Header-only, baseline flags. */
#ifndef PERFKERNELS_EMBEDDING_BAGS_CALL_H
#define PERFKERNELS_EMBEDDING_BAGS_CALL_H

#include "common/bags_parallel.h"
#include "perfkernels/embedding.h"

typedef struct pk_float_bags_args {
    pk_embedding_bag_fn fn;
    const void *table;
    int64_t rows, dim, row_stride;
} pk_float_bags_args;

static pk_status pk_float_bags_call(const void *args, const pk_bags *bags, int64_t *bad_pos)
{
    const pk_float_bags_args *a = (const pk_float_bags_args *)args;
    return a->fn(bags, a->table, a->rows, a->dim, a->row_stride, bad_pos);
}

#endif
