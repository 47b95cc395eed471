# The output pool as the family modules use it:
#
#     from perfkernels._memory cimport pool_empty
#     cdef cnp.npy_intp shape[2]
#     out = pool_empty(2, shape, cnp.NPY_FLOAT32)     # instead of cnp.PyArray_EMPTY(2, shape, ..., 0)
#
# An ordinary writeable, C-contiguous ndarray; when its data are POOL_MIN_BYTES or more they come
# from the process-wide pool (csrc/memory/outpool.c, aligned to 64 bytes), and go back to it when
# the last reference to the array (or to a view of it, or a tensor made from it without a copy)
# dies: the array's base is a small owner object that returns the block.  Smaller arrays come from
# NumPy's allocator (which caches small blocks itself, and glibc never returns them to the kernel).
cimport numpy as cnp

cdef enum:
    POOL_MIN_BYTES = 4096

# A new uninitialised C-contiguous array of `typenum` and shape dims[:nd].
cdef cnp.ndarray pool_empty(int nd, const cnp.npy_intp *dims, int typenum)

# pool_empty with the shape as a tuple of ints (for code that has one).
cdef cnp.ndarray pool_new(tuple shape, int typenum)
