# The thread pool as the family modules use it:
#
#     from perfkernels._parallel cimport pool, resolve_threads, run_ranges, ranges_threads
#     cdef int nt = resolve_threads(num_threads)        # the per-call keyword, validated
#     ... with nogil: pool.parallel_for(n_tasks, k, task, &ctx) ...
#
# `pool` is the process-wide pool, set once when perfkernels._parallel is imported (a cimport
# imports it first); every module reads the same pointer, so there is one pool per process.  The
# helpers on the path of every call are inline here, so a tiny call pays no cross-module call.
from libc.stdint cimport int64_t
from perfkernels._c_parallel cimport (pk_parallel_api, pk_parallel_threads_for,
                                      PK_PARALLEL_MAX_THREADS, PK_PARALLEL_BLOCKS_PER_THREAD)

cdef const pk_parallel_api *pool

cdef int check_threads(object value) except -1


cdef inline int resolve_threads(object num_threads) except -1:
    """The thread count of one call: the default, or the validated `num_threads=` keyword."""
    if num_threads is None:
        return pool.get_num_threads()
    if type(num_threads) is int and 1 <= num_threads <= PK_PARALLEL_MAX_THREADS:
        return <int>num_threads
    return check_threads(num_threads)


# Row / element ranges: [0, n) cut into k contiguous ranges, range c starting at a multiple of
# `align` items (whole cache lines, so threads never write the same line), run as
# fn(ctx, lo, hi, c).  Every item is handled by exactly one range, and the kernels used this way
# compute each item (element, row) independently of where its range starts, so the result does not
# depend on k.

ctypedef void (*range_fn)(void *ctx, int64_t lo, int64_t hi, int64_t chunk) noexcept nogil

ctypedef struct ranges:
    range_fn fn
    void *ctx
    int64_t n
    int64_t k
    int64_t align

# The pool task of run_ranges: ranges c in [t0, t1) of the `ranges` at vctx.
cdef void ranges_task(void *vctx, int64_t t0, int64_t t1) noexcept nogil


cdef inline int ranges_threads(int64_t bytes, int n_threads) noexcept nogil:
    """How many threads a call touching `bytes` bytes is worth (1: it stays on the caller)."""
    return pk_parallel_threads_for(bytes, n_threads)


cdef inline int ranges_chunks(int64_t n, int threads, int64_t align) noexcept nogil:
    """How many ranges run_ranges cuts n items into on `threads` threads: 1, or
    PK_PARALLEL_BLOCKS_PER_THREAD per thread (claimed one at a time), at most one per align items."""
    cdef int64_t units = (n + align - 1) // align
    cdef int64_t k = <int64_t>threads * PK_PARALLEL_BLOCKS_PER_THREAD if threads > 1 else 1
    if k > units:
        k = units
    return <int>k if k > 1 else 1


cdef inline void run_ranges(int64_t n, int threads, int64_t align, range_fn fn,
                            void *ctx) noexcept nogil:
    """fn(ctx, lo, hi, c) over the ranges_chunks(n, threads, align) ranges of [0, n), on the pool."""
    cdef ranges r
    cdef int k = ranges_chunks(n, threads, align)
    if k <= 1:
        if n > 0:
            fn(ctx, 0, n, 0)
        return
    r.fn = fn
    r.ctx = ctx
    r.n = n
    r.k = k
    r.align = align
    pool.parallel_for(k, threads, ranges_task, &r)
