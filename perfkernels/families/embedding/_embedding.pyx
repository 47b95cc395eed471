"""Embedding bags on float32 / float16 / bfloat16 tables."""
from libc.stdint cimport int64_t
from cpython.pycapsule cimport PyCapsule_New
import ml_dtypes
import numpy as np
cimport numpy as cnp

from perfkernels._c_bags cimport pk_bags
from perfkernels.families.embedding._c_embedding cimport pk_embedding_kernels, pk_embedding_table
from perfkernels._c_bags_call cimport pk_table_bags_args, pk_table_bags_call, pk_table_bags_float
from perfkernels._arrays cimport as_input, finish_out, kernel_table_getter, register_family
from perfkernels._bags cimport (BAGS_SCRATCH, prepare_bags, bags_out_for_kernel, bags_output,
                                call_bags)
from perfkernels._parallel cimport resolve_threads

cnp.import_array()

cdef const pk_embedding_kernels *_kernels = NULL

cdef int BF16_NUM = np.dtype(ml_dtypes.bfloat16).num
cdef tuple _TABLE_TYPES = (cnp.NPY_FLOAT32, cnp.NPY_FLOAT16, BF16_NUM)
cdef str _TABLE_ACCEPTED = "float32, float16 or bfloat16 (ml_dtypes.bfloat16)"


register_family("embedding", <kernel_table_getter>pk_embedding_table, <const void **>&_kernels)


def _kernel_table(int level):
    """This level's kernel table (``const pk_embedding_kernels *``) as a PyCapsule, for the
    multi-table lookup (perfkernels.families.multi._multi), which has no kernels of its own."""
    return PyCapsule_New(<void *>pk_embedding_table(level), b"perfkernels.embedding_kernels", NULL)


cdef cnp.ndarray _as_table(object weight):
    """weight as a 2-D float32/float16/bfloat16 array whose rows have unit stride and are aligned
    for their element type.  Rows may be spaced any multiple of the element size apart (a column
    slice of a wider table is used in place); anything else is copied, never misread."""
    cdef cnp.ndarray a
    cdef int t
    cdef cnp.npy_intp itemsize, s0
    if cnp.PyArray_Check(weight):
        a = <cnp.ndarray>weight
    else:
        try:
            a = np.asarray(weight)
        except Exception as exc:
            raise TypeError(f"weight must be an array of {_TABLE_ACCEPTED}; "
                            f"got {type(weight).__name__}") from exc
    t = cnp.PyArray_TYPE(a)
    if t != cnp.NPY_FLOAT32 and t != cnp.NPY_FLOAT16 and t != BF16_NUM:
        raise TypeError(f"weight must have dtype {_TABLE_ACCEPTED}; got {a.dtype}")
    if cnp.PyArray_NDIM(a) != 2:
        raise ValueError(f"weight must be 2-D [rows, D]; got shape {(<object>a).shape}")
    itemsize = cnp.PyArray_ITEMSIZE(a)
    s0 = cnp.PyArray_STRIDE(a, 0)
    if not (cnp.PyArray_ISALIGNED(a) and cnp.PyArray_ISNOTSWAPPED(a)
            and (cnp.PyArray_STRIDE(a, 1) == itemsize or cnp.PyArray_DIM(a, 1) <= 1)
            and s0 >= 0 and s0 % itemsize == 0):
        a = as_input(a, "weight", _TABLE_TYPES, _TABLE_ACCEPTED)
    return a


def _checked_table(weight):
    """``weight`` validated (and copied if its layout needs it) as embedding_bag does."""
    return _as_table(weight)


def embedding_bag(weight: TableArray, indices: IndexArray, offsets: IndexArray | None = None, *,
                  lengths: IndexArray | None = None,
                  per_sample_weights: npt.ArrayLike | None = None, mode: Mode = "sum",
                  include_last_offset: bool = False, padding_idx: int | None = None,
                  positional_weights: bool = False,
                  out: Float32Array | None = None,
                  num_threads: int | None = None) -> Float32Array:
    """Sum (or average) rows of an embedding table over bags of indices.

    ``out[b] = scale_b * sum(w_j * float32(weight[indices[j]]) for j in bag b)``, accumulated in
    float32 whatever the table type (caffe2 SparseLengths[Weighted]Sum/Mean, PyTorch
    ``torch.nn.functional.embedding_bag``).  The kernel runs with the GIL released, except for
    calls touching fewer than 4096 output values + indices, where releasing and re-taking the GIL
    would cost more than the kernel itself (NumPy's ufuncs use the same kind of threshold).
    Larger calls split their bags across up to ``num_threads`` threads (each bag summed by one
    thread, so the result does not depend on the thread count).

    Parameters
    ----------
    weight : ndarray [rows, D] of float32, float16 or ml_dtypes.bfloat16
        The table.  Rows need unit stride along D; a column slice of a wider table is used in
        place, other layouts are copied.
    indices : ndarray of int32 or int64
        1-D with ``offsets`` or ``lengths``, or 2-D ``[B, L]``: B bags of L indices each.
    offsets : 1-D ndarray of int32 or int64, optional
        PyTorch convention: bag b is ``indices[offsets[b]:offsets[b+1]]``, the last bag ends at
        ``len(indices)`` (or at the last offset, which must equal ``len(indices)``, with
        ``include_last_offset=True``).  ``offsets[0]`` must be 0 and offsets non-decreasing.
    lengths : 1-D ndarray of int32 or int64, optional
        caffe2 convention: bag b is the next ``lengths[b]`` indices; ``sum(lengths)`` must equal
        ``len(indices)``.
    per_sample_weights : ndarray of float32, optional
        One weight per index (same shape as ``indices``), or with ``positional_weights=True`` one
        weight per position inside a bag (1-D, at least as long as the longest bag).
    mode : {"sum", "mean"}
        ``"mean"`` multiplies each bag by ``1 / count`` (caffe2's order of operations; PyTorch
        divides, the results agree to rounding), where count is the number of entries in the bag
        that are not ``padding_idx``; an empty bag is zeros in both modes.  Weights, when given,
        apply in both modes.
    include_last_offset : bool
    padding_idx : int, optional
        Entries equal to it (negative values count from the end, as in PyTorch) are skipped and
        not counted by ``"mean"``.
    positional_weights : bool
        Index ``per_sample_weights`` by the position inside the bag (caffe2
        SparseLengthsPositionalWeightedSum, FBGEMM ``is_weight_positional``).
    out : ndarray [num_bags, D] of float32, optional
        Written in place and returned; left untouched if an error is raised.
    num_threads : int, optional
        Threads this call may use (default :func:`perfkernels.get_num_threads`); a call uses
        fewer when it is too small to pay for more.

    Returns
    -------
    ndarray [num_bags, D] of float32

    Raises
    ------
    TypeError
        A dtype other than the ones above.
    ValueError
        Malformed offsets / lengths / weights / mode / padding_idx / out shape (the message
        echoes the offending values).
    IndexError
        An index that is negative or ``>= rows``, e.g.
        ``indices[17] = 1000000 is out of range for a table of 1000 rows``.

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> weight = np.arange(12, dtype=np.float32).reshape(4, 3)
    >>> perfkernels.embedding_bag(weight, np.array([0, 2, 3]), np.array([0, 2]))
    array([[ 6.,  8., 10.],
           [ 9., 10., 11.]], dtype=float32)
    >>> perfkernels.embedding_bag(weight, np.array([[0, 2], [3, 3]]), mode="mean")
    array([[ 3.,  4.,  5.],
           [ 9., 10., 11.]], dtype=float32)
    """
    cdef pk_bags bags
    cdef int64_t scratch[BAGS_SCRATCH]
    cdef int nt = resolve_threads(num_threads)
    cdef cnp.ndarray table = _as_table(weight)
    cdef int64_t rows = cnp.PyArray_DIM(table, 0)
    cdef int64_t dim = cnp.PyArray_DIM(table, 1)
    cdef int64_t row_stride = cnp.PyArray_STRIDE(table, 0) // cnp.PyArray_ITEMSIZE(table)
    cdef object keep = prepare_bags(&bags, indices, offsets, lengths, per_sample_weights, mode,
                                    include_last_offset, padding_idx, positional_weights, rows,
                                    scratch, BAGS_SCRATCH)
    cdef cnp.ndarray dst = bags_output(
        &bags, out, None if out is None else bags_out_for_kernel(out, bags.num_bags, dim, table, keep),
        dim)
    cdef int t = cnp.PyArray_TYPE(table)
    cdef const pk_embedding_kernels *k = _kernels
    cdef pk_table_bags_args args = pk_table_bags_float(
        k.embedding_bag_f32 if t == cnp.NPY_FLOAT32 else (
            k.embedding_bag_f16 if t == cnp.NPY_FLOAT16 else k.embedding_bag_bf16),
        cnp.PyArray_DATA(table), rows, dim, row_stride)
    call_bags(&bags, dst is out, pk_table_bags_call, &args, rows, dim * cnp.PyArray_ITEMSIZE(table),
              dim, nt, "embedding_bag")
    return finish_out(out, dst)
