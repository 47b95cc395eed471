/* Row-wise quantized tables for AVX-512 F/BW/DQ/VL: dequantize and the fused embedding bags
 * (quantize_rowwise is in quantized_prepack_avx512.c).  Compiled with the AVX-512 flags (setup.py,
 * this file only). */
#include "perfkernels/quantized.h"

#if PK_X86_64
#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__))
#error "quantized_avx512.c must be compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl"
#endif
#include <immintrin.h>
#include <math.h>
#include "quantized_rows.h"

static inline __mmask16 tail_mask(size_t n) { return (__mmask16)((1u << n) - 1u); }

/* Codes c .. c+15 of a row (c a multiple of 16; lanes outside m are 0) as floats; reads only the
 * bytes holding the codes in m. */
static inline __m512 codes16_ps(int bits, const uint8_t *codes, size_t c, __mmask16 m)
{
    if (bits == 8) return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, codes + c)));
    if (bits == 4) {
        __mmask16 bm = (__mmask16)((1u << ((__builtin_popcount(m) + 1) / 2)) - 1u);
        __m128i b = _mm_maskz_loadu_epi8(bm, codes + c / 2);
        __m512i rep = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(b, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)));
        __m512i q = _mm512_srlv_epi32(rep, _mm512_set4_epi32(4, 0, 4, 0));
        return _mm512_cvtepi32_ps(_mm512_maskz_and_epi32(m, q, _mm512_set1_epi32(15)));
    }
    __mmask16 bm = (__mmask16)((1u << ((__builtin_popcount(m) + 3) / 4)) - 1u);
    __m128i b = _mm_maskz_loadu_epi8(bm, codes + c / 4);
    __m512i rep = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(b, _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)));
    __m512i q = _mm512_srlv_epi32(rep, _mm512_set4_epi32(6, 4, 2, 0));
    return _mm512_cvtepi32_ps(_mm512_maskz_and_epi32(m, q, _mm512_set1_epi32(3)));
}

void pk_dequantize_rowwise_avx512(int bits, const uint8_t *packed, size_t rows, size_t row_bytes,
                                  size_t dim, float *out)
{
    size_t codes_bytes = bits == 8 ? dim : pk_q_codes_bytes(bits, dim);
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *row = packed + r * row_bytes;
        float *o = out + r * dim;
        float scale, bias;
        pk_q_read_trailer(bits, row, codes_bytes, &scale, &bias);
        const __m512 vs = _mm512_set1_ps(scale), vb = _mm512_set1_ps(bias);
        for (size_t c = 0; c < dim; c += 16) {
            __mmask16 m = dim - c >= 16 ? (__mmask16)0xffff : tail_mask(dim - c);
            _mm512_mask_storeu_ps(o + c, m, _mm512_fmadd_ps(codes16_ps(bits, row, c, m), vs, vb));
        }
    }
}

/* ---- embedding bags ------------------------------------------------------------------------ */

#include "quantized_bags_head.h"

#define BLOCK_VECS 16    /* output floats held in registers per pass: 16 x 16 (D = 256 in one pass) */

/* Sum one bag over output columns [d0, d0 + 16*nv) (the last vector limited by `last`) with that
 * slice of the output row in registers.  bits, nv, index_64, weighted (and row_bytes when D is
 * specialised) are compile-time constants after inlining, so the row loop holds no option branch.
 * Returns the number of non-padding entries, or -1 with *bad_pos set for an out-of-range index. */
PK_ALWAYS_INLINE int64_t bag_block(const int bits, const int nv, const int index_64,
                                   const int weighted, __mmask16 last, const bag_loop *a,
                                   int64_t begin, int64_t end, const int64_t row_bytes,
                                   const int64_t codes_bytes, int64_t d0, int prefetch, float *out,
                                   int64_t *bad_pos)
{
    __m512 acc[BLOCK_VECS];
    float bias_sum = 0.0f;   /* sum of w*bias, added once per bag instead of once per row */
    for (int v = 0; v < nv; v++) acc[v] = _mm512_setzero_ps();
    const void *indices = a->indices;
    const uint8_t *packed = a->packed;
    const uint64_t rows = (uint64_t)a->rows;
    const int64_t padding = a->padding_idx;
    const float *weights = a->weights;
    const int64_t wofs = weighted && a->positional ? begin : 0;
    /* the last index that has a row `ahead` positions ahead of it (prefetch: 0 none, 1 near, 2 far) */
    const int64_t ahead = prefetch == 2 ? PREFETCH_FAR : PREFETCH_NEAR;
    const int64_t pf_end = prefetch ? a->n_indices - ahead : 0;
    const int pairs = bits == 4 && nv % 2 == 0 && last == (__mmask16)0xffff;
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
        const __m512 ws = _mm512_set1_ps(weighted ? w * scale : scale);
        bias_sum += weighted ? w * bias : bias;
        if (pairs) {
            /* 32 codes from 16 bytes: low nibbles (even columns) and high nibbles (odd columns)
             * go to two accumulators, interleaved once at the store */
            for (int v = 0; v < nv; v += 2) {
                __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + (d0 + 16 * v) / 2)));
                __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(bytes, _mm512_set1_epi32(15)));
                __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4));
                acc[v] = _mm512_fmadd_ps(lo, ws, acc[v]);
                acc[v + 1] = _mm512_fmadd_ps(hi, ws, acc[v + 1]);
            }
        } else if (bits == 8) {
            for (int v = 0; v < nv; v++) {
                const uint8_t *c = row + d0 + 16 * v;
                __m128i q = v == nv - 1 && last != (__mmask16)0xffff ? _mm_maskz_loadu_epi8(last, c)
                                                                    : _mm_loadu_si128((const __m128i *)c);
                acc[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)), ws, acc[v]);
            }
        } else {
            for (int v = 0; v < nv; v++) {
                const __mmask16 m = v == nv - 1 ? last : (__mmask16)0xffff;
                acc[v] = _mm512_fmadd_ps(codes16_ps(bits, row, (size_t)d0 + 16 * v, m), ws, acc[v]);
            }
        }
    }
    if (pairs) {
        const __m512i even = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        const __m512i odd = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
        for (int v = 0; v < nv; v += 2) {
            __m512 x = _mm512_permutex2var_ps(acc[v], even, acc[v + 1]);
            __m512 y = _mm512_permutex2var_ps(acc[v], odd, acc[v + 1]);
            acc[v] = x;
            acc[v + 1] = y;
        }
    }
    const float norm_s = a->mean && count > 0 ? 1.0f / (float)count : 1.0f;
    const __m512 norm = _mm512_set1_ps(norm_s), vbias = _mm512_set1_ps(bias_sum);
    for (int v = 0; v < nv; v++) {
        const __mmask16 m = v == nv - 1 ? last : (__mmask16)0xffff;
        _mm512_mask_storeu_ps(out + d0 + 16 * v, m, _mm512_mul_ps(_mm512_add_ps(acc[v], vbias), norm));
    }
    return count;
}

/* All bags, all columns.  D (0: any) is a compile-time constant: a specialised D is held in
 * registers in one pass with a constant row size; any other D takes passes of BLOCK_VECS vectors
 * and a rest of up to BLOCK_VECS vectors, the last one masked. */
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
            if (bag_block(bits, (D + 15) / 16, index_64, weighted,
                          D % 16 ? (__mmask16)((1u << (D % 16)) - 1u) : (__mmask16)0xffff, a, begin,
                          end, row_bytes, codes_bytes, 0, 1 + far, out, bad_pos) < 0)
                return PK_ERR_INDEX;
            continue;
        }
        int64_t d0 = 0;
        int prefetch = 1 + far;
        for (; dim - d0 > 16 * BLOCK_VECS; d0 += 16 * BLOCK_VECS, prefetch = 0)
            if (bag_block(bits, BLOCK_VECS, index_64, weighted, 0xffff, a, begin, end, row_bytes,
                          codes_bytes, d0, prefetch, out, bad_pos) < 0) return PK_ERR_INDEX;
        const int64_t rest = dim - d0;                     /* 1 .. 16 * BLOCK_VECS */
        const int nv = (int)((rest + 15) / 16);
        const __mmask16 last = rest % 16 ? tail_mask((size_t)(rest % 16)) : (__mmask16)0xffff;
        int64_t r = 0;
#define REST_CASE(NV)                                                                             \
        case NV:                                                                                  \
            r = bag_block(bits, NV, index_64, weighted, last, a, begin, end, row_bytes,          \
                          codes_bytes, d0, prefetch, out, bad_pos);                               \
            break;
        switch (nv) {
            REST_CASE(1) REST_CASE(2) REST_CASE(3) REST_CASE(4)
            REST_CASE(5) REST_CASE(6) REST_CASE(7) REST_CASE(8)
            REST_CASE(9) REST_CASE(10) REST_CASE(11) REST_CASE(12)
            REST_CASE(13) REST_CASE(14) REST_CASE(15) REST_CASE(16)
        }
#undef REST_CASE
        if (r < 0) return PK_ERR_INDEX;
    }
    return PK_OK;
}

#define PKQB_KERNEL pk_embedding_bag_quantized_avx512
#include "quantized_bags_entry.h"

#endif /* PK_X86_64 */
