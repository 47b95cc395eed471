"""Row-wise quantized tables: quantize, dequantize and embedding-bag lookups."""
from libc.stdint cimport uint8_t, uint16_t, int64_t
from cpython.pycapsule cimport PyCapsule_New
from cpython.pyport cimport PY_SSIZE_T_MAX
import numpy as np

from perfkernels.families.quantized import layout
cimport numpy as cnp
from perfkernels._memory cimport pool_new

from perfkernels._c_common cimport pk_status, PK_OK, PK_ERR_NONFINITE
from perfkernels._c_bags cimport pk_bags
from perfkernels._c_bags_call cimport pk_table_bags_args, pk_table_bags_call, pk_table_bags_packed
from perfkernels.families.quantized._c_quantized cimport (pk_quantized_kernels,
                                                         pk_quantized_row_bytes,
                                                         pk_quantized_table)
from perfkernels._arrays cimport as_input, finish_out, kernel_table_getter, register_family
from perfkernels._bags cimport (BAGS_SCRATCH, prepare_bags, bags_out_for_kernel, bags_output,
                                call_bags)
from perfkernels._parallel cimport resolve_threads, run_ranges, ranges_threads, ranges_chunks

cnp.import_array()

cdef const pk_quantized_kernels *_kernels = NULL


register_family("quantized-table", <kernel_table_getter>pk_quantized_table, <const void **>&_kernels)


def _kernel_table(int level):
    """This level's kernel table (``const pk_quantized_kernels *``) as a PyCapsule, for the
    multi-table lookup (perfkernels.families.multi._multi), which has no kernels of its own."""
    return PyCapsule_New(<void *>pk_quantized_table(level), b"perfkernels.quantized_kernels", NULL)

cdef tuple WEIGHT_TYPES = (cnp.NPY_FLOAT32, cnp.NPY_FLOAT16)
cdef tuple PACKED_TYPES = (cnp.NPY_UINT8,)


# The rules and messages are layout.py's (shared with the CUDA and torch frontends); the common
# valid calls are answered here in C, without a Python call, and every other goes to layout.py.

cdef int _check_bits(object bits) except -1:
    if type(bits) is int and (bits == 8 or bits == 4 or bits == 2):
        return <int>bits
    return <int>layout.check_bits(bits)


cdef Py_ssize_t _packed_dim(Py_ssize_t width, int bits, object dim) except -1:
    """The embedding dimension of packed rows `width` bytes wide (validated against `dim=`)."""
    cdef Py_ssize_t trailer = <Py_ssize_t>pk_quantized_row_bytes(bits, 0)
    cdef Py_ssize_t per = 8 // bits
    # (width - trailer) * per must not overflow: a wider row goes to layout.packed_dim's error
    if dim is None and trailer < width and width - trailer <= PY_SSIZE_T_MAX // per:
        return (width - trailer) * per
    if (type(dim) is int and 1 <= dim <= PY_SSIZE_T_MAX // 8
            and <Py_ssize_t>pk_quantized_row_bytes(bits, <size_t>dim) == width):
        return <Py_ssize_t>dim
    return <Py_ssize_t>layout.packed_dim(width, bits, dim)


cdef cnp.ndarray _as_packed(object packed):
    cdef cnp.ndarray p = as_input(packed, "packed", PACKED_TYPES, "uint8")
    if p.ndim != 2:
        raise ValueError(f"packed must be 2-D (rows x row bytes); got {p.ndim}-D with shape {(<object>p).shape}")
    return p


ctypedef struct _rows_job:
    const pk_quantized_kernels *k
    int bits
    int half
    const char *src
    char *dst
    size_t src_row_bytes
    size_t dst_row_bytes
    size_t dim
    pk_status *status    # quantize: per range
    size_t *bad_row


cdef void _quantize_range(void *vjob, int64_t lo, int64_t hi, int64_t chunk) noexcept nogil:
    cdef const _rows_job *j = <const _rows_job *>vjob
    cdef size_t bad = 0
    j.status[chunk] = j.k.quantize_rowwise(j.bits, j.half, j.src + <size_t>lo * j.src_row_bytes,
                                           <size_t>(hi - lo), j.dim,
                                           <uint8_t *>(j.dst + <size_t>lo * j.dst_row_bytes), &bad)
    j.bad_row[chunk] = <size_t>lo + bad


cdef void _dequantize_range(void *vjob, int64_t lo, int64_t hi, int64_t chunk) noexcept nogil:
    cdef const _rows_job *j = <const _rows_job *>vjob
    j.k.dequantize_rowwise(j.bits, <const uint8_t *>(j.src + <size_t>lo * j.src_row_bytes),
                           <size_t>(hi - lo), j.src_row_bytes, j.dim,
                           <float *>(j.dst + <size_t>lo * j.dst_row_bytes))


def _checked_packed(packed, bits, dim):
    """(packed array, bits, D) validated as embedding_bag_quantized does."""
    cdef int b = _check_bits(bits)
    cdef cnp.ndarray p = _as_packed(packed)
    return p, b, _packed_dim(p.shape[1], b, dim)


def quantize_rowwise(weight: TableArray, bits: int = 8, *,
                     num_threads: int | None = None) -> npt.NDArray[np.uint8]:
    """Quantize a table row by row to 8, 4 or 2 bits (caffe2/FBGEMM "fused rowwise" layout).

    Bit-exact with ``torch.ops.quantized.embedding_bag_byte_prepack`` (``bits=8``) and
    ``embedding_bag_4bit_prepack`` / ``embedding_bag_2bit_prepack`` (``bits=4``/``2``, default
    arguments).  Each packed row is

    * ``bits=8``: ``D`` uint8 codes, float32 scale, float32 bias (``D + 8`` bytes);
    * ``bits=4, 2``: ``ceil(D / (8 // bits))`` bytes of codes, low bits first (a partial last byte
      is padded with zero codes), float16 scale, float16 bias (``+ 4`` bytes).

    PyTorch requires ``D`` to be a multiple of ``8 // bits``; here any ``D >= 1`` is accepted
    (pass ``dim=D`` to :func:`dequantize_rowwise` / :func:`embedding_bag_quantized` when padded).

    Parameters
    ----------
    weight : array_like of float32 or float16, shape (rows, D)
    bits : {8, 4, 2}
    num_threads : int, optional
        Threads this call may use (default :func:`perfkernels.get_num_threads`); large tables
        are split in row ranges, each row quantized by one thread.

    Returns
    -------
    ndarray of uint8, shape (rows, row_bytes)

    Raises
    ------
    ValueError
        If a row holds NaN or inf (the message names the first such row), or for a bad shape or
        ``bits``.

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> w = np.array([[0.0, 1.0, 2.0, 3.0]], np.float32)
    >>> p = perfkernels.quantize_rowwise(w, bits=8)
    >>> p.shape, p[0, :4]
    ((1, 12), array([  0,  85, 170, 255], dtype=uint8))
    >>> perfkernels.dequantize_rowwise(p)
    array([[0., 1., 2., 3.]], dtype=float32)
    """
    cdef int nt = resolve_threads(num_threads)
    cdef int b = _check_bits(bits)
    cdef cnp.ndarray w = as_input(weight, "weight", WEIGHT_TYPES, "float32 or float16")
    if w.ndim != 2:
        raise ValueError(f"weight must be 2-D (rows x D); got {w.ndim}-D with shape {(<object>w).shape}")
    cdef size_t rows = <size_t>w.shape[0], dim = <size_t>w.shape[1]
    if dim == 0:
        raise ValueError(f"weight must have at least one column; got shape {(<object>w).shape}")
    cdef size_t row_bytes = pk_quantized_row_bytes(b, dim)
    cdef cnp.ndarray out = pool_new((rows, row_bytes), cnp.NPY_UINT8)
    cdef _rows_job j
    j.k = _kernels
    j.bits = b
    j.half = 1 if cnp.PyArray_TYPE(w) == cnp.NPY_FLOAT16 else 0
    j.src = <const char *>cnp.PyArray_DATA(w)
    j.dst = <char *>cnp.PyArray_DATA(out)
    j.src_row_bytes = dim * cnp.PyArray_ITEMSIZE(w)
    j.dst_row_bytes = row_bytes
    j.dim = dim
    cdef int threads = ranges_threads(rows * (j.src_row_bytes + row_bytes), nt)
    cdef int k = ranges_chunks(rows, threads, 1)
    # per range: its status and first bad row (ranges are in row order: the first failed range
    # has the first bad row of the table)
    cdef cnp.ndarray results = np.zeros(2 * k, dtype=np.int64)
    j.status = <pk_status *>cnp.PyArray_DATA(results)
    j.bad_row = <size_t *>(<int64_t *>cnp.PyArray_DATA(results) + k)
    with nogil:
        run_ranges(rows, threads, 1, _quantize_range, &j)
    cdef pk_status status = PK_OK
    cdef size_t bad_row = 0
    cdef int c
    for c in range(k):
        if j.status[c] != PK_OK:
            status = j.status[c]
            bad_row = j.bad_row[c]
            break
    if status == PK_ERR_NONFINITE:
        raise ValueError(f"weight row {bad_row} contains NaN or inf; row-wise quantization needs "
                         f"finite values")
    if status != PK_OK:
        raise RuntimeError(f"quantize_rowwise kernel failed with status {<int>status}")
    return out


def dequantize_rowwise(packed: npt.NDArray[np.uint8], bits: int = 8,
                       dim: int | None = None, *, num_threads: int | None = None) -> Float32Array:
    """Expand row-wise quantized rows back to float32: ``x = code * scale + bias``.

    Parameters
    ----------
    packed : array_like of uint8, shape (rows, row_bytes)
        Rows as produced by :func:`quantize_rowwise` (or PyTorch's prepack ops).
    bits : {8, 4, 2}
    dim : int, optional
        The embedding dimension D.  Needed for 4/2-bit rows whose D is not a multiple of
        ``8 // bits`` (otherwise D is ``(row_bytes - 4) * (8 // bits)``); checked against the
        row width when given.
    num_threads : int, optional
        Threads this call may use (default :func:`perfkernels.get_num_threads`).

    Returns
    -------
    ndarray of float32, shape (rows, D)

    Raises
    ------
    TypeError
        ``packed`` not uint8, or ``out`` not float32.
    ValueError
        ``bits`` not 8, 4 or 2; ``packed`` not 2-D or too narrow for its scale and bias; ``dim``
        that does not fit the row; ``out`` of the wrong shape; a bad ``num_threads``.

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> p = perfkernels.quantize_rowwise(np.array([[1.0, 2.0, 3.0]], np.float32), bits=4)
    >>> perfkernels.dequantize_rowwise(p, bits=4, dim=3)   # 16 levels of step 2/15, in float16
    array([[1.       , 2.0664062, 2.9995117]], dtype=float32)
    """
    cdef int nt = resolve_threads(num_threads)
    cdef int b = _check_bits(bits)
    cdef cnp.ndarray p = _as_packed(packed)
    cdef Py_ssize_t d = _packed_dim(p.shape[1], b, dim)
    cdef size_t rows = <size_t>p.shape[0], row_bytes = <size_t>p.shape[1]
    cdef cnp.ndarray out = pool_new((rows, d), cnp.NPY_FLOAT32)
    cdef _rows_job j
    j.k = _kernels
    j.bits = b
    j.src = <const char *>cnp.PyArray_DATA(p)
    j.dst = <char *>cnp.PyArray_DATA(out)
    j.src_row_bytes = row_bytes
    j.dst_row_bytes = <size_t>d * 4
    j.dim = <size_t>d
    cdef int threads = ranges_threads(rows * (row_bytes + j.dst_row_bytes), nt)
    with nogil:
        run_ranges(rows, threads, 1, _dequantize_range, &j)
    return out



def embedding_bag_quantized(packed: npt.NDArray[np.uint8], indices: IndexArray,
                            offsets: IndexArray | None = None, *, bits: int = 8,
                            dim: int | None = None, lengths: IndexArray | None = None,
                            per_sample_weights: npt.ArrayLike | None = None, mode: Mode = "sum",
                            include_last_offset: bool = False, padding_idx: int | None = None,
                            positional_weights: bool = False,
                            out: Float32Array | None = None,
                            num_threads: int | None = None) -> Float32Array:
    """Embedding bags over a row-wise quantized table, dequantising rows on the fly.

    ``out[b] = scale_b * sum(w_j * (q * scale + bias) of row indices[j], j in bag b)``, computed per
    row as ``acc += (w*scale) * q + (w*bias)`` with the bag's output row held in registers
    (FBGEMM's order); no dequantised copy of the table is made.  Same bag semantics, keywords and
    errors as :func:`embedding_bag`; matches ``torch.ops.quantized.embedding_bag_byte_rowwise_offsets``
    / ``embedding_bag_4bit_rowwise_offsets`` / ``embedding_bag_2bit_rowwise_offsets`` to float32
    rounding.

    Parameters
    ----------
    packed : array_like of uint8, shape (rows, row_bytes)
        Rows from :func:`quantize_rowwise` (or PyTorch's prepack ops) with ``bits`` bits per code.
    indices : array_like of int32 or int64
        1-D with ``offsets`` or ``lengths``, or 2-D ``[B, L]``: B bags of L indices each.
    offsets : array_like of int32 or int64, optional
        PyTorch convention (see :func:`embedding_bag`).
    bits : {8, 4, 2}
    dim : int, optional
        The embedding dimension D, needed for 4/2-bit rows whose D is not a multiple of
        ``8 // bits``; checked against the row width when given.
    lengths, per_sample_weights, mode, include_last_offset, padding_idx, positional_weights
        As in :func:`embedding_bag`.  ``mode="mean"`` multiplies by ``1 / count`` (caffe2's order;
        PyTorch divides), count excluding ``padding_idx`` entries; empty bags are zeros.
    out : ndarray of float32, shape (num_bags, D), optional
        Written in place and returned; left untouched if an error is raised.
    num_threads : int, optional
        Threads this call may use (default :func:`perfkernels.get_num_threads`); bags are split
        across threads, each summed by one thread, so the result does not depend on it.

    Returns
    -------
    ndarray of float32, shape (num_bags, D)

    Raises
    ------
    TypeError, ValueError
        As :func:`embedding_bag`; ValueError also for a row width that does not fit ``bits``/``dim``.
    IndexError
        An index that is negative or ``>= rows``, naming its position and value.

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> w = np.arange(12, dtype=np.float32).reshape(4, 3)
    >>> p = perfkernels.quantize_rowwise(w, bits=8)
    >>> perfkernels.embedding_bag_quantized(p, np.array([0, 2, 3]), np.array([0, 2]))
    ...                       # each row in 256 levels of step (max - min) / 255: 1.0039 for 1
    array([[ 6.       ,  8.007843 , 10.       ],
           [ 9.       , 10.0039215, 11.       ]], dtype=float32)
    """
    cdef int nt = resolve_threads(num_threads)
    cdef int b = _check_bits(bits)
    cdef cnp.ndarray p = _as_packed(packed)
    cdef int64_t d = _packed_dim(p.shape[1], b, dim)
    cdef int64_t rows = p.shape[0], row_bytes = p.shape[1]
    cdef pk_bags bags
    cdef int64_t scratch[BAGS_SCRATCH]
    cdef object keep = prepare_bags(&bags, indices, offsets, lengths, per_sample_weights, mode,
                                    include_last_offset, padding_idx, positional_weights, rows,
                                    scratch, BAGS_SCRATCH)
    cdef cnp.ndarray dst = bags_output(
        &bags, out, None if out is None else bags_out_for_kernel(out, bags.num_bags, d, p, keep),
        d)
    cdef pk_table_bags_args args = pk_table_bags_packed(_kernels.embedding_bag_quantized, b,
                                                        cnp.PyArray_DATA(p), rows, row_bytes, d)
    call_bags(&bags, dst is out, pk_table_bags_call, &args, rows, row_bytes, d, nt,
              "embedding_bag_quantized")
    return finish_out(out, dst)
