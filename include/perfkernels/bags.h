/* perfkernels: the bag layout shared by every embedding-bag family (float tables, quantized tables).
 *
 * `perfkernels/_bags.pyx` validates the Python arguments and fills a pk_bags; a kernel then reads
 * the table rows named by the bags and writes one float32 row per bag.  Everything a kernel may
 * rely on is established by the wrapper before the call:
 *
 *   - offsets has num_bags + 1 entries, non-decreasing, within [0, n_indices]: bag b is
 *     indices[offsets[b] : offsets[b + 1]] (lengths, 2-D indices and PyTorch's
 *     include_last_offset=False are all normalised to this form).  A whole call's bags start at
 *     0 and end at n_indices; a thread's slice of them, or one feature of embedding_bags_multi,
 *     covers only indices[offsets[0] : offsets[num_bags]], and a kernel reads no other index;
 *   - weights is NULL, or holds n_indices floats (per sample: w_j = weights[j]), or, when
 *     positional, at least max-bag-length floats (w_j = weights[j - offsets[b]]);
 *   - padding_idx is -1 (none) or in [0, rows); such entries are skipped and not counted by mean;
 *   - out holds num_bags rows of out_stride floats, of which the first D are written.
 *
 * What the wrapper does NOT establish is that indices are in range: a kernel checks every index
 * with one unsigned compare, `(uint64_t)idx >= rows` (negatives included), before its row is
 * touched, and on failure returns PK_ERR_INDEX with *bad_pos = the position j in the flattened
 * index list (out may then be partly written; the wrapper keeps a caller's out= safe: a kernel
 * that writes a caller's out= runs on a private copy of the indices, checked before it starts,
 * pk_bags_copy_first_bad_in).
 */
#ifndef PERFKERNELS_BAGS_H
#define PERFKERNELS_BAGS_H

#include <stdlib.h>
#include <string.h>

#include "perfkernels/common.h"

#if PK_X86_64 && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pk_bags {
    const void *indices;     /* n_indices entries: int64_t if index_64, else int32_t */
    int64_t n_indices;
    int index_64;
    const int64_t *offsets;  /* num_bags + 1 entries, validated (see above) */
    int64_t num_bags;
    const float *weights;    /* NULL: every w_j = 1 */
    int positional;          /* weights indexed by the position inside the bag */
    int mean;                /* scale each bag by 1 / (number of non-padding entries) */
    int64_t padding_idx;     /* -1: none */
    float *out;              /* num_bags x out_stride floats */
    int64_t out_stride;
} pk_bags;

/* The prefetch policy of every bag kernel (float and quantized tables alike).
 *
 * Near mode: the row this many indices ahead (FBGEMM's distance) into L1 (T0), one prefetch per
 * 64-byte line.
 *
 * Far mode, for tables of PK_BAGS_FAR_MIN_BYTES and more (about half an L3 and beyond, whose rows
 * cannot stay in cache, and seldom do in a model that has many such tables): rows are prefetched
 * into L2 (T1), PK_BAGS_FAR_DISTANCE indices ahead, which keeps more misses in flight without
 * evicting the bag's rows from L1.  The choice follows the table's size, not the rows one call
 * touches (an RM2-class model's calls each touch 2 MB of 18 MB tables, and are 1.3x faster far),
 * and is made once per call by pk_bags_far_table.  Measured interleaved on huge-page tables (Xeon,
 * AVX-512): a model's worth of tables (32 x 250K x 64 float32, 2 GB, 120 lookups per bag) is
 * 15-40% faster far than near; one 256 MB table queried again and again (whose pages and lines
 * stay warm between calls) is 5-15% slower, so that benchmark understates what a model gets.
 * (Far mode from 4 MB on measured 7-35% slower on an L3-resident 10 MB table, AMD EPYC.) */
#define PK_BAGS_PREFETCH_DISTANCE 16
#define PK_BAGS_FAR_MIN_BYTES ((uint64_t)16 << 20)
#define PK_BAGS_FAR_DISTANCE 48

/* Which cache far rows are prefetched into: L2 (T1), as above, or L1 (T0).  AMD's cores take them
 * into L1, where a core has the miss buffers to keep far rows in flight: on an AMD EPYC (Zen 5),
 * unpooled lookups of 12,800 random rows were 7-25% faster with T0 than with T1 at the same
 * distance (1M x 64 float32, bfloat16 and 8-bit tables, 100K x 128 float32), on one table and on
 * eight tables visited in turn, and no setting was slower.  Other CPUs keep T1, the setting
 * measured on the Xeon.  The environment variable PERFKERNELS_FAR_PREFETCH=l1 or l2 overrides the
 * choice, read once per process. */
#define PK_FAR_INTO_L2 1
#define PK_FAR_INTO_L1 2

/* The process's setting, 0 until a translation unit's first call finds it (a race between threads
 * finds it twice, alike). */
static int pk_far_prefetch_setting;

/* The CPU's family (cpuid leaf 1's, the extended family added) where it is AMD's ("AuthenticAMD"
 * in cpuid leaf 0), else 0. */
static inline unsigned pk_cpu_amd_family(void)
{
#if PK_X86_64 && (defined(__GNUC__) || defined(__clang__))
    unsigned a, b, c, d;   /* "AuthenticAMD" in ebx, edx, ecx */
    if (__get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541u && d == 0x69746e65u &&
        c == 0x444d4163u && __get_cpuid(1, &a, &b, &c, &d)) {
        unsigned family = (a >> 8) & 0xFu;
        if (family == 0xFu) family += (a >> 20) & 0xFFu;
        return family;
    }
#endif
    return 0;
}

/* Finds the setting: the environment, else the CPU's vendor (pk_cpu_amd_family).  Out of line, so
 * that the kernels that ask inline only a load and a test. */
#if defined(__GNUC__)
__attribute__((noinline, cold))
#endif
static int pk_far_prefetch_find(void)
{
    int m = PK_FAR_INTO_L2;
    const char *env = getenv("PERFKERNELS_FAR_PREFETCH");
    if (env && strcmp(env, "l1") == 0) {
        m = PK_FAR_INTO_L1;
    } else if (env && strcmp(env, "l2") == 0) {
        m = PK_FAR_INTO_L2;
    } else if (pk_cpu_amd_family() != 0) {
        m = PK_FAR_INTO_L1;
    }
    __atomic_store_n(&pk_far_prefetch_setting, m, __ATOMIC_RELAXED);
    return m;
}

/* PK_FAR_INTO_L1 or PK_FAR_INTO_L2. */
static inline int pk_far_prefetch_mode(void)
{
    const int m = __atomic_load_n(&pk_far_prefetch_setting, __ATOMIC_RELAXED);
    return m ? m : pk_far_prefetch_find();
}

/* Whether a table of `rows` rows spaced `row_bytes` apart takes far prefetches. */
static inline int pk_bags_far_table(int64_t rows, uint64_t row_bytes)
{
    return (uint64_t)rows * row_bytes >= PK_BAGS_FAR_MIN_BYTES;
}

/* Entry j of an index list of int64 (index_64) or int32 entries: the one reader of indices that
 * every bag kernel uses, with the index width a compile-time constant where it is one. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline int64_t pk_index_at(const void *indices, int64_t j, int index_64)
{
    return index_64 ? ((const int64_t *)indices)[j] : (int64_t)((const int32_t *)indices)[j];
}

static inline int64_t pk_bags_index(const pk_bags *bags, int64_t j)
{
    return pk_index_at(bags->indices, j, bags->index_64);
}

/* The reference (scalar) reading of entry j of the bag starting at `begin`: -1 with *bad_pos = j
 * if its index is out of [0, rows), 0 if it is padding_idx (skipped), else 1 with its row in *idx
 * and its weight (1 without weights; per position in the bag when positional) in *w. */
static inline int pk_bags_entry(const pk_bags *bags, int64_t j, int64_t begin, int64_t rows,
                                int64_t *idx, float *w, int64_t *bad_pos)
{
    *idx = pk_bags_index(bags, j);
    if ((uint64_t)*idx >= (uint64_t)rows) { *bad_pos = j; return -1; }
    if (*idx == bags->padding_idx) return 0;
    *w = bags->weights ? bags->weights[bags->positional ? j - begin : j] : 1.0f;
    return 1;
}

/* Visit the non-padding entries of bag b in index order: visit(ctx, j, idx, w) for entry j, its
 * row idx (checked before visit sees it) and its weight.  Returns the number visited, or -1 with
 * *bad_pos = j at the first out-of-range index (nothing visited after it).  The one walk over a
 * bag's entries of the portable code (the scalar bag kernels, the training gather); `visit` is a
 * constant at each call of this function, always inlined, so the compiler inlines `visit` too. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline int64_t pk_bag_entries(const pk_bags *bags, int64_t b, int64_t rows, int64_t *bad_pos,
                                     void (*visit)(void *ctx, int64_t j, int64_t idx, float w),
                                     void *ctx)
{
    const int64_t begin = bags->offsets[b], end = bags->offsets[b + 1];
    int64_t count = 0;
    for (int64_t j = begin; j < end; j++) {
        int64_t idx;
        float w;
        const int use = pk_bags_entry(bags, j, begin, rows, &idx, &w, bad_pos);
        if (use < 0) return -1;
        if (!use) continue;
        count++;
        visit(ctx, j, idx, w);
    }
    return count;
}

/* mode "mean": out[0:dim] *= 1 / count (count = the bag's non-padding entries; empty bags stay 0). */
static inline void pk_bags_finish_mean(const pk_bags *bags, float *out, int64_t dim, int64_t count)
{
    if (!bags->mean || count == 0) return;
    const float inv = 1.0f / (float)count;
    for (int64_t d = 0; d < dim; d++) out[d] *= inv;
}

/* First position j whose index is out of [0, rows), or -1.  The cheap pre-scan a wrapper runs when
 * it must not let a kernel start writing a caller's out=.  x is in [0, rows) exactly when neither x
 * nor rows - 1 - x is negative, so OR-ing both into one word and testing its sign bit checks a
 * block with a subtract and two ORs per index (SSE2 vectorises that with baseline flags; 64-bit
 * compares it has not). */
static inline int64_t pk_bags_first_bad_index(const pk_bags *bags, int64_t rows)
{
    const int64_t n = bags->n_indices, block = 1024;
    const uint64_t last = (uint64_t)rows - 1u;
    for (int64_t start = 0; start < n; start += block) {
        int64_t stop = start + block < n ? start + block : n;
        uint64_t any = 0;
        if (bags->index_64) {
            const int64_t *ix = (const int64_t *)bags->indices;
            for (int64_t j = start; j < stop; j++) any |= (uint64_t)ix[j] | (last - (uint64_t)ix[j]);
        } else {
            const int32_t *ix = (const int32_t *)bags->indices;
            for (int64_t j = start; j < stop; j++) {
                const uint64_t x = (uint64_t)(int64_t)ix[j];
                any |= x | (last - x);
            }
        }
        if (any >> 63)
            for (int64_t j = start; j < stop; j++)
                if ((uint64_t)pk_bags_index(bags, j) >= (uint64_t)rows) return j;
    }
    return -1;
}

/* The first position j (in the whole index list) of an out-of-range index in bags [b0, b1), or -1:
 * only those bags' indices are read. */
static inline int64_t pk_bags_first_bad_in(const pk_bags *bags, int64_t b0, int64_t b1, int64_t rows)
{
    const int64_t begin = bags->offsets[b0];
    pk_bags probe = *bags;
    probe.indices = (const char *)bags->indices + begin * (bags->index_64 ? 8 : 4);
    probe.n_indices = bags->offsets[b1] - begin;
    const int64_t bad = pk_bags_first_bad_index(&probe, rows);
    return bad < 0 ? -1 : begin + bad;
}

/* pk_bags_first_bad_in on a private copy: copies the index entries of bags [b0, b1) into `copy`
 * (at the same positions: `copy` has room for the whole index list), then checks the copy.  A
 * kernel then run on the copy (bags.indices = copy) reads indices that were checked and cannot
 * change, whatever another thread writes into the caller's array meanwhile: each entry is read
 * from it once. */
static inline int64_t pk_bags_copy_first_bad_in(const pk_bags *bags, int64_t b0, int64_t b1,
                                                int64_t rows, void *copy)
{
    const size_t size = bags->index_64 ? 8 : 4;
    const int64_t end = bags->offsets[b1], block = 1024;   /* a block of the copy stays in L1 */
    pk_bags copied = *bags;   /* one block of the copy at a time, as an index list of its own */
    for (int64_t start = bags->offsets[b0]; start < end; start += block) {
        const int64_t stop = start + block < end ? start + block : end;
        copied.indices = (const char *)copy + (size_t)start * size;
        copied.n_indices = stop - start;
        memcpy((char *)copy + (size_t)start * size, (const char *)bags->indices + (size_t)start * size,
               (size_t)(stop - start) * size);
        const int64_t bad = pk_bags_first_bad_index(&copied, rows);
        if (bad >= 0) return start + bad;
    }
    return -1;
}

#ifdef __cplusplus
}
#endif
#endif
