/* Row-wise quantized tables for AVX2 + FMA + F16C: dequantize and the fused embedding bags
 * (quantize_rowwise is in quantized_prepack_avx2.c).  Compiled with -mavx2 -mfma -mf16c (setup.py,
 * this file only). */
#include "perfkernels/quantized.h"

#if PK_X86_64
#if !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "quantized_avx2.c must be compiled with -mavx2 -mfma -mf16c"
#endif
#include <immintrin.h>
#include <math.h>
#include "quantized_rows.h"

/* Codes c .. c+7 of a row (c a multiple of 8) as floats; reads only the bytes holding them. */
static inline __m256 codes8_ps(int bits, const uint8_t *codes, size_t c)
{
    if (bits == 8) {
        return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + c))));
    }
    if (bits == 4) {
        int32_t b;
        memcpy(&b, codes + c / 2, 4);
        __m128i rep = _mm_shuffle_epi8(_mm_cvtsi32_si128(b), _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0));
        __m256i q = _mm256_srlv_epi32(_mm256_cvtepu8_epi32(rep), _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
        return _mm256_cvtepi32_ps(_mm256_and_si256(q, _mm256_set1_epi32(15)));
    }
    uint16_t b;
    memcpy(&b, codes + c / 4, 2);
    __m128i rep = _mm_shuffle_epi8(_mm_cvtsi32_si128(b), _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
    __m256i q = _mm256_srlv_epi32(_mm256_cvtepu8_epi32(rep), _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
    return _mm256_cvtepi32_ps(_mm256_and_si256(q, _mm256_set1_epi32(3)));
}

static inline float code_at(int bits, const uint8_t *codes, size_t c)
{
    unsigned per = 8u / (unsigned)bits;
    return (float)((codes[c / per] >> ((c % per) * (unsigned)bits)) & ((1u << bits) - 1u));
}

void pk_dequantize_rowwise_avx2(int bits, const uint8_t *packed, size_t rows, size_t row_bytes,
                                size_t dim, float *out)
{
    size_t codes_bytes = bits == 8 ? dim : pk_q_codes_bytes(bits, dim);
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *row = packed + r * row_bytes;
        float *o = out + r * dim;
        float scale, bias;
        pk_q_read_trailer(bits, row, codes_bytes, &scale, &bias);
        const __m256 vs = _mm256_set1_ps(scale), vb = _mm256_set1_ps(bias);
        size_t c;
        for (c = 0; c + 8 <= dim; c += 8)
            _mm256_storeu_ps(o + c, _mm256_fmadd_ps(codes8_ps(bits, row, c), vs, vb));
        for (; c < dim; c++) o[c] = fmaf(code_at(bits, row, c), scale, bias);
    }
}

/* ---- embedding bags ------------------------------------------------------------------------ */

#include "quantized_bags_head.h"

#define BLOCK_VECS 8     /* output floats held in registers per pass: 8 x 8 (16 ymm registers) */
/* A specialised D keeps up to 16 vectors (D = 128) in one pass: the compiler spills two
 * accumulators (a store-forwarded load and store each per row), which costs less than a second
 * pass over the bag re-reading every index, trailer and weight. */
#define SPEC_VECS 16

/* Sum one bag over output columns [d0, d0 + 8*nv + tail) with that slice of the output row in
 * registers.  bits, nv, tail, index_64, weighted (and row_bytes when D is specialised) are
 * compile-time constants after inlining, so the row loop holds no option branch.  Returns the
 * number of non-padding entries, or -1 with *bad_pos set for an out-of-range index. */
PK_ALWAYS_INLINE int64_t bag_block(const int bits, const int nv, const int tail, const int index_64,
                                   const int weighted, const bag_loop *a, int64_t begin,
                                   int64_t end, const int64_t row_bytes, const int64_t codes_bytes,
                                   int64_t d0, int prefetch, float *out, int64_t *bad_pos)
{
    __m256 acc[SPEC_VECS > BLOCK_VECS ? SPEC_VECS : BLOCK_VECS];
    float tacc[8] = {0};
    float bias_sum = 0.0f;   /* sum of w*bias, added once per bag instead of once per row */
    for (int v = 0; v < nv; v++) acc[v] = _mm256_setzero_ps();
    const void *indices = a->indices;
    const uint8_t *packed = a->packed;
    const uint64_t rows = (uint64_t)a->rows;
    const int64_t padding = a->padding_idx;
    const float *weights = a->weights;
    const int64_t wofs = weighted && a->positional ? begin : 0;
    /* the last index that has a row `ahead` positions ahead of it (prefetch: 0 none, 1 near, 2 far) */
    const int64_t ahead = prefetch == 2 ? PREFETCH_FAR : PREFETCH_NEAR;
    const int64_t pf_end = prefetch ? a->n_indices - ahead : 0;
    const int pairs = bits == 4 && nv % 2 == 0;
    int64_t count = 0;
    for (int64_t j = begin; j < end; j++) {
        const int64_t idx = index_at(index_64, indices, j);
        if ((uint64_t)idx >= rows) { *bad_pos = j; return -1; }
        if (j < pf_end) {
            const int64_t next = index_at(index_64, indices, j + ahead);
            if (prefetch == 2) prefetch_row(packed, next, row_bytes, 1);
            else prefetch_row(packed, next, row_bytes, 0);
        }
        if (idx == padding) continue;
        count++;
        const float w = weighted ? weights[j - wofs] : 1.0f;
        const uint8_t *row = packed + (uint64_t)idx * (uint64_t)row_bytes;
        float scale, bias;
        pk_q_read_trailer(bits, row, (size_t)codes_bytes, &scale, &bias);
        const float wscale = weighted ? w * scale : scale;
        const __m256 ws = _mm256_set1_ps(wscale);
        bias_sum += weighted ? w * bias : bias;
        if (pairs) {
            /* 16 codes from 8 bytes: low nibbles (even columns) and high nibbles (odd columns)
             * go to two accumulators, interleaved once at the store */
            for (int v = 0; v < nv; v += 2) {
                __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + (d0 + 8 * v) / 2)));
                __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(bytes, _mm256_set1_epi32(15)));
                __m256 hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4));
                acc[v] = _mm256_fmadd_ps(lo, ws, acc[v]);
                acc[v + 1] = _mm256_fmadd_ps(hi, ws, acc[v + 1]);
            }
        } else {
            for (int v = 0; v < nv; v++)
                acc[v] = _mm256_fmadd_ps(codes8_ps(bits, row, (size_t)d0 + 8 * v), ws, acc[v]);
        }
        for (int t = 0; t < tail; t++)
            tacc[t] = fmaf(code_at(bits, row, (size_t)d0 + 8 * nv + t), wscale, tacc[t]);
    }
    if (pairs) {
        for (int v = 0; v < nv; v += 2) {
            __m256 x = _mm256_unpacklo_ps(acc[v], acc[v + 1]);   /* l0 h0 l1 h1 | l4 h4 l5 h5 */
            __m256 y = _mm256_unpackhi_ps(acc[v], acc[v + 1]);   /* l2 h2 l3 h3 | l6 h6 l7 h7 */
            acc[v] = _mm256_permute2f128_ps(x, y, 0x20);
            acc[v + 1] = _mm256_permute2f128_ps(x, y, 0x31);
        }
    }
    const float norm_s = a->mean && count > 0 ? 1.0f / (float)count : 1.0f;
    const __m256 norm = _mm256_set1_ps(norm_s), vbias = _mm256_set1_ps(bias_sum);
    for (int v = 0; v < nv; v++)
        _mm256_storeu_ps(out + d0 + 8 * v, _mm256_mul_ps(_mm256_add_ps(acc[v], vbias), norm));
    for (int t = 0; t < tail; t++) out[d0 + 8 * nv + t] = (tacc[t] + bias_sum) * norm_s;
    return count;
}

/* All bags, all columns.  D (0: any) is a compile-time constant: a specialised D runs D / 128
 * passes of SPEC_VECS vectors (one for D <= 128) with a constant row size; any other D takes
 * passes of BLOCK_VECS vectors and a rest of nv < BLOCK_VECS vectors plus a scalar tail. */
PK_ALWAYS_INLINE pk_status bags_loop(const int bits, const int D, const int index_64,
                                     const int weighted, const int far, const bag_loop *a,
                                     const int64_t *offsets,
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
            const int nv = D < 8 * SPEC_VECS ? D / 8 : SPEC_VECS;
            for (int d0 = 0; d0 < D; d0 += 8 * nv)
                if (bag_block(bits, nv, 0, index_64, weighted, a, begin, end, row_bytes,
                              codes_bytes, d0, (d0 == 0) * (1 + far), out, bad_pos) < 0)
                    return PK_ERR_INDEX;
            continue;
        }
        int64_t d0 = 0;
        int prefetch = 1 + far;
        for (; d0 + 8 * BLOCK_VECS <= dim; d0 += 8 * BLOCK_VECS, prefetch = 0)
            if (bag_block(bits, BLOCK_VECS, 0, index_64, weighted, a, begin, end, row_bytes,
                          codes_bytes, d0, prefetch, out, bad_pos) < 0) return PK_ERR_INDEX;
        const int64_t rest = dim - d0;
        if (rest == 0) continue;
        const int nv = (int)(rest / 8), tail = (int)(rest % 8);
        int64_t r = 0;
#define REST_CASE(NV)                                                                             \
        case NV:                                                                                  \
            r = bag_block(bits, NV, tail, index_64, weighted, a, begin, end, row_bytes,          \
                          codes_bytes, d0, prefetch, out, bad_pos);                               \
            break;
        switch (nv) {
            REST_CASE(0) REST_CASE(1) REST_CASE(2) REST_CASE(3)
            REST_CASE(4) REST_CASE(5) REST_CASE(6) REST_CASE(7)
        }
#undef REST_CASE
        if (r < 0) return PK_ERR_INDEX;
    }
    return PK_OK;
}

#define PKQB_KERNEL pk_embedding_bag_quantized_avx2
#include "quantized_bags_entry.h"

#endif /* PK_X86_64 */
