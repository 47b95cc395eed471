/* The parts of the fused quantized embedding bags that every ISA file shares: what the bag loop
 * reads per row, index loads and row prefetch.  Internal header, x86-64 only; included by
 * quantized_avx2.c and quantized_avx512.c before their bag_block / bags_loop.  (Its other half,
 * quantized_bags_entry.h, specialises bags_loop and defines the exported kernel.) */
#ifndef PERFKERNELS_QUANTIZED_BAGS_HEAD_H
#define PERFKERNELS_QUANTIZED_BAGS_HEAD_H

#include <immintrin.h>
#include "perfkernels/bags.h"

#define PK_ALWAYS_INLINE static inline __attribute__((always_inline))
/* Rows ahead for the two prefetch modes (see prefetch_row). */
#ifndef PREFETCH_NEAR
#define PREFETCH_NEAR PK_BAGS_PREFETCH_DISTANCE
#endif
#ifndef PREFETCH_FAR
#define PREFETCH_FAR 32
#endif
#define FAR_FOOTPRINT ((int64_t)4 << 20)   /* bytes of rows a call may touch from which it is far */

/* What the bag loop reads per row, hoisted out of pk_bags once per call. */
typedef struct bag_loop {
    const void *indices;
    const float *weights;
    int positional, mean;
    int64_t n_indices, padding_idx, rows;
    const uint8_t *packed;
    int far;   /* prefetch mode of the call, see prefetch_row */
} bag_loop;

PK_ALWAYS_INLINE int64_t index_at(const int index_64, const void *indices, int64_t j)
{
    return index_64 ? ((const int64_t *)indices)[j] : (int64_t)((const int32_t *)indices)[j];
}

/* Prefetch of the row PREFETCH_NEAR or PREFETCH_FAR indices ahead.  A call whose rows may not fit in
 * L2 (it has FAR_FOOTPRINT bytes of rows or more, counting each index, at most the whole table) is
 * "far": T1 (to L2), PREFETCH_FAR ahead, on the row's first byte, its last byte and every 64th byte
 * from the first that is more than 64 bytes before the last (every line of a row of up to 64 bytes
 * and of a 72-byte row at an 8-byte offset).  Side by side with torch (FBGEMM) on 8-bit DLRM
 * 1M x 64 B=2048 L=100 that is 1.3-2x faster than T0 16 ahead on uniform indices and ~5-10% on
 * Zipf ones.  A smaller call keeps T0 on every line PREFETCH_NEAR ahead, 10-20% faster on
 * cache-resident rows (fbgemm 4M x D with 1000 indices, cache 20k x 128).  Prefetches never fault,
 * so an index not yet checked is harmless here; the address is formed in integers. */
PK_ALWAYS_INLINE void prefetch_row(const uint8_t *packed, int64_t idx, int64_t row_bytes, const int far)
{
    const uintptr_t p = (uintptr_t)packed + (uint64_t)idx * (uint64_t)row_bytes;
    if (far) {
        _mm_prefetch((const char *)p, _MM_HINT_T1);
        for (int64_t off = 64; off < row_bytes - 64; off += 64) _mm_prefetch((const char *)(p + off), _MM_HINT_T1);
        _mm_prefetch((const char *)(p + row_bytes - 1), _MM_HINT_T1);
    } else {
        for (int64_t off = 0; off < row_bytes; off += 64) _mm_prefetch((const char *)(p + off), _MM_HINT_T0);
        if (row_bytes % 64 != 1) _mm_prefetch((const char *)(p + row_bytes - 1), _MM_HINT_T0);
    }
}

#endif
