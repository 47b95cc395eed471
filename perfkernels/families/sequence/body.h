/* Unpooled lookups (one output row per index), written once over the SIMD primitives of every level
 * (the generated per-level file includes simd/<isa>.h, then this).
 *
 * embedding_rows copies rows as stored: a float32 / float16 / bfloat16 row is `row_bytes` bytes,
 * moved in float vectors (plain loads and stores, masked for the last partial vector: no value is
 * converted, so NaN payloads survive) plus a last 2-byte piece for an odd 16-bit D; the AVX-512
 * level moves 256 bits at a time (seq_copy says why).  The portable level (VL == 1) copies with
 * memcpy.  embedding_rows_quantized dequantises each row,
 * fma(q, scale, bias) per element, as the quantized family's dequantize_rowwise.
 *
 * Both prefetch a row some indices ahead, one prefetch per 64-byte line (plus the row's last byte
 * where rows do not start on lines), with the bag kernels' policy (perfkernels/bags.h): into L1
 * (T0) 16 ahead for a table under PK_BAGS_FAR_MIN_BYTES (32 for rows of at most 128 bytes); a
 * larger one's rows come from DRAM, and go 48 ahead into L2 (T1), or, where pk_far_prefetch_mode
 * says L1, into L1 SEQ_FAR_L1 ahead (64 for rows of at most 128 bytes, fewer for rows of more
 * than 256: seq_ahead; 16 on AMD family 19h: seq_far_l1_rows).  On an AMD EPYC (Zen 5),
 * one thread, 12,800 IDs: T0 32 / 64 ahead against T1 48 ahead, 1M x 64 float32 1.0-1.2x,
 * bfloat16 1.2-1.3x, 8-bit 1.2x, 100K x 128 float32 1.1x faster; 24 / 48 and 48 / 48 ahead were
 * within 5% of it, but each was 5-10% slower on one of those shapes.
 * Row sizes 64 .. 1024 bytes (D = 16 .. 256 float32, 32 .. 512 16-bit; quantized D = 32 .. 256)
 * are compile-time constants, one noinline function per (size, prefetch mode, index width), so each
 * copy is a fixed run of loads and stores. */
#ifndef PK_SEQUENCE_BODY_H
#define PK_SEQUENCE_BODY_H

#include "perfkernels/bags.h"
#include "perfkernels/sequence.h"
#include "perfkernels/quantized.h"
#include "quantized/rows.h"

#define SEQ_NEAR PK_BAGS_PREFETCH_DISTANCE        /* rows of more than 128 bytes */
#define SEQ_NEAR_SHORT (2 * PK_BAGS_PREFETCH_DISTANCE)   /* short rows take little time each */
#define SEQ_FAR_L1 32   /* far rows into L1: rows of more than 128 bytes (twice that for shorter) */

/* Prefetch modes, compile-time constants of each loop: near (T0), far into L2 (T1), far into L1 */
enum { SEQ_PF_NEAR = 0, SEQ_PF_FAR_L2 = PK_FAR_INTO_L2, SEQ_PF_FAR_L1 = PK_FAR_INTO_L1 };

#define SEQ_FAR_L1_19H 16   /* the same on AMD family 19h, for every row of at most 256 bytes */

/* The process's far-into-L1 distance for rows of at most 256 bytes: 0 until a translation unit's
 * first call finds it (a race between threads finds it twice, alike); -1 means the default
 * (SEQ_FAR_L1, doubled for rows of at most 128 bytes). */
static int seq_far_l1_setting;

/* AMD family 19h (Zen 3, Zen 4) takes its far rows SEQ_FAR_L1_19H ahead whatever their size up to
 * 256 bytes.  On an AMD EPYC Zen 4 (family 19h, model 11h), one thread, 12,800 IDs whose rows
 * stay in L2 / L3 between calls, 16 ahead against the default 64 and 32 (a measuring build switching
 * the distance between interleaved rounds): 1M x 64 float16 and bfloat16 1.09x faster (two
 * threads 1.07-1.09x), float32 1.04-1.05x, 8-bit 1.05-1.06x, 100K x 128 float16 and bfloat16
 * 1.03-1.07x; with new rows every call (from DRAM) 0.97-1.06x, level.  On a Zen 3 (family 19h,
 * model 01h; kernel against kernel, benchmarks/ceiling/lookup_ab.py) 16 ahead took 0.90-1.03x
 * the time of the default on the 1M x 64 and 100K x 128 rows, with rows from L2 / L3 and from
 * DRAM alike, but for one noisy run's 1.08x (float32 1M x 64).  A Zen 5 (family 1Ah) measured 64 and 32 ahead best, and keeps them. */
#if defined(__GNUC__)
__attribute__((noinline, cold))
#endif
static int seq_far_l1_find(void)
{
    const int r = pk_cpu_amd_family() == 0x19u ? SEQ_FAR_L1_19H : -1;
    __atomic_store_n(&seq_far_l1_setting, r, __ATOMIC_RELAXED);
    return r;
}

/* Rows of at most 256 bytes: how many indices ahead they go in far-into-L1 mode, or -1 for the
 * default. */
PK_INLINE int seq_far_l1_rows(void)
{
    const int r = __atomic_load_n(&seq_far_l1_setting, __ATOMIC_RELAXED);
    return r ? r : seq_far_l1_find();
}

/* How many indices ahead rows of nbytes are prefetched in mode pf.  Far rows into L1 keep about
 * SEQ_FAR_L1 * 4 lines in flight: rows longer than 256 bytes go fewer indices ahead (16 of 512
 * bytes, 8 of 1024), as 32 rows of 512 bytes (256 lines) asked for more than the core's L1 misses
 * in flight can hold: on an AMD EPYC (Zen 3), one thread, 12,800 IDs of a 100K x 128 float32
 * table, 16 ahead took 0.78-0.88x the time of 32, and 8 ahead 0.94x.  Where seq_far_l1_rows
 * names a distance, it takes the place of SEQ_FAR_L1 (and of its double for short rows). */
PK_INLINE int64_t seq_ahead(const int pf, const int64_t nbytes)
{
    if (pf == SEQ_PF_FAR_L2) return PK_BAGS_FAR_DISTANCE;
    const int chosen = pf == SEQ_PF_FAR_L1 ? seq_far_l1_rows() : -1;
    const int64_t base = pf == SEQ_PF_FAR_L1 ? (chosen > 0 ? chosen : SEQ_FAR_L1) : SEQ_NEAR;
    if (nbytes <= 128) return chosen > 0 ? base : 2 * base;
    if (pf == SEQ_PF_FAR_L1 && nbytes > 256) {
        const int64_t lines_kept = base * 256 / nbytes;
        return lines_kept < 4 ? 4 : lines_kept;
    }
    return base;
}

/* The prefetch mode of a call over a table of rows x row_stride bytes.  Intel CPUs take far rows
 * into L2 (T1): on a 2-core Xeon (2 MiB of L2 a core), one thread, 12,800 IDs, T0 took 0.80-0.97x
 * the time of T1 on 1M x 64 float rows only when the call's rows were in L2 already (the same
 * indices every call), and 1.06-1.31x with rows from L3, 1.14-1.27x from DRAM (10M-row tables);
 * 8-bit rows were level from DRAM. */
PK_INLINE int seq_mode(int64_t rows, int64_t row_stride)
{
    return pk_bags_far_table(rows, (uint64_t)row_stride) ? pk_far_prefetch_mode() : SEQ_PF_NEAR;
}

#define SEQ_NOINLINE static __attribute__((noinline))

PK_INLINE int64_t seq_index(const void *indices, int64_t j, const int idx64)
{
    return idx64 ? ((const int64_t *)indices)[j] : (int64_t)((const int32_t *)indices)[j];
}

PK_INLINE void seq_prefetch(const char *p, int64_t nbytes, const int far, const int straddle)
{
    if (far == SEQ_PF_FAR_L2) {
        for (int64_t off = 0; off < nbytes; off += 64) pk_prefetch_t1(p + off);
        if (straddle) pk_prefetch_t1(p + nbytes - 1);
    } else {
        for (int64_t off = 0; off < nbytes; off += 64) pk_prefetch_t0(p + off);
        if (straddle) pk_prefetch_t0(p + nbytes - 1);
    }
}

/* Prefetch the row of indices[j] (nbytes of it, row_stride bytes apart from `table`).  The
 * address is formed in integers: an unchecked index is harmless to a prefetch. */
PK_INLINE void seq_prefetch_index(const void *indices, int64_t j, const int idx64,
                                  const char *table, int64_t row_stride, int64_t nbytes,
                                  const int far, const int straddle)
{
    const uintptr_t p = (uintptr_t)table
                        + (uint64_t)seq_index(indices, j, idx64) * (uint64_t)row_stride;
    seq_prefetch((const char *)p, nbytes, far, straddle);
}

/* Step j of a lookup: index j, checked against rows (0 when out of range; else 1 with the index
 * in *idx), and, while j < pf_end, a prefetch of the row `ahead` indices on (row_stride bytes
 * apart from `table`, nbytes of it). */
PK_INLINE int seq_next_row(const void *indices, int64_t j, const int idx64, int64_t rows,
                           int64_t *idx, const char *table, int64_t row_stride, int64_t nbytes,
                           int64_t ahead, int64_t pf_end, const int far, const int straddle)
{
    *idx = seq_index(indices, j, idx64);
    if ((uint64_t)*idx >= (uint64_t)rows) return 0;
    if (j < pf_end) seq_prefetch_index(indices, j + ahead, idx64, table, row_stride, nbytes, far,
                                       straddle);
    return 1;
}

/* Prefetch the rows of indices [0, min(ahead, n)): those that no earlier step of the loop
 * prefetches.  Every block of a call cut for threads starts there, so without this each block
 * began with `ahead` rows of demand misses (on an AMD EPYC, Zen 5, 100K x 128 float32 rows: 1.4-2
 * us a block; primed, 12,800-ID lookups measured 2% faster at one thread and at two). */
PK_INLINE void seq_prime(const void *indices, int64_t n, const int idx64, const char *table,
                         int64_t row_stride, int64_t nbytes, int64_t ahead, const int far,
                         const int straddle)
{
    const int64_t first = n < ahead ? n : ahead;
    for (int64_t j = 0; j < first; j++)
        seq_prefetch_index(indices, j, idx64, table, row_stride, nbytes, far, straddle);
}

/* Copy one row of nbytes (a multiple of 2) from src to dst.
 *
 * The AVX-512 level copies in 256-bit moves, as the AVX2 level does: on an AMD EPYC Zen 4, one
 * thread, 12,800 rows of 128 bytes from a 1M-row table (rows in L2 or L3 between calls), a copy in
 * 512-bit loads took 1.3-1.45x the time of one in 256-bit loads (C loops, 31 interleaved rounds;
 * 256-bit loads with 512-bit stores were level with all-256-bit), and the lookups through the
 * kernels 1.16-1.5x for 16-bit 1M x 64 tables.  Rows that are summed (the bags) load 512 bits at
 * a time and are not slower for it there.  The last partial 32 bytes are one masked move of 16-bit
 * lanes (AVX-512 BW + VL), which covers an odd 16-bit D too. */
PK_INLINE void seq_copy(char *dst, const char *src, const int64_t nbytes)
{
#if VL == 1
    memcpy(dst, src, (size_t)nbytes);
#elif VL == 16 && defined(__AVX512BW__) && defined(__AVX512VL__)
    int64_t c = 0;
    for (; c + 128 <= nbytes; c += 128) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(src + c));
        const __m256i b = _mm256_loadu_si256((const __m256i *)(src + c + 32));
        const __m256i x = _mm256_loadu_si256((const __m256i *)(src + c + 64));
        const __m256i y = _mm256_loadu_si256((const __m256i *)(src + c + 96));
        _mm256_storeu_si256((__m256i *)(dst + c), a);
        _mm256_storeu_si256((__m256i *)(dst + c + 32), b);
        _mm256_storeu_si256((__m256i *)(dst + c + 64), x);
        _mm256_storeu_si256((__m256i *)(dst + c + 96), y);
    }
    for (; c + 32 <= nbytes; c += 32)
        _mm256_storeu_si256((__m256i *)(dst + c), _mm256_loadu_si256((const __m256i *)(src + c)));
    if (c < nbytes) {
        const __mmask16 m = (__mmask16)((1u << ((nbytes - c) / 2)) - 1u);
        _mm256_mask_storeu_epi16(dst + c, m, _mm256_maskz_loadu_epi16(m, src + c));
    }
#else
    const int64_t nf = nbytes / 4;
    int64_t c = 0;
    for (; c + 4 * VL <= nf; c += 4 * VL) {
        const vf a = v_load((const float *)src + c), b = v_load((const float *)src + c + VL);
        const vf x = v_load((const float *)src + c + 2 * VL), y = v_load((const float *)src + c + 3 * VL);
        v_store((float *)dst + c, a);
        v_store((float *)dst + c + VL, b);
        v_store((float *)dst + c + 2 * VL, x);
        v_store((float *)dst + c + 3 * VL, y);
    }
    for (; c + VL <= nf; c += VL) v_store((float *)dst + c, v_load((const float *)src + c));
    if (c < nf) {
        const v_tail t = v_tail_of((size_t)(nf - c));
        v_store_tail((float *)dst + c, v_load_tail((const float *)src + c, t), t);
    }
    if (nbytes & 2) memcpy(dst + nbytes - 2, src + nbytes - 2, 2);
#endif
}

/* Rows [0, n): NB (0: any) is the row size in bytes as a compile-time constant. */
PK_INLINE pk_status rows_loop(const char *table, int64_t rows, int64_t row_stride,
                              int64_t row_bytes_rt, const void *indices, int64_t n, char *out,
                              int64_t *bad_pos, const int64_t NB, const int idx64, const int far,
                              const int straddle)
{
    const int64_t nbytes = NB ? NB : row_bytes_rt;
    const int64_t ahead = seq_ahead(far, nbytes);
    const int64_t pf_end = n - ahead;
    seq_prime(indices, n, idx64, table, row_stride, nbytes, ahead, far, straddle);
    for (int64_t j = 0; j < n; j++) {
        int64_t idx;
        if (!seq_next_row(indices, j, idx64, rows, &idx, table, row_stride, nbytes, ahead, pf_end,
                          far, straddle)) {
            *bad_pos = j;
            return PK_ERR_INDEX;
        }
        seq_copy(out + j * nbytes, table + idx * row_stride, nbytes);
    }
    return PK_OK;
}

#define ROWS_FN(NB, IDX64, FAR, STRADDLE)                                                          \
    SEQ_NOINLINE pk_status rows_##NB##_##IDX64##FAR##STRADDLE(                                     \
        const char *table, int64_t rows, int64_t row_stride, int64_t row_bytes,                   \
        const void *indices, int64_t n, char *out, int64_t *bad_pos)                              \
    {                                                                                             \
        return rows_loop(table, rows, row_stride, row_bytes, indices, n, out, bad_pos, NB, IDX64, \
                         FAR, STRADDLE);                                                          \
    }
#define ROWS_FNS_PF(NB, IDX64, PF) ROWS_FN(NB, IDX64, PF, 0) ROWS_FN(NB, IDX64, PF, 1)
#define ROWS_FNS(NB)                                                                               \
    ROWS_FNS_PF(NB, 0, 0) ROWS_FNS_PF(NB, 0, 1) ROWS_FNS_PF(NB, 0, 2)                              \
    ROWS_FNS_PF(NB, 1, 0) ROWS_FNS_PF(NB, 1, 1) ROWS_FNS_PF(NB, 1, 2)                              \
    SEQ_NOINLINE pk_status rows_##NB(const char *table, int64_t rows, int64_t row_stride,         \
                                     int64_t row_bytes, const void *indices, int idx64, int64_t n, \
                                     char *out, int64_t *bad_pos, int pf, int straddle)            \
    {                                                                                             \
        typedef pk_status (*fn)(const char *, int64_t, int64_t, int64_t, const void *, int64_t,   \
                                char *, int64_t *);                                               \
        static const fn by_mode[12] = {                                                           \
            rows_##NB##_000, rows_##NB##_001, rows_##NB##_010, rows_##NB##_011,                   \
            rows_##NB##_020, rows_##NB##_021, rows_##NB##_100, rows_##NB##_101,                   \
            rows_##NB##_110, rows_##NB##_111, rows_##NB##_120, rows_##NB##_121};                  \
        return by_mode[(idx64 * 3 + pf) * 2 + straddle](table, rows, row_stride, row_bytes,       \
                                                        indices, n, out, bad_pos);                \
    }
ROWS_FNS(0) ROWS_FNS(64) ROWS_FNS(128) ROWS_FNS(256) ROWS_FNS(512) ROWS_FNS(1024)
#undef ROWS_FN
#undef ROWS_FNS_PF
#undef ROWS_FNS

pk_status PK_ISA_FN(pk_embedding_rows)(const void *table, int64_t rows, int64_t row_stride,
                                       int64_t row_bytes, const void *indices, int index_64,
                                       int64_t n, void *out, int64_t *bad_pos)
{
    const char *t = (const char *)table;
    const int far = seq_mode(rows, row_stride);
    const int straddle = ((uintptr_t)t % 64 != 0) || (row_stride % 64 != 0);
    char *o = (char *)out;
    const int i64 = index_64 != 0;
    switch (row_bytes) {
    case 64: return rows_64(t, rows, row_stride, row_bytes, indices, i64, n, o, bad_pos, far, straddle);
    case 128: return rows_128(t, rows, row_stride, row_bytes, indices, i64, n, o, bad_pos, far, straddle);
    case 256: return rows_256(t, rows, row_stride, row_bytes, indices, i64, n, o, bad_pos, far, straddle);
    case 512: return rows_512(t, rows, row_stride, row_bytes, indices, i64, n, o, bad_pos, far, straddle);
    case 1024: return rows_1024(t, rows, row_stride, row_bytes, indices, i64, n, o, bad_pos, far, straddle);
    default: return rows_0(t, rows, row_stride, row_bytes, indices, i64, n, o, bad_pos, far, straddle);
    }
}

/* --- quantized rows ------------------------------------------------------------------------------ */

#if VL == 1
/* code c of a packed row */
PK_INLINE float seq_code(const int bits, const uint8_t *row, int64_t c)
{
    if (bits == 8) return (float)row[c];
    const unsigned per = 8u / (unsigned)bits, mask = (1u << bits) - 1u;
    return (float)((row[c / per] >> ((c % per) * (unsigned)bits)) & mask);
}
#else
#include "common/packed_codes.h"   /* load_codes, load_codes_tail */
#endif

PK_INLINE void seq_dequant(const int bits, const uint8_t *row, int64_t codes_bytes, int64_t dim,
                           float *o)
{
    float scale, bias;
#if VL == 1
    pk_q_read_trailer(bits, row, (size_t)codes_bytes, &scale, &bias);
    for (int64_t c = 0; c < dim; c++) o[c] = seq_code(bits, row, c) * scale + bias;
#else
    pk_packed_trailer(bits, row, (size_t)codes_bytes, &scale, &bias);
    const vf vscale = v_set1(scale), vbias = v_set1(bias);
    int64_t c = 0;
    for (; c + VL <= dim; c += VL) v_store(o + c, v_fmadd(load_codes(bits, row, c), vscale, vbias));
    if (c < dim) {
        const v_tail t = v_tail_of((size_t)(dim - c));
        v_store_tail(o + c, v_fmadd(load_codes_tail(bits, row, c, t), vscale, vbias), t);
    }
#endif
}

PK_INLINE pk_status qrows_loop(const int bits, const int64_t D, const uint8_t *packed, int64_t rows,
                               int64_t row_bytes_rt, int64_t dim_rt, const void *indices, int64_t n,
                               float *out, int64_t *bad_pos, const int idx64, const int far)
{
    const int64_t dim = D ? D : dim_rt;
    const int64_t codes_bytes = bits == 8 ? dim : (int64_t)pk_q_codes_bytes(bits, (size_t)dim);
    const int64_t row_bytes = D ? codes_bytes + (bits == 8 ? 8 : 4) : row_bytes_rt;
    const int64_t ahead = seq_ahead(far, row_bytes);
    const int64_t pf_end = n - ahead;
    seq_prime(indices, n, idx64, (const char *)packed, row_bytes, row_bytes, ahead, far, 1);
    for (int64_t j = 0; j < n; j++) {
        int64_t idx;
        if (!seq_next_row(indices, j, idx64, rows, &idx, (const char *)packed, row_bytes,
                          row_bytes, ahead, pf_end, far, 1)) {
            *bad_pos = j;
            return PK_ERR_INDEX;
        }
        seq_dequant(bits, packed + idx * row_bytes, codes_bytes, dim, out + j * dim);
    }
    return PK_OK;
}

#define QROWS_FN(BITS, D, IDX64, FAR)                                                               \
    SEQ_NOINLINE pk_status qrows_##BITS##_##D##_##IDX64##FAR(                                      \
        const uint8_t *packed, int64_t rows, int64_t row_bytes, int64_t dim, const void *indices,   \
        int64_t n, float *out, int64_t *bad_pos)                                                    \
    {                                                                                               \
        return qrows_loop(BITS, D, packed, rows, row_bytes, dim, indices, n, out, bad_pos, IDX64,   \
                          FAR);                                                                     \
    }
#define QROWS_FNS(BITS, D)                                                                          \
    QROWS_FN(BITS, D, 0, 0) QROWS_FN(BITS, D, 0, 1) QROWS_FN(BITS, D, 0, 2)                         \
    QROWS_FN(BITS, D, 1, 0) QROWS_FN(BITS, D, 1, 1) QROWS_FN(BITS, D, 1, 2)                         \
    SEQ_NOINLINE pk_status qrows_##BITS##_##D(const uint8_t *packed, int64_t rows,                  \
                                              int64_t row_bytes, int64_t dim, const void *indices, \
                                              int idx64, int64_t n, float *out, int64_t *bad_pos,  \
                                              int pf)                                               \
    {                                                                                               \
        typedef pk_status (*fn)(const uint8_t *, int64_t, int64_t, int64_t, const void *, int64_t,  \
                                float *, int64_t *);                                                \
        static const fn by_mode[6] = {qrows_##BITS##_##D##_00, qrows_##BITS##_##D##_01,            \
                                      qrows_##BITS##_##D##_02, qrows_##BITS##_##D##_10,            \
                                      qrows_##BITS##_##D##_11, qrows_##BITS##_##D##_12};           \
        return by_mode[idx64 * 3 + pf](packed, rows, row_bytes, dim, indices, n, out, bad_pos);     \
    }
QROWS_FNS(8, 0) QROWS_FNS(8, 32) QROWS_FNS(8, 64) QROWS_FNS(8, 128) QROWS_FNS(8, 256)
QROWS_FNS(4, 0) QROWS_FNS(4, 32) QROWS_FNS(4, 64) QROWS_FNS(4, 128) QROWS_FNS(4, 256)
QROWS_FNS(2, 0)
#undef QROWS_FN
#undef QROWS_FNS

pk_status PK_ISA_FN(pk_embedding_rows_quantized)(int bits, const uint8_t *packed, int64_t rows,
                                                 int64_t row_bytes, int64_t dim,
                                                 const void *indices, int index_64, int64_t n,
                                                 float *out, int64_t *bad_pos)
{
    const int far = seq_mode(rows, row_bytes);
    const int i64 = index_64 != 0;
#define BY_DIM(BITS)                                                                                \
    switch (row_bytes == (int64_t)pk_quantized_row_bytes(BITS, (size_t)dim) ? dim : 0) {                   \
    case 32: return qrows_##BITS##_32(packed, rows, row_bytes, dim, indices, i64, n, out, bad_pos, far); \
    case 64: return qrows_##BITS##_64(packed, rows, row_bytes, dim, indices, i64, n, out, bad_pos, far); \
    case 128: return qrows_##BITS##_128(packed, rows, row_bytes, dim, indices, i64, n, out, bad_pos, far); \
    case 256: return qrows_##BITS##_256(packed, rows, row_bytes, dim, indices, i64, n, out, bad_pos, far); \
    default: return qrows_##BITS##_0(packed, rows, row_bytes, dim, indices, i64, n, out, bad_pos, far); \
    }
    if (bits == 8) BY_DIM(8)
    if (bits == 4) BY_DIM(4)
#undef BY_DIM
    return qrows_2_0(packed, rows, row_bytes, dim, indices, i64, n, out, bad_pos, far);
}

#endif
