/* The quantized family's adapter for the bag splitter (common/bags_parallel.h): its kernel, with
 * its own arguments, as a pk_bags_call.  Header-only, baseline flags. */
#ifndef PERFKERNELS_QUANTIZED_BAGS_CALL_H
#define PERFKERNELS_QUANTIZED_BAGS_CALL_H

#include "common/bags_parallel.h"
#include "perfkernels/quantized.h"

typedef struct pk_quantized_bags_args {
    pk_embedding_bag_quantized_fn fn;
    int bits;
    const uint8_t *packed;
    int64_t rows, row_bytes, dim;
} pk_quantized_bags_args;

static pk_status pk_quantized_bags_call(const void *args, const pk_bags *bags, int64_t *bad_pos)
{
    const pk_quantized_bags_args *a = (const pk_quantized_bags_args *)args;
    return a->fn(a->bits, bags, a->packed, a->rows, a->row_bytes, a->dim, bad_pos);
}

#endif
