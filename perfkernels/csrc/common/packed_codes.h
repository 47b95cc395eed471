/* Block loads of row-wise quantized codes as floats, and the row's scale and bias, for the
 * vector levels (the generated per-level file includes simd/<isa>.h first): the bag loop
 * (common/bag_loop.h), dequantize_rowwise and the unpooled quantized lookups (sequence/body.h)
 * read packed rows (common/packed_rows.h) through these, and nothing else. */
#ifndef PK_COMMON_PACKED_CODES_H
#define PK_COMMON_PACKED_CODES_H

#include <string.h>

/* A packed row's scale and bias.  The 4/2-bit trailer's float16 values go through the level's
 * conversion (F16C: one instruction each, where common/packed_rows.h's portable conversion takes
 * about twenty per value): the same value for every non-NaN (quantize never writes a NaN). */
PK_INLINE void pk_packed_trailer(const int bits, const uint8_t *row, size_t codes_bytes,
                                 float *scale, float *bias)
{
    if (bits == 8) {
        memcpy(scale, row + codes_bytes, 4);
        memcpy(bias, row + codes_bytes + 4, 4);
        return;
    }
    uint16_t s, b;
    memcpy(&s, row + codes_bytes, 2);
    memcpy(&b, row + codes_bytes + 2, 2);
    *scale = s_from_f16(s);
    *bias = s_from_f16(b);
}

/* Codes c .. c + VL - 1 of a row (c a multiple of VL) as floats; reads only the bytes holding them. */
PK_INLINE vf load_codes(const int bits, const uint8_t *row, int64_t c)
{
    if (bits == 8) return v_load_u8(row + c);
    if (bits == 4) return v_load_u4(row + c / 2);
    return v_load_u2(row + c / 4);
}

/* The first codes of tail t from c on.  The row's trailer (8 bytes after 8-bit codes, 4 after 4-
 * and 2-bit ones) follows its codes, so where a full load of VL codes takes no more bytes than one
 * code's byte and the trailer hold (AVX2's 8, 4, 2 bytes; AVX-512's 2-bit 4), that load stays
 * inside the row: it replaces the tail load's copy through a buffer (on AVX2 a call to memcpy of a
 * variable size, for every row, around which the compiler spilled the accumulators).  Lanes past
 * the tail then hold codes read from the trailer: finite, and never stored. */
PK_INLINE vf load_codes_tail(const int bits, const uint8_t *row, int64_t c, v_tail t)
{
    const int load_bytes = bits == 8 ? VL : VL * bits / 8, trailer = bits == 8 ? 8 : 4;
    if (load_bytes <= 1 + trailer) return load_codes(bits, row, c);
    if (bits == 8) return v_load_u8_tail(row + c, t);
    if (bits == 4) return v_load_u4_tail(row + c / 2, t);
    return v_load_u2_tail(row + c / 4, t);
}

#endif
