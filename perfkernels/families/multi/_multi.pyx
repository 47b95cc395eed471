"""Many embedding tables in one call, from TorchRec's KeyedJaggedTensor layout.

The kernels are those of embedding_bag and embedding_bag_quantized (their tables come from those
modules as capsules); this module validates the whole batch once and runs every (feature, bag)
on the thread pool (csrc/common/bags_parallel.h).
"""
from libc.stdint cimport uint8_t, int64_t
from libc.stdlib cimport malloc, free
from cpython.pycapsule cimport PyCapsule_GetPointer
import operator
import numpy as np
cimport numpy as cnp
from perfkernels._memory cimport pool_new

from perfkernels import _dispatch
from perfkernels.families.embedding import _embedding
from perfkernels.families.quantized import _quantized

from perfkernels._c_common cimport pk_status, PK_OK, PK_ERR_INDEX
from perfkernels._c_bags cimport pk_bags_index
from perfkernels._c_bags_parallel cimport pk_bags_part, pk_bags_run
from perfkernels.families.embedding._c_embedding cimport (pk_embedding_kernels, pk_float_bags_args,
                                                         pk_float_bags_call)
from perfkernels.families.quantized._c_quantized cimport (pk_quantized_kernels,
                                                         pk_quantized_bags_args,
                                                         pk_quantized_bags_call)
from perfkernels._arrays cimport as_float32, check_out, finish_out
from perfkernels._bags cimport (as_int_array, lengths_to_offsets, normalise_offsets,
                                out_via_temporary)
from perfkernels._parallel cimport pool, resolve_threads

cnp.import_array()

cdef const pk_embedding_kernels *_float_kernels = NULL
cdef const pk_quantized_kernels *_quantized_kernels = NULL


def _set_isa(int level):
    global _float_kernels, _quantized_kernels
    _float_kernels = <const pk_embedding_kernels *>PyCapsule_GetPointer(
        _embedding._kernel_table(level), b"perfkernels.embedding_kernels")
    _quantized_kernels = <const pk_quantized_kernels *>PyCapsule_GetPointer(
        _quantized._kernel_table(level), b"perfkernels.quantized_kernels")


_dispatch.register(_set_isa)

# one feature's kernel arguments (float or quantized table)
ctypedef union _args:
    pk_float_bags_args f
    pk_quantized_bags_args q


cdef list _per_feature(object value, Py_ssize_t F, str name):
    """A per-table option given once (applies to every table) or as a list of F values."""
    if isinstance(value, (list, tuple)):
        if len(value) != F:
            raise ValueError(f"{name} has {len(value)} entries; it needs one per table ({F})")
        return list(value)
    return [value] * F


cdef int _raise_bad_index(const pk_bags_part *part, int f, int64_t pos, int64_t start,
                          int64_t rows) except -1:
    cdef int64_t value = pk_bags_index(&part.bags, pos)
    raise IndexError(f"feature {f}: indices[{pos}] = {value} (entry {pos - start} of feature {f}) "
                     f"is out of range for table {f} of {rows} rows")


def embedding_bags_multi(tables: Sequence[TableArray], indices: IndexArray, *,
                         lengths: IndexArray | None = None, offsets: IndexArray | None = None,
                         per_sample_weights: npt.ArrayLike | None = None,
                         modes: Mode | Sequence[Mode] = "sum",
                         padding_idx: int | None | Sequence[int | None] = None,
                         bits: Sequence[int | None] | None = None,
                         dims: Sequence[int | None] | None = None,
                         out: Float32Array | None = None,
                         num_threads: int | None = None) -> Float32Array:
    """Pooled lookups of F features in F tables, in one call (TorchRec's EmbeddingBagCollection).

    The input is TorchRec's ``KeyedJaggedTensor`` layout for F features and B samples: ``indices``
    holds every feature's values back to back (feature 0's first), and ``lengths[f * B + b]`` is
    the number of values of feature f in sample b (or ``offsets``, F * B + 1 entries, the running
    sum: KJT's ``offsets()``).  Feature f reads ``tables[f]``.  The result is float32
    ``[B, sum(D_f)]``: sample b's pooled embeddings side by side in feature order, feature f in
    columns ``sum(D_g for g < f)`` to that plus ``D_f`` (TorchRec's ``KeyedTensor.values()``).

    Every bag is computed exactly as :func:`embedding_bag` / :func:`embedding_bag_quantized`
    compute it (same kernels, same order), so the result equals a loop of single-table calls bit
    for bit, for any thread count.  The whole batch is validated once before any kernel runs; the
    (feature, bag) pairs are then split across threads by the bytes they touch.

    Parameters
    ----------
    tables : list of F arrays
        Each a float table (float32, float16 or ml_dtypes.bfloat16, ``[rows_f, D_f]``) or a
        row-wise quantized table (uint8 ``[rows_f, row_bytes]`` from :func:`quantize_rowwise`, with
        its ``bits[f]``); any mix, each with its own rows and D.
    indices : 1-D array of int32 or int64
        The values of every feature, feature-major.
    lengths : 1-D array of int32 or int64, F * B entries, optional
    offsets : 1-D array of int32 or int64, F * B + 1 entries, optional
        Exactly one of ``lengths`` and ``offsets``.  ``offsets[0]`` must be 0, offsets
        non-decreasing, the last one ``len(indices)``.
    per_sample_weights : 1-D array of float32, optional
        One weight per value (KJT ``weights()``).
    modes : "sum" | "mean" or a list of F of them
    padding_idx : int or None, or a list of F of them
        Per table, as in :func:`embedding_bag`.
    bits : list of F entries (None for float tables, 8/4/2 for packed ones), optional
        Needed when any table is packed.
    dims : list of F entries (None or D), optional
        D of packed 4/2-bit tables whose D is not a multiple of ``8 // bits``; checked when given.
    out : ndarray of float32 ``[B, sum(D_f)]``, optional
        Written in place and returned; left untouched if an error is raised.
    num_threads : int, optional
        Threads this call may use (default :func:`perfkernels.get_num_threads`).

    Returns
    -------
    ndarray of float32, shape ``[B, sum(D_f)]``

    Raises
    ------
    TypeError, ValueError
        As the single-table functions, naming the table (``tables[f]``) or the per-table option,
        and for lengths / offsets whose size is not F * B (+ 1).
    IndexError
        An out-of-range index, naming the feature, its position in ``indices`` and in the feature.

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> t0 = np.arange(8, dtype=np.float32).reshape(4, 2)   # D = 2
    >>> t1 = np.ones((3, 3), dtype=np.float32)              # D = 3
    >>> # 2 samples: feature 0 has bags [0, 1] and [3]; feature 1 has [] and [2, 2]
    >>> perfkernels.embedding_bags_multi([t0, t1], np.array([0, 1, 3, 2, 2]),
    ...                                  lengths=np.array([2, 1, 0, 2]))
    array([[2., 4., 0., 0., 0.],
           [6., 7., 2., 2., 2.]], dtype=float32)
    """
    cdef int nt = resolve_threads(num_threads)
    if not isinstance(tables, (list, tuple)):
        raise TypeError(f"tables must be a list of arrays (one per feature); got "
                        f"{type(tables).__name__}")
    cdef Py_ssize_t F = len(tables)
    if F == 0:
        raise ValueError("tables is empty: give at least one table")
    cdef list bits_f = _per_feature(bits, F, "bits") if isinstance(bits, (list, tuple)) else (
        [None] * F if bits is None else None)
    if bits_f is None:
        raise TypeError(f"bits must be a list with one entry per table (None for float tables); "
                        f"got {bits!r}")
    cdef list dims_f = _per_feature(dims, F, "dims") if isinstance(dims, (list, tuple)) else (
        [None] * F if dims is None else None)
    if dims_f is None:
        raise TypeError(f"dims must be a list with one entry per table (None where not needed); "
                        f"got {dims!r}")
    cdef list modes_f = _per_feature(modes, F, "modes")
    cdef list pads_f = _per_feature(padding_idx, F, "padding_idx")

    # tables: validated as the single-table functions do, errors prefixed with the table
    cdef list arrays = [], tdims = [], kinds = []
    cdef Py_ssize_t f
    for f in range(F):
        try:
            if bits_f[f] is None:
                a = _embedding._checked_table(tables[f])
                if dims_f[f] is not None and dims_f[f] != a.shape[1]:
                    raise ValueError(f"dims[{f}] = {dims_f[f]!r} but the table has D = {a.shape[1]}")
                arrays.append(a)
                tdims.append(a.shape[1])
                kinds.append(a.dtype.num)
            else:
                a, b_, d_ = _quantized._checked_packed(tables[f], bits_f[f], dims_f[f])
                arrays.append(a)
                tdims.append(d_)
                kinds.append(-b_)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"tables[{f}]: {exc}") from None

    # the KJT: values, then lengths or offsets (F * B (+ 1) entries) -> offsets[F * B + 1]
    cdef cnp.ndarray ix = as_int_array(indices, "indices")
    if cnp.PyArray_NDIM(ix) != 1:
        raise ValueError(f"indices must be 1-D (every feature's values back to back); got shape "
                         f"{(<object>ix).shape}")
    cdef int64_t n = cnp.PyArray_DIM(ix, 0), max_len = 0, B
    cdef cnp.ndarray src, norm
    if (lengths is None) == (offsets is None):
        raise ValueError("give exactly one of lengths (F * B entries, KJT lengths()) and offsets "
                         "(F * B + 1 entries, KJT offsets())")
    src = as_int_array(lengths if offsets is None else offsets,
                        "lengths" if offsets is None else "offsets")
    if cnp.PyArray_NDIM(src) != 1:
        raise ValueError(f"{'lengths' if offsets is None else 'offsets'} must be 1-D; got shape "
                         f"{(<object>src).shape}")
    cdef Py_ssize_t count = cnp.PyArray_DIM(src, 0)
    if offsets is None:
        if count % F:
            raise ValueError(f"lengths has {count} entries, not a multiple of the {F} tables: it "
                             f"needs F * B (lengths[f * B + b] is feature f of sample b)")
        B = count // F
        norm = pool_new((count + 1,), cnp.NPY_INT64)
        lengths_to_offsets(cnp.PyArray_DATA(src), cnp.PyArray_ITEMSIZE(src) == 8, count, n,
                            <int64_t *>cnp.PyArray_DATA(norm), &max_len)
    else:
        if count == 0 or (count - 1) % F:
            raise ValueError(f"offsets has {count} entries; it needs F * B + 1 for the {F} tables")
        B = (count - 1) // F
        norm = pool_new((count,), cnp.NPY_INT64)
        normalise_offsets(cnp.PyArray_DATA(src), cnp.PyArray_ITEMSIZE(src) == 8, count, True, n,
                           <int64_t *>cnp.PyArray_DATA(norm), &max_len)
    cdef const int64_t *off = <const int64_t *>cnp.PyArray_DATA(norm)

    cdef cnp.ndarray w = None
    if per_sample_weights is not None:
        w = as_float32(per_sample_weights, "per_sample_weights")
        if (<object>w).shape != (n,):
            raise ValueError(f"per_sample_weights has shape {(<object>w).shape}; it needs one "
                             f"weight per value, shape ({n},)")

    cdef list mean_f = [], pad_values = []
    cdef int64_t rows_f
    for f in range(F):
        if modes_f[f] not in ("sum", "mean"):
            raise ValueError(f"modes[{f}] must be 'sum' or 'mean'; got {modes_f[f]!r}")
        mean_f.append(modes_f[f] == "mean")
        rows_f = (<cnp.ndarray>arrays[f]).shape[0]
        if pads_f[f] is None:
            pad_values.append(-1)
            continue
        try:
            pad_obj = operator.index(pads_f[f])
        except TypeError:
            raise TypeError(f"padding_idx[{f}] must be an integer or None; got "
                            f"{type(pads_f[f]).__name__}") from None
        if pad_obj < -rows_f or pad_obj >= rows_f:
            raise ValueError(f"padding_idx[{f}] = {pad_obj} is out of range for table {f} of "
                             f"{rows_f} rows (valid: -{rows_f} <= padding_idx < {rows_f})")
        pad_values.append(pad_obj + rows_f if pad_obj < 0 else pad_obj)

    cdef int64_t total_d = sum(tdims)
    cdef tuple shape = (B, total_d)
    cdef cnp.ndarray dst
    if out is None:
        dst = pool_new(shape, cnp.NPY_FLOAT32)
    else:
        dst = check_out(out, cnp.NPY_FLOAT32, "float32", shape,
                        tuple(arrays) + (ix, src, w))
        if dst is out and out_via_temporary(B, total_d, n, cnp.PyArray_ITEMSIZE(ix)):
            dst = pool_new(shape, cnp.NPY_FLOAT32)   # fewer bytes than a checked index copy

    # one part per feature: its bags (offsets from f * B, out at its columns), kernel and costs
    cdef pk_bags_part *parts = <pk_bags_part *>malloc(F * sizeof(pk_bags_part))
    cdef _args *args = <_args *>malloc(F * sizeof(_args))
    cdef pk_bags_part *part
    cdef cnp.ndarray a_, snapshot = None
    cdef void *snap = NULL
    cdef int64_t col = 0, bad = -1
    cdef int bad_part = 0, kind, idx_bytes = cnp.PyArray_ITEMSIZE(ix)
    cdef pk_status status
    cdef bint direct = dst is out
    cdef const float *weights = NULL
    if w is not None:
        weights = <const float *>cnp.PyArray_DATA(w)
    if parts == NULL or args == NULL:
        free(parts)
        free(args)
        raise MemoryError()
    try:
        for f in range(F):
            a_ = <cnp.ndarray>arrays[f]
            kind = kinds[f]
            part = &parts[f]
            part.bags.indices = cnp.PyArray_DATA(ix)
            part.bags.n_indices = off[(f + 1) * B]   # prefetches stay inside this feature
            part.bags.index_64 = idx_bytes == 8
            part.bags.offsets = off + f * B
            part.bags.num_bags = B
            part.bags.weights = weights
            part.bags.positional = 0
            part.bags.mean = 1 if mean_f[f] else 0
            part.bags.padding_idx = pad_values[f]
            part.bags.out = <float *>cnp.PyArray_DATA(dst) + col
            part.bags.out_stride = total_d
            part.args = &args[f]
            part.bag_cost = tdims[f] * 4 + 8
            part.rows = a_.shape[0]
            if kind > 0:
                args[f].f.fn = (_float_kernels.embedding_bag_f32 if kind == cnp.NPY_FLOAT32 else
                                _float_kernels.embedding_bag_f16 if kind == cnp.NPY_FLOAT16 else
                                _float_kernels.embedding_bag_bf16)
                args[f].f.table = cnp.PyArray_DATA(a_)
                args[f].f.rows = a_.shape[0]
                args[f].f.dim = tdims[f]
                args[f].f.row_stride = cnp.PyArray_STRIDE(a_, 0) // cnp.PyArray_ITEMSIZE(a_)
                part.call = pk_float_bags_call
                part.index_cost = tdims[f] * cnp.PyArray_ITEMSIZE(a_) + idx_bytes
            else:
                args[f].q.fn = _quantized_kernels.embedding_bag_quantized
                args[f].q.bits = -kind
                args[f].q.packed = <const uint8_t *>cnp.PyArray_DATA(a_)
                args[f].q.rows = a_.shape[0]
                args[f].q.row_bytes = a_.shape[1]
                args[f].q.dim = tdims[f]
                part.call = pk_quantized_bags_call
                part.index_cost = a_.shape[1] + idx_bytes
            col += tdims[f]

        if direct:
            # the kernels write the caller's out=: every index is copied into a private buffer
            # and checked (on the same threads) before any kernel runs, and the kernels read the
            # copy (another thread may write the caller's indices meanwhile)
            snapshot = pool_new((n * idx_bytes,), cnp.NPY_UINT8)
            snap = cnp.PyArray_DATA(snapshot)
        with nogil:
            status = pk_bags_run(pool, nt, parts, <int>F, snap, &bad, &bad_part)
        if snap != NULL:
            for f in range(F):
                parts[f].bags.indices = snap   # the message names the value that was checked
        if status == PK_ERR_INDEX:
            _raise_bad_index(&parts[bad_part], bad_part, bad, off[bad_part * B],
                             (<cnp.ndarray>arrays[bad_part]).shape[0])
        elif status != PK_OK:
            raise RuntimeError(f"embedding_bags_multi kernel failed with status {<int>status}")
    finally:
        free(parts)
        free(args)
    return finish_out(out, dst)
