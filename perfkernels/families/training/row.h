/* What every ISA's training update shares (internal header, everything static): reading a group,
 * the table element types, and rounding a new float32 value back to a 16-bit table, to nearest
 * even or stochastically. */
#ifndef PK_TRAINING_ROW_H
#define PK_TRAINING_ROW_H

#include <math.h>

#include "perfkernels/training.h"
#include "common/half_bits.h"

enum training_table { TRAIN_F32, TRAIN_F16, TRAIN_BF16 };

/* The row a group updates. */
static inline int64_t group_row(const pk_training_work *work, int64_t u)
{
    return (int64_t)(work->keys[work->group_start[u]] >> work->payload_bits);
}

/* An entry's upstream gradient row G[b] and its coefficient scale_b * w_j. */
static inline const float *entry_grad(const pk_training_work *work, uint64_t key, const float *grad,
                                      int64_t grad_stride, float *coef)
{
    const uint64_t mask = work->payload_bits ? (~(uint64_t)0 >> (64 - work->payload_bits)) : 0;
    const int64_t p = (int64_t)(key & mask);
    if (work->per_entry) {
        *coef = work->entry_coef[p];
        return grad + work->entry_bag[p] * grad_stride;
    }
    *coef = work->bag_scale[p];
    return grad + p * grad_stride;
}

/* Random bits for stochastic rounding: a hash (splitmix64's finaliser) of (seed, row, column), so
 * the bits do not depend on which thread updates the row or in which order. */
static inline uint64_t sr_bits(uint64_t seed, int64_t row, int64_t col)
{
    uint64_t x = seed + (uint64_t)row * 0x9E3779B97F4A7C15u + (uint64_t)col * 0xD1B54A32D192ED03u;
    x ^= x >> 30; x *= 0xBF58476D1CE4E5B9u;
    x ^= x >> 27; x *= 0x94D049BB133111EBu;
    return x ^ (x >> 31);
}

/* float32 -> bfloat16 rounding up in magnitude with probability (dropped bits) / 2^16: adding 16
 * random bits below the kept ones and truncating (FBGEMM's stochastic rounding).  NaN as nearest. */
static inline uint16_t f32_to_bf16_stochastic(float x, uint64_t rnd)
{
    const uint32_t b = pk_f32_bits(x);
    if ((b & 0x7fffffffu) >= 0x7f800000u) return pk_f32_to_bf16_bits(b);
    return (uint16_t)((b + (uint32_t)(rnd & 0xffffu)) >> 16);
}

/* float32 -> float16 rounding to the neighbour above |x| with probability (|x| - lo) / (hi - lo),
 * lo and hi the float16 magnitudes around |x|.  Overflow (nearest rounds to inf) and NaN as nearest. */
static inline uint16_t f32_to_f16_stochastic(float x, uint64_t rnd)
{
    const uint16_t h = pk_f32_to_f16_bits(pk_f32_bits(x));
    if ((h & 0x7c00u) == 0x7c00u) return h;
    const float ax = fabsf(x), ah = fabsf(pk_bits_f32(pk_f16_to_f32_bits(h)));
    if (ah == ax) return h;
    const uint16_t lo = ah > ax ? (uint16_t)(h - 1u) : h;   /* magnitudes step by one in the bits */
    const uint16_t hi = (uint16_t)(lo + 1u);
    const float flo = fabsf(pk_bits_f32(pk_f16_to_f32_bits(lo)));
    const float fhi = fabsf(pk_bits_f32(pk_f16_to_f32_bits(hi)));
    const float u = (float)(rnd >> 40) * 0x1p-24f;         /* uniform in [0, 1), 24 bits */
    return u * (fhi - flo) < ax - flo ? hi : lo;
}

/* A new float32 value as an element of a table of `type` (nearest-even unless stochastic). */
static inline void store_element(void *row, int64_t d, float x, const int type,
                                 const pk_sparse_optim *opt, int64_t r)
{
    switch (type) {
    case TRAIN_F16:
        ((uint16_t *)row)[d] = opt->stochastic_rounding
            ? f32_to_f16_stochastic(x, sr_bits(opt->seed, r, d)) : pk_f32_to_f16_bits(pk_f32_bits(x));
        break;
    case TRAIN_BF16:
        ((uint16_t *)row)[d] = opt->stochastic_rounding
            ? f32_to_bf16_stochastic(x, sr_bits(opt->seed, r, d)) : pk_f32_to_bf16_bits(pk_f32_bits(x));
        break;
    default:
        ((float *)row)[d] = x;
    }
}

static inline float load_element(const void *row, int64_t d, const int type)
{
    switch (type) {
    case TRAIN_F16: return pk_bits_f32(pk_f16_to_f32_bits(((const uint16_t *)row)[d]));
    case TRAIN_BF16: return pk_bits_f32(pk_bf16_to_f32_bits(((const uint16_t *)row)[d]));
    default: return ((const float *)row)[d];
    }
}

static inline char *table_row(void *table, int64_t r, int64_t row_stride, const int type)
{
    return (char *)table + (size_t)r * (size_t)row_stride * (type == TRAIN_F32 ? 4u : 2u);
}

#endif
