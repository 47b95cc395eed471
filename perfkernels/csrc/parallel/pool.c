/* The perfkernels thread pool (see include/perfkernels/parallel.h for the contract), linked into
 * the perfkernels._parallel extension only.
 *
 * One job at a time.  The job owner publishes (fn, ctx, n_tasks, k) under the lock and bumps
 * `generation`.  The tasks are cut into n_blocks = min(n_tasks, BLOCKS_PER_THREAD * k) contiguous
 * blocks (fixed by n_tasks and k alone), which the owner and up to k - 1 workers claim one at a
 * time from `ticket` (the generation in the high 32 bits, the next block in the low 32, so a late
 * worker can never claim a block of a later job).  The owner claims blocks too, then waits until
 * every block is finished, never for a worker that has not started one: on a machine where a worker
 * is not scheduled in time (more runnable threads than cores), the owner simply does its share,
 * and a call is never much slower than on one thread.  Workers spin briefly on `generation` before
 * they sleep on `wake`, and the owner spins briefly before it sleeps on `done`, so a burst of
 * calls does not pay a futex wake-up per call while an idle pool costs no CPU.
 *
 * Baseline flags only; POSIX threads (Linux, macOS).
 */
/* -std=c11 hides POSIX: ask for it (pthread_sigmask, sigset_t) */
#define _POSIX_C_SOURCE 200809L

#include "perfkernels/parallel.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* How long a waiting thread spins (pause instructions) before it sleeps on a condition variable:
 * a worker waiting for the next job, the caller waiting for the workers' last blocks.  A time, not
 * a count of pauses: one pause takes 10-140 cycles depending on the CPU (11 ns on an Intel Xeon VM,
 * where 1,000 of them spun 11 us, shorter than the gap between two calls, and a 12,800-row lookup
 * at two threads took as long as at one: the worker slept through every call's start and woke too
 * late to take a block).  100 us covers the gap between the kernel calls of a model's forward pass
 * and is too short to show as a busy CPU. */
#define SPIN_NS 100000u

static inline uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* A bounded spin: spin_step pauses once and returns 0 when the spin has lasted SPIN_NS (the clock
 * is read every 32 pauses), so `while (!ready && spin_step(&s)) {}` waits at most about that long. */
typedef struct spin {
    uint64_t deadline;  /* 0 until the first reading of the clock */
    unsigned steps;
} spin;

static inline int spin_step(spin *s)
{
    CPU_RELAX();
    if ((++s->steps & 31u) != 0) return 1;
    const uint64_t t = now_ns();
    if (s->deadline == 0) s->deadline = t + SPIN_NS;
    return t < s->deadline;
}

#define BLOCKS_PER_THREAD PK_PARALLEL_BLOCKS_PER_THREAD

typedef struct pool {
    pthread_mutex_t lock;
    pthread_cond_t wake;         /* workers: a new generation was published */
    pthread_cond_t done;         /* owner: finished reached n_blocks */
    int n_workers;               /* started (worker ids 1..n_workers) */
    int capacity;                /* entries in threads */
    pthread_t *threads;
    /* the published job (written under lock before generation is bumped) */
    pk_parallel_fn fn;
    void *ctx;
    int64_t n_tasks;
    int64_t n_blocks;
    int n_threads;
    atomic_uint_fast64_t generation;
    atomic_uint_fast64_t ticket;  /* (generation << 32) | next unclaimed block */
    atomic_int_fast64_t finished; /* blocks of the current job done */
    atomic_int busy;             /* a job owns the pool */
    atomic_int default_threads;
} pool_t;

static pool_t pool = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .wake = PTHREAD_COND_INITIALIZER,
    .done = PTHREAD_COND_INITIALIZER,
    .default_threads = 1,
};
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* The host's OpenMP runtime (libgomp ABI), when a job should run on its team: PyTorch's CPU ops
 * run on libgomp's team, whose threads spin for a while after each region; a pool of our own
 * beside them competes with those spinning threads for the same cores (its worker starts late and
 * the owner does most of the job alone), while the spinning team takes our job at once. */
typedef void (*gomp_parallel_fn)(void (*fn)(void *), void *data, unsigned num_threads,
                                 unsigned flags);
static _Atomic(gomp_parallel_fn) host_gomp_parallel;
/* Its omp_get_max_threads (NULL: unknown) and omp_get_thread_limit(): the largest team a job runs
 * on it (see use_openmp in parallel.h). */
typedef int (*omp_max_threads_fn)(void);
static _Atomic(omp_max_threads_fn) host_omp_max_threads;
static atomic_int host_omp_thread_limit = PK_PARALLEL_MAX_THREADS;

/* Whether a team of k threads stays within what the host runtime runs and may create. */
static int host_team_fits(int k)
{
    const omp_max_threads_fn max_threads =
        atomic_load_explicit(&host_omp_max_threads, memory_order_acquire);
    if (k > atomic_load_explicit(&host_omp_thread_limit, memory_order_relaxed)) return 0;
    return max_threads == NULL || k <= max_threads();
}

/* Blocks a job of n tasks on k threads is cut into (fixed by n and k alone). */
static inline int64_t n_blocks_for(int64_t n, int k)
{
    return n < (int64_t)BLOCKS_PER_THREAD * k ? n : (int64_t)BLOCKS_PER_THREAD * k;
}

/* Tasks [*begin, *end) of block b when n tasks are cut into `blocks` contiguous blocks. */
static inline void block_bounds(int64_t n, int64_t blocks, int64_t b, int64_t *begin, int64_t *end)
{
    *begin = n / blocks * b + n % blocks * b / blocks;
    *end = n / blocks * (b + 1) + n % blocks * (b + 1) / blocks;
}

typedef struct gomp_job {
    pk_parallel_fn fn;
    void *ctx;
    int64_t n_tasks;
    int64_t n_blocks;
    atomic_int_fast64_t next;  /* next unclaimed block */
} gomp_job;

/* The body every thread of the OpenMP team runs: claim blocks until none is left (the same
 * blocks as on the own pool, so the split does not depend on which runs the job). */
static void gomp_body(void *arg)
{
    gomp_job *job = arg;
    const int64_t n = job->n_tasks, blocks = job->n_blocks;
    for (;;) {
        const int64_t b = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        if (b >= blocks) break;
        int64_t begin, end;
        block_bounds(n, blocks, b, &begin, &end);
        if (begin < end) job->fn(job->ctx, begin, end);
    }
}

/* Claim and run blocks of job `gen` until none is left; returns how many this thread ran. */
static int64_t run_blocks(uint_fast64_t gen, pk_parallel_fn fn, void *ctx, int64_t n, int64_t blocks)
{
    int64_t ran = 0;
    uint_fast64_t t = atomic_load_explicit(&pool.ticket, memory_order_acquire);
    for (;;) {
        if ((t >> 32) != (gen & 0xffffffffu) || (int64_t)(t & 0xffffffffu) >= blocks) break;
        if (!atomic_compare_exchange_weak_explicit(&pool.ticket, &t, t + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        const int64_t b = (int64_t)(t & 0xffffffffu);
        int64_t begin, end;
        block_bounds(n, blocks, b, &begin, &end);
        if (begin < end) fn(ctx, begin, end);
        ran++;
        if (atomic_fetch_add_explicit(&pool.finished, 1, memory_order_acq_rel) + 1 == blocks) {
            pthread_mutex_lock(&pool.lock);
            pthread_cond_signal(&pool.done);
            pthread_mutex_unlock(&pool.lock);
        }
        t = atomic_load_explicit(&pool.ticket, memory_order_acquire);
    }
    return ran;
}

/* What a new worker needs: its id and the generation current when it was created (the job it
 * must wait for is the next one, even if that is published before the thread first runs). */
typedef struct worker_start {
    int id;
    uint_fast64_t generation;
} worker_start;

static void *worker_main(void *arg)
{
    const worker_start start = *(const worker_start *)arg;
    free(arg);
    const int id = start.id;
    uint_fast64_t seen = start.generation;
    for (;;) {
        spin s = {0, 0};
        while (atomic_load_explicit(&pool.generation, memory_order_acquire) == seen && spin_step(&s)) {
        }
        pthread_mutex_lock(&pool.lock);
        while (atomic_load_explicit(&pool.generation, memory_order_relaxed) == seen)
            pthread_cond_wait(&pool.wake, &pool.lock);
        /* the latest job: a job cannot be replaced before all its participants finished */
        seen = atomic_load_explicit(&pool.generation, memory_order_relaxed);
        const pk_parallel_fn fn = pool.fn;
        void *ctx = pool.ctx;
        const int64_t n = pool.n_tasks, blocks = pool.n_blocks;
        const int k = pool.n_threads;
        pthread_mutex_unlock(&pool.lock);
        if (id < k) run_blocks(seen, fn, ctx, n, blocks);
    }
    return NULL;
}

/* In a forked child only the forking thread exists: forget the parent's workers and any job in
 * flight (its owner is not in the child), and give the child fresh synchronisation objects (the
 * parent's may have been held by a thread that does not exist here).  The next call that needs
 * workers starts them. */
static void atfork_child(void)
{
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.n_workers = 0;
    pool.fn = NULL;
    pool.ctx = NULL;
    pool.n_tasks = 0;
    pool.n_blocks = 0;
    pool.n_threads = 0;
    atomic_store(&pool.generation, 0);
    atomic_store(&pool.ticket, 0);
    atomic_store(&pool.finished, 0);
    atomic_store(&pool.busy, 0);
    /* the parent's OpenMP team does not exist here, and libgomp is not fork-safe */
    atomic_store(&host_gomp_parallel, (gomp_parallel_fn)NULL);
}

static void register_atfork(void) { pthread_atfork(NULL, NULL, atfork_child); }

/* Start workers until there are `want`; returns how many exist.  Only the job owner calls this.
 * Workers block every signal, so Python's handlers keep running on the threads that expect them. */
static int ensure_workers(int want)
{
    if (pool.n_workers >= want) return pool.n_workers;
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&pool.lock);
    if (want > pool.capacity) {
        int cap = pool.capacity ? pool.capacity : 8;
        while (cap < want) cap *= 2;
        pthread_t *grown = realloc(pool.threads, (size_t)cap * sizeof(pthread_t));
        if (grown) {
            pool.threads = grown;
            pool.capacity = cap;
        } else {
            want = pool.capacity;
        }
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    while (pool.n_workers < want) {
        worker_start *start = malloc(sizeof *start);
        if (!start) break;
        start->id = pool.n_workers + 1;
        start->generation = atomic_load_explicit(&pool.generation, memory_order_relaxed);
        if (pthread_create(&pool.threads[pool.n_workers], &attr, worker_main, start) != 0) {
            free(start);
            break;
        }
        pool.n_workers++;
    }
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    const int have = pool.n_workers;
    pthread_mutex_unlock(&pool.lock);
    return have;
}

static int parallel_for(int64_t n_tasks, int n_threads, pk_parallel_fn fn, void *ctx)
{
    if (n_tasks <= 0) return 1;
    int k = n_threads;
    if (k > PK_PARALLEL_MAX_THREADS) k = PK_PARALLEL_MAX_THREADS;
    if ((int64_t)k > n_tasks) k = (int)n_tasks;
    int expected = 0;
    if (k <= 1 || !atomic_compare_exchange_strong(&pool.busy, &expected, 1)) {
        fn(ctx, 0, n_tasks);  /* small call, or the pool serves another call: this thread only */
        return 1;
    }
    const gomp_parallel_fn gomp = atomic_load_explicit(&host_gomp_parallel, memory_order_acquire);
    if (gomp && host_team_fits(k)) {
        gomp_job job = {.fn = fn, .ctx = ctx, .n_tasks = n_tasks, .n_blocks = n_blocks_for(n_tasks, k)};
        atomic_init(&job.next, 0);
        gomp(gomp_body, &job, (unsigned)k, 0);  /* returns when every team thread is done */
        atomic_store_explicit(&pool.busy, 0, memory_order_release);
        return k;
    }
    const int workers = ensure_workers(k - 1);
    if (workers < k - 1) k = workers + 1;
    if (k <= 1) {
        atomic_store_explicit(&pool.busy, 0, memory_order_release);
        fn(ctx, 0, n_tasks);
        return 1;
    }
    const int64_t blocks = n_blocks_for(n_tasks, k);
    pthread_mutex_lock(&pool.lock);
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n_tasks = n_tasks;
    pool.n_blocks = blocks;
    pool.n_threads = k;
    atomic_store_explicit(&pool.finished, 0, memory_order_relaxed);
    const uint_fast64_t gen = atomic_load_explicit(&pool.generation, memory_order_relaxed) + 1;
    atomic_store_explicit(&pool.ticket, (gen & 0xffffffffu) << 32, memory_order_release);
    atomic_store_explicit(&pool.generation, gen, memory_order_release);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);

    run_blocks(gen, fn, ctx, n_tasks, blocks);

    spin s = {0, 0};
    while (atomic_load_explicit(&pool.finished, memory_order_acquire) != blocks && spin_step(&s)) {
    }
    if (atomic_load_explicit(&pool.finished, memory_order_acquire) != blocks) {
        pthread_mutex_lock(&pool.lock);
        while (atomic_load_explicit(&pool.finished, memory_order_acquire) != blocks)
            pthread_cond_wait(&pool.done, &pool.lock);
        pthread_mutex_unlock(&pool.lock);
    }
    atomic_store_explicit(&pool.busy, 0, memory_order_release);
    return k;
}

/* Whether the default thread count is the automatic one (set_auto_threads), which follows the
 * host OpenMP runtime's thread count while jobs run on its team. */
static atomic_int default_is_auto;

static int get_num_threads(void)
{
    int n = atomic_load_explicit(&pool.default_threads, memory_order_relaxed);
    if (atomic_load_explicit(&default_is_auto, memory_order_relaxed)
        && atomic_load_explicit(&host_gomp_parallel, memory_order_acquire)) {
        const omp_max_threads_fn max_threads =
            atomic_load_explicit(&host_omp_max_threads, memory_order_acquire);
        const int host = max_threads ? max_threads() : n;
        if (host >= 1 && host < n) n = host;
    }
    return n;
}

static void store_default_threads(int n, int is_auto)
{
    if (n < 1) n = 1;
    if (n > PK_PARALLEL_MAX_THREADS) n = PK_PARALLEL_MAX_THREADS;
    atomic_store_explicit(&pool.default_threads, n, memory_order_relaxed);
    atomic_store_explicit(&default_is_auto, is_auto, memory_order_relaxed);
}

static void set_num_threads(int n) { store_default_threads(n, 0); }

static void set_auto_threads(int n) { store_default_threads(n, 1); }

static int num_workers(void)
{
    pthread_mutex_lock(&pool.lock);
    const int n = pool.n_workers;
    pthread_mutex_unlock(&pool.lock);
    return n;
}

static void use_openmp(void *gomp_parallel, void *max_threads, int thread_limit)
{
    pthread_once(&atfork_once, register_atfork);
    atomic_store_explicit(&host_omp_max_threads, (omp_max_threads_fn)max_threads,
                          memory_order_release);
    atomic_store_explicit(&host_omp_thread_limit, thread_limit, memory_order_relaxed);
    atomic_store_explicit(&host_gomp_parallel, (gomp_parallel_fn)gomp_parallel, memory_order_release);
}

static void *openmp_in_use(void)
{
    return (void *)atomic_load_explicit(&host_gomp_parallel, memory_order_acquire);
}

static const pk_parallel_api api = {
    .abi_version = 4,
    .parallel_for = parallel_for,
    .get_num_threads = get_num_threads,
    .set_num_threads = set_num_threads,
    .num_workers = num_workers,
    .use_openmp = use_openmp,
    .openmp_in_use = openmp_in_use,
    .set_auto_threads = set_auto_threads,
};

const pk_parallel_api *pk_parallel_get_api(void)
{
    pthread_once(&atfork_once, register_atfork);
    return &api;
}
