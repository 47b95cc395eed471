/* Row-wise quantized tables, portable C (any architecture; the reference the vector paths match). */
#include "quantized/levels.h"
#include "quantized/rows.h"
#include "common/bags_scalar.h"

static pk_status quantize_row_scalar(int bits, int half_input, const void *row, size_t dim,
                                     uint8_t *out)
{
    int bad = 0;
    for (size_t c = 0; c < dim; c++) bad |= pk_q_nonfinite(pk_q_load(row, half_input, c));
    if (bad) return PK_ERR_NONFINITE;
    float mn, mx;
    pk_q_minmax_exact(row, half_input, dim, &mn, &mx);
    size_t codes_bytes = bits == 8 ? dim : pk_q_codes_bytes(bits, dim);
    pk_q_params p = pk_q_params_for(bits, mn, mx, out, codes_bytes);
    int qmax = (1 << bits) - 1;
    if (bits == 8) {
        for (size_t c = 0; c < dim; c++)
            out[c] = pk_q_code((pk_q_load(row, half_input, c) - p.sub) * p.inv, qmax);
        return PK_OK;
    }
    uint8_t codes[256];
    for (size_t c0 = 0; c0 < dim; c0 += 256) {     /* 256 is a multiple of every 8/bits */
        size_t n = dim - c0 < 256 ? dim - c0 : 256;
        for (size_t k = 0; k < n; k++)
            codes[k] = pk_q_code((pk_q_load(row, half_input, c0 + k) - p.sub) * p.inv, qmax);
        pk_q_pack(bits, codes, n, out + c0 / (size_t)(8 / bits));
    }
    return PK_OK;
}

pk_status pk_quantize_rowwise_scalar(int bits, int half_input, const void *weight, size_t rows,
                                     size_t dim, uint8_t *packed, size_t *bad_row)
{
    size_t row_bytes = pk_quantized_row_bytes(bits, dim);
    size_t in_row = dim * (half_input ? 2 : 4);
    for (size_t r = 0; r < rows; r++) {
        pk_status s = quantize_row_scalar(bits, half_input, (const char *)weight + r * in_row, dim,
                                          packed + r * row_bytes);
        if (s != PK_OK) { *bad_row = r; return s; }
    }
    return PK_OK;
}

void pk_dequantize_rowwise_scalar(int bits, const uint8_t *packed, size_t rows, size_t row_bytes,
                                  size_t dim, float *out)
{
    size_t codes_bytes = bits == 8 ? dim : pk_q_codes_bytes(bits, dim);
    unsigned per = 8u / (unsigned)bits, mask = (1u << bits) - 1u;
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *row = packed + r * row_bytes;
        float *o = out + r * dim;
        float scale, bias;
        pk_q_read_trailer(bits, row, codes_bytes, &scale, &bias);
        for (size_t c = 0; c < dim; c++) {
            unsigned q = (row[c / per] >> ((c % per) * (unsigned)bits)) & mask;
            o[c] = (float)q * scale + bias;
        }
    }
}

typedef struct packed_table {
    const uint8_t *packed;
    size_t row_bytes, codes_bytes;
    int bits;
} packed_table;

/* out += w * row idx dequantised: (w * scale) * q + (out + w * bias), FBGEMM's order. */
static inline void add_row_quantized(const void *table, int64_t idx, float w, float *out,
                                     int64_t dim)
{
    const packed_table *t = (const packed_table *)table;
    const unsigned bits = (unsigned)t->bits, per = 8u / bits, mask = (1u << bits) - 1u;
    const uint8_t *row = t->packed + (size_t)idx * t->row_bytes;
    float scale, bias;
    pk_q_read_trailer(t->bits, row, t->codes_bytes, &scale, &bias);
    const float ws = w * scale, wb = w * bias;
    for (int64_t d = 0; d < dim; d++) {
        unsigned q = (row[d / per] >> ((d % per) * bits)) & mask;
        out[d] = (float)q * ws + (out[d] + wb);
    }
}

pk_status pk_embedding_bag_quantized_scalar(int bits, const pk_bags *bags, const uint8_t *packed,
                                            int64_t rows, int64_t row_bytes, int64_t dim,
                                            int64_t *bad_pos)
{
    const packed_table t = {packed, (size_t)row_bytes,
                            bits == 8 ? (size_t)dim : pk_q_codes_bytes(bits, (size_t)dim), bits};
    return pk_bags_scalar(bags, rows, dim, bad_pos, add_row_quantized, &t);
}
