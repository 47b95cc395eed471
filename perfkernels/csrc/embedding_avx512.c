/* Embedding-bag kernels for AVX-512 (F + BW + VL; F16C for half rows).  Compiled with the AVX-512
 * flags (setup.py, this file only).
 *
 * One bag's output row is held in zmm registers while its rows are summed (acc = fma(w, x, acc)),
 * FBGEMM style.  `bag_pass` sums NV full 16-float vectors (plus an optional masked tail vector)
 * of one column block; NV and the table / index types are compile-time constants at every call,
 * so each specialisation keeps its accumulators in registers: D = 16, 32, 64, 128, 256 are single
 * passes with NV = 1, 2, 4, 8, 16; any other D is cut into blocks of 16, 8, 4, 2, 1 vectors and a
 * masked tail (masked loads never touch memory past the row). */
#include "perfkernels/embedding.h"

#if PK_X86_64
#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__F16C__) && defined(__FMA__))
#error "embedding_avx512.c must be compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl -mf16c -mfma"
#endif
#include <immintrin.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define VL 16          /* floats per vector */
#define MAX_VECS 16    /* accumulators per pass: 16 of the 32 zmm, the rest for loads */
#ifndef PREFETCH_DISTANCE
#define PREFETCH_DISTANCE PK_BAGS_PREFETCH_DISTANCE
#endif

enum table_type { TABLE_F32, TABLE_F16, TABLE_BF16 };
enum weighting { UNWEIGHTED, PER_SAMPLE, POSITIONAL };

ALWAYS_INLINE __m512 widen_bf16(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 elements of a row starting at element col, as floats. */
ALWAYS_INLINE __m512 load_row(const void *row, int64_t col, const int type)
{
    if (type == TABLE_F32) return _mm512_loadu_ps((const float *)row + col);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + col));
    return type == TABLE_F16 ? _mm512_cvtph_ps(h) : widen_bf16(h);
}

ALWAYS_INLINE __m512 load_row_masked(const void *row, int64_t col, __mmask16 m, const int type)
{
    if (type == TABLE_F32) return _mm512_maskz_loadu_ps(m, (const float *)row + col);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + col);
    return type == TABLE_F16 ? _mm512_cvtph_ps(h) : widen_bf16(h);
}

ALWAYS_INLINE int64_t index_at(const void *indices, int64_t j, const int idx64)
{
    return idx64 ? ((const int64_t *)indices)[j] : (int64_t)((const int32_t *)indices)[j];
}

/* One prefetch per 64 bytes from the start of the block (nbytes is a compile-time constant
 * for the fixed-D paths, so this unrolls), as FBGEMM does, plus one for the block's last byte:
 * NumPy's large arrays start 16 bytes past a page, so a 256-byte row spans 5 lines, and the
 * line FBGEMM leaves out is a demand miss on every row of a DRAM-resident table. */
ALWAYS_INLINE void prefetch_bytes(const char *p, size_t nbytes)
{
#pragma GCC unroll 16
    for (size_t off = 0; off < nbytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
    _mm_prefetch(p + nbytes - 1, _MM_HINT_T0);
}

/* Add row indices[j] (times its weight) to acc: the index is checked before its row is touched,
 * the row PREFETCH_DISTANCE indices ahead is prefetched.  Returns 0, or 1 for a bad index. */
ALWAYS_INLINE int add_row(const void *indices, int64_t n, int64_t padding, const float *weights,
                          const char *table, int64_t rows, size_t row_bytes,
                          int64_t begin, int64_t j, int64_t col, __mmask16 tail, __m512 *acc,
                          int64_t *count, const int NV, const int has_tail, const int type,
                          const int idx64, const int weighting)
{
    const size_t elem = type == TABLE_F32 ? 4 : 2;
    const size_t block_bytes = (size_t)(NV * VL + (has_tail ? __builtin_popcount(tail) : 0)) * elem;
    const int64_t idx = index_at(indices, j, idx64);
    if ((uint64_t)idx >= (uint64_t)rows) return 1;
    if (j + PREFETCH_DISTANCE < n) {
        const int64_t ahead = index_at(indices, j + PREFETCH_DISTANCE, idx64);
        if ((uint64_t)ahead < (uint64_t)rows)
            prefetch_bytes(table + (size_t)ahead * row_bytes + (size_t)col * elem, block_bytes);
    }
    if (idx == padding) return 0;
    ++*count;
    const __m512 w = _mm512_set1_ps(weighting == UNWEIGHTED ? 1.0f
                                    : weights[weighting == POSITIONAL ? j - begin : j]);
    const char *row = table + (size_t)idx * row_bytes;
#pragma GCC unroll 16
    for (int v = 0; v < NV; v++)
        acc[v] = _mm512_fmadd_ps(w, load_row(row, col + v * VL, type), acc[v]);
    if (has_tail)
        acc[NV] = _mm512_fmadd_ps(w, load_row_masked(row, col + NV * VL, tail, type), acc[NV]);
    return 0;
}

/* Sum columns [col, col + NV*VL + tail) of bag [begin, end) into out_row.  Narrow blocks
 * alternate rows between two accumulator sets: two independent FMA chains instead of one, so
 * a short row does not wait for the previous row's FMA latency. */
ALWAYS_INLINE pk_status bag_pass(const pk_bags *bags, const char *table, int64_t rows,
                                 size_t row_bytes, int64_t begin, int64_t end, int64_t col,
                                 __mmask16 tail, float *out_row, int64_t *bad_pos,
                                 const int NV, const int has_tail, const int type, const int idx64,
                                 const int weighting)
{
    /* struct fields in locals: the prefetches would otherwise make the compiler reload them */
    const void *indices = bags->indices;
    const int64_t n = bags->n_indices, padding = bags->padding_idx;
    const float *weights = bags->weights;
    const int split = (NV + has_tail) * 2 <= 8;
    __m512 acc[2][MAX_VECS + 1];  /* constant indices only, so they live in registers */
#pragma GCC unroll 17
    for (int v = 0; v <= NV; v++) acc[0][v] = acc[1][v] = _mm512_setzero_ps();
    int64_t count = 0, j = begin;
#define ADD_ROW(J, SET)                                                                           \
    if (add_row(indices, n, padding, weights, table, rows, row_bytes, begin, (J), col, tail, acc[SET], &count, NV,        \
                has_tail, type, idx64, weighting)) {                                              \
        *bad_pos = (J);                                                                           \
        return PK_ERR_INDEX;                                                                      \
    }
    if (split) {
        for (; j + 1 < end; j += 2) {
            ADD_ROW(j, 0)
            ADD_ROW(j + 1, 1)
        }
    }
    for (; j < end; j++) {
        ADD_ROW(j, 0)
    }
#undef ADD_ROW
    if (split) {
#pragma GCC unroll 17
        for (int v = 0; v <= NV; v++) acc[0][v] = _mm512_add_ps(acc[0][v], acc[1][v]);
    }
    const __m512 scale = _mm512_set1_ps(bags->mean && count > 0 ? 1.0f / (float)count : 1.0f);
#pragma GCC unroll 16
    for (int v = 0; v < NV; v++) _mm512_storeu_ps(out_row + col + v * VL, _mm512_mul_ps(acc[0][v], scale));
    if (has_tail) _mm512_mask_storeu_ps(out_row + col + NV * VL, tail, _mm512_mul_ps(acc[0][NV], scale));
    return PK_OK;
}

#define PASS(NV_, HAS_TAIL_, TAIL_MASK_)                                                          \
    do {                                                                                          \
        pk_status s_ = bag_pass(bags, tab, rows, row_bytes, begin, end, col, (TAIL_MASK_), out,   \
                                bad_pos, (NV_), (HAS_TAIL_), type, idx64, weighting);                        \
        if (s_ != PK_OK) return s_;                                                               \
        col += (NV_) * VL;                                                                        \
    } while (0)

/* D == NV * 16: one pass per bag, the whole row in NV registers. */
ALWAYS_INLINE pk_status bags_fixed(const pk_bags *bags, const void *table, int64_t rows,
                                   int64_t row_stride, int64_t *bad_pos, const int NV,
                                   const int type, const int idx64, const int weighting)
{
    const char *tab = (const char *)table;
    const size_t row_bytes = (size_t)row_stride * (type == TABLE_F32 ? 4 : 2);
    for (int64_t b = 0; b < bags->num_bags; b++) {
        const int64_t begin = bags->offsets[b], end = bags->offsets[b + 1];
        float *out = bags->out + b * bags->out_stride;
        int64_t col = 0;
        PASS(NV, 0, 0);
    }
    return PK_OK;
}

/* Any D: blocks of 16, 8, 4, 2, 1 vectors, then a masked tail. */
ALWAYS_INLINE pk_status bags_generic(const pk_bags *bags, const void *table, int64_t rows,
                                     int64_t dim, int64_t row_stride, int64_t *bad_pos,
                                     const int type, const int idx64, const int weighting)
{
    const char *tab = (const char *)table;
    const size_t row_bytes = (size_t)row_stride * (type == TABLE_F32 ? 4 : 2);
    const __mmask16 tail = (__mmask16)((1u << (dim % VL)) - 1u);
    for (int64_t b = 0; b < bags->num_bags; b++) {
        const int64_t begin = bags->offsets[b], end = bags->offsets[b + 1];
        float *out = bags->out + b * bags->out_stride;
        int64_t col = 0;
        while (dim - col >= MAX_VECS * VL) PASS(MAX_VECS, 0, 0);
        if (dim - col >= 8 * VL) PASS(8, 0, 0);
        if (dim - col >= 4 * VL) PASS(4, 0, 0);
        if (dim - col >= 2 * VL) PASS(2, 0, 0);
        if (dim - col >= 1 * VL) PASS(1, 0, 0);
        if (dim - col > 0) PASS(0, 1, tail);
    }
    return PK_OK;
}

ALWAYS_INLINE pk_status bags_by_dim(const pk_bags *bags, const void *table, int64_t rows,
                                    int64_t dim, int64_t row_stride, int64_t *bad_pos,
                                    const int type, const int idx64, const int weighting)
{
    switch (dim) {
    case 16: return bags_fixed(bags, table, rows, row_stride, bad_pos, 1, type, idx64, weighting);
    case 32: return bags_fixed(bags, table, rows, row_stride, bad_pos, 2, type, idx64, weighting);
    case 64: return bags_fixed(bags, table, rows, row_stride, bad_pos, 4, type, idx64, weighting);
    case 128: return bags_fixed(bags, table, rows, row_stride, bad_pos, 8, type, idx64, weighting);
    case 256: return bags_fixed(bags, table, rows, row_stride, bad_pos, 16, type, idx64, weighting);
    default: return bags_generic(bags, table, rows, dim, row_stride, bad_pos, type, idx64, weighting);
    }
}

ALWAYS_INLINE pk_status embedding_bag(const pk_bags *bags, const void *table, int64_t rows,
                                      int64_t dim, int64_t row_stride, int64_t *bad_pos,
                                      const int type)
{
    if (dim == 0) {  /* no row is read, but a bad index is still an error */
        int64_t j = pk_bags_first_bad_index(bags, rows);
        if (j >= 0) { *bad_pos = j; return PK_ERR_INDEX; }
        return PK_OK;
    }
#define BY_DIM(IDX64, WEIGHTING) bags_by_dim(bags, table, rows, dim, row_stride, bad_pos, type, IDX64, WEIGHTING)
    if (bags->weights == NULL)
        return bags->index_64 ? BY_DIM(1, UNWEIGHTED) : BY_DIM(0, UNWEIGHTED);
    if (!bags->positional)
        return bags->index_64 ? BY_DIM(1, PER_SAMPLE) : BY_DIM(0, PER_SAMPLE);
    return bags->index_64 ? BY_DIM(1, POSITIONAL) : BY_DIM(0, POSITIONAL);
#undef BY_DIM
}

pk_status pk_embedding_bag_f32_avx512(const pk_bags *bags, const void *table, int64_t rows,
                                      int64_t dim, int64_t row_stride, int64_t *bad_pos)
{
    return embedding_bag(bags, table, rows, dim, row_stride, bad_pos, TABLE_F32);
}

pk_status pk_embedding_bag_f16_avx512(const pk_bags *bags, const void *table, int64_t rows,
                                      int64_t dim, int64_t row_stride, int64_t *bad_pos)
{
    return embedding_bag(bags, table, rows, dim, row_stride, bad_pos, TABLE_F16);
}

pk_status pk_embedding_bag_bf16_avx512(const pk_bags *bags, const void *table, int64_t rows,
                                       int64_t dim, int64_t row_stride, int64_t *bad_pos)
{
    return embedding_bag(bags, table, rows, dim, row_stride, bad_pos, TABLE_BF16);
}
#endif
