/* The embedding-bag loops, written once over the SIMD primitives of the vector levels
 * (simd/avx2.h, simd/avx512.h; the generated per-level file includes the primitive header, then this).
 *
 * One bag's output row is held in vector registers while its rows are summed (acc = fma(w, x, acc)),
 * FBGEMM style.  `bag_pass` sums NV full VL-float vectors (plus an optional tail vector) of one
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

/* Accumulators per pass: half the vector registers, the rest hold the weight and the loads. */
#define MAX_VECS (V_REGS / 2)
/* An unweighted float32 pass needs neither: vaddps takes the row straight from memory, so every
 * register can be an accumulator.  That turns AVX2's two passes over a D = 128 bag into one (each
 * row's index, check and prefetches paid once; the first pass no longer prefetches only half of
 * each row).  AVX-512 already sums D <= 256 in one pass and keeps MAX_VECS. */
#define WIDE_VECS (VL == 8 ? V_REGS : MAX_VECS)

enum table_type { TABLE_F32, TABLE_F16, TABLE_BF16 };
enum weighting { UNWEIGHTED, PER_SAMPLE, POSITIONAL };

/* A block of a row as floats (common/float_rows.h; the table types are its formats). */
#include "common/float_rows.h"
#define load_row pk_load_float_row
#define load_row_tail pk_load_float_row_tail
_Static_assert(TABLE_F32 == PK_ROW_F32 && TABLE_F16 == PK_ROW_F16 && TABLE_BF16 == PK_ROW_BF16,
               "the table types are float_rows.h's formats");

/* How many indices ahead a block's row is prefetched: FBGEMM's 16, doubled for blocks of at most
 * 128 bytes (16-bit rows of D <= 64, float rows of D <= 32).  A short row is summed in few cycles,
 * so 16 rows ahead is too little time for an L3 / DRAM miss when most rows hit in cache (skewed
 * indices); for longer blocks 16 is enough, and 32 ahead only evicts rows still to be used.  (On an
 * AMD EPYC, an L3-resident 20K x 128 table: 8 or 28 ahead for blocks of 256 bytes and more were
 * 4-9% slower than 16.) */
#define PREFETCH_DISTANCE(block_bytes) \
    ((block_bytes) <= 128 ? 2 * PK_BAGS_PREFETCH_DISTANCE : PK_BAGS_PREFETCH_DISTANCE)

/* Far mode (include/perfkernels/bags.h: tables of PK_BAGS_FAR_MIN_BYTES and more, rows into L2,
 * PK_BAGS_FAR_DISTANCE indices ahead) is chosen once per call and compiled in. */
#define FAR_DISTANCE PK_BAGS_FAR_DISTANCE

/* One prefetch per 64 bytes from the start of the block (nbytes is a compile-time constant for the
 * fixed-D paths, so this unrolls), as FBGEMM does; where the blocks do not start on a line
 * (`straddle`: NumPy's arrays start 16 bytes past one, or the rows are not whole lines), the
 * block's last byte too, whose line the others then miss.  Without it each row of a 1M x 64
 * float16 NumPy table costs a demand miss to DRAM: 4.5x slower than on a placed table on an AMD
 * EPYC, and behind PyTorch there.  Blocks that start on lines (placed tables, torch's tensors)
 * get no extra prefetch. */
PK_INLINE void prefetch_bytes(const char *p, size_t nbytes, const int far, const int straddle)
{
    if (far) {
        PK_UNROLL(WIDE_VECS)
        for (size_t off = 0; off < nbytes; off += 64) pk_prefetch_t1(p + off);
        if (straddle) pk_prefetch_t1(p + nbytes - 1);
    } else {
        PK_UNROLL(WIDE_VECS)
        for (size_t off = 0; off < nbytes; off += 64) pk_prefetch_t0(p + off);
        if (straddle) pk_prefetch_t0(p + nbytes - 1);
    }
}

/* Add row indices[j] (times its weight) to acc: the index is checked before its row is touched;
 * with `prefetch`, the row `distance` indices ahead (which exists) is prefetched.  Padding entries
 * are skipped only where the call has a padding_idx (`padded`), and counted only there (mean
 * divides by the non-padding entries).  Returns 0, or 1 for a bad index. */
PK_INLINE int add_row(const void *indices, int64_t padding, const float *weights,
                      const char *table, int64_t rows, size_t row_bytes,
                      int64_t begin, int64_t j, int64_t col, v_tail tail, vf *acc,
                      int64_t *skipped, const int NV, const int has_tail, const int type,
                      const int idx64, const int weighting, const int padded, const int far,
                      const int straddle, const int64_t distance, const int prefetch)
{
    const size_t elem = type == TABLE_F32 ? 4 : 2;
    const size_t block_bytes = (size_t)(NV * VL + (has_tail ? v_tail_len(tail) : 0)) * elem;
    const int64_t idx = pk_index_at(indices, j, idx64);
    if ((uint64_t)idx >= (uint64_t)rows) return 1;
    if (prefetch) {
        const int64_t ahead = pk_index_at(indices, j + distance, idx64);
        if ((uint64_t)ahead < (uint64_t)rows)
            prefetch_bytes(table + (size_t)ahead * row_bytes + (size_t)col * elem, block_bytes, far,
                           straddle);
    }
    if (padded && idx == padding) {
        ++*skipped;
        return 0;
    }
    /* the block's start, so that each vector is a constant offset from one register */
    const char *block = table + (size_t)idx * row_bytes + (size_t)col * elem;
    if (weighting == UNWEIGHTED) {  /* acc + x is fma(1, x, acc) exactly, and needs no register for 1 */
        PK_UNROLL(WIDE_VECS)
        for (int v = 0; v < NV; v++) acc[v] = v_add(acc[v], load_row(block, v * VL, type));
        if (has_tail) acc[NV] = v_add(acc[NV], load_row_tail(block, NV * VL, tail, type));
        return 0;
    }
    const vf w = v_set1(weights[weighting == POSITIONAL ? j - begin : j]);
    PK_UNROLL(WIDE_VECS)
    for (int v = 0; v < NV; v++)
        acc[v] = v_fmadd(w, load_row(block, v * VL, type), acc[v]);
    if (has_tail)
        acc[NV] = v_fmadd(w, load_row_tail(block, NV * VL, tail, type), acc[NV]);
    return 0;
}

/* Sum columns [col, col + NV*VL + tail) of bag [begin, end) into out_row.  Narrow blocks (the two
 * sets together at most half the MAX_VECS accumulators) alternate rows between two accumulator
 * sets: two independent FMA chains instead of one, so a short row does not wait for the previous
 * row's FMA latency; row j goes to set (j - begin) % 2, so the sums do not depend on the rest of the
 * call.  The rows that have a row to prefetch ahead of them (all but the call's last few) run in a
 * loop of their own, so only those last few test whether they have one. */
PK_INLINE pk_status bag_pass(const pk_bags *bags, const char *table, int64_t rows,
                             size_t row_bytes, int64_t begin, int64_t end, int64_t col,
                             v_tail tail, float *out_row, int64_t *bad_pos, int prefetch,
                             const int NV, const int has_tail, const int type, const int idx64,
                             const int weighting, const int padded, const int far)
{
    /* struct fields in locals: the prefetches would otherwise make the compiler reload them */
    const void *indices = bags->indices;
    const int64_t padding = bags->padding_idx;
    const float *weights = bags->weights;
    const int split = (NV + has_tail) * 2 <= MAX_VECS / 2;
    const size_t elem = type == TABLE_F32 ? 4 : 2;
    const size_t block_bytes = (size_t)(NV * VL + (has_tail ? v_tail_len(tail) : 0)) * elem;
    /* near rows into L1, far ones into L2 (`far`), or into L1 48 ahead too: a far table whose
     * call went to a near loop (where the far-prefetch policy says L1) */
    const int64_t distance = far || pk_bags_far_table(rows, row_bytes) ? FAR_DISTANCE
                                                                        : PREFETCH_DISTANCE(block_bytes);
    /* do the blocks span one more line than their length needs?  (Always possible where rows
     * are not whole lines; otherwise every block starts at the same offset in its line.) */
    const size_t line_off = ((uintptr_t)table + (size_t)col * elem) % 64;
    const int straddle = row_bytes % 64 != 0
                         || line_off + block_bytes > (block_bytes + 63) / 64 * 64;
    const int64_t last_ahead = bags->n_indices - distance;
    const int64_t pf_end = !prefetch ? begin
                           : end < last_ahead ? end : (last_ahead > begin ? last_ahead : begin);
    vf acc[2][WIDE_VECS + 1];  /* constant indices only, so they live in registers */
    PK_UNROLL(WIDE_VECS + 1)
    for (int v = 0; v <= NV; v++) acc[0][v] = acc[1][v] = v_zero();
    int64_t skipped = 0, j = begin;
#define ADD_ROW(J, SET, PREFETCH)                                                                 \
    if (add_row(indices, padding, weights, table, rows, row_bytes, begin, (J), col, tail,        \
                acc[SET], &skipped, NV, has_tail, type, idx64, weighting, padded, far, straddle, \
                distance, (PREFETCH))) {                                                          \
        *bad_pos = (J);                                                                           \
        return PK_ERR_INDEX;                                                                      \
    }
    if (split) {  /* row j goes to set (j - begin) % 2 wherever the call's index list ends */
        for (; j + 1 < pf_end; j += 2) {
            ADD_ROW(j, 0, 1)
            ADD_ROW(j + 1, 1, 1)
        }
        for (; j + 1 < end; j += 2) {
            ADD_ROW(j, 0, j < pf_end)
            ADD_ROW(j + 1, 1, 0)
        }
    } else {
        for (; j < pf_end; j++) {
            ADD_ROW(j, 0, 1)
        }
    }
    for (; j < end; j++) {
        ADD_ROW(j, 0, j < pf_end)
    }
#undef ADD_ROW
    if (split) {
        PK_UNROLL(WIDE_VECS + 1)
        for (int v = 0; v <= NV; v++) acc[0][v] = v_add(acc[0][v], acc[1][v]);
    }
    const int64_t count = end - begin - skipped;
    const vf scale = v_set1(bags->mean && count > 0 ? 1.0f / (float)count : 1.0f);
    PK_UNROLL(WIDE_VECS)
    for (int v = 0; v < NV; v++) v_store(out_row + col + v * VL, v_mul(acc[0][v], scale));
    if (has_tail) v_store_tail(out_row + col + NV * VL, v_mul(acc[0][NV], scale), tail);
    return PK_OK;
}

/* A pass over columns [col, col + NV * VL + tail).  Its rows are prefetched unless the block lies
 * in the lines an earlier pass of the bag prefetched (`fetched`, bytes from the row's start; only
 * where rows start on lines): AVX2's 16-bit D = 248 is two passes of 15 vectors, whose prefetches
 * cover the last vector's 16 bytes, then one of 1, which then reads each index once more and
 * nothing else. */
#define PASS(NV_, HAS_TAIL_, TAIL_)                                                               \
    do {                                                                                          \
        const size_t stop_ = (size_t)(col + (NV_) * VL + ((HAS_TAIL_) ? v_tail_len(TAIL_) : 0)) * elem; \
        const int fetch_ = !lined || stop_ > fetched;                                             \
        pk_status s_ = bag_pass(bags, tab, rows, row_bytes, begin, end, col, (TAIL_), out,        \
                                bad_pos, fetch_, (NV_), (HAS_TAIL_), type, idx64, weighting,      \
                                padded, far);                                                     \
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
    const char *tab = (const char *)table;
    const size_t elem = type == TABLE_F32 ? 4 : 2, row_bytes = (size_t)row_stride * elem;
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
    const char *tab = (const char *)table;
    const size_t elem = type == TABLE_F32 ? 4 : 2, row_bytes = (size_t)row_stride * elem;
    const v_tail tail = v_tail_of((uint64_t)dim % VL);
    const int lined = (uintptr_t)tab % 64 == 0 && row_bytes % 64 == 0;   /* rows start on lines */
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

/* bags_by_dim for one (table type, index width, weighting, padding, prefetch mode), in a function
 * of its own.  Inlined all into one exported kernel, the 72 loop nests made one function too large
 * for GCC's register allocator to treat each loop on its own: it kept 2 of the 15 accumulators of
 * AVX2's 16-bit pass on the stack (a load and a store per row each) and left a register unused;
 * apart, no accumulator of a pass of at most 15 vectors leaves the registers. */
typedef pk_status (*bags_fn)(const pk_bags *, const void *, int64_t, int64_t, int64_t, int64_t *);
#define BAGS_FN(TYPE, IDX64, WEIGHTING, PADDED, FAR)                                               \
    static __attribute__((noinline)) pk_status                                                     \
    bags_##TYPE##_##IDX64##_##WEIGHTING##_##PADDED##_##FAR(const pk_bags *bags, const void *table, \
                                                           int64_t rows, int64_t dim,             \
                                                           int64_t row_stride, int64_t *bad_pos)  \
    {                                                                                              \
        return bags_by_dim(bags, table, rows, dim, row_stride, bad_pos, TYPE, IDX64, WEIGHTING,   \
                           PADDED, FAR);                                                           \
    }
#define BAGS_FN_PF(T, I, W) BAGS_FN(T, I, W, 0, 0) BAGS_FN(T, I, W, 0, 1) BAGS_FN(T, I, W, 1, 0) \
                            BAGS_FN(T, I, W, 1, 1)
#define BAGS_FN_W(T, I) BAGS_FN_PF(T, I, UNWEIGHTED) BAGS_FN_PF(T, I, PER_SAMPLE) \
                        BAGS_FN_PF(T, I, POSITIONAL)
#define BAGS_FNS(T) BAGS_FN_W(T, 0) BAGS_FN_W(T, 1)                                               \
    static const bags_fn bags_##T[2][3][2][2] = {BAGS_ROW_I(T, 0), BAGS_ROW_I(T, 1)};
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
    const int far = pk_bags_far_table(rows, (uint64_t)row_stride * (type == TABLE_F32 ? 4 : 2))
                    && pk_far_prefetch_mode() == PK_FAR_INTO_L2;
    const int weighting = bags->weights == NULL ? UNWEIGHTED : bags->positional ? POSITIONAL : PER_SAMPLE;
    const bags_fn (*fns)[3][2][2] = type == TABLE_F32 ? bags_TABLE_F32
                                    : type == TABLE_F16 ? bags_TABLE_F16 : bags_TABLE_BF16;
    return fns[bags->index_64 != 0][weighting][padded][far](bags, table, rows, dim, row_stride, bad_pos);
}

/* The exported kernels (declared in perfkernels/embedding.h under their level's names). */
pk_status PK_ISA_FN(pk_embedding_bag_f32)(const pk_bags *bags, const void *table, int64_t rows,
                                          int64_t dim, int64_t row_stride, int64_t *bad_pos)
{
    return embedding_bag(bags, table, rows, dim, row_stride, bad_pos, TABLE_F32);
}

pk_status PK_ISA_FN(pk_embedding_bag_f16)(const pk_bags *bags, const void *table, int64_t rows,
                                          int64_t dim, int64_t row_stride, int64_t *bad_pos)
{
    return embedding_bag(bags, table, rows, dim, row_stride, bad_pos, TABLE_F16);
}

pk_status PK_ISA_FN(pk_embedding_bag_bf16)(const pk_bags *bags, const void *table, int64_t rows,
                                           int64_t dim, int64_t row_stride, int64_t *bad_pos)
{
    return embedding_bag(bags, table, rows, dim, row_stride, bad_pos, TABLE_BF16);
}

#endif
