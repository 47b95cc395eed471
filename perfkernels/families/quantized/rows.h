/* Scalar pieces of row-wise quantization shared by every ISA file: the per-row parameters, exactly
 * as FBGEMM computes them.  Internal header, everything static (see simd/common.h).
 *
 * PyTorch's prepack ops run FBGEMM's AVX2 quantizer (float16 tables are widened to float32
 * first).  It takes min/max with 8 lanes of `minps(acc, x)` over the first D/8*8 elements, folds
 * the lanes with std::min/std::max in lane order, then the tail with std::min/std::max.  On
 * values that compare equal only the sign of zero can differ, and it shows in the stored bias
 * (and in an 8-bit scale of -0.0), so pk_q_minmax_exact replays that order exactly; vector paths
 * may reduce any way they like and fall back to it only when the min or max is a zero.
 *
 * Nothing here can be contracted into an FMA ((x - mn) * inv is a subtract then a multiply), so
 * the vector paths produce the same bytes as this code without -ffp-contract games. */
#ifndef PERFKERNELS_QUANTIZED_ROWS_H
#define PERFKERNELS_QUANTIZED_ROWS_H

#include <float.h>
#include <stdint.h>
#include <string.h>
#include "common/half_bits.h"
#include "common/packed_rows.h"   /* pk_q_read_trailer, pk_q_codes_bytes */

/* float32 -> float16 bits (round to nearest even) and back for the 4/2-bit trailer.  Portable by
 * default; an ISA file may define both as F16C instructions before including this header. */
#ifndef PK_Q_TO_F16
#define PK_Q_TO_F16(f) pk_f32_to_f16_bits(pk_f32_bits(f))
#define PK_Q_FROM_F16(h) pk_bits_f32(pk_f16_to_f32_bits(h))
#endif

static inline float pk_q_load(const void *w, int half_input, size_t i)
{
    if (half_input) return pk_bits_f32(pk_f16_to_f32_bits(((const uint16_t *)w)[i]));
    return ((const float *)w)[i];
}

/* FBGEMM's reduction order, second half: the 8 lane results (lane l covers columns l, l+8, ...
 * of the first `body` = D/8*8) folded in lane order with std::min/std::max (std::min(a, b) =
 * b < a ? b : a), then the tail columns. */
static inline void pk_q_minmax_fold(const float mn8[8], const float mx8[8], const void *row,
                                    int half_input, size_t body, size_t dim,
                                    float *mn_out, float *mx_out)
{
    float m = FLT_MAX, M = -FLT_MAX;
    for (int l = 0; l < 8; l++) {
        m = mn8[l] < m ? mn8[l] : m;
        M = M < mx8[l] ? mx8[l] : M;
    }
    for (size_t c = body; c < dim; c++) {
        float x = pk_q_load(row, half_input, c);
        m = x < m ? x : m;
        M = M < x ? x : M;
    }
    *mn_out = m;
    *mx_out = M;
}

/* FBGEMM's min/max exactly: 8 lanes of minps(acc, x) = acc < x ? acc : x over the first D/8*8
 * columns, then pk_q_minmax_fold. */
static inline void pk_q_minmax_exact(const void *row, int half_input, size_t dim,
                                     float *mn_out, float *mx_out)
{
    float mn[8], mx[8];
    for (int l = 0; l < 8; l++) { mn[l] = FLT_MAX; mx[l] = -FLT_MAX; }
    size_t body = dim / 8 * 8;
    for (size_t c = 0; c < body; c += 8)
        for (int l = 0; l < 8; l++) {
            float x = pk_q_load(row, half_input, c + l);
            mn[l] = mn[l] < x ? mn[l] : x;
            mx[l] = mx[l] > x ? mx[l] : x;
        }
    pk_q_minmax_fold(mn, mx, row, half_input, body, dim, mn_out, mx_out);
}

/* What the quantize loop needs: code = round_even((x - sub) * inv), clamped to [0, qmax]. */
typedef struct pk_q_params {
    float sub, inv;
} pk_q_params;

/* Write the row's trailer (scale, bias) after `codes_bytes` bytes and return the loop's params. */
static inline pk_q_params pk_q_params_for(int bits, float mn, float mx, uint8_t *row_out,
                                          size_t codes_bytes)
{
    pk_q_params p;
    if (bits == 8) {
        float range = mx - mn;
        float scale = range / 255.0f;
        p.sub = mn;
        p.inv = 255.0f / (range + 1e-8f);
        memcpy(row_out + codes_bytes, &scale, 4);
        memcpy(row_out + codes_bytes + 4, &mn, 4);
        return p;
    }
    uint16_t bias_h = PK_Q_TO_F16(mn);
    float bias = PK_Q_FROM_F16(bias_h);
    float range = mx - bias;
    float scale = range == 0.0f ? 1.0f : range / (float)((1 << bits) - 1);
    scale = PK_Q_FROM_F16(PK_Q_TO_F16(scale));
    if (scale == 0.0f) scale = 1.0f;
    float inv = 1.0f / scale;
    if (inv - inv != 0.0f && inv == inv) { scale = 1.0f; inv = 1.0f; }   /* isinf(inv) */
    uint16_t scale_h = PK_Q_TO_F16(scale);
    memcpy(row_out + codes_bytes, &scale_h, 2);
    memcpy(row_out + codes_bytes + 2, &bias_h, 2);
    p.sub = bias;
    p.inv = inv;
    return p;
}

/* round_even(v) clamped to [0, qmax]; NaN gives 0 (as lrintf -> LONG_MIN -> clamp/truncate in
 * FBGEMM).  |v| < 2^22 whenever v is finite (v = (x - min) * inv <= ~2^bits), so the 1.5 * 2^23 trick
 * rounds to nearest even exactly. */
static inline uint8_t pk_q_code(float v, int qmax)
{
    if (!(v == v)) return 0;
    float r = (v + 12582912.0f) - 12582912.0f;
    if (!(r > 0.0f)) return 0;
    if (r >= (float)qmax) return (uint8_t)qmax;
    return (uint8_t)(int)r;
}

/* Nonzero if x is NaN or inf. */
static inline int pk_q_nonfinite(float x) { return !(x - x == 0.0f); }

/* Pack `n` codes (each < 2^bits) into bytes, low bits first; a partial last byte is zero-padded. */
static inline void pk_q_pack(int bits, const uint8_t *codes, size_t n, uint8_t *dst)
{
    size_t per = (size_t)(8 / bits);
    size_t full = n / per, i;
    for (i = 0; i < full; i++) {
        unsigned b = 0;
        for (size_t k = 0; k < per; k++) b |= (unsigned)codes[i * per + k] << (k * bits);
        dst[i] = (uint8_t)b;
    }
    if (n % per) {
        unsigned b = 0;
        for (size_t k = 0; k < n % per; k++) b |= (unsigned)codes[i * per + k] << (k * bits);
        dst[i] = (uint8_t)b;
    }
}

#endif
