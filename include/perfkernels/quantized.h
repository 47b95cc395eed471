/* perfkernels: row-wise quantized tables.
 *
 * Packed row layouts (little-endian, rows unaligned):
 *   bits 8:    D uint8 codes, float32 scale, float32 bias                 (D + 8 bytes)
 *   bits 4, 2: ceil(D / (8/bits)) bytes of codes, low bits first, then
 *              float16 scale, float16 bias                                 (+ 4 bytes)
 * Quantization is bit-exact with PyTorch's embedding_bag_{byte,4bit,2bit}_prepack (FBGEMM), the
 * sign of a zero scale/bias included.
 */
#ifndef PERFKERNELS_QUANTIZED_H
#define PERFKERNELS_QUANTIZED_H

#include "perfkernels/common.h"
#include "perfkernels/bags.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of one packed row. */
static inline size_t pk_quantized_row_bytes(int bits, size_t dim)
{
    if (bits == 8) return dim + 8;
    size_t per_byte = (size_t)(8 / bits);
    return (dim + per_byte - 1) / per_byte + 4;
}

/* weight: rows x dim, float32 (half_input = 0) or float16 bits (half_input = 1), C-contiguous.
 * packed: rows x pk_quantized_row_bytes(bits, dim).  A row holding NaN or inf stops the kernel
 * with PK_ERR_NONFINITE and its number in *bad_row (rows before it are written; that row and
 * the rest of `packed` are unspecified). */
typedef pk_status (*pk_quantize_rowwise_fn)(int bits, int half_input, const void *weight,
                                            size_t rows, size_t dim, uint8_t *packed,
                                            size_t *bad_row);
/* packed: rows x row_bytes (row_bytes == pk_quantized_row_bytes(bits, dim)); out: rows x dim. */
typedef void (*pk_dequantize_rowwise_fn)(int bits, const uint8_t *packed, size_t rows,
                                         size_t row_bytes, size_t dim, float *out);

/* Embedding bags over packed rows, dequantising in the inner loop:
 * out[b] += (w*scale) * q + (w*bias) per row.  packed: rows x row_bytes, row_bytes ==
 * pk_quantized_row_bytes(bits, dim); bags->out holds num_bags x out_stride floats.  An index out of
 * [0, rows) returns PK_ERR_INDEX with its position in *bad_pos before its row is read. */
typedef pk_status (*pk_embedding_bag_quantized_fn)(int bits, const pk_bags *bags,
                                                   const uint8_t *packed, int64_t rows,
                                                   int64_t row_bytes, int64_t dim,
                                                   int64_t *bad_pos);

/* The kernels of one level: member x is the function pk_x_<level> (the build declares it for
 * every level and fills the table from this struct; perfkernels/_codegen.py). */
typedef struct pk_quantized_kernels {
    pk_quantize_rowwise_fn quantize_rowwise;
    pk_dequantize_rowwise_fn dequantize_rowwise;
    pk_embedding_bag_quantized_fn embedding_bag_quantized;
} pk_quantized_kernels;

/* The kernels of one level, or NULL when this build does not contain that level. */
const pk_quantized_kernels *pk_quantized_table(int isa);

#ifdef __cplusplus
}
#endif
#endif
