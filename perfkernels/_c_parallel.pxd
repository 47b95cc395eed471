# C declarations of include/perfkernels/parallel.h.
from libc.stdint cimport int64_t

cdef extern from "perfkernels/parallel.h":
    const char *PK_PARALLEL_CAPSULE
    int PK_PARALLEL_BLOCKS_PER_THREAD
    int PK_PARALLEL_MAX_THREADS
    long long PK_PARALLEL_MIN_BYTES_PER_THREAD
    ctypedef void (*pk_parallel_fn)(void *ctx, int64_t begin, int64_t end) noexcept nogil
    ctypedef struct pk_parallel_api:
        int abi_version
        int (*parallel_for)(int64_t n_tasks, int n_threads, pk_parallel_fn fn,
                            void *ctx) noexcept nogil
        int (*get_num_threads)() noexcept nogil
        void (*set_num_threads)(int n) noexcept nogil
        int (*num_workers)() noexcept nogil
        void (*use_openmp)(void *gomp_parallel, void *max_threads, int thread_limit) noexcept nogil
        void *(*openmp_in_use)() noexcept nogil
        void (*set_auto_threads)(int n) noexcept nogil
    const pk_parallel_api *pk_parallel_get_api() noexcept nogil
    int pk_parallel_threads_for(int64_t bytes, int n_threads) noexcept nogil
