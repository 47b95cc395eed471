/* perfkernels: the output pool, memory for the arrays the kernels return.
 *
 * A freed block of a few hundred KiB or more goes back to the kernel under glibc's malloc, and the
 * next call that asks for it pays a page fault per 4 KiB page as it writes it again (an LSTM step
 * at 256 x 1024 spends more time in those faults than in its kernel).  The pool keeps freed blocks
 * instead and hands the same memory out again, so a steady-state loop makes no page faults for
 * its outputs.
 *
 * Blocks come in size classes (multiples of 64 bytes up to 4 KiB, then 8 classes per power of
 * two, at most 12.5% over the request), are aligned to 64 bytes (blocks of PK_POOL_MMAP_MIN bytes
 * and more are whole pages of their own mapping), and are kept on a per-class free list, most
 * recently freed first; a mapped request whose class has no idle block takes one of the next
 * eight classes' (up to twice its size), its tail unmapped.  The bytes held idle are bounded by
 * the limit: a block that would exceed
 * it evicts the least recently freed blocks first (a block larger than the limit is not kept).
 * Thread-safe (one mutex, held for a few list operations); after fork() the child's pool is valid
 * (the lock is taken around fork and the child's copy released).  Linked into the
 * perfkernels._memory extension only; other modules reach it through that module's Cython API.
 */
#ifndef PERFKERNELS_MEMORY_H
#define PERFKERNELS_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Blocks of at least this many bytes are mmap'ed (unmapped when evicted); smaller ones come from
 * the C heap, aligned to 64 bytes. */
#define PK_POOL_MMAP_MIN ((size_t)128 * 1024)
#define PK_POOL_ALIGN 64

typedef struct pk_pool_stats {
    uint64_t limit;          /* bound on the idle (cached) bytes */
    uint64_t cached_bytes;   /* idle blocks held for reuse */
    uint64_t cached_blocks;
    uint64_t live_bytes;     /* blocks handed out and not yet returned */
    uint64_t live_blocks;
    uint64_t hits;           /* requests served from the cache */
    uint64_t misses;         /* requests that asked the system */
    uint64_t released_bytes; /* bytes handed back to the system (evictions and releases) */
} pk_pool_stats;

/* The capacity of the size class `bytes` falls in (>= bytes; 0 for 0). */
size_t pk_pool_class_size(size_t bytes);
/* A block of at least `bytes` bytes (its capacity: pk_pool_class_size(bytes)), 64-byte aligned;
 * NULL when the system has no memory.  Return it with pk_pool_put(ptr, bytes). */
void *pk_pool_get(size_t bytes);
/* Return a block from pk_pool_get (`bytes`: the size it was asked for). */
void pk_pool_put(void *ptr, size_t bytes);
/* Hand every idle block back to the system; returns the bytes released. */
uint64_t pk_pool_release(void);
/* Set the bound on idle bytes (evicting down to it now); returns the previous one. */
uint64_t pk_pool_set_limit(uint64_t limit);
void pk_pool_get_stats(pk_pool_stats *out);
/* 1 in a build with AddressSanitizer: then every block is allocated at its exact size and freed
 * when returned (nothing is kept), so ASan sees the true bounds and any use after free. */
int pk_pool_sanitized(void);
/* Once per process, before the first use: the fork handlers. */
void pk_pool_init(void);

#ifdef __cplusplus
}
#endif
#endif
