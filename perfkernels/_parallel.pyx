"""The process-wide intra-op thread pool and its thread-count setting.

Kernels split a call's work (bags, rows, element ranges) across threads only when it is big enough
to pay for it; each output element is computed by exactly one thread, in the single-thread order,
so results are identical for any thread count.  The pool is perfkernels' own (POSIX threads, see
``include/perfkernels/parallel.h``), not OpenMP: it survives ``fork()`` and never oversubscribes.

``PERFKERNELS_NUM_THREADS=<n>`` sets the default at import (validated strictly: a bad value fails
the import with the reason).  Without it the default is the number of cores this process may run
on (``len(os.sched_getaffinity(0))``: a container's or ``taskset``'s limit, not the machine's).
While that automatic default is in force and jobs run on PyTorch's OpenMP threads (``import
perfkernels.torch``), it is also capped by PyTorch's thread count (``torch.set_num_threads``,
``OMP_NUM_THREADS``), so one setting budgets both libraries; ``set_num_threads`` or the variable
make the count explicit.
"""
import os
import operator

from cpython.pycapsule cimport PyCapsule_New
from libc.stdint cimport int64_t

from perfkernels._c_parallel cimport (pk_parallel_get_api, PK_PARALLEL_CAPSULE,
                                      PK_PARALLEL_MAX_THREADS, PK_PARALLEL_MIN_BYTES_PER_THREAD)

# the process-wide pool (declared in _parallel.pxd, read by every family module)
pool = pk_parallel_get_api()

#: The pool's C API (a ``const pk_parallel_api *``) for C code in other extension modules.
_C_API = PyCapsule_New(<void *>pool, PK_PARALLEL_CAPSULE, NULL)

MAX_THREADS: int = PK_PARALLEL_MAX_THREADS
MIN_BYTES_PER_THREAD: int = PK_PARALLEL_MIN_BYTES_PER_THREAD


def available_cores() -> int:
    """The number of cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no sched_getaffinity (macOS)
        return max(1, os.cpu_count() or 1)


def check_num_threads(value, str source="num_threads") -> int:
    """``value`` as a thread count (an integer in [1, MAX_THREADS]), or the error naming ``source``."""
    if type(value) is int and 1 <= value <= PK_PARALLEL_MAX_THREADS:
        return value
    if isinstance(value, bool):
        raise TypeError(f"{source} must be a positive integer; got {value!r}")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{source} must be a positive integer (or None for the default); got "
                        f"{type(value).__name__} {value!r}") from None
    if not 1 <= n <= PK_PARALLEL_MAX_THREADS:
        raise ValueError(f"{source} = {n} is out of range: it must be between 1 and "
                         f"{PK_PARALLEL_MAX_THREADS} (this process may use {available_cores()} cores)")
    return n


def get_num_threads() -> int:
    """The number of threads a kernel call may use when it is not given ``num_threads=``.

    >>> import perfkernels
    >>> perfkernels.get_num_threads() >= 1
    True
    """
    return pool.get_num_threads()


def set_num_threads(n) -> None:
    """Set the default number of threads of every kernel call (process-wide, like
    ``torch.set_num_threads``).  ``n`` is an integer >= 1; more threads than cores is allowed.
    A call still uses fewer when its work is too small to pay for more.

    Raises
    ------
    TypeError
        ``n`` not an integer.
    ValueError
        ``n`` < 1 or above the pool's maximum (65536).

    Examples
    --------
    >>> import perfkernels
    >>> old = perfkernels.get_num_threads()
    >>> perfkernels.set_num_threads(1); perfkernels.get_num_threads()
    1
    >>> perfkernels.set_num_threads(old)
    """
    pool.set_num_threads(check_num_threads(n, "set_num_threads(n)"))


def _num_workers() -> int:
    """Pool workers started so far in this process (tests: 0 in a freshly forked child)."""
    return pool.num_workers()


def _parse_environment(value: str) -> int:
    text = value.strip()
    if not text.isdigit():
        raise ValueError(f"PERFKERNELS_NUM_THREADS={value!r} is not a thread count; expected a "
                         f"positive integer such as {available_cores()} (the cores this process "
                         f"may use), or unset for that default")
    return check_num_threads(int(text), "PERFKERNELS_NUM_THREADS")


def _init_from_environment() -> None:
    value = os.environ.get("PERFKERNELS_NUM_THREADS")
    if value is None or value.strip() == "":
        pool.set_auto_threads(min(available_cores(), PK_PARALLEL_MAX_THREADS))
    else:
        pool.set_num_threads(_parse_environment(value))


cdef int check_threads(object value) except -1:
    """resolve_threads' slow path: a `num_threads=` that is not a plain int in range."""
    return check_num_threads(value, "num_threads")


cdef inline int64_t _range_start(const ranges *r, int64_t c) noexcept nogil:
    if c >= r.k:
        return r.n
    cdef int64_t units = (r.n + r.align - 1) // r.align
    return (units // r.k * c + units % r.k * c // r.k) * r.align


cdef void ranges_task(void *vctx, int64_t t0, int64_t t1) noexcept nogil:
    cdef const ranges *r = <const ranges *>vctx
    cdef int64_t c, lo, hi
    for c in range(t0, t1):
        lo = _range_start(r, c)
        hi = _range_start(r, c + 1)
        if hi > r.n:
            hi = r.n
        if lo < hi:
            r.fn(r.ctx, lo, hi, c)


def _use_openmp(address, max_threads=None, thread_limit=None) -> None:
    """Run parallel jobs on the team of the OpenMP runtime whose ``GOMP_parallel`` entry point is
    at ``address`` (an int), or on the pool's own workers again when ``address`` is 0 or None.
    ``max_threads``: the address of its ``omp_get_max_threads`` (None: unknown); ``thread_limit``:
    its ``omp_get_thread_limit()`` (None: none).  A job asking for more threads than either runs
    on the own workers (see ``include/perfkernels/parallel.h``).  ``perfkernels.torch`` calls this
    with PyTorch's libgomp; see ``docs/threads.md``."""
    cdef size_t a = 0 if address is None else operator.index(address)
    cdef size_t m = 0 if max_threads is None else operator.index(max_threads)
    cdef int limit = PK_PARALLEL_MAX_THREADS if thread_limit is None else min(
        max(operator.index(thread_limit), 1), PK_PARALLEL_MAX_THREADS)
    pool.use_openmp(<void *>a, <void *>m, limit)


def _openmp_in_use() -> int:
    """The ``GOMP_parallel`` address jobs run on, or 0 (the pool's own workers)."""
    return <size_t>pool.openmp_in_use()
