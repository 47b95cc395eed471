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
 * fastest, so the loop is the best this simple copy can do.  Plain C, baseline flags; the copy is
 * glibc's memcpy (which picks its own vector width at run time).
 */
#include <stdint.h>
#include <string.h>

static char hot[1 << 14];   /* the source of a packed row's output bytes */

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
            memcpy(dst, row, (size_t)row_bytes);
            continue;
        }
        for (int64_t off = 0; off < row_bytes; off += 64) sink += *(const volatile uint8_t *)(row + off);
        sink += *(const volatile uint8_t *)(row + row_bytes - 1);
        if (out_bytes != 0) memcpy(dst, hot, (size_t)out_bytes);
    }
    return (int)(sink & 0);
}
