/* perfkernels: the intra-op thread pool (one per process, shared by every kernel family).
 *
 * A call splits its work into `n_tasks` independent tasks and asks for `n_threads` threads:
 *
 *     pool->parallel_for(n_tasks, n_threads, fn, ctx);
 *
 runs fn(ctx, begin, end) on contiguous blocks of [0, n_tasks): with k = min(n_tasks, n_threads)
 * threads there are B = min(n_tasks, PK_PARALLEL_BLOCKS_PER_THREAD * k) blocks, block b being
 * [n_tasks*b/B, n_tasks*(b+1)/B).  The calling thread and k - 1 pool workers claim blocks one at a
 * time until none is left; the call returns when every block is done.  The blocks depend only on
 * (n_tasks, k) and each is run by exactly one thread, so a kernel whose tasks are independent gives
 * the same bits for any thread count and any assignment of blocks to threads.  Claiming (rather than
 * one fixed block per thread) keeps a call fast when a worker is not scheduled in time: the others,
 * the caller included, take its share; the caller never waits for a worker that started nothing.
 *
 * Guarantees:
 *   - Workers are created lazily, on the first call that needs them, as many as asked for (no fixed
 *     cap; a failed pthread_create only lowers k).  They sleep on a condition variable when idle
 *     (after a short spin, so back-to-back calls do not pay a wake-up).
 *   - No oversubscription: the pool runs one call at a time.  A call that finds it busy (another
 *     user thread's call, or a nested call from inside a task) runs all its tasks on its own
 *     thread instead of queueing or starting threads: many user threads calling at once never
 *     create more than the pool's workers on top of themselves.
 *   - fork(): a pthread_atfork child handler forgets the parent's workers (they do not exist in
 *     the child), so a forked child that calls a kernel starts its own workers lazily instead of
 *     waiting forever for threads that were never copied.  (GNU libgomp's OpenMP pool has no such
 *     handler, which is why perfkernels does not use OpenMP.)
 *   - fn must not fail by longjmp/exceptions; it reports errors through ctx (e.g. a status per
 *     chunk, or the lowest bad position with an atomic minimum).  Workers block all signals.
 *
 * C code in any perfkernels extension module gets the pool as a `const pk_parallel_api *` from
 * the PyCapsule `perfkernels._parallel._C_API` (name PK_PARALLEL_CAPSULE); Cython modules do
 * `from perfkernels._parallel cimport pool` (the same pointer, declared in _parallel.pxd).  There
 * is exactly one pool per process however many extension modules use it.
 */
#ifndef PERFKERNELS_PARALLEL_H
#define PERFKERNELS_PARALLEL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PK_PARALLEL_CAPSULE "perfkernels._parallel._C_API"

/* Blocks per thread of a call: a caller that wants its own result slot per block passes
 * n_tasks <= PK_PARALLEL_BLOCKS_PER_THREAD * k, and then every task is one block. */
#define PK_PARALLEL_BLOCKS_PER_THREAD 4

/* Largest accepted thread count (a sanity bound for typos such as 1e9, far above any server). */
#define PK_PARALLEL_MAX_THREADS 65536

/* A call is worth splitting across k threads only when each thread gets at least this many bytes
 * of memory traffic (rows gathered + indices + output, or input + output elements): waking a
 * sleeping worker costs ~5-20 us, the time to stream roughly this much from DRAM on one core. */
#define PK_PARALLEL_MIN_BYTES_PER_THREAD ((int64_t)128 << 10)

typedef void (*pk_parallel_fn)(void *ctx, int64_t begin, int64_t end);

typedef struct pk_parallel_api {
    int abi_version;  /* 4 */
    /* Run fn over [0, n_tasks) on up to min(n_tasks, n_threads) threads (see above).  Returns the
     * number of threads allowed to take part (1: it all ran on the caller's thread). */
    int (*parallel_for)(int64_t n_tasks, int n_threads, pk_parallel_fn fn, void *ctx);
    /* The process-wide default thread count.  set_num_threads(n) sets it explicitly
     * (perfkernels.set_num_threads, PERFKERNELS_NUM_THREADS); set_auto_threads(n) sets the
     * automatic default (the cores this process may use).  While the default is automatic and
     * jobs run on a host OpenMP runtime (use_openmp), get_num_threads is also capped by that
     * runtime's omp_get_max_threads(): PyTorch's thread count (torch.set_num_threads,
     * OMP_NUM_THREADS) is then the budget of both libraries. */
    int (*get_num_threads)(void);
    void (*set_num_threads)(int n);
    /* Workers started so far in this process (0 after fork in the child): for tests. */
    int (*num_workers)(void);
    /* Run jobs on the team of an OpenMP runtime already loaded in the process instead of the
     * pool's own workers: `gomp_parallel` is that runtime's GOMP_parallel entry point (libgomp's
     * ABI, what `#pragma omp parallel` compiles to); NULL goes back to the own workers.  A forked
     * child always goes back to the own workers.  `max_threads` is that runtime's
     * omp_get_max_threads (NULL: unknown) and `thread_limit` its omp_get_thread_limit(): a job asking
     * for more threads than either (the team the host itself runs, and the threads it may
     * create) runs on the own workers, because libgomp ends the process ("Thread creation
     * failed", exit(1)) when it cannot create a team's threads (an address-space limit), where the
     * own pool runs the job on the threads it could start. */
    void (*use_openmp)(void *gomp_parallel, void *max_threads, int thread_limit);
    /* The GOMP_parallel entry point in use, or NULL. */
    void *(*openmp_in_use)(void);
    void (*set_auto_threads)(int n);
} pk_parallel_api;

/* The pool of this process (defined only in the perfkernels._parallel extension; other modules
 * get the same pointer through the capsule). */
const pk_parallel_api *pk_parallel_get_api(void);

/* How many threads a call touching `bytes` bytes should use when allowed `n_threads`: at least
 * PK_PARALLEL_MIN_BYTES_PER_THREAD per thread, at least 1, at most n_threads. */
static inline int pk_parallel_threads_for(int64_t bytes, int n_threads)
{
    if (n_threads <= 1 || bytes < 2 * PK_PARALLEL_MIN_BYTES_PER_THREAD) return 1;
    const int64_t by_size = bytes / PK_PARALLEL_MIN_BYTES_PER_THREAD;
    return by_size < (int64_t)n_threads ? (int)by_size : n_threads;
}

#ifdef __cplusplus
}
#endif
#endif
