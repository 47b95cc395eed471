"""The output pool: memory for the arrays perfkernels' functions return.

A freed block of a few hundred KiB or more goes back to the kernel under glibc's malloc, and the
next call that asks for the same size pays a page fault per 4 KiB page while it writes it again.
Outputs of perfkernels' functions (NumPy API, the torch layer) come from a pool of our own
instead, which keeps freed blocks for reuse, so a steady-state loop makes no page faults for them
(``docs/memory.md``).

The pool holds at most ``get_pool_limit()`` idle bytes (``set_pool_limit``, or
``PERFKERNELS_POOL_LIMIT`` at import: bytes, or with a K, M or G suffix, e.g. ``512M``; ``0``
keeps nothing); ``release_memory()`` gives every idle block back to the system; ``pool_stats()``
says what it holds.  Arrays handed out are ordinary arrays with ordinary lifetimes: a block
returns to the pool when the last array, view or tensor using it dies.
"""
import os
import re

cimport cython
cimport numpy as cnp
from cpython.ref cimport Py_INCREF
from libc.stdint cimport uint64_t

cnp.import_array()

cdef extern from "perfkernels/memory.h" nogil:
    ctypedef struct pk_pool_stats:
        uint64_t limit
        uint64_t cached_bytes
        uint64_t cached_blocks
        uint64_t live_bytes
        uint64_t live_blocks
        uint64_t hits
        uint64_t misses
        uint64_t released_bytes
    size_t pk_pool_class_size(size_t bytes)
    void *pk_pool_get(size_t bytes)
    void pk_pool_put(void *ptr, size_t bytes)
    uint64_t pk_pool_release()
    uint64_t pk_pool_set_limit(uint64_t limit)
    void pk_pool_get_stats(pk_pool_stats *out)
    void pk_pool_init()
    int pk_pool_sanitized()

cdef extern from *:
    """
    /* A new array over `data` (writeable, C-contiguous, aligned); NULL with an exception set. */
    static PyObject *pk_memory_new_array(PyArray_Descr *descr, int nd, const npy_intp *dims,
                                         void *data) {
        Py_INCREF(descr);   /* PyArray_NewFromDescr steals it */
        return PyArray_NewFromDescr(&PyArray_Type, descr, nd, (npy_intp *)dims, NULL, data,
                                    NPY_ARRAY_CARRAY, NULL);
    }
    static Py_ssize_t pk_memory_itemsize(PyArray_Descr *descr) {
        return (Py_ssize_t)PyDataType_ELSIZE(descr);
    }
    """
    object pk_memory_new_array(cnp.dtype descr, int nd, const cnp.npy_intp *dims, void *data)
    Py_ssize_t pk_memory_itemsize(cnp.dtype descr)

pk_pool_init()

#: The environment variable that sets the limit at import.
LIMIT_VARIABLE = "PERFKERNELS_POOL_LIMIT"
_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@cython.final
@cython.freelist(32)
cdef class _Block:
    """The owner of one pooled block: the base of the array made over it.  When the last
    reference dies (the array, its views, a tensor made from it without a copy), the block goes
    back to the pool."""
    cdef void *ptr
    cdef size_t nbytes

    def __dealloc__(self):
        pk_pool_put(self.ptr, self.nbytes)

    @property
    def nbytes(self) -> int:
        return self.nbytes


cdef list _DESCRS = [None] * 32


cdef inline cnp.dtype _descr(int typenum):
    cdef object d
    if 0 <= typenum < 32:
        d = _DESCRS[typenum]
        if d is None:
            d = cnp.PyArray_DescrFromType(typenum)
            _DESCRS[typenum] = d
        return <cnp.dtype>d
    return cnp.PyArray_DescrFromType(typenum)


cdef cnp.ndarray pool_empty(int nd, const cnp.npy_intp *dims, int typenum):
    """A new uninitialised C-contiguous array (see _memory.pxd)."""
    cdef cnp.dtype descr = _descr(typenum)
    cdef size_t nbytes = <size_t>pk_memory_itemsize(descr)
    cdef size_t limit = (<size_t>1) << 62
    cdef int k
    cdef void *ptr
    cdef _Block block
    cdef cnp.ndarray arr
    for k in range(nd):
        if dims[k] < 0:
            raise ValueError(f"negative dimension {dims[k]}")
        if dims[k] != 0 and nbytes > limit // <size_t>dims[k]:
            raise MemoryError("array too large")
        nbytes *= <size_t>dims[k]
    if nbytes < POOL_MIN_BYTES:
        return cnp.PyArray_EMPTY(nd, <cnp.npy_intp *>dims, typenum, 0)
    ptr = pk_pool_get(nbytes)
    if ptr == NULL:
        raise MemoryError(f"cannot allocate {nbytes} bytes")
    block = _Block.__new__(_Block)
    block.ptr = ptr
    block.nbytes = nbytes
    arr = pk_memory_new_array(descr, nd, dims, ptr)
    cnp.set_array_base(arr, block)
    return arr


cdef cnp.ndarray pool_new(tuple shape, int typenum):
    """pool_empty with the shape as a tuple of ints."""
    cdef cnp.npy_intp dims[32]
    cdef Py_ssize_t k, nd = len(shape)
    if nd > 32:
        raise ValueError(f"at most 32 dimensions; got {nd}")
    for k in range(nd):
        dims[k] = <cnp.npy_intp>shape[k]
    return pool_empty(<int>nd, dims, typenum)


def empty(shape, dtype=float) -> cnp.ndarray:
    """``numpy.empty(shape, dtype)`` from the pool (C order): for Python code of the package."""
    return pool_new((shape,) if isinstance(shape, int) else tuple(shape), cnp.dtype(dtype).num)


def _parse_limit(value, str source) -> int:
    """A limit in bytes from an int or a string like "512M" (K, M, G, T: powers of 1024)."""
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", value, re.IGNORECASE)
        if not m:
            raise ValueError(f"{source} must be a byte count like 268435456 or 256M; "
                             f"got {value!r}")
        return int(m.group(1)) * _SUFFIXES[m.group(2).upper()]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{source} must be an int (bytes); got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{source} must be >= 0; got {value}")
    if value >= 1 << 63:
        raise ValueError(f"{source} must be < 2**63; got {value}")
    return value


def set_pool_limit(limit: int | str) -> int:
    """Bound the memory the output pool keeps idle for reuse, in bytes (an int, or a string with
    a K, M, G or T suffix like ``"512M"``); idle blocks beyond it are given back to the system now,
    least recently used first.  ``0`` keeps nothing (every output's memory is freed when the
    output dies).  Outputs alive are never affected.  Returns the previous limit.

    Raises
    ------
    TypeError
        ``limit`` neither an int nor a string.
    ValueError
        A negative limit, one of 2**63 or more, or a string that is not a byte count with an
        optional K/M/G/T suffix.

    Examples
    --------
    >>> import perfkernels
    >>> old = perfkernels.set_pool_limit("64M")
    >>> perfkernels.get_pool_limit()
    67108864
    >>> _ = perfkernels.set_pool_limit(old)
    """
    return int(pk_pool_set_limit(<uint64_t>_parse_limit(limit, "limit")))


def get_pool_limit() -> int:
    """The output pool's bound on idle bytes (``set_pool_limit``, ``PERFKERNELS_POOL_LIMIT``).

    >>> import perfkernels
    >>> perfkernels.get_pool_limit() >= 0
    True
    """
    cdef pk_pool_stats s
    pk_pool_get_stats(&s)
    return int(s.limit)


def release_memory() -> int:
    """Give every idle block of the output pool back to the system (outputs still alive keep
    their memory, and return it to the pool when they die).  Returns the bytes released.

    >>> import numpy as np, perfkernels
    >>> out = perfkernels.half_to_float(np.zeros(1 << 20, np.float16))
    >>> del out                                           # its 4 MiB go back to the pool
    >>> perfkernels.release_memory() >= 0
    True
    >>> perfkernels.pool_stats()["cached_bytes"]
    0
    """
    return int(pk_pool_release())


def pool_stats() -> dict[str, int]:
    """What the output pool holds: ``limit``, ``cached_bytes`` / ``cached_blocks`` (idle, kept
    for reuse), ``live_bytes`` / ``live_blocks`` (held by arrays and tensors alive),
    ``hits`` / ``misses`` (requests served from the pool / from the system, since the start) and
    ``released_bytes`` (given back to the system, since the start).  Byte counts are of whole
    blocks (each request rounded up to its size class).

    >>> import perfkernels
    >>> sorted(perfkernels.pool_stats())
    ['cached_blocks', 'cached_bytes', 'hits', 'limit', 'live_blocks', 'live_bytes', 'misses', 'released_bytes']
    """
    cdef pk_pool_stats s
    pk_pool_get_stats(&s)
    return {"limit": int(s.limit), "cached_bytes": int(s.cached_bytes),
            "cached_blocks": int(s.cached_blocks), "live_bytes": int(s.live_bytes),
            "live_blocks": int(s.live_blocks), "hits": int(s.hits), "misses": int(s.misses),
            "released_bytes": int(s.released_bytes)}


def _sanitized() -> bool:
    """Whether this build has AddressSanitizer: the pool then keeps nothing and allocates exact
    sizes (so ASan sees every output's bounds and any use after free)."""
    return bool(pk_pool_sanitized())


def _class_size(nbytes: int) -> int:
    """The capacity of the size class of an nbytes request (for tests)."""
    return int(pk_pool_class_size(<size_t>nbytes))


def _init_from_environment() -> None:
    value = os.environ.get(LIMIT_VARIABLE)
    if value is not None and value.strip():
        pk_pool_set_limit(<uint64_t>_parse_limit(value, LIMIT_VARIABLE))


_init_from_environment()
