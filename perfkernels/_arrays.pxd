# Shared argument handling for the family modules (`from perfkernels._arrays cimport ...`).
#
# Every Python-object step happens here, before `with nogil:`.  Inputs may be read-only, unaligned,
# non-contiguous or byte-swapped: such arrays are copied to an aligned, contiguous, native array
# (never misread).  `out=` is validated fully before any kernel runs; when it cannot be written
# directly (non-contiguous, unaligned, overlapping an input) the kernel writes a temporary and the
# result is copied into `out` only after the kernel succeeded, so `out` is never half-written.
cimport numpy as cnp

# as_input's slow path: converts, copies or raises.
cdef cnp.ndarray as_input_copy(object x, str name, tuple typenums, str accepted)


cdef inline cnp.ndarray as_input(object x, str name, tuple typenums, str accepted):
    """`x` as an aligned, C-contiguous, native-order ndarray whose type number is in `typenums`
    (`accepted` names them in the TypeError).  Inline: an array that is already so (every tiny
    call's) is returned without a call into this module."""
    cdef cnp.ndarray a
    if cnp.PyArray_Check(x):
        a = <cnp.ndarray>x
        if (cnp.PyArray_IS_C_CONTIGUOUS(a) and cnp.PyArray_ISALIGNED(a)
                and cnp.PyArray_ISNOTSWAPPED(a) and cnp.PyArray_TYPE(a) in typenums):
            return a
    return as_input_copy(x, name, typenums, accepted)

# as_input for float32 only.
cdef cnp.ndarray as_float32(object x, str name)

# Validate `out=` and return the array the kernel should write: `out` itself when it is
# contiguous, aligned and shares no memory with `inputs`, otherwise a fresh temporary that the
# caller copies into `out` with `finish_out` after the kernel succeeded.
cdef cnp.ndarray check_out(object out, int typenum, str dtype_name, tuple shape, tuple inputs)

# finish_out's copy of a temporary into the caller's `out`.
cdef int copy_out(object out, cnp.ndarray dst) except -1


cdef inline object finish_out(object out, cnp.ndarray dst):
    """After a successful kernel: copy a temporary into the caller's `out` and return `out`."""
    if out is None:
        return dst
    if dst is not out:
        copy_out(out, dst)
    return out


ctypedef const void *(*kernel_table_getter)(int isa) noexcept nogil

# Register a family module with the dispatcher: *slot = getter(level) for the active level now and
# for every level chosen later (use_isa, PERFKERNELS_ISA).
cdef int register_family(str family, kernel_table_getter getter, const void **slot) except -1
