/* Conversion kernels, portable C (any architecture). */
#include "convert/levels.h"
#include "common/half_bits.h"

#define CLIP_MAX_HALF 65504.0f

void pk_float_to_half_scalar(const float *src, uint16_t *dst, size_t n, int clip)
{
    for (size_t i = 0; i < n; i++) {
        float x = src[i];
        if (clip && x == x)    /* NaN compares false and passes through */
            x = x > CLIP_MAX_HALF ? CLIP_MAX_HALF : (x < -CLIP_MAX_HALF ? -CLIP_MAX_HALF : x);
        dst[i] = pk_f32_to_f16_bits(pk_f32_bits(x));
    }
}

void pk_half_to_float_scalar(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = pk_bits_f32(pk_f16_to_f32_bits(src[i]));
}

void pk_float_to_bf16_scalar(const float *src, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = pk_f32_to_bf16_bits(pk_f32_bits(src[i]));
}

void pk_bf16_to_float_scalar(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = pk_bits_f32(pk_bf16_to_f32_bits(src[i]));
}
