/* Row-wise quantization (quantize_rowwise), written once over the SIMD primitives; part of
 * quantized/body.h.
 *
 * Per row: pass 1 takes min/max with 4 x VL lanes, pass 2 writes the codes with four vectors per
 * block (v_round_u8) and one int16 pack/min chain, which replaces clamping (the packs saturate) and
 * the non-finite check.  A NaN or inf anywhere in a row makes some code NaN (x - mn or x - bias is
 * inf or NaN, or inv is 0 and inf * 0 is NaN), and cvtps of NaN is INT_MIN, which saturates to
 * -32768; a finite row gets there only when its range overflows float32 (then PyTorch's codes are
 * 0, as ours are) or its float16 bias is infinite.  So a row that hits -32768 is scanned for a
 * non-finite value, and every other row is known finite without looking at each element twice.
 *
 * The min/max may be reduced in any order: on values that compare equal only the sign of a zero
 * can differ, so a row whose min or max is zero is redone in FBGEMM's 8-lane order (pkq_exact). */
#ifndef PK_QUANTIZED_PREPACK_H
#define PK_QUANTIZED_PREPACK_H

#include <float.h>
#include <string.h>

#define PKQ_B (4 * VL) /* columns per block */

PK_INLINE vf pkq_load(const void *row, int half, size_t c)
{
    if (half) return v_from_f16(vh_load((const uint16_t *)row + c));
    return v_load((const float *)row + c);
}

PK_INLINE float pkq_load1(const void *row, int half, size_t c)
{
    if (half) return s_from_f16(((const uint16_t *)row)[c]);
    return ((const float *)row)[c];
}

/* FBGEMM's min/max replayed exactly (pk_q_minmax_exact): its 8 lanes are an AVX2 register. */
static __attribute__((noinline, cold)) void pkq_exact(const void *row, int half, size_t dim,
                                                       float *mn_out, float *mx_out)
{
#ifndef __AVX2__
    pk_q_minmax_exact(row, half, dim, mn_out, mx_out);
#else
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
#endif
}

static __attribute__((noinline, cold)) int pkq_row_nonfinite(const void *row, int half, size_t dim)
{
    for (size_t c = 0; c < dim; c++)
        if (pk_q_nonfinite(pkq_load1(row, half, c))) return 1;
    return 0;
}

/* Pass 1 of a row: its min/max, its trailer written to `out`, the codes pass's parameters. */
PK_INLINE pk_q_params pkq_prepare(int bits, int half, const void *row, size_t dim, uint8_t *out)
{
    /* four independent min and max chains: one chain would make the row's latency, not the
     * instruction count, the limit */
    vf vmn = v_set1(FLT_MAX), vmx = v_set1(-FLT_MAX);
    vf vmn1 = vmn, vmn2 = vmn, vmn3 = vmn, vmx1 = vmx, vmx2 = vmx, vmx3 = vmx;
    size_t c;
    for (c = 0; c + PKQ_B <= dim; c += PKQ_B) {
        vf x0 = pkq_load(row, half, c), x1 = pkq_load(row, half, c + VL);
        vf x2 = pkq_load(row, half, c + 2 * VL), x3 = pkq_load(row, half, c + 3 * VL);
        vmn = v_min(vmn, x0);
        vmx = v_max(vmx, x0);
        vmn1 = v_min(vmn1, x1);
        vmx1 = v_max(vmx1, x1);
        vmn2 = v_min(vmn2, x2);
        vmx2 = v_max(vmx2, x2);
        vmn3 = v_min(vmn3, x3);
        vmx3 = v_max(vmx3, x3);
    }
    for (; c + VL <= dim; c += VL) {
        vf x = pkq_load(row, half, c);
        vmn = v_min(vmn, x);
        vmx = v_max(vmx, x);
    }
    vmn = v_min(v_min(vmn, vmn1), v_min(vmn2, vmn3));
    vmx = v_max(v_max(vmx, vmx1), v_max(vmx2, vmx3));
    float mn = v_hmin(vmn), mx = v_hmax(vmx);
    for (; c < dim; c++) {
        float x = pkq_load1(row, half, c);
        mn = x < mn ? x : mn;
        mx = mx < x ? x : mx;
    }
    if (__builtin_expect(mn == 0.0f || mx == 0.0f, 0)) pkq_exact(row, half, dim, &mn, &mx);

    const size_t codes_bytes = bits == 8 ? dim : pk_q_codes_bytes(bits, dim);
    return pk_q_params_for(bits, mn, mx, out, codes_bytes);
}

/* A block's 4 * VL codes round_even((x - sub) * inv), saturated to [0, 255], in order. */
PK_INLINE vb pkq_codes(vf x0, vf x1, vf x2, vf x3, vf sub, vf inv, vl *low)
{
    return v_round_u8(v_mul(v_sub(x0, sub), inv), v_mul(v_sub(x1, sub), inv),
                      v_mul(v_sub(x2, sub), inv), v_mul(v_sub(x3, sub), inv), low);
}

/* Pass 2 of a row: its codes.  Returns nonzero if the row holds NaN or inf (its output bytes are
 * then unspecified). */
PK_INLINE int pkq_encode(int bits, int half, const void *row, size_t dim, uint8_t *out,
                          pk_q_params p)
{
    const vf sub = v_set1(p.sub), inv = v_set1(p.inv);
    vl low = vl_init();
    size_t c;
    for (c = 0; c + PKQ_B <= dim; c += PKQ_B) {
        vb q = pkq_codes(pkq_load(row, half, c), pkq_load(row, half, c + VL),
                         pkq_load(row, half, c + 2 * VL), pkq_load(row, half, c + 3 * VL), sub, inv,
                         &low);
        vb_store_bits(bits, q, out + c * (size_t)bits / 8);
    }
    if (c < dim) {   /* the last partial block, padded with `sub` (code 0) */
        float buf[PKQ_B];
        uint8_t codes[PKQ_B];
        size_t n = dim - c, k;
        for (k = 0; k < n; k++) buf[k] = pkq_load1(row, half, c + k);
        for (; k < PKQ_B; k++) buf[k] = p.sub;
        vb q = pkq_codes(pkq_load(buf, 0, 0), pkq_load(buf, 0, VL), pkq_load(buf, 0, 2 * VL),
                         pkq_load(buf, 0, 3 * VL), sub, inv, &low);
        vb_store_bits(bits, q, codes);
        memcpy(out + c * (size_t)bits / 8, codes, (n * (size_t)bits + 7) / 8);
    }
    return __builtin_expect(vl_at_floor(low), 0) ? pkq_row_nonfinite(row, half, dim) : 0;
}

/* Rows one after another, written with ordinary stores: the output is freshly allocated, so its
 * pages have just been zeroed into cache and non-temporal stores would only evict them.
 *
 * A table whose input stays in cache is compute-bound, and there the rows are software-pipelined:
 * row r + 1's pass 1 (a long dependency chain: min/max, reductions, two divisions) is issued
 * before row r's codes pass, so the two overlap.  Larger tables are memory-bound, and the plain
 * order streams better there; the limit is a fraction of a typical L3. */
#define PKQ_PIPELINE_MAX_BYTES ((size_t)8 << 20)

PK_INLINE pk_status pkq_rows(int bits, int half, const void *weight, size_t rows, size_t dim,
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

pk_status PK_ISA_FN(pk_quantize_rowwise)(int bits, int half_input, const void *weight, size_t rows,
                                         size_t dim, uint8_t *packed, size_t *bad_row)
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
