/* Embedding-bag kernels, portable C (any architecture): the scalar bag kernel of
 * common/bags_scalar.h, with the conversion of a table element to float the only thing that
 * differs between table types. */
#include "embedding/levels.h"
#include "common/bags_scalar.h"
#include "common/half_bits.h"

typedef struct float_table {
    const char *data;
    size_t row_bytes;
} float_table;

static inline void add_row_f32(const void *table, int64_t idx, float w, float *out, int64_t dim)
{
    const float_table *t = (const float_table *)table;
    const float *row = (const float *)(t->data + (size_t)idx * t->row_bytes);
    for (int64_t d = 0; d < dim; d++) out[d] += w * row[d];
}

static inline void add_row_f16(const void *table, int64_t idx, float w, float *out, int64_t dim)
{
    const float_table *t = (const float_table *)table;
    const uint16_t *row = (const uint16_t *)(t->data + (size_t)idx * t->row_bytes);
    for (int64_t d = 0; d < dim; d++) out[d] += w * pk_bits_f32(pk_f16_to_f32_bits(row[d]));
}

static inline void add_row_bf16(const void *table, int64_t idx, float w, float *out, int64_t dim)
{
    const float_table *t = (const float_table *)table;
    const uint16_t *row = (const uint16_t *)(t->data + (size_t)idx * t->row_bytes);
    for (int64_t d = 0; d < dim; d++) out[d] += w * pk_bits_f32(pk_bf16_to_f32_bits(row[d]));
}

pk_status pk_embedding_bag_f32_scalar(const pk_bags *bags, const void *table, int64_t rows,
                                      int64_t dim, int64_t row_stride, int64_t *bad_pos)
{
    const float_table t = {(const char *)table, (size_t)row_stride * 4};
    return pk_bags_scalar(bags, rows, dim, bad_pos, add_row_f32, &t);
}

pk_status pk_embedding_bag_f16_scalar(const pk_bags *bags, const void *table, int64_t rows,
                                      int64_t dim, int64_t row_stride, int64_t *bad_pos)
{
    const float_table t = {(const char *)table, (size_t)row_stride * 2};
    return pk_bags_scalar(bags, rows, dim, bad_pos, add_row_f16, &t);
}

pk_status pk_embedding_bag_bf16_scalar(const pk_bags *bags, const void *table, int64_t rows,
                                       int64_t dim, int64_t row_stride, int64_t *bad_pos)
{
    const float_table t = {(const char *)table, (size_t)row_stride * 2};
    return pk_bags_scalar(bags, rows, dim, bad_pos, add_row_bf16, &t);
}
