/* Scalar float16/bfloat16 bit conversions, exact for every input.  Internal header: everything is
 * static, so an ISA file that includes it gets a private copy (see simd/common.h). */
#ifndef PERFKERNELS_CONVERT_BITS_H
#define PERFKERNELS_CONVERT_BITS_H

#include <stdint.h>
#include <string.h>

static inline uint32_t pk_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float pk_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* float32 -> float16, round to nearest even; NaN payload truncated as NumPy does. */
static inline uint16_t pk_f32_to_f16_bits(uint32_t f)
{
    uint32_t sign = (f >> 16) & 0x8000u;
    uint32_t a = f & 0x7fffffffu;
    if (a >= 0x7f800000u) {                    /* inf or NaN */
        uint32_t payload = (a & 0x7fffffu) >> 13;
        if (a == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
        return (uint16_t)(sign | 0x7c00u | (payload ? payload : 1u));
    }
    if (a >= 0x477ff000u)                      /* >= 65520 rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) {                    /* normal half: |f| >= 2^-14 */
        uint32_t r = a + 0x0fffu + ((a >> 13) & 1u);
        return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
    }
    if (a < 0x33000000u)                       /* < 2^-25: rounds to zero */
        return (uint16_t)sign;
    /* subnormal half: round(|f| / 2^-24); may round up into the smallest normal */
    uint32_t e = a >> 23;                      /* 102 .. 112 */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;                 /* 14 .. 24 */
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    q += (rem > half) || (rem == half && (q & 1u));
    return (uint16_t)(sign | q);
}

/* float16 -> float32, exact; NaN payload kept (shifted), not quieted, as NumPy does. */
static inline uint32_t pk_f16_to_f32_bits(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0x1fu) return sign | 0x7f800000u | (m << 13);
    if (e != 0) return sign | ((e + 112u) << 23) | (m << 13);
    return sign | pk_f32_bits((float)m * 0x1p-24f);   /* zero or subnormal: exact */
}

/* float32 -> bfloat16, round to nearest even; NaN -> quiet NaN with the sign, as ml_dtypes does. */
static inline uint16_t pk_f32_to_bf16_bits(uint32_t f)
{
    if ((f & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(((f >> 16) & 0x8000u) | 0x7fc0u);
    return (uint16_t)((f + 0x7fffu + ((f >> 16) & 1u)) >> 16);
}

static inline uint32_t pk_bf16_to_f32_bits(uint16_t b) { return (uint32_t)b << 16; }

#endif
