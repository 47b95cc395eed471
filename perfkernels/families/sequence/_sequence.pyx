"""Unpooled lookups (torch.nn.Embedding): one output row per index, for float and packed tables."""
from libc.stdint cimport uint8_t, int64_t
from libc.string cimport memset

import numpy as np
cimport numpy as cnp
from perfkernels._memory cimport pool_new

from perfkernels._c_common cimport pk_status, PK_OK, PK_ERR_INDEX
from perfkernels.families.sequence._c_sequence cimport (pk_sequence_kernels, pk_sequence_table,
                                                       pk_sequence_copy_first_bad)
from perfkernels._arrays cimport check_out, kernel_table_getter, register_family
from perfkernels._bags cimport as_int_array, checked_padding_idx
from perfkernels._parallel cimport (resolve_threads, run_ranges, ranges_threads, ranges_chunks,
                                   range_fn)
from perfkernels.families.embedding._embedding import _checked_table
from perfkernels.families.quantized._quantized import _checked_packed

cnp.import_array()

cdef const pk_sequence_kernels *_kernels = NULL

register_family("sequence", <kernel_table_getter>pk_sequence_table, <const void **>&_kernels)

cdef enum:
    # calls with fewer output values + indices run with the GIL held, on the calling thread
    TINY_ROWS = 4096
    # per-chunk results of calls split in at most this many ranges live on the stack
    STACK_CHUNKS = 64


ctypedef struct _rows_job:
    const pk_sequence_kernels *k
    int bits                 # 0: a float table (embedding_rows), else the packed rows' bits
    const void *table
    int64_t rows
    int64_t row_stride       # bytes between rows of the table
    int64_t row_bytes        # bytes of one table row
    int64_t dim              # packed tables: the output row's floats
    int64_t out_row_bytes
    const void *indices
    int index_64
    void *snapshot           # the checked private copy of the indices, or NULL
    char *out
    pk_status *status        # per range
    int64_t *bad             # per range: the first bad position


cdef void _scan_range(void *vjob, int64_t lo, int64_t hi, int64_t chunk) noexcept nogil:
    """Copy indices [lo, hi) into the snapshot and check them."""
    cdef _rows_job *j = <_rows_job *>vjob
    cdef int64_t bad = pk_sequence_copy_first_bad(j.indices, j.index_64, lo, hi, j.rows, j.snapshot)
    j.status[chunk] = PK_OK if bad < 0 else PK_ERR_INDEX
    j.bad[chunk] = bad


cdef void _rows_range(void *vjob, int64_t lo, int64_t hi, int64_t chunk) noexcept nogil:
    cdef _rows_job *j = <_rows_job *>vjob
    cdef int64_t bad = 0
    cdef const char *ix = <const char *>j.indices + lo * (8 if j.index_64 else 4)
    if j.bits == 0:
        j.status[chunk] = j.k.embedding_rows(j.table, j.rows, j.row_stride, j.row_bytes, ix,
                                             j.index_64, hi - lo, j.out + lo * j.out_row_bytes,
                                             &bad)
    else:
        j.status[chunk] = j.k.embedding_rows_quantized(
            j.bits, <const uint8_t *>j.table, j.rows, j.row_bytes, j.dim, ix, j.index_64, hi - lo,
            <float *>(j.out + lo * j.out_row_bytes), &bad)
    j.bad[chunk] = lo + bad


cdef int64_t _first_bad(const _rows_job *j, int k) noexcept nogil:
    """The first bad position of the call (ranges are in index order), or -1."""
    cdef int c
    for c in range(k):
        if j.status[c] != PK_OK:
            return j.bad[c]
    return -1


cdef int _raise_index(cnp.ndarray ix, int64_t pos, int64_t rows) except -1:
    cdef object value = ix.reshape(-1)[pos]
    raise IndexError(f"indices[{pos}] = {int(value)} is out of range for a table of {rows} rows")


cdef int64_t _run_pass(_rows_job *j, range_fn fn, int64_t n, int64_t align, bint tiny,
                       int threads, int k) noexcept:
    """fn over the ranges of [0, n): on the calling thread with the GIL held when tiny, else on
    `threads` threads (k ranges) without it; the first bad position, or -1."""
    cdef int64_t bad
    if tiny:
        run_ranges(n, 1, align, fn, j)
        return _first_bad(j, 1)
    with nogil:
        run_ranges(n, threads, align, fn, j)
        bad = _first_bad(j, k)
    return bad


cdef int64_t _execute(_rows_job *j, int64_t n, bint writes_out, int nt) except -2:
    """Run the lookup of n indices on up to nt threads; the first bad position, or -1 (nothing
    written when writes_out: the kernels then read a private copy of the indices checked before
    they start)."""
    cdef int isz = 8 if j.index_64 else 4
    cdef int64_t align = 1
    cdef int64_t lb = j.out_row_bytes
    cdef pk_status st_stack[STACK_CHUNKS]
    cdef int64_t bad_stack[STACK_CHUNKS]
    cdef cnp.ndarray results = None, snapshot = None
    cdef int threads, k
    cdef int64_t bad
    cdef cnp.npy_intp size
    cdef bint tiny
    if n == 0:
        return -1
    # ranges start on whole lines of the output: no two threads write one line
    while (align * lb) % 64 != 0 and align < 64:
        align *= 2
    threads = ranges_threads(n * (j.row_bytes + lb + isz), nt)
    k = ranges_chunks(n, threads, align)
    if k <= STACK_CHUNKS:
        j.status = st_stack
        j.bad = bad_stack
    else:
        results = np.empty(2 * k, dtype=np.int64)
        j.status = <pk_status *>cnp.PyArray_DATA(results)
        j.bad = <int64_t *>cnp.PyArray_DATA(results) + k
    tiny = n * (lb // 4 + 1) < TINY_ROWS
    if writes_out:
        size = <cnp.npy_intp>(n * isz)
        snapshot = cnp.PyArray_EMPTY(1, &size, cnp.NPY_UINT8, 0)
        j.snapshot = cnp.PyArray_DATA(snapshot)
        bad = _run_pass(j, _scan_range, n, align, tiny, threads, k)
        if bad >= 0:
            return bad
        j.indices = j.snapshot
    return _run_pass(j, _rows_range, n, align, tiny, threads, k)


cdef int64_t rows_into(const void *table, int64_t rows, int64_t row_stride, int64_t row_bytes,
                       const void *indices, bint index_64, int64_t n, char *out,
                       int nt) except -2:
    """See _sequence.pxd."""
    cdef _rows_job j
    memset(&j, 0, sizeof(j))
    j.k = _kernels
    j.table = table
    j.rows = rows
    j.row_stride = row_stride
    j.row_bytes = j.out_row_bytes = row_bytes
    j.indices = indices
    j.index_64 = index_64
    j.out = out
    return _execute(&j, n, False, nt)


cdef object _run(_rows_job *j, cnp.ndarray ix, cnp.ndarray dst, bint writes_out, int nt):
    """Run the lookup on up to nt threads; IndexError for a bad index (dst untouched when
    writes_out)."""
    cdef int64_t bad = _execute(j, cnp.PyArray_SIZE(ix), writes_out, nt)
    if bad >= 0:
        _raise_index(ix, bad, j.rows)
    return dst


cdef object _lookup(object table_or_packed, cnp.ndarray ix, int bits, int64_t dim,
                    object out, int out_type, str out_name, object dtype, int nt):
    cdef cnp.ndarray t = <cnp.ndarray>table_or_packed
    cdef _rows_job j
    cdef tuple shape = (<object>ix).shape + (dim,)
    cdef cnp.ndarray dst
    if out is None:
        dst = pool_new(shape, np.dtype(dtype).num)   # the output pool (docs/memory.md)
    else:
        dst = check_out(out, out_type, out_name, shape, (t, ix))
    memset(&j, 0, sizeof(j))
    j.k = _kernels
    j.bits = bits
    j.table = cnp.PyArray_DATA(t)
    j.rows = cnp.PyArray_DIM(t, 0)
    j.row_stride = cnp.PyArray_STRIDE(t, 0)
    j.dim = dim
    j.row_bytes = cnp.PyArray_DIM(t, 1) if bits else dim * cnp.PyArray_ITEMSIZE(t)
    j.out_row_bytes = dim * (4 if bits else cnp.PyArray_ITEMSIZE(t))
    j.indices = cnp.PyArray_DATA(ix)
    j.index_64 = cnp.PyArray_ITEMSIZE(ix) == 8
    j.out = <char *>cnp.PyArray_DATA(dst)
    _run(&j, ix, dst, out is not None and dst is out, nt)
    if out is None:
        return dst
    if dst is not out:
        np.copyto(out, dst)
    return out


def embedding(weight: TableArray, indices: IndexArray, *, padding_idx: int | None = None,
              out: npt.NDArray | None = None, num_threads: int | None = None) -> npt.NDArray:
    """Look up one table row per index: ``weight[indices]`` (``torch.nn.functional.embedding``).

    The output has shape ``indices.shape + (D,)`` and the table's dtype; rows are copied as
    stored (no conversion: every bit of a float16 / bfloat16 row, NaN payloads included, is
    kept).  ``padding_idx`` rows are returned as stored too, as in PyTorch, where only their
    gradient is zero: the argument is checked (PyTorch's range) and otherwise has no effect here.
    Every index is checked before its row is read.  Calls of at least 4096 output values +
    indices release the GIL; large ones are split across up to ``num_threads`` threads in
    contiguous index ranges (each output row copied by one thread: results do not depend on the
    thread count).

    Parameters
    ----------
    weight : ndarray [rows, D] of float32, float16 or ml_dtypes.bfloat16
        The table.  Rows need unit stride along D; a column slice of a wider table is used in
        place, other layouts are copied.
    indices : ndarray of int32 or int64, any shape (0-d included)
    padding_idx : int, optional
        In ``[-rows, rows)`` (negative counts from the end), as PyTorch checks it.
    out : ndarray of the table's dtype, shape ``indices.shape + (D,)``, optional
        Written in place and returned; left untouched if an error is raised.
    num_threads : int, optional
        Threads this call may use (default :func:`perfkernels.get_num_threads`).

    Returns
    -------
    ndarray of the table's dtype, shape ``indices.shape + (D,)``

    Raises
    ------
    TypeError
        A dtype other than the ones above, or a padding_idx that is not an integer.
    ValueError
        A table that is not 2-D, a padding_idx out of range, a bad ``out``.
    IndexError
        An index that is negative or ``>= rows``, naming its flattened position and value, e.g.
        ``indices[17] = 1000000 is out of range for a table of 1000 rows``.

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> weight = np.arange(8, dtype=np.float32).reshape(4, 2)
    >>> perfkernels.embedding(weight, np.array([[3, 0], [1, 1]]))
    array([[[6., 7.],
            [0., 1.]],
    <BLANKLINE>
           [[2., 3.],
            [2., 3.]]], dtype=float32)
    """
    cdef int nt = resolve_threads(num_threads)
    cdef cnp.ndarray table = <cnp.ndarray>_checked_table(weight)
    cdef cnp.ndarray ix = as_int_array(indices, "indices")
    checked_padding_idx(padding_idx, cnp.PyArray_DIM(table, 0))
    return _lookup(table, ix, 0, cnp.PyArray_DIM(table, 1), out, cnp.PyArray_TYPE(table),
                   str(table.dtype), table.dtype, nt)


def embedding_quantized(packed: npt.NDArray[np.uint8], indices: IndexArray, *, bits: int = 8,
                        dim: int | None = None, out: Float32Array | None = None,
                        num_threads: int | None = None) -> Float32Array:
    """Look up one row-wise quantized row per index, dequantised to float32:
    ``out[..., c] = q_c * scale + bias`` of row ``indices[...]`` (as :func:`dequantize_rowwise`,
    rounded once: an FMA on the vector levels).

    Parameters
    ----------
    packed : ndarray of uint8, shape (rows, row_bytes)
        Rows from :func:`quantize_rowwise` (or PyTorch's prepack ops) with ``bits`` bits per code.
    indices : ndarray of int32 or int64, any shape
    bits : {8, 4, 2}
    dim : int, optional
        The embedding dimension D, needed for 4/2-bit rows whose D is not a multiple of
        ``8 // bits``; checked against the row width when given.
    out : ndarray of float32, shape ``indices.shape + (D,)``, optional
        Written in place and returned; left untouched if an error is raised.
    num_threads : int, optional
        Threads this call may use (default :func:`perfkernels.get_num_threads`).

    Returns
    -------
    ndarray of float32, shape ``indices.shape + (D,)``

    Raises
    ------
    TypeError, ValueError
        As :func:`embedding_bag_quantized` for the packed table; as :func:`embedding` for
        ``out``.
    IndexError
        An index that is negative or ``>= rows``, naming its flattened position and value.

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> p = perfkernels.quantize_rowwise(np.array([[0, 1, 2, 3], [4, 4, 4, 4]], np.float32))
    >>> perfkernels.embedding_quantized(p, np.array([1, 0]))
    array([[4., 4., 4., 4.],
           [0., 1., 2., 3.]], dtype=float32)
    """
    cdef int nt = resolve_threads(num_threads)
    p, b, d = _checked_packed(packed, bits, dim)
    cdef cnp.ndarray ix = as_int_array(indices, "indices")
    return _lookup(p, ix, b, d, out, cnp.NPY_FLOAT32, "float32", np.float32, nt)
