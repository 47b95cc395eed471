/* A touch-only reference loop for embedding-bag lookups: read every 64-byte line of every row the
 * bags name, and nothing else (no conversion, no sums, no output).  It is a reference, not a bound:
 * lookup kernels have been measured beating it (their prefetch schedule is better than its), so it
 * says how far a kernel is from this simple loop, not what any implementation could gain.
 *
 * Each thread takes a contiguous slice of the index list, prefetches `distance` indices ahead into
 * L1 or L2 (`into_l2`; one prefetch per line, plus the row's last byte for rows that straddle a
 * line), and reads one byte per line.  The driver tries several distances and both hints and keeps
 * the fastest, so the bound is the best this simple loop can do, not one setting's.  Built and driven by gather_ceiling.py; plain C, baseline flags.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    const char *table;
    const int64_t *indices;
    int64_t begin, end, row_bytes;
    int distance, into_l2;
    uint64_t sink;
} gather_job;

static void *gather_slice(void *arg)
{
    gather_job *job = (gather_job *)arg;
    const char *table = job->table;
    const int64_t rb = job->row_bytes;
    uint64_t sink = 0;
    for (int64_t i = job->begin; i < job->end; i++) {
        if (i + job->distance < job->end) {
            const char *ahead = table + job->indices[i + job->distance] * rb;
            if (job->into_l2) {
                for (int64_t off = 0; off < rb; off += 64) __builtin_prefetch(ahead + off, 0, 2);
                __builtin_prefetch(ahead + rb - 1, 0, 2);
            } else {
                for (int64_t off = 0; off < rb; off += 64) __builtin_prefetch(ahead + off, 0, 3);
                __builtin_prefetch(ahead + rb - 1, 0, 3);
            }
        }
        const char *row = table + job->indices[i] * rb;
        for (int64_t off = 0; off < rb; off += 64) sink += *(const volatile uint8_t *)(row + off);
        sink += *(const volatile uint8_t *)(row + rb - 1);
    }
    job->sink = sink;
    return NULL;
}

typedef void (*gomp_parallel_fn)(void (*fn)(void *), void *data, unsigned num_threads,
                                 unsigned flags);
typedef int (*omp_thread_num_fn)(void);

typedef struct {
    gather_job *jobs;
    omp_thread_num_fn thread_num;
} gather_team;

/* One member of the OpenMP team: member t takes slice t. */
static void gather_team_member(void *arg)
{
    const gather_team *team = (const gather_team *)arg;
    gather_slice(&team->jobs[team->thread_num()]);
}

/* Touches the rows of indices[0:n] on `threads` threads (at most 256): on an OpenMP team when
 * `gomp_parallel` and `thread_num` are libgomp's GOMP_parallel and omp_get_thread_num (PyTorch's
 * copy: the probe then runs on the same threads as PyTorch, and as perfkernels once
 * perfkernels.torch is imported), else on threads of its own.  Returns 0, or -1 on bad arguments or
 * when a thread could not be started. */
int gather_touch(const void *table, int64_t row_bytes, const int64_t *indices, int64_t n,
                 int threads, int distance, int into_l2, gomp_parallel_fn gomp_parallel,
                 omp_thread_num_fn thread_num)
{
    if (threads < 1 || threads > 256 || row_bytes < 1 || n < 0 || distance < 0) return -1;
    gather_job jobs[256];
    for (int t = 0; t < threads; t++)
        jobs[t] = (gather_job){(const char *)table, indices, n * t / threads, n * (t + 1) / threads,
                               row_bytes, distance, into_l2, 0};
    if (gomp_parallel != NULL && thread_num != NULL) {
        gather_team team = {jobs, thread_num};
        gomp_parallel(gather_team_member, &team, (unsigned)threads, 0);
        return 0;
    }
    pthread_t tids[256];
    int started = 0, status = 0;
    for (int t = 1; t < threads; t++) {  /* the caller's thread takes slice 0 */
        if (pthread_create(&tids[t], NULL, gather_slice, &jobs[t]) != 0) { status = -1; break; }
        started = t;
    }
    gather_slice(&jobs[0]);
    for (int t = 1; t <= started; t++) pthread_join(tids[t], NULL);
    return status;
}
