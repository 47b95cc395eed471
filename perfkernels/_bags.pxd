# Bag handling shared by the embedding-bag families (float tables in _embedding.pyx, quantized
# tables in _quantized.pyx, _multi.pyx, _training.pyx):
#
#     from perfkernels._bags cimport (BAGS_SCRATCH, TINY_BAGS, prepare_bags, bags_out_for_kernel,
#                                     bags_output, check_bags_status, run_bags)
#
#     cdef pk_bags bags
#     cdef int64_t scratch[BAGS_SCRATCH]
#     keep = prepare_bags(&bags, indices, offsets, lengths, per_sample_weights, mode,
#                         include_last_offset, padding_idx, positional_weights, rows,
#                         scratch, BAGS_SCRATCH)
#     checked = None if out is None else bags_out_for_kernel(out, bags.num_bags, D, table, keep)
#     dst = bags_output(&bags, out, checked, D)              # sets bags.out / bags.out_stride
#     args = pk_table_bags_float(kernel, table, rows, D, row_stride)    # or pk_table_bags_packed
#     call_bags(&bags, dst is out, pk_table_bags_call, &args, rows, row_bytes, D, num_threads, "name")
#
# (call_bags: the kernel through the bag splitter's one adapter for every table format,
# csrc/common/bags_call.h, on up to num_threads threads when the call is big enough; IndexError or
# RuntimeError for a bad status.)
#
# `keep` holds the arrays the pointers in `bags` point into: keep it alive until the kernel
# returns.  `scratch` (caller's stack) holds the normalised offsets of small calls, so a call with
# a few bags allocates nothing here.  Every check raises the documented exception with the
# offending values; afterwards the kernel may rely on everything bags.h lists, and reads no memory
# outside the arrays whatever the input.
from libc.stdint cimport int64_t
cimport numpy as cnp

from perfkernels._memory cimport pool_empty
from perfkernels._c_common cimport pk_status, PK_OK
from perfkernels._c_bags cimport pk_bags
from perfkernels._c_bags_parallel cimport pk_bags_call

cdef enum:
    BAGS_SCRATCH = 64   # normalised offsets of calls with < 64 bags live on the caller's stack
    # calls with fewer output values + indices run with the GIL held, on the calling thread:
    # releasing and re-taking the GIL would cost more than the kernel
    TINY_BAGS = 4096

# x as an aligned contiguous native int32 or int64 array; TypeError naming `name` for any other
# dtype.
cdef cnp.ndarray as_int_array(object x, str name)

# Validate PyTorch-style offsets (count entries, int32 or int64 at p) and write the num_bags + 1
# normalised offsets into dst (NULL: validate only); *max_len = the longest bag.  Returns num_bags.
cdef int64_t normalise_offsets(const void *p, bint is64, Py_ssize_t count, bint include_last,
                               int64_t n, int64_t *dst, int64_t *max_len) except -1

# Validate caffe2-style lengths and write the count + 1 offsets into dst.  Returns count.
cdef int64_t lengths_to_offsets(const void *p, bint is64, Py_ssize_t count, int64_t n,
                                int64_t *dst, int64_t *max_len) except -1

# Validate and normalise the bag arguments into *bags (all but out / out_stride); returns the
# arrays that must stay alive while the kernel runs.
cdef object prepare_bags(pk_bags *bags, object indices, object offsets, object lengths,
                         object per_sample_weights, object mode, bint include_last_offset,
                         object padding_idx, bint positional_weights, int64_t rows,
                         int64_t *scratch, Py_ssize_t scratch_len)

# padding_idx as PyTorch takes it (None, or an integer in [-rows, rows), negative counting from
# the end): -1 for None, else the row it names; TypeError / ValueError naming it otherwise.
cdef int64_t checked_padding_idx(object padding_idx, int64_t rows) except -2

# The IndexError for the index at flattened position pos.
cdef int raise_index_error(const pk_bags *bags, int64_t pos, int64_t rows) except -1

# Whether a call that could write out= directly moves fewer bytes through a temporary copied into
# out= on success (no checked copy of the indices needed then).
cdef bint out_via_temporary(int64_t num_bags, int64_t dim, int64_t n_indices, int index_bytes)

# The array the kernel writes for a caller's `out=`: out itself when it can be, else a temporary.
cdef cnp.ndarray bags_out_for_kernel(object out, int64_t num_bags, int64_t dim, cnp.ndarray table,
                                     tuple keep)

# check_bags_status' slow path: IndexError for a bad index, RuntimeError for any other status.
cdef int raise_bags_status(const pk_bags *bags, pk_status status, int64_t bad, int64_t rows,
                           str name) except -1

# bags_output and check_bags_status run on every call, the tiny ones included: inline, so such a
# call pays no call into this module for them.
cdef inline cnp.ndarray bags_output(pk_bags *bags, object out, cnp.ndarray checked, int64_t dim):
    """The array the kernel writes, num_bags x dim float32, pointed to by bags.out: a new one when
    out is None, else `checked` (out as checked by the caller, or the temporary it needs)."""
    cdef cnp.npy_intp shape[2]
    cdef cnp.ndarray dst
    if out is None:
        shape[0] = <cnp.npy_intp>bags.num_bags
        shape[1] = <cnp.npy_intp>dim
        dst = pool_empty(2, shape, cnp.NPY_FLOAT32)
    else:
        dst = checked
    bags.out = <float *>cnp.PyArray_DATA(dst)
    bags.out_stride = dim
    return dst


# Room for a private copy of the bags' index list (uint8, n * 4 or 8 bytes), for a call whose
# kernel writes the caller's out= directly: run_bags copies the indices into it, checks the copy
# and runs the kernel on it, so that out= is never written when an index is bad, even one another
# thread writes during the call (a check of the caller's array followed by a second read of it
# could pass, then see a bad index half-way through out=).  The copy costs a write of the index
# bytes, much less than a temporary the size of out plus a copy into it.  *data points to the
# room: the caller's `scratch` (stack) when the copy fits in scratch_bytes (tiny calls allocate
# nothing), else the returned array's data (keep the array alive while the kernel runs).
cdef inline cnp.ndarray index_snapshot(const pk_bags *bags, void *scratch, size_t scratch_bytes,
                                       void **data):
    cdef cnp.npy_intp size = <cnp.npy_intp>(bags.n_indices * (8 if bags.index_64 else 4))
    cdef cnp.ndarray room
    if <size_t>size <= scratch_bytes:
        data[0] = scratch
        return None
    room = pool_empty(1, &size, cnp.NPY_UINT8)
    data[0] = cnp.PyArray_DATA(room)
    return room


cdef inline int check_bags_status(const pk_bags *bags, pk_status status, int64_t bad, int64_t rows,
                                  str name) except -1:
    """The exception for a kernel's status: IndexError for a bad index, RuntimeError otherwise."""
    if status != PK_OK:
        return raise_bags_status(bags, status, bad, rows, name)
    return 0


# One table's bags on up to n_threads threads (csrc/common/bags_parallel.h), with the GIL
# released by the caller unless the call is tiny.  snapshot: NULL, or index_snapshot's buffer (the
# kernels write the caller's out=): the indices are copied there and checked before any kernel
# runs, the kernels read the copy, and bags.indices points to it afterwards (so an IndexError
# names the value that was checked).
cdef pk_status run_bags(pk_bags *bags, pk_bags_call call, const void *args,
                        int64_t rows, int64_t row_bytes, int64_t dim, int n_threads,
                        void *snapshot, int64_t *bad_pos) noexcept nogil


# One table's bag kernel, called as every bag family calls it: on up to n_threads threads with the
# GIL released when the call is big enough (TINY_BAGS), else on the calling thread with the GIL
# held; when the kernel writes the caller's out= (writes_out), on a checked private copy of the
# indices (index_snapshot), so out= is never half-written.  `call` and `args` are the family's
# adapter for the bag splitter and its arguments; `name` names the function in an error.
cdef inline int call_bags(pk_bags *bags, bint writes_out, pk_bags_call call, const void *args,
                          int64_t rows, int64_t row_bytes, int64_t dim, int n_threads,
                          str name) except -1:
    cdef int64_t ix_scratch[BAGS_SCRATCH]
    cdef void *snap = NULL
    cdef cnp.ndarray snapshot = None
    cdef int64_t bad = -1
    cdef pk_status status
    if writes_out:
        snapshot = index_snapshot(bags, ix_scratch, sizeof(ix_scratch), &snap)
    if bags.num_bags * dim + bags.n_indices >= TINY_BAGS:
        with nogil:
            status = run_bags(bags, call, args, rows, row_bytes, dim, n_threads, snap, &bad)
    elif snap != NULL:
        status = run_bags(bags, call, args, rows, row_bytes, dim, 1, snap, &bad)
    else:
        status = call(args, bags, &bad)
    return check_bags_status(bags, status, bad, rows, name)
