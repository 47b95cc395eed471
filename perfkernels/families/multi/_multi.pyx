"""Many embedding tables in one call, from TorchRec's KeyedJaggedTensor layout.

The kernels are those of embedding_bag and embedding_bag_quantized (their tables come from those
modules as capsules); this module validates the whole batch once and runs every (feature, bag)
on the thread pool (csrc/common/bags_parallel.h).
"""
from libc.stdint cimport uint8_t, int32_t, int64_t
from libc.stdlib cimport malloc, free
from cpython.pycapsule cimport PyCapsule_GetPointer
import operator
import numpy as np
cimport numpy as cnp
from perfkernels._memory cimport pool_new

from perfkernels import _dispatch
from perfkernels.families.embedding import _embedding
from perfkernels.families.quantized import _quantized
from perfkernels.families.interaction import _interaction

from perfkernels._c_common cimport pk_status, PK_OK, PK_ERR_INDEX
from perfkernels._c_bags cimport pk_bags, pk_bags_index
from perfkernels._c_parallel cimport pk_parallel_api
from perfkernels._c_bags_parallel cimport pk_bags_part, pk_bags_run
from perfkernels.families.embedding._c_embedding cimport pk_embedding_kernels
from perfkernels.families.quantized._c_quantized cimport pk_quantized_kernels
from perfkernels._c_bags_call cimport (pk_table_bags_args, pk_table_bags_call, pk_table_bags_float,
                                       pk_table_bags_packed)
from perfkernels._arrays cimport as_float32, check_out, finish_out
from perfkernels._bags cimport (as_int_array, lengths_to_offsets, normalise_offsets,
                                out_via_temporary)
from perfkernels._parallel cimport pool, resolve_threads
from perfkernels._c_bags cimport pk_bags_first_bad_in
from perfkernels.families.interaction._c_interaction cimport (pk_interaction_dot_fn,
                                                              pk_interaction_kernels)
from perfkernels.families.multi.fused cimport run_interaction

cnp.import_array()

cdef const pk_embedding_kernels *_float_kernels = NULL
cdef const pk_quantized_kernels *_quantized_kernels = NULL
cdef const pk_interaction_kernels *_interaction_kernels = NULL



def _set_isa(int level):
    global _float_kernels, _quantized_kernels, _interaction_kernels
    _interaction_kernels = <const pk_interaction_kernels *>PyCapsule_GetPointer(
        _interaction._kernel_table(level), b"perfkernels.interaction_kernels")
    _float_kernels = <const pk_embedding_kernels *>PyCapsule_GetPointer(
        _embedding._kernel_table(level), b"perfkernels.embedding_kernels")
    _quantized_kernels = <const pk_quantized_kernels *>PyCapsule_GetPointer(
        _quantized._kernel_table(level), b"perfkernels.quantized_kernels")


_dispatch.register(_set_isa)


cdef list _per_feature(object value, Py_ssize_t F, str name):
    """A per-table option given once (applies to every table) or as a list of F values."""
    if isinstance(value, (list, tuple)):
        if len(value) != F:
            raise ValueError(f"{name} has {len(value)} entries; it needs one per table ({F})")
        return list(value)
    return [value] * F


cdef tuple _checked_tables(object tables, Py_ssize_t F, list bits_f, list dims_f):
    """The tables validated as the single-table functions do (errors prefixed with ``tables[f]``):
    (arrays, dims, kinds), kind the NumPy type number of a float table or -bits of a packed one."""
    cdef list arrays = [], tdims = [], kinds = []
    cdef Py_ssize_t f
    for f in range(F):
        try:
            if bits_f[f] is None:
                a = _embedding._checked_table(tables[f])
                if dims_f[f] is not None and dims_f[f] != a.shape[1]:
                    raise ValueError(f"dims[{f}] = {dims_f[f]!r} but the table has D = "
                                     f"{a.shape[1]}")
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
    return arrays, tdims, kinds


cdef void _set_kernel(pk_bags_part *part, pk_table_bags_args *arg, cnp.ndarray a_, int kind, int64_t dim,
                      int idx_bytes):
    """Point a part at its table's kernel (float or packed) and set its costs."""
    part.args = arg
    part.call = pk_table_bags_call
    part.bag_cost = dim * 4 + 8
    part.rows = a_.shape[0]
    if kind > 0:
        arg[0] = pk_table_bags_float(
            _float_kernels.embedding_bag_f32 if kind == cnp.NPY_FLOAT32 else
            _float_kernels.embedding_bag_f16 if kind == cnp.NPY_FLOAT16 else
            _float_kernels.embedding_bag_bf16,
            cnp.PyArray_DATA(a_), a_.shape[0], dim,
            cnp.PyArray_STRIDE(a_, 0) // cnp.PyArray_ITEMSIZE(a_))
        part.index_cost = dim * cnp.PyArray_ITEMSIZE(a_) + idx_bytes
    else:
        arg[0] = pk_table_bags_packed(_quantized_kernels.embedding_bag_quantized, -kind,
                                      cnp.PyArray_DATA(a_), a_.shape[0], a_.shape[1], dim)
        part.index_cost = a_.shape[1] + idx_bytes


cdef tuple _modes_and_pads(list modes_f, list pads_f, list arrays, Py_ssize_t F):
    """Per table: mode mean (bool) and padding_idx (-1: none; negatives wrapped), validated."""
    cdef list mean_f = [], pad_values = []
    cdef Py_ssize_t f
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
    return mean_f, pad_values


cdef bint _column_slice(object out, tuple shape, tuple inputs) except -1:
    """Whether ``out`` is a writeable, aligned float32 ``shape`` array whose rows are contiguous
    but further apart than their length (a column slice ``big[:, c:c + W]`` of a row-major
    ``big``), sharing no memory with the inputs: the kernels then write it in place, each row at
    its own stride (the rest of ``big`` is never touched)."""
    if not cnp.PyArray_Check(out):
        return False
    cdef cnp.ndarray o = <cnp.ndarray>out
    if (cnp.PyArray_TYPE(o) != cnp.NPY_FLOAT32 or cnp.PyArray_NDIM(o) != 2
            or (<object>o).shape != shape or cnp.PyArray_IS_C_CONTIGUOUS(o)
            or not cnp.PyArray_ISWRITEABLE(o) or not cnp.PyArray_ISALIGNED(o)
            or not cnp.PyArray_ISNOTSWAPPED(o)):
        return False
    cdef Py_ssize_t row = cnp.PyArray_STRIDE(o, 0), col = cnp.PyArray_STRIDE(o, 1)
    if (shape[1] > 1 and col != 4) or row % 4 or row < 4 * shape[1] or shape[0] < 2:
        return False
    for x in inputs:
        if x is not None and np.may_share_memory(o, x):
            return False
    return True


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
        Written in place and returned; left untouched if an error is raised.  It may be a column
        slice of a wider row-major array (``big[:, c:c + sum(D_f)]``, e.g. the columns of the
        pooled features beside a model's dense features): the kernels write its rows at their
        stride, straight into ``big``, without a temporary, and no other column of ``big``.
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

    cdef list arrays, tdims, kinds
    arrays, tdims, kinds = _checked_tables(tables, F, bits_f, dims_f)
    cdef Py_ssize_t f

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

    cdef list mean_f, pad_values
    mean_f, pad_values = _modes_and_pads(modes_f, pads_f, arrays, F)

    cdef int64_t total_d = sum(tdims)
    cdef tuple shape = (B, total_d)
    cdef cnp.ndarray dst
    cdef int64_t out_stride = total_d
    if out is None:
        dst = pool_new(shape, cnp.NPY_FLOAT32)
    elif _column_slice(out, shape, tuple(arrays) + (ix, src, w)):
        # a column slice of a wider row-major array (big[:, c:c + sum(D)]): written in place
        dst = <cnp.ndarray>out
        out_stride = cnp.PyArray_STRIDE(dst, 0) // 4
    else:
        dst = check_out(out, cnp.NPY_FLOAT32, "float32", shape,
                        tuple(arrays) + (ix, src, w))
        if dst is out and out_via_temporary(B, total_d, n, cnp.PyArray_ITEMSIZE(ix)):
            dst = pool_new(shape, cnp.NPY_FLOAT32)   # fewer bytes than a checked index copy

    # one part per feature: its bags (offsets from f * B, out at its columns), kernel and costs
    cdef pk_bags_part *parts = <pk_bags_part *>malloc(F * sizeof(pk_bags_part))
    cdef pk_table_bags_args *args = <pk_table_bags_args *>malloc(F * sizeof(pk_table_bags_args))
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
            part.bags.out_stride = out_stride
            _set_kernel(part, &args[f], a_, kind, tdims[f], idx_bytes)
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


def embedding_bags_interaction(dense: Float32Array, tables: Sequence[TableArray],
                               indices: Sequence[IndexArray], offsets: Sequence[IndexArray], *,
                               interaction: str = "dot", pairs: object = "dlrm",
                               self_interaction: bool = False,
                               include_last_offset: bool = False,
                               per_sample_weights: Sequence[npt.ArrayLike | None] | None = None,
                               modes: Mode | Sequence[Mode] = "sum",
                               padding_idx: int | None | Sequence[int | None] = None,
                               bits: Sequence[int | None] | None = None,
                               dims: Sequence[int | None] | None = None,
                               out: Float32Array | None = None,
                               num_threads: int | None = None) -> Float32Array:
    """F pooled lookups and DLRM's feature interaction in one call, written straight into the
    interaction's output (facebookresearch DLRM's ``interact_features``, TorchRec's
    ``InteractionArch``).

    Feature f is the bags of ``indices[f]`` / ``offsets[f]`` in ``tables[f]`` (PyTorch's
    ``embedding_bag`` inputs, one pair per table: DLRM's ``lS_i[f]``, ``lS_o[f]``), pooled as
    :func:`embedding_bag` pools it.  With ``dense`` (float32 ``[B, Dd]``, the bottom MLP's output):

    * ``interaction="cat"``: ``[B, Dd + sum(D_f)]``, ``torch.cat([dense] + pooled, 1)``: every
      pooled row is written at its columns of the output;
    * ``interaction="dot"`` (every ``D_f == Dd = D``): ``[B, D + P]``, the dense row and the P
      pairwise dot products of ``z = [dense[b], pooled_0[b], ..., pooled_{F-1}[b]]`` in the order
      of ``pairs`` (as :func:`perfkernels.dot_interaction` gives them: ``"dlrm"``,
      ``"torchrec"`` or ``(li, lj)``), ``self_interaction`` adding the pairs (i, i).  Each
      sample's ``z`` is a small per-thread scratch: ``[B, F, D]`` is never made.

    Each bag is pooled by the same kernel, in the same order, as :func:`embedding_bag`, and each
    dot product by :func:`dot_interaction`'s kernel, so the result equals those calls one after
    the other, bit for bit, for any thread count.  Everything is validated, every index of every
    feature included, before anything is written; an out-of-range index raises the IndexError of
    the first bad feature (``feature f: indices[j] = v is out of range for a table of R rows``,
    j the position in ``indices[f]``).

    ``per_sample_weights``: None, or a list of F (None or float32 ``[len(indices[f])]``).
    ``modes``, ``padding_idx``, ``bits``, ``dims``: as :func:`embedding_bags_multi`.

    Raises
    ------
    TypeError
        ``tables`` not a list, a table or index array of an unsupported dtype.
    ValueError
        ``interaction`` not ``"dot"`` or ``"cat"``, per-feature lists of the wrong length,
        malformed bags, widths that disagree (``"dot"`` needs every ``D_f == Dd``), a bad ``out``.
    IndexError
        An index outside its table (the first bad feature's, named).

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> dense = np.array([[1, 2]], dtype=np.float32)                   # B = 1, D = 2
    >>> table = np.array([[1, 0], [0, 1], [0, 0]], dtype=np.float32)
    >>> indices, offsets = [np.array([0, 1]), np.array([2])], [np.array([0]), np.array([0])]
    >>> perfkernels.embedding_bags_interaction(dense, [table, table], indices, offsets)
    array([[1., 2., 3., 0., 0.]], dtype=float32)
    >>> perfkernels.embedding_bags_interaction(dense, [table, table], indices, offsets,
    ...                                        interaction="cat")
    array([[1., 2., 1., 1., 0., 0.]], dtype=float32)
    """
    cdef int nt = resolve_threads(num_threads)
    if interaction not in ("dot", "cat"):
        raise ValueError(f"interaction must be 'dot' or 'cat'; got {interaction!r}")
    if not isinstance(tables, (list, tuple)):
        raise TypeError(f"tables must be a list of arrays (one per feature); got "
                        f"{type(tables).__name__}")
    cdef Py_ssize_t F = len(tables), f
    if F == 0:
        raise ValueError("tables is empty: give at least one table")
    for name, value in (("indices", indices), ("offsets", offsets)):
        if not isinstance(value, (list, tuple)) or len(value) != F:
            raise ValueError(f"{name} must be a list of {F} arrays (one per table); got "
                             f"{type(value).__name__}"
                             + (f" of {len(value)}" if isinstance(value, (list, tuple)) else ""))
    cdef list psw = ([None] * F if per_sample_weights is None
                     else _per_feature(per_sample_weights, F, "per_sample_weights"))
    cdef list bits_f = [None] * F if bits is None else _per_feature(bits, F, "bits")
    cdef list dims_f = [None] * F if dims is None else _per_feature(dims, F, "dims")
    cdef list arrays, tdims, kinds, mean_f, pad_values
    arrays, tdims, kinds = _checked_tables(tables, F, bits_f, dims_f)
    mean_f, pad_values = _modes_and_pads(_per_feature(modes, F, "modes"),
                                         _per_feature(padding_idx, F, "padding_idx"), arrays, F)
    cdef cnp.ndarray x = as_float32(dense, "dense")
    if cnp.PyArray_NDIM(x) != 2:
        raise ValueError(f"dense must be 2-D [B, D]; got shape {(<object>x).shape}")
    cdef int64_t B = x.shape[0], Dd = x.shape[1], max_len = 0, count, n
    if interaction == "dot" and any(d != Dd for d in tdims):
        raise ValueError(f"interaction 'dot' needs every table's D equal to dense's {Dd}; got "
                         f"D = {tdims}")

    # per feature: its indices, normalised offsets (B + 1) and weights
    cdef list keep = []
    cdef cnp.ndarray ix, src, norm, w
    cdef list ixs = [], norms = [], ws = []
    for f in range(F):
        ix = as_int_array(indices[f], f"indices[{f}]")
        if cnp.PyArray_NDIM(ix) != 1:
            raise ValueError(f"indices[{f}] must be 1-D; got shape {(<object>ix).shape}")
        src = as_int_array(offsets[f], f"offsets[{f}]")
        if cnp.PyArray_NDIM(src) != 1:
            raise ValueError(f"offsets[{f}] must be 1-D; got shape {(<object>src).shape}")
        n = cnp.PyArray_DIM(ix, 0)
        count = cnp.PyArray_DIM(src, 0)
        if count - (1 if include_last_offset else 0) != B:
            raise ValueError(f"offsets[{f}] has {count} entries: {B} bags (dense has {B} rows) "
                             f"need {B + 1 if include_last_offset else B}")
        norm = np.empty(B + 1, dtype=np.int64)
        try:
            normalise_offsets(cnp.PyArray_DATA(src), cnp.PyArray_ITEMSIZE(src) == 8, count,
                              include_last_offset, n, <int64_t *>cnp.PyArray_DATA(norm), &max_len)
        except ValueError as exc:
            raise ValueError(f"feature {f}: {exc}") from None
        if not include_last_offset:
            (<int64_t *>cnp.PyArray_DATA(norm))[B] = n
        w = None
        if psw[f] is not None:
            w = as_float32(psw[f], f"per_sample_weights[{f}]")
            if (<object>w).shape != (n,):
                raise ValueError(f"per_sample_weights[{f}] has shape {(<object>w).shape}; it "
                                 f"needs one weight per index, shape ({n},)")
        ixs.append(ix)
        norms.append(norm)
        ws.append(w)

    cdef cnp.ndarray ali = None, alj = None
    cdef int64_t P = 0, width
    if interaction == "dot":
        ali, alj = _interaction.pair_lists(F + 1, pairs, self_interaction)
        P = ali.shape[0]
        width = Dd + P
    else:
        width = Dd + sum(tdims)
    cdef tuple shape = (B, width)
    cdef cnp.ndarray dst
    if out is None:
        dst = pool_new(shape, cnp.NPY_FLOAT32)
    else:   # validated, written through a temporary (out= is never half-written)
        check_out(out, cnp.NPY_FLOAT32, "float32", shape, ())
        dst = pool_new(shape, cnp.NPY_FLOAT32)

    cdef pk_bags_part *parts = <pk_bags_part *>malloc(F * sizeof(pk_bags_part))
    cdef pk_table_bags_args *args = <pk_table_bags_args *>malloc(F * sizeof(pk_table_bags_args))
    cdef pk_bags_part *part
    cdef int64_t col = Dd, bad = -1
    cdef int bad_part = -1, kind
    cdef pk_status status = PK_OK
    cdef bint is_cat = interaction == "cat"
    cdef const int32_t *li = NULL
    cdef const int32_t *lj = NULL
    if not is_cat:
        li = <const int32_t *>cnp.PyArray_DATA(ali)
        lj = <const int32_t *>cnp.PyArray_DATA(alj)
    cdef float *o = <float *>cnp.PyArray_DATA(dst)
    cdef const float *xd = <const float *>cnp.PyArray_DATA(x)
    if parts == NULL or args == NULL:
        free(parts)
        free(args)
        raise MemoryError()
    try:
        for f in range(F):
            part = &parts[f]
            ix = <cnp.ndarray>ixs[f]
            part.bags.indices = cnp.PyArray_DATA(ix)
            part.bags.n_indices = cnp.PyArray_DIM(ix, 0)
            part.bags.index_64 = cnp.PyArray_ITEMSIZE(ix) == 8
            part.bags.offsets = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>norms[f])
            part.bags.num_bags = B
            part.bags.weights = (NULL if ws[f] is None
                                 else <const float *>cnp.PyArray_DATA(<cnp.ndarray>ws[f]))
            part.bags.positional = 0
            part.bags.mean = 1 if mean_f[f] else 0
            part.bags.padding_idx = pad_values[f]
            part.bags.out = o + col
            part.bags.out_stride = width
            _set_kernel(part, &args[f], <cnp.ndarray>arrays[f], kinds[f], tdims[f],
                        cnp.PyArray_ITEMSIZE(ix))
            col += tdims[f]
        with nogil:
            # every index checked first, feature by feature: the first bad one is reported
            for f in range(F):
                bad = pk_bags_first_bad_in(&parts[f].bags, 0, B, parts[f].rows)
                if bad >= 0:
                    bad_part = <int>f
                    status = PK_ERR_INDEX
                    break
            if status == PK_OK:
                status = run_interaction(pool, nt, parts, <int>F, is_cat, xd, Dd, li, lj, P,
                                         _interaction_kernels.interaction_dot, o, width, B, &bad,
                                         &bad_part)
        if status == PK_ERR_INDEX:
            raise IndexError(f"feature {bad_part}: indices[{bad}] = "
                             f"{pk_bags_index(&parts[bad_part].bags, bad)} is out of range for "
                             f"a table of {parts[bad_part].rows} rows")
        elif status != PK_OK:
            raise RuntimeError(f"embedding_bags_interaction kernel failed with status "
                               f"{<int>status}")
    finally:
        free(parts)
        free(args)
    return finish_out(out, dst)
