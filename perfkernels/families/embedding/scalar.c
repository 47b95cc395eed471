/* Embedding-bag kernels, portable C (any architecture).  The output row accumulates in place;
 * the conversion of a table element to float is the only thing that differs between table types. */
#include "embedding/levels.h"
#include "common/half_bits.h"

enum table_type { TABLE_F32, TABLE_F16, TABLE_BF16 };

static inline float element(const void *row, int64_t d, const int type)
{
    switch (type) {
    case TABLE_F16: return pk_bits_f32(pk_f16_to_f32_bits(((const uint16_t *)row)[d]));
    case TABLE_BF16: return pk_bits_f32(pk_bf16_to_f32_bits(((const uint16_t *)row)[d]));
    default: return ((const float *)row)[d];
    }
}

static inline pk_status bags_scalar(const pk_bags *bags, const void *table, int64_t rows,
                                    int64_t dim, int64_t row_stride, int64_t *bad_pos,
                                    const int type)
{
    const size_t elem = type == TABLE_F32 ? 4 : 2;
    for (int64_t b = 0; b < bags->num_bags; b++) {
        const int64_t begin = bags->offsets[b], end = bags->offsets[b + 1];
        float *out = bags->out + b * bags->out_stride;
        int64_t count = 0;
        for (int64_t d = 0; d < dim; d++) out[d] = 0.0f;
        for (int64_t j = begin; j < end; j++) {
            int64_t idx;
            float w;
            const int use = pk_bags_entry(bags, j, begin, rows, &idx, &w, bad_pos);
            if (use < 0) return PK_ERR_INDEX;
            if (!use) continue;
            count++;
            const char *row = (const char *)table + (size_t)idx * (size_t)row_stride * elem;
            for (int64_t d = 0; d < dim; d++) out[d] += w * element(row, d, type);
        }
        pk_bags_finish_mean(bags, out, dim, count);
    }
    return PK_OK;
}

pk_status pk_embedding_bag_f32_scalar(const pk_bags *bags, const void *table, int64_t rows,
                                      int64_t dim, int64_t row_stride, int64_t *bad_pos)
{
    return bags_scalar(bags, table, rows, dim, row_stride, bad_pos, TABLE_F32);
}

pk_status pk_embedding_bag_f16_scalar(const pk_bags *bags, const void *table, int64_t rows,
                                      int64_t dim, int64_t row_stride, int64_t *bad_pos)
{
    return bags_scalar(bags, table, rows, dim, row_stride, bad_pos, TABLE_F16);
}

pk_status pk_embedding_bag_bf16_scalar(const pk_bags *bags, const void *table, int64_t rows,
                                       int64_t dim, int64_t row_stride, int64_t *bad_pos)
{
    return bags_scalar(bags, table, rows, dim, row_stride, bad_pos, TABLE_BF16);
}
