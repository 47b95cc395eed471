"""Shared argument handling of the family modules (cimported: see ``_arrays.pxd``)."""

import numpy as np
cimport numpy as cnp

from perfkernels._memory cimport pool_new

cnp.import_array()


cdef inline str _dtype_name(cnp.ndarray a):
    return str(a.dtype)


cdef cnp.ndarray as_input_copy(object x, str name, tuple typenums, str accepted):
    """as_input for an `x` that is not yet an aligned, C-contiguous, native-order ndarray of one of
    `typenums`: the array, converted or copied, or the TypeError naming `name`."""
    cdef cnp.ndarray a
    if cnp.PyArray_Check(x):
        a = <cnp.ndarray>x
    else:
        try:
            a = np.asarray(x)
        except Exception as exc:  # e.g. a ragged list
            raise TypeError(f"{name} must be an array of {accepted}; got {type(x).__name__}") from exc
    if cnp.PyArray_TYPE(a) not in typenums:
        raise TypeError(f"{name} must have dtype {accepted}; got {_dtype_name(a)}")
    if not cnp.PyArray_ISNOTSWAPPED(a):
        a = a.astype(a.dtype.newbyteorder("="))
    if not (cnp.PyArray_IS_C_CONTIGUOUS(a) and cnp.PyArray_ISALIGNED(a)):
        a = np.array(a, order="C", copy=True)
    return a


cdef tuple _FLOAT32 = (cnp.NPY_FLOAT32,)


cdef cnp.ndarray as_float32(object x, str name):
    return as_input(x, name, _FLOAT32, "float32")


cdef cnp.ndarray check_out(object out, int typenum, str dtype_name, tuple shape, tuple inputs):
    """Validate `out=` and return the array the kernel should write: `out` itself when it is
    contiguous, aligned and shares no memory with `inputs`, otherwise a fresh temporary that the
    caller copies into `out` with `finish_out` after the kernel succeeded."""
    cdef cnp.ndarray o
    if not cnp.PyArray_Check(out):
        raise TypeError(f"out must be a numpy.ndarray; got {type(out).__name__}")
    o = <cnp.ndarray>out
    if cnp.PyArray_TYPE(o) != typenum:
        raise TypeError(f"out must have dtype {dtype_name}; got {_dtype_name(o)}")
    if (<object>o).shape != shape:
        raise ValueError(f"out has shape {(<object>o).shape}; expected {shape}")
    if not cnp.PyArray_ISWRITEABLE(o):
        raise ValueError("out is read-only")
    if not (cnp.PyArray_IS_C_CONTIGUOUS(o) and cnp.PyArray_ISALIGNED(o)
            and cnp.PyArray_ISNOTSWAPPED(o)):
        return pool_new(shape, typenum)
    for x in inputs:
        if x is not None and np.may_share_memory(o, x):
            return pool_new(shape, typenum)
    return o


cdef int copy_out(object out, cnp.ndarray dst) except -1:
    np.copyto(out, dst)
    return 0


cdef class _KernelTableSetter:
    """What a family registers with the dispatcher: on a level change, point its kernel-table
    pointer at that level's table (the hot path then pays one pointer load)."""
    cdef kernel_table_getter getter
    cdef const void **slot
    cdef str family

    def __call__(self, int level):
        cdef const void *table = self.getter(level)
        if table == NULL:
            raise RuntimeError(f"{self.family} kernels for ISA level {level} are not in this build")
        self.slot[0] = table


cdef int register_family(str family, kernel_table_getter getter, const void **slot) except -1:
    """Register a family module with the dispatcher: *slot = getter(level) for the active level
    now and for every level chosen later (use_isa, PERFKERNELS_ISA)."""
    from . import _dispatch
    cdef _KernelTableSetter setter = _KernelTableSetter.__new__(_KernelTableSetter)
    setter.getter = getter
    setter.slot = slot
    setter.family = family
    _dispatch.register(setter)
    return 0
