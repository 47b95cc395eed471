/* The second half of the fused quantized embedding bags shared by the ISA files: one compiled
 * bags_loop per (bits, D, prefetch mode), the index width and weights picked once per call, and the
 * exported kernel PKQB_KERNEL, which picks a specialised D (32/64/128/256) when the rows have
 * exactly that width.  Internal header; the including file defines bags_loop and PKQB_KERNEL. */
#ifndef PERFKERNELS_QUANTIZED_BAGS_ENTRY_H
#define PERFKERNELS_QUANTIZED_BAGS_ENTRY_H

/* One function per (bits, D, far); the index width and whether there are weights picked once per call. */
#define BAGS_FOR_FAR(BITS, D, FAR)                                                                       \
    static pk_status bags_##BITS##bit_d##D##_##FAR(const bag_loop *a, const pk_bags *g,          \
                                           int64_t dim, int64_t row_bytes, int64_t *bad)          \
    {                                                                                             \
        const int weighted = g->weights != NULL;                                                  \
        if (g->index_64)                                                                          \
            return weighted ? bags_loop(BITS, D, 1, 1, FAR, a, g->offsets, g->num_bags, g->out,       \
                                        g->out_stride, dim, row_bytes, bad)                       \
                            : bags_loop(BITS, D, 1, 0, FAR, a, g->offsets, g->num_bags, g->out,       \
                                        g->out_stride, dim, row_bytes, bad);                      \
        return weighted ? bags_loop(BITS, D, 0, 1, FAR, a, g->offsets, g->num_bags, g->out,           \
                                    g->out_stride, dim, row_bytes, bad)                           \
                        : bags_loop(BITS, D, 0, 0, FAR, a, g->offsets, g->num_bags, g->out,           \
                                    g->out_stride, dim, row_bytes, bad);                          \
    }
#define BAGS_FOR(BITS, D)                                                                         \
    BAGS_FOR_FAR(BITS, D, 0) BAGS_FOR_FAR(BITS, D, 1)                                             \
    static pk_status bags_##BITS##bit_d##D(const bag_loop *a, const pk_bags *g, int64_t dim,      \
                                           int64_t row_bytes, int64_t *bad)                       \
    {                                                                                             \
        return a->far ? bags_##BITS##bit_d##D##_1(a, g, dim, row_bytes, bad)                      \
                      : bags_##BITS##bit_d##D##_0(a, g, dim, row_bytes, bad);                     \
    }
BAGS_FOR(8, 0) BAGS_FOR(8, 32) BAGS_FOR(8, 64) BAGS_FOR(8, 128) BAGS_FOR(8, 256)
BAGS_FOR(4, 0) BAGS_FOR(4, 32) BAGS_FOR(4, 64) BAGS_FOR(4, 128) BAGS_FOR(4, 256)
BAGS_FOR(2, 0)
#undef BAGS_FOR_FAR
#undef BAGS_FOR

pk_status PKQB_KERNEL(int bits, const pk_bags *bags, const uint8_t *packed, int64_t rows,
                      int64_t row_bytes, int64_t dim, int64_t *bad_pos)
{
    const bag_loop a = {bags->indices, bags->weights, bags->positional, bags->mean,
                        bags->n_indices, bags->padding_idx, rows, packed,
                        row_bytes > 0 && (bags->n_indices < rows ? bags->n_indices : rows)
                                             >= FAR_FOOTPRINT / row_bytes};
#define BY_DIM(BITS)                                                                              \
    switch (row_bytes == (int64_t)pk_quantized_row_bytes(BITS, (size_t)dim) ? dim : 0) {          \
    case 32: return bags_##BITS##bit_d32(&a, bags, dim, row_bytes, bad_pos);                      \
    case 64: return bags_##BITS##bit_d64(&a, bags, dim, row_bytes, bad_pos);                      \
    case 128: return bags_##BITS##bit_d128(&a, bags, dim, row_bytes, bad_pos);                    \
    case 256: return bags_##BITS##bit_d256(&a, bags, dim, row_bytes, bad_pos);                    \
    default: return bags_##BITS##bit_d0(&a, bags, dim, row_bytes, bad_pos);                       \
    }
    if (bits == 8) BY_DIM(8)
    if (bits == 4) BY_DIM(4)
#undef BY_DIM
    return bags_2bit_d0(&a, bags, dim, row_bytes, bad_pos);
}

#endif
