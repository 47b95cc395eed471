/* Row-wise quantization (quantize_rowwise), written once over vector primitives.  Internal header,
 * x86-64 only: quantized_prepack_avx2.c and quantized_prepack_avx512.c define the primitives below
 * and PKQ_KERNEL (the exported function's name), then include this file.
 *
 *   PKQ_W                        lanes of a float vector (8 / 16); a block is 4 vectors (PKQ_B)
 *   pkq_vf, pkq_vb, pkq_vl       float vector; 4W codes as bytes; int16 "lowest code" tracker
 *   pkq_load(row, half, c)       W floats of the row from column c (float32 or float16 row)
 *   pkq_set1(x), pkq_min/max     broadcast, lane-wise minps / maxps
 *   pkq_reduce(vmn, vmx, &mn, &mx)  min and max over the lanes, in any order
 *   pkq_codes(x0..x3, sub, inv, &low)  the block's 4W codes round_even((x - sub) * inv),
 *                                saturated to [0, 255] (a NaN lane gives 0), in order; `low`
 *                                takes the lane-wise minimum of the codes saturated to int16
 *   pkq_low_init(), pkq_hit_floor(low)  start value; nonzero if some code saturated at -32768
 *   pkq_store(bits, codes, dst)  the block's codes clamped to 2^bits - 1 and packed low bits first:
 *                                4W * bits / 8 bytes at dst
 *
 * Per row: pass 1 takes min/max with 4 x W lanes, pass 2 writes the codes with four vectors per block
 * and one int16 pack/min chain, which replaces clamping (the packs saturate) and the non-finite
 * check.  A NaN or inf anywhere in a row makes some code NaN (x - mn or x - bias is inf or NaN, or
 * inv is 0 and inf * 0 is NaN), and cvtps of NaN is INT_MIN, which saturates to -32768; a finite
 * row gets there only when its range overflows float32 (then PyTorch's codes are 0, as ours are)
 * or its float16 bias is infinite.  So a row that hits -32768 is scanned for a non-finite value,
 * and every other row is known finite without looking at each element twice.
 *
 * The min/max may be reduced in any order: on values that compare equal only the sign of a zero
 * can differ, so a row whose min or max is zero is redone in FBGEMM's 8-lane order (pkq_exact). */
#ifndef PERFKERNELS_QUANTIZED_PREPACK_BODY_H
#define PERFKERNELS_QUANTIZED_PREPACK_BODY_H

#include <float.h>
#include <string.h>
#include <immintrin.h>

/* float16 <-> float32 of the per-row trailer through F16C: the same bits as the portable
 * conversions of convert_bits.h for every non-NaN value (a NaN row is an error anyway). */
#define PK_Q_TO_F16(f) ((uint16_t)_cvtss_sh((f), _MM_FROUND_TO_NEAREST_INT))
#define PK_Q_FROM_F16(h) _cvtsh_ss((unsigned short)(h))
#include "quantized_rows.h"

#define PKQ_B (4 * PKQ_W)
#define PKQ_INLINE static inline __attribute__((always_inline))

PKQ_INLINE float pkq_load1(const void *row, int half, size_t c)
{
    if (half) return _cvtsh_ss(((const uint16_t *)row)[c]);
    return ((const float *)row)[c];
}

/* FBGEMM's min/max replayed exactly (pk_q_minmax_exact), its 8-lane part with AVX2. */
static __attribute__((noinline, cold)) void pkq_exact(const void *row, int half, size_t dim,
                                                       float *mn_out, float *mx_out)
{
    __m256 vmn = _mm256_set1_ps(FLT_MAX), vmx = _mm256_set1_ps(-FLT_MAX);
    size_t c;
    for (c = 0; c + 8 <= dim; c += 8) {
        __m256 x = half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + c)))
                        : _mm256_loadu_ps((const float *)row + c);
        vmn = _mm256_min_ps(vmn, x);
        vmx = _mm256_max_ps(vmx, x);
    }
    float mn8[8], mx8[8];
    _mm256_storeu_ps(mn8, vmn);
    _mm256_storeu_ps(mx8, vmx);
    pk_q_minmax_fold(mn8, mx8, row, half, c, dim, mn_out, mx_out);
}

static __attribute__((noinline, cold)) int pkq_row_nonfinite(const void *row, int half, size_t dim)
{
    for (size_t c = 0; c < dim; c++)
        if (pk_q_nonfinite(pkq_load1(row, half, c))) return 1;
    return 0;
}

/* Pass 1 of a row: its min/max, its trailer written to `out`, the codes pass's parameters. */
PKQ_INLINE pk_q_params pkq_prepare(int bits, int half, const void *row, size_t dim, uint8_t *out)
{
    /* four independent min and max chains: one chain would make the row's latency, not the
     * instruction count, the limit */
    pkq_vf vmn = pkq_set1(FLT_MAX), vmx = pkq_set1(-FLT_MAX);
    pkq_vf vmn1 = vmn, vmn2 = vmn, vmn3 = vmn, vmx1 = vmx, vmx2 = vmx, vmx3 = vmx;
    size_t c;
    for (c = 0; c + PKQ_B <= dim; c += PKQ_B) {
        pkq_vf x0 = pkq_load(row, half, c), x1 = pkq_load(row, half, c + PKQ_W);
        pkq_vf x2 = pkq_load(row, half, c + 2 * PKQ_W), x3 = pkq_load(row, half, c + 3 * PKQ_W);
        vmn = pkq_min(vmn, x0);
        vmx = pkq_max(vmx, x0);
        vmn1 = pkq_min(vmn1, x1);
        vmx1 = pkq_max(vmx1, x1);
        vmn2 = pkq_min(vmn2, x2);
        vmx2 = pkq_max(vmx2, x2);
        vmn3 = pkq_min(vmn3, x3);
        vmx3 = pkq_max(vmx3, x3);
    }
    for (; c + PKQ_W <= dim; c += PKQ_W) {
        pkq_vf x = pkq_load(row, half, c);
        vmn = pkq_min(vmn, x);
        vmx = pkq_max(vmx, x);
    }
    vmn = pkq_min(pkq_min(vmn, vmn1), pkq_min(vmn2, vmn3));
    vmx = pkq_max(pkq_max(vmx, vmx1), pkq_max(vmx2, vmx3));
    float mn, mx;
    pkq_reduce(vmn, vmx, &mn, &mx);
    for (; c < dim; c++) {
        float x = pkq_load1(row, half, c);
        mn = x < mn ? x : mn;
        mx = mx < x ? x : mx;
    }
    if (__builtin_expect(mn == 0.0f || mx == 0.0f, 0)) pkq_exact(row, half, dim, &mn, &mx);

    const size_t codes_bytes = bits == 8 ? dim : pk_q_codes_bytes(bits, dim);
    return pk_q_params_for(bits, mn, mx, out, codes_bytes);
}

/* Pass 2 of a row: its codes.  Returns nonzero if the row holds NaN or inf (its output bytes are
 * then unspecified). */
PKQ_INLINE int pkq_encode(int bits, int half, const void *row, size_t dim, uint8_t *out,
                          pk_q_params p)
{
    const pkq_vf sub = pkq_set1(p.sub), inv = pkq_set1(p.inv);
    pkq_vl low = pkq_low_init();
    size_t c;
    for (c = 0; c + PKQ_B <= dim; c += PKQ_B) {
        pkq_vb q = pkq_codes(pkq_load(row, half, c), pkq_load(row, half, c + PKQ_W),
                             pkq_load(row, half, c + 2 * PKQ_W), pkq_load(row, half, c + 3 * PKQ_W),
                             sub, inv, &low);
        pkq_store(bits, q, out + c * (size_t)bits / 8);
    }
    if (c < dim) {   /* the last partial block, padded with `sub` (code 0) */
        float buf[PKQ_B];
        uint8_t codes[PKQ_B];
        size_t n = dim - c, k;
        for (k = 0; k < n; k++) buf[k] = pkq_load1(row, half, c + k);
        for (; k < PKQ_B; k++) buf[k] = p.sub;
        pkq_vb q = pkq_codes(pkq_load(buf, 0, 0), pkq_load(buf, 0, PKQ_W), pkq_load(buf, 0, 2 * PKQ_W),
                             pkq_load(buf, 0, 3 * PKQ_W), sub, inv, &low);
        pkq_store(bits, q, codes);
        memcpy(out + c * (size_t)bits / 8, codes, (n * (size_t)bits + 7) / 8);
    }
    return __builtin_expect(pkq_hit_floor(low), 0) ? pkq_row_nonfinite(row, half, dim) : 0;
}

/* Rows one after another, written with ordinary stores.  (Staging the output in L1 and leaving
 * it as non-temporal 64-byte lines was tried for tables that exceed the caches: no faster once the
 * output pages exist, and slower when they are fresh, since the kernel's zeroing has just pulled
 * them into cache.)
 *
 * A table whose input stays in cache is compute-bound, and there the rows are software-pipelined:
 * row r + 1's pass 1 (a long dependency chain: min/max, reductions, two divisions) is issued
 * before row r's codes pass, so the two overlap (8-bit, D = 128, 2,000 and 20,000 rows:
 * 18.6 -> 15.2 and 18.9 -> 17.1 ns a row).  Tables beyond that are memory-bound and keep the plain
 * order, which streams better (the pipelined order was 5-25% slower from 15 MB of input up,
 * measured side by side on AMD Zen 4 with a 32 MiB L3). */
#define PKQ_PIPELINE_MAX_BYTES ((size_t)8 << 20)

PKQ_INLINE pk_status pkq_rows(int bits, int half, const void *weight, size_t rows, size_t dim,
                              uint8_t *packed, size_t *bad_row)
{
    const size_t row_bytes = pk_quantized_row_bytes(bits, dim);
    const size_t in_row = dim * (half ? 2 : 4);
    if (rows == 0) return PK_OK;
    if (rows * in_row > PKQ_PIPELINE_MAX_BYTES) {
        for (size_t r = 0; r < rows; r++) {
            const char *row = (const char *)weight + r * in_row;
            uint8_t *out = packed + r * row_bytes;
            if (pkq_encode(bits, half, row, dim, out, pkq_prepare(bits, half, row, dim, out))) {
                *bad_row = r;
                return PK_ERR_NONFINITE;
            }
        }
        return PK_OK;
    }
    pk_q_params p = pkq_prepare(bits, half, weight, dim, packed);
    for (size_t r = 0; r < rows; r++) {
        const char *row = (const char *)weight + r * in_row;
        pk_q_params next = p;
        if (r + 1 < rows) next = pkq_prepare(bits, half, row + in_row, dim, packed + (r + 1) * row_bytes);
        if (pkq_encode(bits, half, row, dim, packed + r * row_bytes, p)) {
            *bad_row = r;
            return PK_ERR_NONFINITE;
        }
        p = next;
    }
    return PK_OK;
}

/* bits and the input type as constants; D = 64 / 128 / 256 (the common widths) compiled in too. */
#define PKQ_ROWS(BITS, HALF)                                                                     \
    switch (dim) {                                                                               \
    case 64: return pkq_rows(BITS, HALF, weight, rows, 64, packed, bad_row);                     \
    case 128: return pkq_rows(BITS, HALF, weight, rows, 128, packed, bad_row);                   \
    case 256: return pkq_rows(BITS, HALF, weight, rows, 256, packed, bad_row);                   \
    default: return pkq_rows(BITS, HALF, weight, rows, dim, packed, bad_row);                    \
    }

pk_status PKQ_KERNEL(int bits, int half_input, const void *weight, size_t rows, size_t dim,
                     uint8_t *packed, size_t *bad_row)
{
    if (half_input) {
        if (bits == 8) PKQ_ROWS(8, 1)
        if (bits == 4) PKQ_ROWS(4, 1)
        PKQ_ROWS(2, 1)
    }
    if (bits == 8) PKQ_ROWS(8, 0)
    if (bits == 4) PKQ_ROWS(4, 0)
    PKQ_ROWS(2, 0)
}

#endif
