/* Embedding bags over row-wise quantized tables for the vector levels; part of quantized/body.h:
 * the passes of common/bag_loop.h over each bag's columns.  Rows are dequantised in the inner
 * loop, out[b] += (w*scale) * q + (w*bias), with the bag's output row in vector registers; one
 * compiled loop per (bits, D, prefetch mode, index width, weighting). */
#ifndef PK_QUANTIZED_BAGS_H
#define PK_QUANTIZED_BAGS_H

#include "common/bag_loop.h"
#include "common/bags_sve.h"

#define BLOCK_VECS (V_REGS / 2) /* any D: output vectors held in registers per pass */
/* A specialised D keeps up to SPEC_VECS_PACKED vectors in one pass: 16 where there are 32
 * registers (AVX-512: D = 256 in one pass).  In AVX2's 16 registers 8-bit rows take 8 (D = 128
 * and 256 in 2 and 4 passes over the bag, the later ones reading rows the first brought to L1),
 * and no accumulator leaves the registers.  A pass of 16 cannot: with the row's scale and the code
 * being widened it needs 18 registers.  8-bit rows were as fast in passes of 8 on bags of 20 rows
 * and faster on bags of one.  4-bit rows take passes of 16 (SPEC_VECS_Q4) on every level: on an
 * AVX2-only AMD EPYC (Zen 3) one pass of 16 with spills (12 stack accesses a row) took 0.83x the
 * time of two passes of 8 at D = 128 (bags of 40 rows of an L3-resident table; 0.88x weighted,
 * 0.91x at D = 256 and on a 4M-row table), the kernels of both builds called alternately. */
#if V_REGS > 16
#define SPEC_VECS_PACKED 16
#else
#define SPEC_VECS_PACKED 8
#endif
/* 4-bit rows: passes of 16 everywhere (on AVX2 D = 128 in one pass, its spills notwithstanding:
 * a second pass would read every index, trailer and prefetch of the bag again) */
#define SPEC_VECS_Q4 16

/* Sum bag b over output columns [d0, d0 + VL*nv + tail): the bag loop's pass over packed rows of
 * `bits` bits, prefetching rows ahead (near, or far into L2) when `prefetch` (the first pass). */
PK_INLINE pk_status bag_block(const int bits, const int nv, const int has_tail, v_tail tail,
                              const int index_64, const int weighted, const int far,
                              const pk_bags *g, const pk_bag_table *t, int64_t b, int64_t d0,
                              int prefetch, int64_t *bad_pos)
{
    return pk_bag_pass(g, t, g->offsets[b], g->offsets[b + 1], d0, tail,
                       g->out + b * g->out_stride, bad_pos, prefetch, nv, has_tail,
                       bits == 8 ? PK_BAG_Q8 : bits == 4 ? PK_BAG_Q4 : PK_BAG_Q2, index_64,
                       weighted ? PK_BAG_WEIGHTED : PK_BAG_UNWEIGHTED, 1, far);
}

/* All bags, all columns.  D (0: any) is a compile-time constant: a specialised D runs
 * D / (VL * SPEC_VECS_PACKED) passes (one for D <= VL * SPEC_VECS_PACKED) with a constant row size;
 * any other D takes passes of BLOCK_VECS vectors and one rest pass of up to BLOCK_VECS vectors
 * plus a tail (a pass more reads every index, trailer and prefetch of the bag again, dearer for
 * packed rows than for float ones: the float planner's blocks of 8, 4, 2, 1 vectors measured
 * 11-27% slower at D = 100 and 129).  Only the first pass prefetches: it brings whole rows. */
PK_INLINE pk_status bags_loop(const pk_bags *g, const void *packed, int64_t rows, int64_t dim_rt,
                              int64_t row_bytes_rt, int64_t *bad_pos, const int bits, const int D,
                              const int index_64, const int weighted, const int far)
{
    const int64_t dim = D ? D : dim_rt;
    const int64_t codes_bytes = bits == 8 ? dim : (int64_t)pk_q_codes_bytes(bits, (size_t)dim);
    const int64_t row_bytes = D ? codes_bytes + (bits == 8 ? 8 : 4) : row_bytes_rt;
    const pk_bag_table t = pk_bag_table_of(packed, rows, (size_t)row_bytes, (size_t)codes_bytes);
    for (int64_t b = 0; b < g->num_bags; b++) {
        if (D) {
            const int spec = bits == 4 ? SPEC_VECS_Q4 : SPEC_VECS_PACKED;
            const int nv = D / VL < spec ? D / VL : spec;
            for (int d0 = 0; d0 < D; d0 += VL * nv)
                if (bag_block(bits, nv, 0, v_tail_of(0), index_64, weighted, far, g, &t, b, d0,
                              d0 == 0, bad_pos) != PK_OK)
                    return PK_ERR_INDEX;
            continue;
        }
        int64_t d0 = 0;
        int prefetch = 1;
        for (; dim - d0 > VL * BLOCK_VECS; d0 += VL * BLOCK_VECS, prefetch = 0)
            if (bag_block(bits, BLOCK_VECS, 0, v_tail_of(0), index_64, weighted, far, g, &t, b, d0,
                          prefetch, bad_pos) != PK_OK)
                return PK_ERR_INDEX;
        const int64_t rest = dim - d0; /* 1 .. VL * BLOCK_VECS */
        const int nv = (int)(rest / VL), has_tail = rest % VL != 0;
        const v_tail tail = v_tail_of((size_t)(rest % VL));
        pk_status r = PK_OK;
#define REST_CASE(NV)                                                                              \
        case NV:                                                                                   \
            r = bag_block(bits, NV, has_tail, tail, index_64, weighted, far, g, &t, b, d0,         \
                          prefetch, bad_pos);                                                      \
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
        if (r != PK_OK) return PK_ERR_INDEX;
    }
    return PK_OK;
}

/* The compiled loops (PK_BAG_FN): one per (bits, D, far, index width, weighting); the index width
 * and whether there are weights are picked once per call. */
#define BAGS_ONE(BITS, D, FAR, IDX64, WEIGHTED)                                                   \
    PK_BAG_FN(bags_##BITS##bit_d##D##_##FAR##_##IDX64##_##WEIGHTED, bags_loop, BITS, D, IDX64,    \
              WEIGHTED, FAR)
#define BAGS_FOR_FAR(BITS, D, FAR)                                                                \
    BAGS_ONE(BITS, D, FAR, 0, 0) BAGS_ONE(BITS, D, FAR, 0, 1)                                     \
    BAGS_ONE(BITS, D, FAR, 1, 0) BAGS_ONE(BITS, D, FAR, 1, 1)
#define BAGS_FOR(BITS, D)                                                                         \
    BAGS_FOR_FAR(BITS, D, 0) BAGS_FOR_FAR(BITS, D, 1)                                             \
    static const pk_bag_fn bags_##BITS##bit_d##D[2][2][2] = {                                       \
        {{bags_##BITS##bit_d##D##_0_0_0, bags_##BITS##bit_d##D##_0_0_1},                          \
         {bags_##BITS##bit_d##D##_0_1_0, bags_##BITS##bit_d##D##_0_1_1}},                         \
        {{bags_##BITS##bit_d##D##_1_0_0, bags_##BITS##bit_d##D##_1_0_1},                          \
         {bags_##BITS##bit_d##D##_1_1_0, bags_##BITS##bit_d##D##_1_1_1}}};
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
    /* far loops prefetch into L2; a far table under the L1 policy takes the near loops (which
     * look 48 rows ahead for it) */
    const int far = pk_bags_far_table(rows, (uint64_t)row_bytes)
                    && pk_far_prefetch_mode() == PK_FAR_INTO_L2;
    const int i64 = bags->index_64 != 0, weighted = bags->weights != NULL;
#if defined(__ARM_FEATURE_SVE)
    if (dim > 0 && svcntw() > 4) {   /* SVE wider than NEON: the length-agnostic loop */
        if (bits == 8) return pk_sve_bags_q8(bags, packed, rows, dim, row_bytes, bad_pos);
        if (bits == 4) return pk_sve_bags_q4(bags, packed, rows, dim, row_bytes, bad_pos);
        return pk_sve_bags_q2(bags, packed, rows, dim, row_bytes, bad_pos);
    }
#endif
#define BY_DIM(BITS)                                                                              \
    switch (row_bytes == (int64_t)pk_quantized_row_bytes(BITS, (size_t)dim) ? dim : 0) {          \
    case 32: return bags_##BITS##bit_d32[far][i64][weighted](bags, packed, rows, dim, row_bytes, bad_pos); \
    case 64: return bags_##BITS##bit_d64[far][i64][weighted](bags, packed, rows, dim, row_bytes, bad_pos); \
    case 128: return bags_##BITS##bit_d128[far][i64][weighted](bags, packed, rows, dim, row_bytes, bad_pos); \
    case 256: return bags_##BITS##bit_d256[far][i64][weighted](bags, packed, rows, dim, row_bytes, bad_pos); \
    default: return bags_##BITS##bit_d0[far][i64][weighted](bags, packed, rows, dim, row_bytes, bad_pos); \
    }
    if (bits == 8) BY_DIM(8)
    if (bits == 4) BY_DIM(4)
#undef BY_DIM
    return bags_2bit_d0[far][i64][weighted](bags, packed, rows, dim, row_bytes, bad_pos);
}

#endif
