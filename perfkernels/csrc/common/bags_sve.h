/* Float-table (float32, float16, bfloat16) and packed-row (8/4/2-bit) bags in vector-length-agnostic SVE, for the sve level (simd/sve.h) on CPUs whose
 * vectors are wider than NEON's: the vector length is read at run time (svcntw() float lanes),
 * every load and store is predicated (svwhilelt), so any D and any length from 256 to 2048 bits
 * take the same code, and nothing past a row or an output row is touched.
 *
 * A pass sums up to PK_SVE_BAG_VECS vectors of one bag's columns over its rows, in registers:
 * acc = fma(w, x, acc) per row in index order (acc + x unweighted), then times 1/count for mean,
 * as the bag loop of the other levels does (common/bag_loop.h).  Every index is checked before
 * its row is read; the first bad one returns PK_ERR_INDEX with its position.  Rows are prefetched
 * PK_BAGS_PREFETCH_DISTANCE indices ahead, a prefetch per 64 bytes of the pass's columns.
 *
 * 128-bit SVE keeps the NEON body (the same width, and NEON's code is at least as fast there). */
#ifndef PK_COMMON_BAGS_SVE_H
#define PK_COMMON_BAGS_SVE_H

#if defined(__ARM_FEATURE_SVE)
#include <arm_sve.h>
#include <string.h>

#include "perfkernels/bags.h"

#define PK_SVE_BAG_VECS 8

PK_INLINE int64_t pk_sve_index(const void *indices, int64_t j, int idx64)
{
    return idx64 ? ((const int64_t *)indices)[j] : (int64_t)((const int32_t *)indices)[j];
}

/* The float row formats of these loops: float32, float16 and bfloat16 elements. */
enum { PK_SVE_F32 = 0, PK_SVE_F16 = 1, PK_SVE_BF16 = 2 };

/* Elements [off, off + lanes of pg) of a row as float32: 16-bit ones widened in the load
 * (svld1uh_u32 puts each in the low half of its 32-bit lane), float16 then converted exactly
 * (svcvt_f32_f16 reads the low halves), bfloat16 shifted into the high half (exact). */
PK_INLINE svfloat32_t pk_sve_load_row(svbool_t pg, const void *row, int64_t off, const int fmt)
{
    if (fmt == PK_SVE_F32) return svld1_f32(pg, (const float *)row + off);
    const svuint32_t h = svld1uh_u32(pg, (const uint16_t *)row + off);
    if (fmt == PK_SVE_F16) return svcvt_f32_f16_x(pg, svreinterpret_f16_u32(h));
    return svreinterpret_f32_u32(svlsl_n_u32_x(pg, h, 16));
}

/* One pass: columns [col, col + n) with n <= NV * svcntw(), of bag [begin, end); NV, the vectors
 * of the pass, and the weighting are constants where it is called, so each specialisation keeps
 * only its own accumulators and no test per vector. */
PK_INLINE pk_status pk_sve_bag_pass(const pk_bags *bags, const void *table, int64_t rows,
                                    int64_t row_stride, int64_t begin, int64_t end, int64_t col,
                                    int64_t n, float *out_row, int64_t *bad_pos, const int nv,
                                    const int weighted, const int fmt)
{
    const int64_t elem = fmt == PK_SVE_F32 ? 4 : 2;
    const int64_t vl = (int64_t)svcntw();
    /* sizeless types make no arrays: eight predicates and accumulators by name */
#define PK_SVE_PRED(V) const svbool_t pg##V = svwhilelt_b32_s64((int64_t)V * vl, n);
    PK_SVE_PRED(0) PK_SVE_PRED(1) PK_SVE_PRED(2) PK_SVE_PRED(3)
    PK_SVE_PRED(4) PK_SVE_PRED(5) PK_SVE_PRED(6) PK_SVE_PRED(7)
#undef PK_SVE_PRED
    svfloat32_t a0 = svdup_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    const void *indices = bags->indices;
    const int idx64 = bags->index_64;
    const float *weights = bags->weights;
    const int64_t wofs = bags->positional ? begin : 0, padding = bags->padding_idx;
    const size_t pf_bytes = (size_t)(n * elem);
    int64_t skipped = 0;
    for (int64_t j = begin; j < end; j++) {
        const int64_t idx = pk_sve_index(indices, j, idx64);
        if ((uint64_t)idx >= (uint64_t)rows) {
            *bad_pos = j;
            return PK_ERR_INDEX;
        }
        if (j + PK_BAGS_PREFETCH_DISTANCE < bags->n_indices) {
            const int64_t ahead = pk_sve_index(indices, j + PK_BAGS_PREFETCH_DISTANCE, idx64);
            if ((uint64_t)ahead < (uint64_t)rows) {
                const char *p = (const char *)table + (ahead * row_stride + col) * elem;
                for (size_t off = 0; off < pf_bytes; off += 64) __builtin_prefetch(p + off, 0, 3);
            }
        }
        if (idx == padding) {
            skipped++;
            continue;
        }
        const char *x = (const char *)table + (idx * row_stride + col) * elem;
        if (!weighted) {
#define PK_SVE_ADD(V) if (nv > V) a##V = svadd_f32_m(pg##V, a##V, pk_sve_load_row(pg##V, x, V * vl, fmt));
            PK_SVE_ADD(0) PK_SVE_ADD(1) PK_SVE_ADD(2) PK_SVE_ADD(3)
            PK_SVE_ADD(4) PK_SVE_ADD(5) PK_SVE_ADD(6) PK_SVE_ADD(7)
#undef PK_SVE_ADD
        } else {
            const svfloat32_t w = svdup_n_f32(weights[j - wofs]);
#define PK_SVE_FMA(V) if (nv > V) a##V = svmla_f32_m(pg##V, a##V, w, pk_sve_load_row(pg##V, x, V * vl, fmt));
            PK_SVE_FMA(0) PK_SVE_FMA(1) PK_SVE_FMA(2) PK_SVE_FMA(3)
            PK_SVE_FMA(4) PK_SVE_FMA(5) PK_SVE_FMA(6) PK_SVE_FMA(7)
#undef PK_SVE_FMA
        }
    }
    const int64_t count = end - begin - skipped;
    const svfloat32_t scale = svdup_n_f32(bags->mean && count > 0 ? 1.0f / (float)count : 1.0f);
    float *o = out_row + col;
#define PK_SVE_STORE(V) if (nv > V) svst1_f32(pg##V, o + V * vl, svmul_f32_x(pg##V, a##V, scale));
    PK_SVE_STORE(0) PK_SVE_STORE(1) PK_SVE_STORE(2) PK_SVE_STORE(3)
    PK_SVE_STORE(4) PK_SVE_STORE(5) PK_SVE_STORE(6) PK_SVE_STORE(7)
#undef PK_SVE_STORE
    return PK_OK;
}

/* The passes over every bag: columns [col, col + n) in passes of up to PK_SVE_BAG_VECS vectors,
 * PASS(NV) summing one with NV vectors (a constant there, so each keeps only its accumulators). */
#define PK_SVE_FOR_PASSES(DIM, PASS)                                                              \
    const int64_t vl = (int64_t)svcntw(), chunk = PK_SVE_BAG_VECS * vl;                            \
    for (int64_t b = 0; b < bags->num_bags; b++) {                                                 \
        const int64_t begin = bags->offsets[b], end = bags->offsets[b + 1];                        \
        float *out = bags->out + b * bags->out_stride;                                             \
        for (int64_t col = 0; col < (DIM); col += chunk) {                                         \
            const int64_t n = (DIM) - col < chunk ? (DIM) - col : chunk;                           \
            pk_status s;                                                                           \
            switch ((n + vl - 1) / vl) {                                                           \
            case 1: s = PASS(1); break;                                                            \
            case 2: s = PASS(2); break;                                                            \
            case 3: s = PASS(3); break;                                                            \
            case 4: s = PASS(4); break;                                                            \
            case 5: s = PASS(5); break;                                                            \
            case 6: s = PASS(6); break;                                                            \
            case 7: s = PASS(7); break;                                                            \
            default: s = PASS(8);                                                                  \
            }                                                                                      \
            if (s != PK_OK) return s;                                                              \
        }                                                                                          \
    }                                                                                              \
    return PK_OK;

/* Every bag of a float table, in passes (PK_SVE_FOR_PASSES). dim > 0. */
PK_INLINE pk_status pk_sve_bags_w(const pk_bags *bags, const void *table, int64_t rows,
                                  int64_t dim, int64_t row_stride, int64_t *bad_pos,
                                  const int weighted, const int fmt)
{
#define PK_SVE_FLOAT_PASS(NV) pk_sve_bag_pass(bags, table, rows, row_stride, begin, end, col, n, \
                                              out, bad_pos, NV, weighted, fmt)
    PK_SVE_FOR_PASSES(dim, PK_SVE_FLOAT_PASS)
#undef PK_SVE_FLOAT_PASS
}

/* Bags over a float32, float16 or bfloat16 table (row_stride in elements). dim > 0. */
#define PK_SVE_BAGS_FN(NAME, FMT)                                                                \
    static __attribute__((noinline)) pk_status NAME(const pk_bags *bags, const void *table,       \
                                                    int64_t rows, int64_t dim, int64_t row_stride, \
                                                    int64_t *bad_pos)                             \
    {                                                                                              \
        if (bags->weights == NULL)                                                                 \
            return pk_sve_bags_w(bags, table, rows, dim, row_stride, bad_pos, 0, FMT);            \
        return pk_sve_bags_w(bags, table, rows, dim, row_stride, bad_pos, 1, FMT);                \
    }
PK_SVE_BAGS_FN(pk_sve_bags_f32, PK_SVE_F32)
PK_SVE_BAGS_FN(pk_sve_bags_f16, PK_SVE_F16)
PK_SVE_BAGS_FN(pk_sve_bags_bf16, PK_SVE_BF16)
#undef PK_SVE_BAGS_FN

/* Codes [c0, c0 + lanes of pg) of a packed row as float32, c0 = col + V * vl.  8-bit codes are
 * widened in the load; 4-bit ones (two a byte, low nibble first) come from the vl / 2 bytes that
 * hold them, split into low and high nibbles and interleaved (svzip1), 2-bit ones likewise from
 * vl / 4 bytes; the loads are predicated on the row's code bytes (nb: bytes of the pass's columns
 * from byte col * bits / 8 on), so they never read past them. */
PK_INLINE svfloat32_t pk_sve_load_codes(svbool_t pg, const uint8_t *codes, int64_t col, int64_t v0,
                                        int64_t nb, const int bits)
{
    if (bits == 8) return svcvt_f32_u32_x(pg, svld1ub_u32(pg, codes + col + v0));
    const svbool_t all = svptrue_b32();
    if (bits == 4) {
        const svbool_t pb = svwhilelt_b32_s64(v0 / 2, nb);
        const svuint32_t b = svld1ub_u32(pb, codes + col / 2 + v0 / 2);
        const svuint32_t q = svzip1_u32(svand_n_u32_x(all, b, 0xF), svlsr_n_u32_x(all, b, 4));
        return svcvt_f32_u32_x(pg, q);
    }
    /* 2-bit: four codes a byte, lowest bits first; (c0, c1) and (c2, c3) interleaved, then the
     * pairs interleaved as 64-bit elements: c0 c1 c2 c3 of byte 0, then of byte 1, ... */
    const svbool_t pb = svwhilelt_b32_s64(v0 / 4, nb);
    const svuint32_t b = svld1ub_u32(pb, codes + col / 4 + v0 / 4);
    const svuint32_t c0 = svand_n_u32_x(all, b, 3), c1 = svand_n_u32_x(all, svlsr_n_u32_x(all, b, 2), 3);
    const svuint32_t c2 = svand_n_u32_x(all, svlsr_n_u32_x(all, b, 4), 3), c3 = svlsr_n_u32_x(all, b, 6);
    const svuint64_t lo = svreinterpret_u64_u32(svzip1_u32(c0, c1));
    const svuint64_t hi = svreinterpret_u64_u32(svzip1_u32(c2, c3));
    return svcvt_f32_u32_x(pg, svreinterpret_u32_u64(svzip1_u64(lo, hi)));
}

/* Packed rows of 8, 4 or 2 bits (common/packed_rows.h: the codes, then the scale and bias, float32
 * after 8-bit codes, float16 after 4- and 2-bit ones), the same passes: per row acc = fma(q, w * scale,
 * acc), w * bias summed apart and added once at the store, then times 1/count for mean: the bag
 * loop's order (common/bag_loop.h), so the sums are those of the NEON body.  Only the first pass
 * over a bag prefetches, whole rows (as the bag loop's packed passes do). */
PK_INLINE pk_status pk_sve_packed_pass(const pk_bags *bags, const uint8_t *table, int64_t rows,
                                       int64_t row_bytes, int64_t dim, int64_t begin, int64_t end,
                                       int64_t col, int64_t n, float *out_row, int64_t *bad_pos,
                                       const int nv, const int weighted, const int bits)
{
    const int64_t vl = (int64_t)svcntw();
    const int64_t per = 8 / bits, codes_bytes = (dim + per - 1) / per, nb = (n + per - 1) / per;
#define PK_SVE_PRED(V) const svbool_t pg##V = svwhilelt_b32_s64((int64_t)V * vl, n);
    PK_SVE_PRED(0) PK_SVE_PRED(1) PK_SVE_PRED(2) PK_SVE_PRED(3)
    PK_SVE_PRED(4) PK_SVE_PRED(5) PK_SVE_PRED(6) PK_SVE_PRED(7)
#undef PK_SVE_PRED
    svfloat32_t a0 = svdup_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    const void *indices = bags->indices;
    const int idx64 = bags->index_64;
    const float *weights = bags->weights;
    const int64_t wofs = bags->positional ? begin : 0, padding = bags->padding_idx;
    const int prefetch = col == 0;
    int64_t skipped = 0;
    float bias_sum = 0.0f;
    for (int64_t j = begin; j < end; j++) {
        const int64_t idx = pk_sve_index(indices, j, idx64);
        if ((uint64_t)idx >= (uint64_t)rows) {
            *bad_pos = j;
            return PK_ERR_INDEX;
        }
        if (prefetch && j + PK_BAGS_PREFETCH_DISTANCE < bags->n_indices) {
            const int64_t ahead = pk_sve_index(indices, j + PK_BAGS_PREFETCH_DISTANCE, idx64);
            if ((uint64_t)ahead < (uint64_t)rows) {
                const char *p = (const char *)(table + ahead * row_bytes);
                for (int64_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(p + off, 0, 3);
            }
        }
        if (idx == padding) {
            skipped++;
            continue;
        }
        const uint8_t *row = table + idx * row_bytes;
        float scale, bias;
        if (bits == 8) {
            memcpy(&scale, row + dim, 4);
            memcpy(&bias, row + dim + 4, 4);
        } else {    /* float16 scale and bias: exact conversions */
            __fp16 h[2];
            memcpy(h, row + codes_bytes, 4);
            scale = (float)h[0];
            bias = (float)h[1];
        }
        const float w = weighted ? weights[j - wofs] : 1.0f;
        const svfloat32_t ws = svdup_n_f32(weighted ? w * scale : scale);
        bias_sum += weighted ? w * bias : bias;
#define PK_SVE_Q8(V) if (nv > V) a##V = svmla_f32_m(pg##V, a##V, \
                         pk_sve_load_codes(pg##V, row, col, (int64_t)V * vl, nb, bits), ws);
        PK_SVE_Q8(0) PK_SVE_Q8(1) PK_SVE_Q8(2) PK_SVE_Q8(3)
        PK_SVE_Q8(4) PK_SVE_Q8(5) PK_SVE_Q8(6) PK_SVE_Q8(7)
#undef PK_SVE_Q8
    }
    const int64_t count = end - begin - skipped;
    const svfloat32_t mul = svdup_n_f32(bags->mean && count > 0 ? 1.0f / (float)count : 1.0f);
    const svfloat32_t vbias = svdup_n_f32(bias_sum);
    float *o = out_row + col;
#define PK_SVE_STORE(V) if (nv > V) svst1_f32(pg##V, o + V * vl, \
                            svmul_f32_x(pg##V, svadd_f32_x(pg##V, a##V, vbias), mul));
    PK_SVE_STORE(0) PK_SVE_STORE(1) PK_SVE_STORE(2) PK_SVE_STORE(3)
    PK_SVE_STORE(4) PK_SVE_STORE(5) PK_SVE_STORE(6) PK_SVE_STORE(7)
#undef PK_SVE_STORE
    return PK_OK;
}

/* Every bag of a packed table, in passes (PK_SVE_FOR_PASSES). dim > 0. */
PK_INLINE pk_status pk_sve_bags_packed_w(const pk_bags *bags, const uint8_t *table, int64_t rows,
                                         int64_t dim, int64_t row_bytes, int64_t *bad_pos,
                                         const int weighted, const int bits)
{
#define PK_SVE_PACKED_PASS(NV) pk_sve_packed_pass(bags, table, rows, row_bytes, dim, begin, end, \
                                                  col, n, out, bad_pos, NV, weighted, bits)
    PK_SVE_FOR_PASSES(dim, PK_SVE_PACKED_PASS)
#undef PK_SVE_PACKED_PASS
}

/* Bags over packed rows of 8, 4 or 2 bits, row_bytes bytes each (at least the codes and the
 * trailer). dim > 0. */
#define PK_SVE_PACKED_FN(NAME, BITS)                                                             \
    static __attribute__((noinline)) pk_status NAME(const pk_bags *bags, const uint8_t *table,    \
                                                    int64_t rows, int64_t dim, int64_t row_bytes,  \
                                                    int64_t *bad_pos)                             \
    {                                                                                              \
        if (bags->weights == NULL)                                                                 \
            return pk_sve_bags_packed_w(bags, table, rows, dim, row_bytes, bad_pos, 0, BITS);     \
        return pk_sve_bags_packed_w(bags, table, rows, dim, row_bytes, bad_pos, 1, BITS);         \
    }
PK_SVE_PACKED_FN(pk_sve_bags_q8, 8)
PK_SVE_PACKED_FN(pk_sve_bags_q4, 4)
PK_SVE_PACKED_FN(pk_sve_bags_q2, 2)
#undef PK_SVE_PACKED_FN

#endif /* __ARM_FEATURE_SVE */
#endif
