/* Embedding bags over row-wise quantized tables, written once over the SIMD primitives; part of
 * quantized/body.h.  Rows are dequantised in the inner loop, out[b] += (w*scale) * q + (w*bias),
 * with the bag's output row in vector registers; one compiled loop per (bits, D, prefetch mode),
 * the index width and weights picked once per call. */
#ifndef PK_QUANTIZED_BAGS_H
#define PK_QUANTIZED_BAGS_H

#include "perfkernels/bags.h"

/* Rows ahead for the two prefetch modes (include/perfkernels/bags.h; see prefetch_row). */
#define PREFETCH_NEAR PK_BAGS_PREFETCH_DISTANCE
#define PREFETCH_FAR PK_BAGS_FAR_DISTANCE

/* What the bag loop reads per row, hoisted out of pk_bags once per call. */
typedef struct bag_loop {
    const void *indices;
    const float *weights;
    int positional, mean;
    int64_t n_indices, padding_idx, rows;
    const uint8_t *packed;
    int far;             /* rows into L2, PREFETCH_FAR ahead (see prefetch_row) */
    int64_t near_ahead;  /* otherwise into L1, this far ahead: PREFETCH_NEAR, or PREFETCH_FAR for a
                          * far table under the L1 policy (include/perfkernels/bags.h) */
} bag_loop;

/* Prefetch of the row PREFETCH_NEAR or PREFETCH_FAR indices ahead (the policy of
 * include/perfkernels/bags.h).  Far: T1 (to L2) on the row's first byte, its last byte and every
 * 64th byte from the first that is more than 64 bytes before the last (every line of a row of up
 * to 64 bytes and of a 72-byte row at an 8-byte offset).  Near: T0 on every line: the rows of a
 * smaller table mostly hit in L2/L3, and bringing them to L1 early is what helps there (and the
 * rows of a far table under the L1 policy, PREFETCH_FAR ahead).
 * Prefetches never fault, so an index not yet checked is harmless here; the address is formed in
 * integers. */
PK_INLINE void prefetch_row(const uint8_t *packed, int64_t idx, int64_t row_bytes, const int far)
{
    const uintptr_t p = (uintptr_t)packed + (uint64_t)idx * (uint64_t)row_bytes;
    if (far) {
        pk_prefetch_t1((const char *)p);
        for (int64_t off = 64; off < row_bytes - 64; off += 64) pk_prefetch_t1((const char *)(p + off));
        pk_prefetch_t1((const char *)(p + row_bytes - 1));
    } else {
        for (int64_t off = 0; off < row_bytes; off += 64) pk_prefetch_t0((const char *)(p + off));
        if (row_bytes % 64 != 1) pk_prefetch_t0((const char *)(p + row_bytes - 1));
    }
}


#define BLOCK_VECS (V_REGS / 2) /* any D: output vectors held in registers per pass */
/* A specialised D keeps up to spec_vecs(bits) vectors in one pass: 16 where there are 32
 * registers (AVX-512: D = 256 in one pass).  In AVX2's 16 registers, 8-bit rows take 8 (D = 128
 * and 256 in 2 and 4 passes over the bag, the later ones reading rows the first brought to L1):
 * with 16 the compiler kept accumulators on the stack, 6 stack accesses a row, and 8 is as fast
 * on bags of 20 rows and faster on bags of one.  4-bit rows keep 16 and their spills (15-19
 * stack accesses a row, next to a pair's two halves and the nibble mask): 8 measured 6-15%
 * slower on bags of 20 rows. */
#define SPEC_VECS 16
#if V_REGS > 16 || VL == 1
#define SPEC_VECS_8BIT 16
#else
#define SPEC_VECS_8BIT 8
#endif
PK_INLINE int spec_vecs(const int bits) { return bits == 8 ? SPEC_VECS_8BIT : SPEC_VECS; }

#include "quantized/codes.h"

/* Sum one bag over output columns [d0, d0 + VL*nv + tail) with that slice of the output row in
 * registers.  bits, nv, index_64, weighted (and row_bytes when D is specialised) are compile-time
 * constants after inlining, so the row loop holds no option branch.  Returns the number of
 * non-padding entries, or -1 with *bad_pos set for an out-of-range index. */
PK_INLINE int64_t bag_block(const int bits, const int nv, const int has_tail, v_tail tail,
                            const int index_64, const int weighted, const bag_loop *a,
                            int64_t begin, int64_t end, const int64_t row_bytes,
                            const int64_t codes_bytes, int64_t d0, int prefetch, float *out,
                            int64_t *bad_pos)
{
    vf acc[SPEC_VECS + 1];
    float bias_sum = 0.0f; /* sum of w*bias, added once per bag instead of once per row */
    for (int v = 0; v <= nv; v++) acc[v] = v_zero();
    const void *indices = a->indices;
    const uint8_t *packed = a->packed;
    const uint64_t rows = (uint64_t)a->rows;
    const int64_t padding = a->padding_idx;
    const float *weights = a->weights;
    const int64_t wofs = weighted && a->positional ? begin : 0;
    /* the last index that has a row `ahead` positions ahead of it (prefetch: 0 none, 1 near, 2 far) */
    const int64_t ahead = prefetch == 2 ? PREFETCH_FAR : a->near_ahead;
    const int64_t pf_end = prefetch ? a->n_indices - ahead : 0;
    /* 4-bit codes two vectors at a time: VL bytes give the even columns (low nibbles) and the odd
     * ones (high nibbles) in two accumulators, interleaved once at the store */
    const int pairs = bits == 4 && nv % 2 == 0;
    int64_t count = 0;
    for (int64_t j = begin; j < end; j++) {
        const int64_t idx = pk_index_at(indices, j, index_64);
        if ((uint64_t)idx >= rows) { *bad_pos = j; return -1; }
        if (j < pf_end) {
            const int64_t next = pk_index_at(indices, j + ahead, index_64);
            if (prefetch == 2) prefetch_row(packed, next, row_bytes, 1);
            else prefetch_row(packed, next, row_bytes, 0);
        }
        if (idx == padding) continue;
        count++;
        const float w = weighted ? weights[j - wofs] : 1.0f;
        const uint8_t *row = packed + (uint64_t)idx * (uint64_t)row_bytes;
        float scale, bias;
        pk_q_read_trailer(bits, row, (size_t)codes_bytes, &scale, &bias);
        const vf ws = v_set1(weighted ? w * scale : scale);
        bias_sum += weighted ? w * bias : bias;
        if (pairs) {
            for (int v = 0; v < nv; v += 2) {
                vf lo, hi;
                v_load_u4_pairs(row + (d0 + VL * v) / 2, &lo, &hi);
                acc[v] = v_fmadd(lo, ws, acc[v]);
                acc[v + 1] = v_fmadd(hi, ws, acc[v + 1]);
            }
        } else {
            for (int v = 0; v < nv; v++)
                acc[v] = v_fmadd(load_codes(bits, row, d0 + VL * v), ws, acc[v]);
        }
        if (has_tail)
            acc[nv] = v_fmadd(load_codes_tail(bits, row, d0 + VL * nv, tail), ws, acc[nv]);
    }
    if (pairs)
        for (int v = 0; v < nv; v += 2) v_zip(acc[v], acc[v + 1], &acc[v], &acc[v + 1]);
    const vf norm = v_set1(a->mean && count > 0 ? 1.0f / (float)count : 1.0f);
    const vf vbias = v_set1(bias_sum);
    for (int v = 0; v < nv; v++) v_store(out + d0 + VL * v, v_mul(v_add(acc[v], vbias), norm));
    if (has_tail) v_store_tail(out + d0 + VL * nv, v_mul(v_add(acc[nv], vbias), norm), tail);
    return count;
}

/* All bags, all columns.  D (0: any) is a compile-time constant: a specialised D runs
 * D / (VL * spec_vecs(bits)) passes (one for D <= VL * spec_vecs(bits)) with a constant row size; any other D
 * takes passes of BLOCK_VECS vectors and a rest of up to BLOCK_VECS vectors plus a tail. */
PK_INLINE pk_status bags_loop(const int bits, const int D, const int index_64, const int weighted,
                              const int far, const bag_loop *a, const int64_t *offsets,
                              int64_t num_bags, float *out_base, int64_t out_stride,
                              int64_t dim_rt, int64_t row_bytes_rt, int64_t *bad_pos)
{
    const int64_t dim = D ? D : dim_rt;
    const int64_t codes_bytes = bits == 8 ? dim : (int64_t)pk_q_codes_bytes(bits, (size_t)dim);
    const int64_t row_bytes = D ? codes_bytes + (bits == 8 ? 8 : 4) : row_bytes_rt;
    for (int64_t b = 0; b < num_bags; b++) {
        const int64_t begin = offsets[b], end = offsets[b + 1];
        float *out = out_base + b * out_stride;
        if (D) {
            const int nv = D / VL < spec_vecs(bits) ? D / VL : spec_vecs(bits);
            for (int d0 = 0; d0 < D; d0 += VL * nv)
                if (bag_block(bits, nv, 0, v_tail_of(0), index_64, weighted, a, begin, end,
                              row_bytes, codes_bytes, d0, (d0 == 0) * (1 + far), out, bad_pos) < 0)
                    return PK_ERR_INDEX;
            continue;
        }
        int64_t d0 = 0;
        int prefetch = 1 + far;
        for (; dim - d0 > VL * BLOCK_VECS; d0 += VL * BLOCK_VECS, prefetch = 0)
            if (bag_block(bits, BLOCK_VECS, 0, v_tail_of(0), index_64, weighted, a, begin, end,
                          row_bytes, codes_bytes, d0, prefetch, out, bad_pos) < 0)
                return PK_ERR_INDEX;
        const int64_t rest = dim - d0; /* 1 .. VL * BLOCK_VECS */
        const int nv = (int)(rest / VL), has_tail = rest % VL != 0;
        const v_tail tail = v_tail_of((size_t)(rest % VL));
        int64_t r = 0;
#define REST_CASE(NV)                                                                              \
        case NV:                                                                                   \
            r = bag_block(bits, NV, has_tail, tail, index_64, weighted, a, begin, end, row_bytes,  \
                          codes_bytes, d0, prefetch, out, bad_pos);                                \
            break;
        switch (nv) {
            REST_CASE(0) REST_CASE(1) REST_CASE(2) REST_CASE(3) REST_CASE(4)
            REST_CASE(5) REST_CASE(6) REST_CASE(7) REST_CASE(8)
#if BLOCK_VECS > 8
            REST_CASE(9) REST_CASE(10) REST_CASE(11) REST_CASE(12)
            REST_CASE(13) REST_CASE(14) REST_CASE(15) REST_CASE(16)
#endif
        }
#undef REST_CASE
        if (r < 0) return PK_ERR_INDEX;
    }
    return PK_OK;
}

/* One function per (bits, D, far, index width, weighting), each on its own (noinline): inlined
 * into one function per (bits, D, far), the four loop nests of each made a function too large for
 * GCC's register allocator to treat each loop apart, and it kept accumulators of the 4-bit AVX2
 * passes on the stack (a load and a store per row each).  The index width and whether there are
 * weights are picked once per call. */
#define BAGS_ONE(BITS, D, FAR, IDX64, WEIGHTED)                                                   \
    static __attribute__((noinline)) pk_status                                                    \
    bags_##BITS##bit_d##D##_##FAR##_##IDX64##_##WEIGHTED(const bag_loop *a, const pk_bags *g,     \
                                                         int64_t dim, int64_t row_bytes,          \
                                                         int64_t *bad)                            \
    {                                                                                             \
        return bags_loop(BITS, D, IDX64, WEIGHTED, FAR, a, g->offsets, g->num_bags, g->out,       \
                         g->out_stride, dim, row_bytes, bad);                                     \
    }
#define BAGS_FOR_FAR(BITS, D, FAR)                                                                \
    BAGS_ONE(BITS, D, FAR, 0, 0) BAGS_ONE(BITS, D, FAR, 0, 1)                                     \
    BAGS_ONE(BITS, D, FAR, 1, 0) BAGS_ONE(BITS, D, FAR, 1, 1)                                     \
    static pk_status bags_##BITS##bit_d##D##_##FAR(const bag_loop *a, const pk_bags *g,          \
                                                   int64_t dim, int64_t row_bytes, int64_t *bad)  \
    {                                                                                             \
        const int weighted = g->weights != NULL;                                                  \
        if (g->index_64)                                                                          \
            return weighted ? bags_##BITS##bit_d##D##_##FAR##_1_1(a, g, dim, row_bytes, bad)      \
                            : bags_##BITS##bit_d##D##_##FAR##_1_0(a, g, dim, row_bytes, bad);     \
        return weighted ? bags_##BITS##bit_d##D##_##FAR##_0_1(a, g, dim, row_bytes, bad)          \
                        : bags_##BITS##bit_d##D##_##FAR##_0_0(a, g, dim, row_bytes, bad);         \
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
#undef BAGS_ONE
#undef BAGS_FOR_FAR
#undef BAGS_FOR

pk_status PK_ISA_FN(pk_embedding_bag_quantized)(int bits, const pk_bags *bags, const uint8_t *packed,
                                                int64_t rows, int64_t row_bytes, int64_t dim,
                                                int64_t *bad_pos)
{
    const int far_table = pk_bags_far_table(rows, (uint64_t)row_bytes);
    const int into_l2 = far_table && pk_far_prefetch_mode() == PK_FAR_INTO_L2;
    const bag_loop a = {bags->indices, bags->weights, bags->positional, bags->mean,
                        bags->n_indices, bags->padding_idx, rows, packed, into_l2,
                        far_table ? PREFETCH_FAR : PREFETCH_NEAR};
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
