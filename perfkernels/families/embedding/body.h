/* The embedding bags of float32, float16 and bfloat16 tables for the vector levels (simd/avx2.h,
 * simd/avx512.h; the generated per-level file includes the primitive header, then this): the
 * passes of common/bag_loop.h over each bag's columns.
 *
 * One bag's output row is held in vector registers while its rows are summed (acc = fma(w, x, acc)),
 * FBGEMM style.  A pass sums NV full VL-float vectors (plus an optional tail vector) of one
 * column block; NV and the table / index types are compile-time constants at every call, so each
 * specialisation keeps its accumulators in registers.  D = 16 .. 256 (powers of two) with
 * D <= MAX_VECS * VL are single passes, and so is an unweighted float32 D = 128 on AVX2 (all 16
 * registers, WIDE_VECS); otherwise AVX2's D = 128, 256 are several passes over the bag (whose rows
 * stay in L1 between passes): of 8 vectors, or for an unweighted bag as wide as the registers allow
 * (a 16-bit D = 128: one of 16; a float32 D = 256: 16 and 16); any other D is cut into blocks of
 * MAX_VECS, 8, 4, 2, 1 vectors and a tail (a masked load, or a bounded copy where the ISA has no
 * masked 16-bit load; never touching memory past the row). */
#ifndef PK_EMBEDDING_BODY_H
#define PK_EMBEDDING_BODY_H

#include "perfkernels/embedding.h"
#include "common/bag_loop.h"
#include "common/bags_sve.h"   /* the sve level's float32 bags (nothing elsewhere) */

/* Accumulators per pass: half the vector registers, the rest hold the weight and the loads. */
#define MAX_VECS (V_REGS / 2)
/* An unweighted float32 pass needs neither: vaddps takes the row straight from memory, so every
 * register can be an accumulator.  That turns AVX2's two passes over a D = 128 bag into one (each
 * row's index, check and prefetches paid once; the first pass no longer prefetches only half of
 * each row).  AVX-512 already sums D <= 256 in one pass and keeps MAX_VECS. */
#define WIDE_VECS (VL == 8 ? V_REGS : MAX_VECS)
_Static_assert(WIDE_VECS <= PK_BAG_MAX_BLOCK, "a pass fits the bag loop's accumulators");

/* The table types are the bag loop's float formats; the weightings its first three. */
enum { TABLE_F32 = PK_BAG_F32, TABLE_F16 = PK_BAG_F16, TABLE_BF16 = PK_BAG_BF16 };
enum { UNWEIGHTED = PK_BAG_UNWEIGHTED, PER_SAMPLE = PK_BAG_PER_SAMPLE, POSITIONAL = PK_BAG_POSITIONAL };

/* A pass over columns [col, col + NV * VL + tail).  Its rows are prefetched unless the block lies
 * in the lines an earlier pass of the bag prefetched (`fetched`, bytes from the row's start; only
 * where rows start on lines): AVX2's 16-bit D = 248 is two passes of 15 vectors, whose prefetches
 * cover the last vector's 16 bytes, then one of 1, which then reads each index once more and
 * nothing else. */
#define PASS(NV_, HAS_TAIL_, TAIL_)                                                               \
    do {                                                                                          \
        const size_t stop_ = (size_t)(col + (NV_) * VL + ((HAS_TAIL_) ? v_tail_len(TAIL_) : 0)) * elem; \
        const int fetch_ = !lined || stop_ > fetched;                                             \
        pk_status s_ = pk_bag_pass(bags, &t, begin, end, col, (TAIL_), out, bad_pos, fetch_,     \
                                   (NV_), (HAS_TAIL_), type, idx64, weighting, padded, far);      \
        if (s_ != PK_OK) return s_;                                                               \
        if (fetch_) fetched = (stop_ + 63) / 64 * 64;                                             \
        col += (NV_) * VL;                                                                        \
    } while (0)

/* D == NV * VL: one pass per bag, the whole row in NV registers. */
PK_INLINE pk_status bags_fixed(const pk_bags *bags, const void *table, int64_t rows,
                               int64_t row_stride, int64_t *bad_pos, const int NV,
                               const int type, const int idx64, const int weighting,
                               const int padded, const int far)
{
    const size_t elem = pk_bag_elem(type);
    const pk_bag_table t = pk_bag_table_of(table, rows, (size_t)row_stride * elem, 0);
    const int lined = 0;
    for (int64_t b = 0; b < bags->num_bags; b++) {
        const int64_t begin = bags->offsets[b], end = bags->offsets[b + 1];
        float *out = bags->out + b * bags->out_stride;
        int64_t col = 0;
        size_t fetched = 0;
        PASS(NV, 0, 0);
        (void)fetched;
    }
    return PK_OK;
}

/* Passes over a bag for `vecs` whole vectors in passes of `wide`, then of MAX_VECS, 8, 4, 2, 1 (as
 * bags_generic takes them; the tail's pass is the same either way). */
PK_INLINE int64_t pass_count(int64_t vecs, int64_t wide)
{
    const int64_t rest = vecs % wide;
    return vecs / wide + rest / MAX_VECS + __builtin_popcountll((unsigned long long)(rest % MAX_VECS));
}

/* Any D: blocks of MAX_VECS, 8, 4, 2, 1 vectors, then a tail; on AVX2 an unweighted bag first takes
 * passes as wide as the registers allow (below).  (An earlier measurement on a Xeon found passes
 * of WIDE_VECS for every D 4-6% slower at D = 256, 1000, 129; the AVX2 passes below were measured
 * on an AMD EPYC only.) */
PK_INLINE pk_status bags_generic(const pk_bags *bags, const void *table, int64_t rows,
                                 int64_t dim, int64_t row_stride, int64_t *bad_pos,
                                 const int type, const int idx64, const int weighting,
                                 const int padded, const int far)
{
    const size_t elem = pk_bag_elem(type), row_bytes = (size_t)row_stride * elem;
    const pk_bag_table t = pk_bag_table_of(table, rows, row_bytes, 0);
    const v_tail tail = v_tail_of((uint64_t)dim % VL);
    const int lined = (uintptr_t)table % 64 == 0 && row_bytes % 64 == 0;   /* rows start on lines */
#if VL == 8
    /* AVX2, unweighted: every register an accumulator (a float row is added straight from
     * memory), or for a 16-bit row all but the one it is widened into, FBGEMM's 15 (D = 120, 240,
     * 960 are passes of 15 and nothing else).  Where passes of 16 vectors take fewer passes
     * (D = 128, 256, 384, 512, 1024: 128 is one pass of 16 instead of 15 and 1) they win, although
     * GCC then keeps one accumulator on the stack (a store-forwarded load and store per row): each
     * pass more reads every index of the bag again.  (16-bit, L3-resident 20K x 128 table, AMD
     * EPYC, interleaved: 6-9% faster; D = 256 2-7%, D = 1024 4%.) */
    const int64_t whole = dim / VL;
    const int sixteen = type != TABLE_F32 && pass_count(whole, V_REGS) < pass_count(whole, V_REGS - 1);
#endif
    for (int64_t b = 0; b < bags->num_bags; b++) {
        const int64_t begin = bags->offsets[b], end = bags->offsets[b + 1];
        float *out = bags->out + b * bags->out_stride;
        int64_t col = 0;
        size_t fetched = 0;   /* the first bytes of a row that an earlier pass prefetched */
#if VL == 8
        /* AVX2, unweighted: passes as wide as the registers allow (below). */
        if (weighting == UNWEIGHTED) {
            if (type == TABLE_F32)
                while (dim - col >= V_REGS * VL) PASS(V_REGS, 0, 0);
            else if (sixteen)
                while (dim - col >= V_REGS * VL) PASS(V_REGS, 0, 0);
            else
                while (dim - col >= (V_REGS - 1) * VL) PASS(V_REGS - 1, 0, 0);
        }
#endif
        while (dim - col >= MAX_VECS * VL) PASS(MAX_VECS, 0, 0);
#if MAX_VECS > 8
        if (dim - col >= 8 * VL) PASS(8, 0, 0);
#endif
        if (dim - col >= 4 * VL) PASS(4, 0, 0);
        if (dim - col >= 2 * VL) PASS(2, 0, 0);
        if (dim - col >= 1 * VL) PASS(1, 0, 0);
        if (dim - col > 0) PASS(0, 1, tail);
    }
    return PK_OK;
}
#undef PASS

/* The single-pass D (16 .. 256 that fit MAX_VECS vectors, or WIDE_VECS) get their own
 * specialisation. */
PK_INLINE pk_status bags_by_dim(const pk_bags *bags, const void *table, int64_t rows,
                                int64_t dim, int64_t row_stride, int64_t *bad_pos,
                                const int type, const int idx64, const int weighting,
                                const int padded, const int far)
{
#if MAX_VECS * VL < 128 && WIDE_VECS * VL >= 128
    if (dim == 128 && type == TABLE_F32 && weighting == UNWEIGHTED)
        return bags_fixed(bags, table, rows, row_stride, bad_pos, 128 / VL, type, idx64, weighting, padded, far);
#endif
    switch (dim) {
    case 16: return bags_fixed(bags, table, rows, row_stride, bad_pos, 16 / VL, type, idx64, weighting, padded, far);
    case 32: return bags_fixed(bags, table, rows, row_stride, bad_pos, 32 / VL, type, idx64, weighting, padded, far);
    case 64: return bags_fixed(bags, table, rows, row_stride, bad_pos, 64 / VL, type, idx64, weighting, padded, far);
#if MAX_VECS * VL >= 128
    case 128: return bags_fixed(bags, table, rows, row_stride, bad_pos, 128 / VL, type, idx64, weighting, padded, far);
#endif
#if MAX_VECS * VL >= 256
    case 256: return bags_fixed(bags, table, rows, row_stride, bad_pos, 256 / VL, type, idx64, weighting, padded, far);
#endif
    default: return bags_generic(bags, table, rows, dim, row_stride, bad_pos, type, idx64, weighting, padded, far);
    }
}

/* The compiled loops (PK_BAG_FN): one per (table type, index width, weighting, padding, prefetch
 * mode). */
#define BAGS_FN(TYPE, IDX64, WEIGHTING, PADDED, FAR)                                               \
    PK_BAG_FN(bags_##TYPE##_##IDX64##_##WEIGHTING##_##PADDED##_##FAR, bags_by_dim, TYPE, IDX64,    \
              WEIGHTING, PADDED, FAR)
#define BAGS_FN_PF(T, I, W) BAGS_FN(T, I, W, 0, 0) BAGS_FN(T, I, W, 0, 1) BAGS_FN(T, I, W, 1, 0) \
                            BAGS_FN(T, I, W, 1, 1)
#define BAGS_FN_W(T, I) BAGS_FN_PF(T, I, UNWEIGHTED) BAGS_FN_PF(T, I, PER_SAMPLE) \
                        BAGS_FN_PF(T, I, POSITIONAL)
#define BAGS_FNS(T) BAGS_FN_W(T, 0) BAGS_FN_W(T, 1)                                               \
    static const pk_bag_fn bags_##T[2][3][2][2] = {BAGS_ROW_I(T, 0), BAGS_ROW_I(T, 1)};
#define BAGS_ROW_PF(T, I, W) {{bags_##T##_##I##_##W##_0_0, bags_##T##_##I##_##W##_0_1}, \
                              {bags_##T##_##I##_##W##_1_0, bags_##T##_##I##_##W##_1_1}}
#define BAGS_ROW_I(T, I) {BAGS_ROW_PF(T, I, UNWEIGHTED), BAGS_ROW_PF(T, I, PER_SAMPLE), \
                          BAGS_ROW_PF(T, I, POSITIONAL)}
BAGS_FNS(TABLE_F32)
BAGS_FNS(TABLE_F16)
BAGS_FNS(TABLE_BF16)
#undef BAGS_FNS
#undef BAGS_FN_W
#undef BAGS_FN_PF
#undef BAGS_FN
#undef BAGS_ROW_I
#undef BAGS_ROW_PF

PK_INLINE pk_status embedding_bag(const pk_bags *bags, const void *table, int64_t rows,
                                  int64_t dim, int64_t row_stride, int64_t *bad_pos,
                                  const int type)
{
    if (dim == 0) {  /* no row is read, but a bad index in these bags is still an error */
        const int64_t j = pk_bags_first_bad_in(bags, 0, bags->num_bags, rows);
        if (j >= 0) { *bad_pos = j; return PK_ERR_INDEX; }
        return PK_OK;
    }
    /* a call without padding_idx (the common one) compiles no padding test and no count */
    const int padded = bags->padding_idx >= 0;
    /* far loops prefetch into L2; a far table under the L1 policy takes the near loops (which
     * look 48 rows ahead for it) */
    const int far = pk_bags_far_table(rows, (uint64_t)row_stride * pk_bag_elem(type))
                    && pk_far_prefetch_mode() == PK_FAR_INTO_L2;
    const int weighting = bags->weights == NULL ? UNWEIGHTED : bags->positional ? POSITIONAL : PER_SAMPLE;
    const pk_bag_fn (*fns)[3][2][2] = type == TABLE_F32 ? bags_TABLE_F32
                                    : type == TABLE_F16 ? bags_TABLE_F16 : bags_TABLE_BF16;
    return fns[bags->index_64 != 0][weighting][padded][far](bags, table, rows, dim, row_stride, bad_pos);
}

/* The exported kernels (declared in perfkernels/embedding.h under their level's names). */
pk_status PK_ISA_FN(pk_embedding_bag_f32)(const pk_bags *bags, const void *table, int64_t rows,
                                          int64_t dim, int64_t row_stride, int64_t *bad_pos)
{
#if defined(__ARM_FEATURE_SVE)
    if (dim > 0 && svcntw() > 4)   /* SVE wider than NEON: the length-agnostic loop */
        return pk_sve_bags_f32(bags, table, rows, dim, row_stride, bad_pos);
#endif
    return embedding_bag(bags, table, rows, dim, row_stride, bad_pos, TABLE_F32);
}

pk_status PK_ISA_FN(pk_embedding_bag_f16)(const pk_bags *bags, const void *table, int64_t rows,
                                          int64_t dim, int64_t row_stride, int64_t *bad_pos)
{
#if defined(__ARM_FEATURE_SVE)
    if (dim > 0 && svcntw() > 4)
        return pk_sve_bags_f16(bags, table, rows, dim, row_stride, bad_pos);
#endif
    return embedding_bag(bags, table, rows, dim, row_stride, bad_pos, TABLE_F16);
}

pk_status PK_ISA_FN(pk_embedding_bag_bf16)(const pk_bags *bags, const void *table, int64_t rows,
                                           int64_t dim, int64_t row_stride, int64_t *bad_pos)
{
#if defined(__ARM_FEATURE_SVE)
    if (dim > 0 && svcntw() > 4)
        return pk_sve_bags_bf16(bags, table, rows, dim, row_stride, bad_pos);
#endif
    return embedding_bag(bags, table, rows, dim, row_stride, bad_pos, TABLE_BF16);
}

#endif
