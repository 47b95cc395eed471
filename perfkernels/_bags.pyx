"""Bag handling shared by the embedding-bag families (cimported: see ``_bags.pxd``)."""

from libc.stdint cimport int32_t, int64_t, uint64_t
import operator

import numpy as np
cimport numpy as cnp

from perfkernels._c_common cimport pk_status, PK_OK, PK_ERR_INDEX
from perfkernels._c_bags cimport pk_bags, pk_bags_index
from perfkernels._c_bags_parallel cimport pk_bags_call, pk_bags_part, pk_bags_run
from perfkernels._arrays cimport as_input, as_float32, check_out
from perfkernels._memory cimport pool_empty, pool_new
from perfkernels._parallel cimport pool

cnp.import_array()

cdef tuple _INDEX_TYPES = (cnp.NPY_INT32, cnp.NPY_INT64, cnp.NPY_LONGLONG, cnp.NPY_INT, cnp.NPY_LONG)


cdef inline bint _is_ready_int(object x):
    """True when x is already an aligned, contiguous, native int32/int64 ndarray (the fast path)."""
    cdef cnp.ndarray a
    cdef int itemsize
    if not cnp.PyArray_Check(x):
        return False
    a = <cnp.ndarray>x
    if not cnp.PyTypeNum_ISINTEGER(cnp.PyArray_TYPE(a)) or not cnp.PyTypeNum_ISSIGNED(cnp.PyArray_TYPE(a)):
        return False
    itemsize = cnp.PyArray_ITEMSIZE(a)
    return ((itemsize == 4 or itemsize == 8) and cnp.PyArray_IS_C_CONTIGUOUS(a)
            and cnp.PyArray_ISALIGNED(a) and cnp.PyArray_ISNOTSWAPPED(a))


cdef cnp.ndarray as_int_array(object x, str name):
    """x as an aligned contiguous native int32 or int64 array; TypeError for any other dtype."""
    if _is_ready_int(x):
        return <cnp.ndarray>x
    return as_input(x, name, _INDEX_TYPES, "int32 or int64")


cdef inline int64_t _get_int(const void *p, bint is64, Py_ssize_t i) noexcept nogil:
    return (<const int64_t *>p)[i] if is64 else <int64_t>(<const int32_t *>p)[i]


cdef int64_t normalise_offsets(const void *p, bint is64, Py_ssize_t count, bint include_last,
                                int64_t n, int64_t *dst, int64_t *max_len) except -1:
    """Validate PyTorch-style offsets (count entries) and write the num_bags + 1 normalised offsets
    into dst (NULL: validate only).  Returns num_bags."""
    cdef Py_ssize_t i, num_bags
    cdef int64_t v, prev, longest = 0
    if include_last:
        if count == 0:
            raise ValueError("offsets is empty: with include_last_offset=True it needs at least "
                             "one entry (the end of the last bag, len(indices))")
        num_bags = count - 1
    else:
        num_bags = count
        if count == 0:
            if n != 0:
                raise ValueError(f"offsets is empty (no bags) but there are {n} indices")
            if dst != NULL:
                dst[0] = 0
            max_len[0] = 0
            return 0
    prev = _get_int(p, is64, 0)
    if prev != 0:
        raise ValueError(f"offsets[0] = {prev}: the first offset must be 0")
    if dst != NULL:
        dst[0] = 0
    for i in range(1, count):
        v = _get_int(p, is64, i)
        if v < prev:
            raise ValueError(f"offsets[{i}] = {v} < offsets[{i - 1}] = {prev}: "
                             "offsets must be non-decreasing")
        if v - prev > longest:
            longest = v - prev
        if dst != NULL:
            dst[i] = v
        prev = v
    if include_last:
        if prev != n:
            raise ValueError(f"offsets[{count - 1}] = {prev} != len(indices) = {n}: with "
                             "include_last_offset=True the last offset must equal len(indices)")
    else:
        if prev > n:
            raise ValueError(f"offsets[{count - 1}] = {prev} > len(indices) = {n}: "
                             "offsets must not exceed the number of indices")
        if n - prev > longest:
            longest = n - prev
        if dst != NULL:
            dst[count] = n
    max_len[0] = longest
    return num_bags


cdef int64_t lengths_to_offsets(const void *p, bint is64, Py_ssize_t count, int64_t n,
                                 int64_t *dst, int64_t *max_len) except -1:
    """Validate caffe2-style lengths and write the count + 1 offsets into dst.  Returns count."""
    cdef Py_ssize_t i
    cdef int64_t v, longest = 0
    cdef uint64_t total = 0   # each term < 2**63 and total <= n before adding: no overflow
    dst[0] = 0
    for i in range(count):
        v = _get_int(p, is64, i)
        if v < 0:
            raise ValueError(f"lengths[{i}] = {v} is negative: lengths must be >= 0")
        total += <uint64_t>v
        if total > <uint64_t>n:
            raise ValueError(f"lengths[:{i + 1}] sum to {total} > len(indices) = {n}: "
                             "sum(lengths) must equal len(indices)")
        if v > longest:
            longest = v
        dst[i + 1] = <int64_t>total
    if total != <uint64_t>n:
        raise ValueError(f"sum(lengths) = {total} != len(indices) = {n}: "
                         "sum(lengths) must equal len(indices)")
    max_len[0] = longest
    return count


cdef object prepare_bags(pk_bags *bags, object indices, object offsets, object lengths,
                         object per_sample_weights, object mode, bint include_last_offset,
                         object padding_idx, bint positional_weights, int64_t rows,
                         int64_t *scratch, Py_ssize_t scratch_len):
    """Validate and normalise the bag arguments into *bags (all but out / out_stride).

    Raises TypeError (dtypes), ValueError (shapes, offsets, lengths, weights, mode, padding_idx).
    Indices are not range-checked here: the kernels check each one (bags.h).  Returns the tuple of
    arrays that must stay alive while the kernel runs.
    """
    cdef cnp.ndarray ix, off = None, lens, w = None, norm = None
    cdef int64_t n, max_len = 0, num_bags, L, b
    cdef Py_ssize_t count
    cdef int64_t *dst

    # mode
    if mode == "sum":
        bags.mean = 0
    elif mode == "mean":
        bags.mean = 1
    else:
        raise ValueError(f"mode must be 'sum' or 'mean'; got {mode!r}")

    # indices
    ix = as_int_array(indices, "indices")
    n = cnp.PyArray_SIZE(ix)
    bags.indices = cnp.PyArray_DATA(ix)
    bags.n_indices = n
    bags.index_64 = cnp.PyArray_ITEMSIZE(ix) == 8

    # bag boundaries -> offsets[num_bags + 1]
    if cnp.PyArray_NDIM(ix) == 2:
        if offsets is not None or lengths is not None:
            raise ValueError(f"indices is 2-D {(<object>ix).shape} (one bag per row): "
                             "offsets and lengths must be None")
        num_bags = cnp.PyArray_DIM(ix, 0)
        L = cnp.PyArray_DIM(ix, 1)
        if num_bags + 1 <= scratch_len:
            dst = scratch
        else:
            norm = pool_new((num_bags + 1,), cnp.NPY_INT64)
            dst = <int64_t *>cnp.PyArray_DATA(norm)
        for b in range(num_bags + 1):
            dst[b] = b * L
        max_len = L if num_bags > 0 else 0
        bags.offsets = dst
    elif cnp.PyArray_NDIM(ix) == 1:
        if offsets is not None and lengths is not None:
            raise ValueError("give either offsets (PyTorch convention) or lengths (caffe2 "
                             "convention), not both")
        if offsets is None and lengths is None:
            raise ValueError("1-D indices need offsets or lengths to say where the bags are "
                             "(or pass 2-D indices [num_bags, bag_length])")
        if offsets is not None:
            off = as_int_array(offsets, "offsets")
            if cnp.PyArray_NDIM(off) != 1:
                raise ValueError(f"offsets must be 1-D; got shape {(<object>off).shape}")
            count = cnp.PyArray_DIM(off, 0)
            # Always copied into the normalised buffer, even when already int64 with
            # include_last_offset: the kernel then reads offsets that cannot change after they were
            # validated (another thread may write the caller's array while the GIL is released).
            num_bags = count - 1 if include_last_offset else count
            if num_bags < 0:
                num_bags = 0
            if num_bags + 1 <= scratch_len:
                dst = scratch
            else:
                norm = pool_new((num_bags + 1,), cnp.NPY_INT64)
                dst = <int64_t *>cnp.PyArray_DATA(norm)
            num_bags = normalise_offsets(cnp.PyArray_DATA(off), cnp.PyArray_ITEMSIZE(off) == 8,
                                          count, include_last_offset, n, dst, &max_len)
            bags.offsets = dst
        else:
            lens = as_int_array(lengths, "lengths")
            off = lens
            if cnp.PyArray_NDIM(lens) != 1:
                raise ValueError(f"lengths must be 1-D; got shape {(<object>lens).shape}")
            count = cnp.PyArray_DIM(lens, 0)
            if count + 1 <= scratch_len:
                dst = scratch
            else:
                norm = pool_new((count + 1,), cnp.NPY_INT64)
                dst = <int64_t *>cnp.PyArray_DATA(norm)
            num_bags = lengths_to_offsets(cnp.PyArray_DATA(lens), cnp.PyArray_ITEMSIZE(lens) == 8,
                                           count, n, dst, &max_len)
            bags.offsets = dst
    else:
        raise ValueError(f"indices must be 1-D (with offsets or lengths) or 2-D [num_bags, "
                         f"bag_length]; got shape {(<object>ix).shape}")
    bags.num_bags = num_bags

    # weights
    bags.positional = 1 if positional_weights else 0
    if per_sample_weights is None:
        if positional_weights:
            raise ValueError("positional_weights=True needs per_sample_weights (one weight per "
                             "position inside a bag)")
        bags.weights = NULL
    else:
        w = as_float32(per_sample_weights, "per_sample_weights")
        if positional_weights:
            if cnp.PyArray_NDIM(w) != 1:
                raise ValueError(f"positional per_sample_weights must be 1-D; got shape "
                                 f"{(<object>w).shape}")
            if cnp.PyArray_DIM(w, 0) < max_len:
                raise ValueError(f"positional per_sample_weights has {cnp.PyArray_DIM(w, 0)} "
                                 f"entries but the longest bag has {max_len}: it needs one per "
                                 "position")
        elif (<object>w).shape != (<object>ix).shape:
            raise ValueError(f"per_sample_weights has shape {(<object>w).shape}; it needs one "
                             f"weight per index, shape {(<object>ix).shape}")
        bags.weights = <const float *>cnp.PyArray_DATA(w)

    bags.padding_idx = checked_padding_idx(padding_idx, rows)

    bags.out = NULL
    bags.out_stride = 0
    return (ix, off, w, norm)


cdef int64_t checked_padding_idx(object padding_idx, int64_t rows) except -2:
    # PyTorch's padding_idx: None, or an integer in [-rows, rows), negative counting from the end
    if padding_idx is None:
        return -1
    try:
        pad_obj = operator.index(padding_idx)
    except TypeError as exc:
        raise TypeError(f"padding_idx must be an integer or None; got "
                        f"{type(padding_idx).__name__}") from exc
    if pad_obj < -rows or pad_obj >= rows:
        raise ValueError(f"padding_idx = {pad_obj} is out of range for a table of {rows} rows "
                         f"(valid: -{rows} <= padding_idx < {rows})")
    cdef int64_t pad = pad_obj
    return pad + rows if pad < 0 else pad


cdef int raise_index_error(const pk_bags *bags, int64_t pos, int64_t rows) except -1:
    """The IndexError for the index at flattened position pos (reported by a kernel or the
    pre-scan)."""
    cdef int64_t value = pk_bags_index(bags, pos)
    raise IndexError(f"indices[{pos}] = {value} is out of range for a table of {rows} rows")


cdef inline bint bags_may_overlap(cnp.ndarray out, object other):
    """Conservative overlap test by address ranges (np.may_share_memory costs ~1 us a call,
    more than the whole tiny lookup).  Arrays here have non-negative strides or are copies."""
    cdef cnp.ndarray a
    cdef char *lo
    cdef char *hi
    cdef char *olo = <char *>cnp.PyArray_DATA(out)
    cdef char *ohi = olo + cnp.PyArray_NBYTES(out)
    cdef int k
    if other is None:
        return False
    a = <cnp.ndarray>other
    if cnp.PyArray_SIZE(a) == 0:
        return False
    lo = <char *>cnp.PyArray_DATA(a)
    hi = lo + cnp.PyArray_ITEMSIZE(a)
    for k in range(cnp.PyArray_NDIM(a)):
        if cnp.PyArray_STRIDE(a, k) < 0:
            return True
        hi += (cnp.PyArray_DIM(a, k) - 1) * cnp.PyArray_STRIDE(a, k)
    return lo < ohi and olo < hi


cdef bint out_via_temporary(int64_t num_bags, int64_t dim, int64_t n_indices, int index_bytes):
    """Whether a call that could write the caller's out= directly should write a temporary and
    copy it into out= on success instead: when that moves fewer bytes.  Writing out= directly
    needs a checked copy of the indices first (index_snapshot: the copy's write, about 2 * n * s
    bytes of traffic); a temporary needs no check (a failed call drops it) but a copy into out=
    (2 * B * D * 4) and saves the check's read (n * s).  Tiny calls keep the copy of the indices:
    np.copyto costs more than their kernel."""
    if num_bags * dim + n_indices < TINY_BAGS:
        return False
    return 8 * num_bags * dim < 3 * n_indices * index_bytes


cdef cnp.ndarray bags_out_for_kernel(object out, int64_t num_bags, int64_t dim, cnp.ndarray table,
                                     tuple keep):
    """The array the kernel writes: out itself on the fast path (float32, C-contiguous, aligned,
    right shape, no overlap with an input, and out_via_temporary says no), else a temporary
    (check_out's validation and temporary off the fast path)."""
    cdef cnp.ndarray o, ix = <cnp.ndarray>keep[0]
    cdef cnp.npy_intp shape[2]
    if (cnp.PyArray_Check(out) and cnp.PyArray_TYPE(<cnp.ndarray>out) == cnp.NPY_FLOAT32
            and cnp.PyArray_NDIM(<cnp.ndarray>out) == 2):
        o = <cnp.ndarray>out
        if (cnp.PyArray_DIM(o, 0) == num_bags and cnp.PyArray_DIM(o, 1) == dim
                and cnp.PyArray_ISCARRAY(o) and cnp.PyArray_ISNOTSWAPPED(o)
                and not bags_may_overlap(o, table) and not bags_may_overlap(o, keep[0])
                and not bags_may_overlap(o, keep[1]) and not bags_may_overlap(o, keep[2])):
            if out_via_temporary(num_bags, dim, cnp.PyArray_SIZE(ix), cnp.PyArray_ITEMSIZE(ix)):
                shape[0] = <cnp.npy_intp>num_bags
                shape[1] = <cnp.npy_intp>dim
                return pool_empty(2, shape, cnp.NPY_FLOAT32)
            return o
    return check_out(out, cnp.NPY_FLOAT32, "float32", (num_bags, dim), (table,) + keep)


cdef int raise_bags_status(const pk_bags *bags, pk_status status, int64_t bad, int64_t rows,
                           str name) except -1:
    """check_bags_status' slow path: the exception for a status that is not PK_OK."""
    if status == PK_ERR_INDEX:
        raise_index_error(bags, bad, rows)
    elif status != PK_OK:
        raise RuntimeError(f"{name} kernel failed with status {<int>status}")
    return 0


cdef pk_status run_bags(pk_bags *bags, pk_bags_call call, const void *args,
                        int64_t rows, int64_t row_bytes, int64_t dim, int n_threads,
                        void *snapshot, int64_t *bad_pos) noexcept nogil:
    cdef pk_bags_part part
    cdef pk_status status
    cdef int bad_part = 0
    part.bags = bags[0]
    part.call = call
    part.args = args
    part.index_cost = row_bytes + (8 if bags.index_64 else 4)
    part.bag_cost = dim * 4 + 8
    part.rows = rows
    status = pk_bags_run(pool, n_threads, &part, 1, snapshot, bad_pos, &bad_part)
    if snapshot != NULL:
        bags.indices = snapshot
    return status
