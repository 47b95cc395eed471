/* perfkernels: unpooled lookups (torch.nn.Embedding): one output row per index.
 *
 *     out[j, :] = table[indices[j], :]                      (embedding_rows: bytes copied as stored)
 *     out[j, c] = float(q_c) * scale + bias  of row indices[j]   (embedding_rows_quantized)
 *
 * embedding_rows copies `row_bytes` bytes of each row (a float32 / float16 / bfloat16 row is its
 * bytes: no conversion, NaN payloads kept); row r of the table starts `row_stride` bytes after row
 * r - 1, rows may be unaligned.  out holds n rows of `row_bytes` bytes back to back.
 * embedding_rows_quantized reads packed rows of `row_bytes` bytes (the layout of quantized.h) and
 * writes n rows of `dim` floats, each element fma(q, scale, bias) (the scalar level rounds twice,
 * as its dequantize_rowwise).
 *
 * Every index is checked before its row is read: on an index out of [0, rows) the kernel returns
 * PK_ERR_INDEX with *bad_pos = its position in `indices` (rows before it are written).  A wrapper
 * that must not leave a caller's out half-written checks a private copy of the indices first
 * (pk_sequence_copy_first_bad) and runs the kernel on that copy.
 */
#ifndef PERFKERNELS_SEQUENCE_H
#define PERFKERNELS_SEQUENCE_H

#include <string.h>

#include "perfkernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef pk_status (*pk_embedding_rows_fn)(const void *table, int64_t rows, int64_t row_stride,
                                          int64_t row_bytes, const void *indices, int index_64,
                                          int64_t n, void *out, int64_t *bad_pos);

typedef pk_status (*pk_embedding_rows_quantized_fn)(int bits, const uint8_t *packed, int64_t rows,
                                                    int64_t row_bytes, int64_t dim,
                                                    const void *indices, int index_64, int64_t n,
                                                    float *out, int64_t *bad_pos);

/* The kernels of one level: member x is the function pk_x_<level> (the build declares it for
 * every level and fills the table from this struct; perfkernels/_codegen.py). */
typedef struct pk_sequence_kernels {
    pk_embedding_rows_fn embedding_rows;
    pk_embedding_rows_quantized_fn embedding_rows_quantized;
} pk_sequence_kernels;

/* The kernels of one level, or NULL when this build does not contain that level. */
const pk_sequence_kernels *pk_sequence_table(int isa);

/* Copy indices [lo, hi) (int64_t if index_64, else int32_t) into the same positions of `copy`
 * and check the copy: the first position whose index is out of [0, rows), or -1.  Baseline C,
 * for the wrappers. */
static inline int64_t pk_sequence_copy_first_bad(const void *indices, int index_64, int64_t lo,
                                                 int64_t hi, int64_t rows, void *copy)
{
    const size_t size = index_64 ? 8 : 4;
    memcpy((char *)copy + (size_t)lo * size, (const char *)indices + (size_t)lo * size,
           (size_t)(hi - lo) * size);
    int64_t bad = -1;
    if (index_64) {
        const int64_t *c = (const int64_t *)copy;
        for (int64_t j = lo; j < hi; j++)
            if ((uint64_t)c[j] >= (uint64_t)rows) { bad = j; break; }
    } else {
        const int32_t *c = (const int32_t *)copy;
        for (int64_t j = lo; j < hi; j++)
            if ((uint64_t)(int64_t)c[j] >= (uint64_t)rows) { bad = j; break; }
    }
    return bad;
}

#ifdef __cplusplus
}
#endif
#endif
