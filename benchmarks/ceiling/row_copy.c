/* A copy-only reference loop for unpooled lookups (torch.nn.Embedding, perfkernels.embedding): for
 * each index, copy its row to the next output row, and nothing else (no index check, no
 * conversion).  A lookup of a float table is exactly this copy; a lookup of a packed table reads
 * `row_bytes` and writes `out_bytes` (its float32 row), which the loop models by reading one byte
 * of each of the row's lines and writing the output row from a buffer that stays in L1.  With
 * `out_bytes` 0 it only reads (one byte of each line of each row; `out` unused): the time the
 * rows take to arrive, with no output written.
 *
 * The row `distance` indices ahead is prefetched into L1 or L2 (`into_l2`), one prefetch per line
 * and the row's last byte; the driver (lookup_ceiling.py) tries several settings and keeps the
 * fastest, so the loop is the best this simple copy can do.  Plain C; the copy is inline, in
 * 32-byte vectors (copy_bytes).
 *
 * fill_bytes / fill_rows_threads only write: the output of a lookup, stored from a register.
 *
 * row_copy_threads runs the same loop on `threads` OpenMP threads, each on one contiguous share
 * of the indices (and of the output), the split the lookups use: built with -fopenmp, its workers
 * persist between calls, so a call pays no thread start.
 */
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static char hot[1 << 14];   /* the source of a packed row's output bytes */

/* Copy n bytes in 32-byte vectors (GCC's vector extension; lookup_ceiling.py builds this file
 * with -mavx2 where the CPU has AVX2, so each is one AVX move), inline: a call of memcpy per row
 * costs more than a short row's stores (12,800 calls of a few ns each), so the loops would be
 * slower than what they stand for. */
typedef char v32 __attribute__((vector_size(32), aligned(1)));
static inline void copy_bytes(char *dst, const char *src, int64_t n)
{
    int64_t off = 0;
    for (; off + 32 <= n; off += 32) *(v32 *)(dst + off) = *(const v32 *)(src + off);
    for (; off < n; off++) dst[off] = src[off];
}

int row_copy(const void *table, int64_t row_bytes, const int64_t *indices, int64_t n,
             void *out, int64_t out_bytes, int distance, int into_l2)
{
    if (row_bytes < 1 || (out_bytes != 0 && out_bytes < row_bytes) || n < 0 || distance < 0)
        return -1;
    if (out_bytes != row_bytes && out_bytes > (int64_t)sizeof hot) return -1;
    uint64_t sink = 0;
    const char *tab = (const char *)table;
    char *dst = (char *)out;
    for (int64_t i = 0; i < n; i++, dst += out_bytes) {
        if (i + distance < n) {
            const char *ahead = tab + indices[i + distance] * row_bytes;
            if (into_l2) {
                for (int64_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(ahead + off, 0, 2);
                __builtin_prefetch(ahead + row_bytes - 1, 0, 2);
            } else {
                for (int64_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(ahead + off, 0, 3);
                __builtin_prefetch(ahead + row_bytes - 1, 0, 3);
            }
        }
        const char *row = tab + indices[i] * row_bytes;
        if (out_bytes == row_bytes) {
            copy_bytes(dst, row, row_bytes);
            continue;
        }
        for (int64_t off = 0; off < row_bytes; off += 64) sink += *(const volatile uint8_t *)(row + off);
        sink += *(const volatile uint8_t *)(row + row_bytes - 1);
        if (out_bytes != 0) copy_bytes(dst, hot, out_bytes);
    }
    return (int)(sink & 0);
}

/* This OpenMP thread's contiguous share [*lo, *hi) of n items (all of them outside a parallel
 * region or without OpenMP). */
static void my_share(int64_t n, int64_t *lo, int64_t *hi)
{
#ifdef _OPENMP
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
    const int64_t t = 0, nt = 1;
#endif
    *lo = n * t / nt;
    *hi = n * (t + 1) / nt;
}

/* Write n bytes at out and read nothing: 32-byte stores of a zero vector, then single bytes.  The
 * least any lookup's output costs with ordinary stores (the `write` side of the bound). */
int fill_bytes(void *out, int64_t n)
{
    if (n < 0 || (n > 0 && out == 0)) return -1;
    char *dst = (char *)out;
    const v32 zero = {0};
    int64_t off = 0;
    for (; off + 128 <= n; off += 128) {
        *(v32 *)(dst + off) = zero;
        *(v32 *)(dst + off + 32) = zero;
        *(v32 *)(dst + off + 64) = zero;
        *(v32 *)(dst + off + 96) = zero;
    }
    for (; off + 32 <= n; off += 32) *(v32 *)(dst + off) = zero;
    for (; off < n; off++) dst[off] = 0;
    return 0;
}

/* fill_bytes on `threads` OpenMP threads, each on one contiguous share of n_rows rows of
 * row_bytes (the split of row_copy_threads). */
int fill_rows_threads(void *out, int64_t row_bytes, int64_t n_rows, int threads)
{
    if (threads < 1 || row_bytes < 0 || n_rows < 0) return -1;
    if (threads == 1) return fill_bytes(out, row_bytes * n_rows);
    int bad = 0;
#pragma omp parallel num_threads(threads) reduction(| : bad)
    {
        int64_t lo, hi;
        my_share(n_rows, &lo, &hi);
        bad |= fill_bytes((char *)out + lo * row_bytes, (hi - lo) * row_bytes);
    }
    return bad;
}

int row_copy_threads(const void *table, int64_t row_bytes, const int64_t *indices, int64_t n,
                     void *out, int64_t out_bytes, int distance, int into_l2, int threads)
{
    if (threads < 1) return -1;
    if (threads == 1)
        return row_copy(table, row_bytes, indices, n, out, out_bytes, distance, into_l2);
    int bad = 0;
#pragma omp parallel num_threads(threads) reduction(| : bad)
    {
        int64_t lo, hi;
        my_share(n, &lo, &hi);
        bad |= row_copy(table, row_bytes, indices + lo, hi - lo,
                        out ? (char *)out + lo * out_bytes : out, out_bytes, distance, into_l2);
    }
    return bad;
}
