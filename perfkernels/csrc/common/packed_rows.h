/* The packed-row layout of the row-wise quantized formats, as every reader of packed rows needs it
 * (the bag loop, the scalar kernels, dequantize, the unpooled lookups): a row is its codes (8-bit: one
 * byte each; 4/2-bit: packed low bits first, a partial last byte zero-padded), then a trailer of
 * scale and bias (8-bit: two float32; 4/2-bit: two float16).  Plain C, everything static. */
#ifndef PK_COMMON_PACKED_ROWS_H
#define PK_COMMON_PACKED_ROWS_H

#include <stdint.h>
#include <string.h>

#include "common/half_bits.h"

/* Trailer of a packed row: scale and bias as float32. */
static inline void pk_q_read_trailer(int bits, const uint8_t *row, size_t codes_bytes,
                                     float *scale, float *bias)
{
    if (bits == 8) {
        memcpy(scale, row + codes_bytes, 4);
        memcpy(bias, row + codes_bytes + 4, 4);
    } else {
        uint16_t s, b;
        memcpy(&s, row + codes_bytes, 2);
        memcpy(&b, row + codes_bytes + 2, 2);
        *scale = pk_bits_f32(pk_f16_to_f32_bits(s));
        *bias = pk_bits_f32(pk_f16_to_f32_bits(b));
    }
}

static inline size_t pk_q_codes_bytes(int bits, size_t dim)
{
    size_t per = (size_t)(8 / bits);
    return (dim + per - 1) / per;
}

#endif
