/* The bag loop of every table format, written once over the SIMD primitives of the vector levels
 * (the generated per-level file includes simd/<isa>.h first; embedding/body.h and
 * quantized/bags.h include this and plan the passes over a bag's columns).
 *
 * pk_bag_pass sums one column block [col, col + NV * VL + tail) of one bag into its output row,
 * FBGEMM style: the block's slice of the output row is held in NV (+1) vector registers while the
 * bag's rows are walked in index order.  A table format supplies two things, both here:
 *
 *   - a block load: VL elements of a row as floats (common/float_rows.h for float32, float16 and
 *     bfloat16; common/packed_codes.h for 8-, 4- and 2-bit codes, 4-bit ones two vectors at a time);
 *   - a per-row step: float rows add w * x; packed rows read the row's scale and bias first and
 *     add (w * scale) * q, summing w * bias apart, added once at the store.
 *
 * Everything else is written once: the index check (one unsigned compare, before the row is
 * touched), the prefetch of the row `distance` indices ahead, padding, per-sample and positional
 * weights, two accumulator sets for narrow float blocks, mode "mean", and the store into an output
 * row of any stride (bags->out_stride: a column slice of a wider output is written in place).
 * NV, the tail's presence and every option are compile-time constants at each call, and each
 * planner compiles one noinline function per combination, so no option is tested in the row loop
 * and the accumulators stay in registers. */
#ifndef PK_COMMON_BAG_LOOP_H
#define PK_COMMON_BAG_LOOP_H

#include "perfkernels/bags.h"
#include "common/float_rows.h"
#include "common/packed_rows.h"
#include "common/packed_codes.h"

/* The table formats: float_rows.h's three, then the packed ones. */
enum { PK_BAG_F32 = PK_ROW_F32, PK_BAG_F16 = PK_ROW_F16, PK_BAG_BF16 = PK_ROW_BF16,
       PK_BAG_Q8 = 3, PK_BAG_Q4 = 4, PK_BAG_Q2 = 5 };
#define PK_BAG_PACKED(format) ((format) >= PK_BAG_Q8)
PK_INLINE int pk_bag_bits(const int format)
{
    return format == PK_BAG_Q8 ? 8 : format == PK_BAG_Q4 ? 4 : 2;
}

/* How entry j of bag [begin, end) is weighted.  WEIGHTED: per sample or positional, read from
 * the call (bags->positional), for planners that compile one loop for both. */
enum { PK_BAG_UNWEIGHTED, PK_BAG_PER_SAMPLE, PK_BAG_POSITIONAL, PK_BAG_WEIGHTED };

/* The widest block a planner may ask for: 16 vectors (AVX2's unweighted float pass and 16-bit
 * D = 128; AVX-512's half of its registers, its packed D = 128 / 256 blocks).  AVX2's packed
 * blocks are at most 8 vectors (quantized/bags.h). */
#define PK_BAG_MAX_BLOCK 16
/* Narrow blocks alternate rows between two accumulator sets when both fit in a quarter of the
 * registers (below). */
#define PK_BAG_SPLIT_VECS (V_REGS / 4)

/* A table as the loop reads it, filled once per call. */
typedef struct pk_bag_table {
    const char *base;      /* row 0 */
    int64_t rows;
    size_t row_bytes;      /* from one row to the next */
    size_t codes_bytes;    /* packed formats: the codes before each row's trailer */
    int far_table;         /* pk_bags_far_table(rows, row_bytes): rows come from DRAM */
} pk_bag_table;

PK_INLINE pk_bag_table pk_bag_table_of(const void *base, int64_t rows, size_t row_bytes,
                                       size_t codes_bytes)
{
    const pk_bag_table t = {(const char *)base, rows, row_bytes, codes_bytes,
                            pk_bags_far_table(rows, (uint64_t)row_bytes)};
    return t;
}

/* Bytes of one element of a float format. */
PK_INLINE size_t pk_bag_elem(const int format) { return format == PK_BAG_F32 ? 4 : 2; }

/* How many indices ahead a row is prefetched.  Far tables (include/perfkernels/bags.h): 48, into
 * L2 (`far`), or into L1 where the far-prefetch policy says L1.  Otherwise FBGEMM's 16, doubled
 * for float blocks of at most 128 bytes (16-bit rows of D <= 64, float rows of D <= 32): a short
 * row is summed in few cycles, so 16 rows ahead is too little time for an L3 / DRAM miss when most
 * rows hit in cache (skewed indices); for longer blocks 16 is enough, and 32 ahead only evicts
 * rows still to be used.  (On an AMD EPYC, an L3-resident 20K x 128 table: 8 or 28 ahead for
 * blocks of 256 bytes and more were 4-9% slower than 16.)  Packed rows keep 16 at every size: the
 * doubling was measured on float rows only, and a packed row costs more cycles per byte. */
PK_INLINE int64_t pk_bag_distance(const int format, size_t block_bytes, const int far,
                                  int far_table)
{
    if (far || far_table) return PK_BAGS_FAR_DISTANCE;
    return !PK_BAG_PACKED(format) && block_bytes <= 128 ? 2 * PK_BAGS_PREFETCH_DISTANCE
                                                        : PK_BAGS_PREFETCH_DISTANCE;
}

/* Prefetch nbytes from p, into L2 (`far`) or L1.
 *
 * Float blocks: one prefetch per 64 bytes from the start of the block (nbytes is a compile-time
 * constant for a fixed D, so this unrolls), as FBGEMM does; where the blocks do not start on a
 * line (`straddle`: NumPy's arrays start 16 bytes past one, or the rows are not whole lines), the
 * block's last byte too, whose line the others then miss.  Without it each row of a 1M x 64
 * float16 NumPy table costs a demand miss to DRAM: 4.5x slower than on a placed table on an AMD
 * EPYC, and behind PyTorch there.  Blocks that start on lines get no extra prefetch.
 *
 * Packed rows (the whole row, trailer included, once per bag: by the first pass): far, the first
 * byte, the last byte and every 64th byte from the first that is more than 64 bytes before the last
 * (every line of a row of up to 64 bytes and of a 72-byte row at an 8-byte offset); near, every
 * line.  The address is formed in integers: an unchecked index is harmless to a prefetch. */
PK_INLINE void pk_bag_prefetch(uintptr_t p, size_t nbytes, const int format, const int far,
                               const int straddle)
{
    if (PK_BAG_PACKED(format)) {
        if (far) {
            pk_prefetch_t1((const char *)p);
            for (size_t off = 64; off + 64 < nbytes; off += 64) pk_prefetch_t1((const char *)(p + off));
            pk_prefetch_t1((const char *)(p + nbytes - 1));
        } else {
            for (size_t off = 0; off < nbytes; off += 64) pk_prefetch_t0((const char *)(p + off));
            if (nbytes % 64 != 1) pk_prefetch_t0((const char *)(p + nbytes - 1));
        }
    } else if (far) {
        PK_UNROLL(PK_BAG_MAX_BLOCK)
        for (size_t off = 0; off < nbytes; off += 64) pk_prefetch_t1((const char *)(p + off));
        if (straddle) pk_prefetch_t1((const char *)(p + nbytes - 1));
    } else {
        PK_UNROLL(PK_BAG_MAX_BLOCK)
        for (size_t off = 0; off < nbytes; off += 64) pk_prefetch_t0((const char *)(p + off));
        if (straddle) pk_prefetch_t0((const char *)(p + nbytes - 1));
    }
}

/* Add the block of row indices[j] (times its weight, and for packed rows its scale) to acc: the
 * index is checked before its row is touched; with `prefetch`, the row `distance` indices ahead
 * (which exists) is prefetched.  Padding entries are skipped only where the call may have a
 * padding_idx (`padded`), and counted (*skipped: mean divides by the non-padding entries).  A
 * packed row adds its w * bias to *bias_sum.  Returns 0, or 1 for a bad index. */
PK_INLINE int pk_bag_add_row(const void *indices, int64_t padding, const float *weights,
                             int64_t wofs, const char *start, uint64_t rows, size_t row_bytes,
                             size_t codes_bytes, int64_t j, int64_t col, v_tail tail, vf *acc,
                             int64_t *skipped, float *bias_sum, const int NV, const int has_tail,
                             const int format, const int idx64, const int weighting,
                             const int padded, const int far, const int straddle,
                             const int64_t distance, size_t pf_bytes,
                             const int prefetch)
{
    const int64_t idx = pk_index_at(indices, j, idx64);
    if ((uint64_t)idx >= rows) return 1;
    if (prefetch) {
        const int64_t ahead = pk_index_at(indices, j + distance, idx64);
        /* a packed row's address is formed unchecked; a float row's only for a valid index */
        if (PK_BAG_PACKED(format) || (uint64_t)ahead < rows)
            pk_bag_prefetch((uintptr_t)start + (uint64_t)ahead * row_bytes,
                            pf_bytes, format, far, straddle);
    }
    if (padded && idx == padding) {
        ++*skipped;
        return 0;
    }
    /* the block's start (a packed row's first byte), so that each vector is a constant offset
     * from one register */
    const char *block = start + (size_t)idx * row_bytes;
    const float w = weighting == PK_BAG_UNWEIGHTED ? 1.0f
                    : weights[weighting == PK_BAG_PER_SAMPLE ? j : j - wofs];
    if (!PK_BAG_PACKED(format)) {
        if (weighting == PK_BAG_UNWEIGHTED) {  /* acc + x is fma(1, x, acc) exactly, and needs no
                                                * register for 1 */
            PK_UNROLL(PK_BAG_MAX_BLOCK)
            for (int v = 0; v < NV; v++) acc[v] = v_add(acc[v], pk_load_float_row(block, v * VL, format));
            if (has_tail)
                acc[NV] = v_add(acc[NV], pk_load_float_row_tail(block, NV * VL, tail, format));
            return 0;
        }
        const vf vw = v_set1(w);
        PK_UNROLL(PK_BAG_MAX_BLOCK)
        for (int v = 0; v < NV; v++) acc[v] = v_fmadd(vw, pk_load_float_row(block, v * VL, format), acc[v]);
        if (has_tail)
            acc[NV] = v_fmadd(vw, pk_load_float_row_tail(block, NV * VL, tail, format), acc[NV]);
        return 0;
    }
    const int bits = pk_bag_bits(format);
    const uint8_t *codes = (const uint8_t *)block;
    float scale, bias;
    pk_packed_trailer(bits, codes, codes_bytes, &scale, &bias);
    const vf ws = v_set1(weighting == PK_BAG_UNWEIGHTED ? scale : w * scale);
    *bias_sum += weighting == PK_BAG_UNWEIGHTED ? bias : w * bias;
    if (bits == 4 && NV % 2 == 0) {
        /* VL bytes give the block's even columns (low nibbles) and odd ones (high nibbles) of two
         * vectors, in two accumulators, interleaved once at the store; a tail after them on its
         * own.  (Without the pairs where there is a tail, D = 100 and 129 on AVX-512 took
         * 1.10-1.49x the time of the build before the one bag loop on an AMD EPYC Zen 4.) */
        PK_UNROLL(PK_BAG_MAX_BLOCK)
        for (int v = 0; v < NV; v += 2) {
            vf lo, hi;
            v_load_u4_pairs(codes + (col + VL * v) / 2, &lo, &hi);
            acc[v] = v_fmadd(lo, ws, acc[v]);
            acc[v + 1] = v_fmadd(hi, ws, acc[v + 1]);
        }
        if (has_tail)
            acc[NV] = v_fmadd(load_codes_tail(bits, codes, col + VL * NV, tail), ws, acc[NV]);
        return 0;
    }
    PK_UNROLL(PK_BAG_MAX_BLOCK)
    for (int v = 0; v < NV; v++)
        acc[v] = v_fmadd(load_codes(bits, codes, col + VL * v), ws, acc[v]);
    if (has_tail)
        acc[NV] = v_fmadd(load_codes_tail(bits, codes, col + VL * NV, tail), ws, acc[NV]);
    return 0;
}

/* Sum columns [col, col + NV*VL + tail) of bag [begin, end) of `bags` into out_row (the bag's
 * output row), prefetching rows ahead unless `prefetch` is 0 (a later pass over rows an earlier
 * one prefetched).  Narrow float blocks (the two sets together at most a quarter of the
 * registers) alternate rows between two accumulator sets: two independent FMA chains instead of
 * one, so a short row does not wait for the previous row's FMA latency; row j goes to set
 * (j - begin) % 2, so the sums do not depend on the rest of the call.  The rows that have a row to
 * prefetch ahead of them (all but the call's last few) run in a loop of their own, so only those
 * last few test whether they have one.  Returns PK_OK, or PK_ERR_INDEX with *bad_pos = j at the
 * first out-of-range index. */
PK_INLINE pk_status pk_bag_pass(const pk_bags *bags, const pk_bag_table *t, int64_t begin,
                                int64_t end, int64_t col, v_tail tail, float *out_row,
                                int64_t *bad_pos, int prefetch, const int NV, const int has_tail,
                                const int format, const int idx64, const int weighting,
                                const int padded, const int far)
{
    const int packed = PK_BAG_PACKED(format);
    const int split = !packed && (NV + has_tail) * 2 <= PK_BAG_SPLIT_VECS;
    const size_t block_bytes = packed ? 0
        : (size_t)(NV * VL + (has_tail ? v_tail_len(tail) : 0)) * pk_bag_elem(format);
    const int64_t distance = pk_bag_distance(format, block_bytes, far, t->far_table);
    /* struct fields in locals: the prefetches would otherwise make the compiler reload them */
    const void *indices = bags->indices;
    const int64_t padding = bags->padding_idx;
    const float *weights = bags->weights;
    const int64_t wofs = weighting == PK_BAG_POSITIONAL
                         || (weighting == PK_BAG_WEIGHTED && bags->positional) ? begin : 0;
    const char *base = t->base;
    const uint64_t rows = (uint64_t)t->rows;
    const size_t row_bytes = t->row_bytes, codes_bytes = t->codes_bytes;
    /* row 0's block: float rows, its first column; packed rows, the row */
    const char *start = base + (packed ? 0 : (size_t)col * pk_bag_elem(format));
    const size_t pf_bytes = packed ? row_bytes : block_bytes;
    /* do the blocks span one more line than their length needs?  (Always possible where rows
     * are not whole lines; otherwise every block starts at the same offset in its line.) */
    const size_t line_off = ((uintptr_t)start) % 64;
    const int straddle = !packed && (row_bytes % 64 != 0
                                     || line_off + block_bytes > (block_bytes + 63) / 64 * 64);
    const int64_t last_ahead = bags->n_indices - distance;
    const int64_t pf_end = !prefetch ? begin
                           : end < last_ahead ? end : (last_ahead > begin ? last_ahead : begin);
    vf acc[2][PK_BAG_MAX_BLOCK + 1];  /* constant indices only, so they live in registers */
    PK_UNROLL(PK_BAG_MAX_BLOCK + 1)
    for (int v = 0; v <= NV; v++) acc[0][v] = acc[1][v] = v_zero();
    int64_t skipped = 0, j = begin;
    float bias_sum = 0.0f;   /* packed rows: the sum of w * bias, added once per bag */
#define PK_BAG_ROW(J, SET, PREFETCH)                                                              \
    if (pk_bag_add_row(indices, padding, weights, wofs, start, rows, row_bytes, codes_bytes, (J), \
                       col, tail, acc[SET], &skipped, &bias_sum, NV, has_tail, format, idx64,     \
                       weighting, padded, far, straddle, distance, pf_bytes, (PREFETCH))) {       \
        *bad_pos = (J);                                                                           \
        return PK_ERR_INDEX;                                                                      \
    }
    if (split) {  /* row j goes to set (j - begin) % 2 wherever the call's index list ends */
        for (; j + 1 < pf_end; j += 2) {
            PK_BAG_ROW(j, 0, 1)
            PK_BAG_ROW(j + 1, 1, 1)
        }
        for (; j + 1 < end; j += 2) {
            PK_BAG_ROW(j, 0, j < pf_end)
            PK_BAG_ROW(j + 1, 1, 0)
        }
    } else {
        for (; j < pf_end; j++) {
            PK_BAG_ROW(j, 0, 1)
        }
    }
    for (; j < end; j++) {
        PK_BAG_ROW(j, 0, j < pf_end)
    }
#undef PK_BAG_ROW
    if (split) {
        PK_UNROLL(PK_BAG_MAX_BLOCK + 1)
        for (int v = 0; v <= NV; v++) acc[0][v] = v_add(acc[0][v], acc[1][v]);
    }
    if (packed && pk_bag_bits(format) == 4 && NV % 2 == 0) {
        PK_UNROLL(PK_BAG_MAX_BLOCK)
        for (int v = 0; v < NV; v += 2) v_zip(acc[0][v], acc[0][v + 1], &acc[0][v], &acc[0][v + 1]);
    }
    const int64_t count = end - begin - skipped;
    const vf scale = v_set1(bags->mean && count > 0 ? 1.0f / (float)count : 1.0f);
    if (packed) {   /* each row's w * bias, once */
        const vf vbias = v_set1(bias_sum);
        PK_UNROLL(PK_BAG_MAX_BLOCK + 1)
        for (int v = 0; v <= NV; v++) acc[0][v] = v_add(acc[0][v], vbias);
    }
    PK_UNROLL(PK_BAG_MAX_BLOCK)
    for (int v = 0; v < NV; v++) v_store(out_row + col + v * VL, v_mul(acc[0][v], scale));
    if (has_tail) v_store_tail(out_row + col + NV * VL, v_mul(acc[0][NV], scale), tail);
    return PK_OK;
}

/* A compiled loop of the engine: the planner PLAN of a table format (its pass plan over a bag's
 * columns) for one (format, D class, index width, weighting, padding, prefetch mode), given as the
 * constants after PLAN's run-time arguments, in a noinline function of its own, named NAME.  The
 * formats' kernels pick one from a table of these once per call.  Inlined all into one exported
 * kernel, the loop nests made one function too large for GCC's register allocator to treat each
 * loop on its own: it kept accumulators on the stack, a load and a store per row each (2 of the 15
 * of AVX2's 16-bit float pass, 2-4 of the 4-bit packed pass), and left a register unused; apart, no
 * accumulator of a pass within the register budget leaves the registers.  `row_stride` is the
 * format's own (elements of a float row, bytes of a packed one). */
typedef pk_status (*pk_bag_fn)(const pk_bags *bags, const void *table, int64_t rows, int64_t dim,
                               int64_t row_stride, int64_t *bad_pos);
#define PK_BAG_FN(NAME, PLAN, ...)                                                                 \
    static __attribute__((noinline)) pk_status NAME(const pk_bags *bags, const void *table,       \
                                                    int64_t rows, int64_t dim, int64_t row_stride, \
                                                    int64_t *bad_pos)                             \
    {                                                                                              \
        return PLAN(bags, table, rows, dim, row_stride, bad_pos, __VA_ARGS__);                    \
    }

#endif
