"""float32 <-> float16 and float32 <-> bfloat16 conversion."""
from libc.stdint cimport uint16_t, int64_t
import ml_dtypes
import numpy as np
cimport numpy as cnp
from perfkernels._memory cimport pool_new

from perfkernels._arrays cimport (as_input, check_out, finish_out, kernel_table_getter,
                                  register_family)
from perfkernels._parallel cimport resolve_threads, run_ranges, ranges_threads

cnp.import_array()

from perfkernels.families.convert._c_convert cimport pk_convert_kernels, pk_convert_table

cdef const pk_convert_kernels *_kernels = NULL

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
cdef int BF16_NUM = BFLOAT16.num
cdef tuple F32 = (cnp.NPY_FLOAT32,)
cdef tuple F16 = (cnp.NPY_FLOAT16,)
cdef tuple BF16 = (BF16_NUM,)


register_family("conversion", <kernel_table_getter>pk_convert_table, <const void **>&_kernels)


cdef enum:
    TO_HALF, TO_HALF_CLIP, FROM_HALF, TO_BF16, FROM_BF16
    ALIGN = 64   # elements per range boundary: whole cache lines of both arrays


ctypedef struct _job:
    const pk_convert_kernels *k
    int kind
    const char *src
    char *dst
    int src_size
    int dst_size


cdef void _convert_range(void *vjob, int64_t lo, int64_t hi, int64_t chunk) noexcept nogil:
    cdef const _job *j = <const _job *>vjob
    cdef const void *s = j.src + lo * j.src_size
    cdef void *d = j.dst + lo * j.dst_size
    cdef size_t n = <size_t>(hi - lo)
    if j.kind == TO_HALF or j.kind == TO_HALF_CLIP:
        j.k.float_to_half(<const float *>s, <uint16_t *>d, n, 1 if j.kind == TO_HALF_CLIP else 0)
    elif j.kind == FROM_HALF:
        j.k.half_to_float(<const uint16_t *>s, <float *>d, n)
    elif j.kind == TO_BF16:
        j.k.float_to_bf16(<const float *>s, <uint16_t *>d, n)
    else:
        j.k.bf16_to_float(<const uint16_t *>s, <float *>d, n)


cdef object _convert(int kind, cnp.ndarray src, cnp.ndarray dst, object num_threads):
    """Run one conversion over every element, split in element ranges on large arrays."""
    cdef int nt = resolve_threads(num_threads)
    cdef _job j
    j.k = _kernels
    j.kind = kind
    j.src = <const char *>cnp.PyArray_DATA(src)
    j.dst = <char *>cnp.PyArray_DATA(dst)
    j.src_size = cnp.PyArray_ITEMSIZE(src)
    j.dst_size = cnp.PyArray_ITEMSIZE(dst)
    cdef int64_t n = cnp.PyArray_SIZE(src)
    cdef int threads = ranges_threads(n * (j.src_size + j.dst_size), nt)
    with nogil:
        run_ranges(n, threads, ALIGN, _convert_range, &j)


cdef tuple _prepare(object x, object out, str xname, tuple in_types, str in_name,
                    object out_dtype, int out_num):
    cdef cnp.ndarray src = as_input(x, xname, in_types, in_name)
    cdef tuple shape = (<object>src).shape
    cdef cnp.ndarray dst
    if out is None:
        dst = pool_new(shape, out_num)
    else:
        dst = check_out(out, out_num, str(np.dtype(out_dtype)), shape, (src,))
    return src, dst


def float_to_half(x: npt.ArrayLike, out: npt.NDArray[np.float16] | None = None, *,
                  clip: bool = False, num_threads: int | None = None) -> npt.NDArray[np.float16]:
    """Convert float32 to float16, rounding to nearest even.

    Bit-exact with ``x.astype(np.float16)`` for every input: overflow goes to +-inf, subnormals are
    kept, NaN stays NaN with NumPy's payload.  ``clip=True`` saturates to +-65504 instead
    (infinities included), as FBGEMM's ``do_clip``.

    Parameters
    ----------
    x : array_like of float32, any shape
    out : ndarray of float16 with x's shape, optional
        Written in place and returned; left untouched if an error is raised.
    clip : bool
    num_threads : int, optional
        Threads this call may use (default :func:`perfkernels.get_num_threads`); large arrays are
        split in element ranges, small ones stay on the calling thread.

    Returns
    -------
    ndarray of float16, x's shape

    Raises
    ------
    TypeError
        ``x`` (or ``out``) of another dtype than float32 (float16 for ``out``).
    ValueError
        ``out`` of another shape than ``x``, or not writeable; a bad ``num_threads``.

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> perfkernels.float_to_half(np.array([1.0, 70000.0], np.float32), clip=True).tolist()
    [1.0, 65504.0]
    """
    cdef cnp.ndarray src, dst
    src, dst = _prepare(x, out, "x", F32, "float32", np.float16, cnp.NPY_FLOAT16)
    _convert(TO_HALF_CLIP if clip else TO_HALF, src, dst, num_threads)
    return finish_out(out, dst)


def half_to_float(h: npt.ArrayLike, out: npt.NDArray[np.float32] | None = None, *,
                  num_threads: int | None = None) -> npt.NDArray[np.float32]:
    """Convert float16 to float32, exactly (subnormals, infinities and NaN payloads included).

    Parameters
    ----------
    h : array_like of float16, any shape
    out : ndarray of float32 with h's shape, optional
    num_threads : int, optional
        As in :func:`float_to_half`.

    Returns
    -------
    ndarray of float32, h's shape

    Raises
    ------
    TypeError
        ``h`` not float16, or ``out`` not float32.
    ValueError
        ``out`` of another shape than ``h``, or not writeable; a bad ``num_threads``.

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> perfkernels.half_to_float(np.array([0.5, np.inf], np.float16))
    array([0.5, inf], dtype=float32)
    """
    cdef cnp.ndarray src, dst
    src, dst = _prepare(h, out, "h", F16, "float16", np.float32, cnp.NPY_FLOAT32)
    _convert(FROM_HALF, src, dst, num_threads)
    return finish_out(out, dst)


def float_to_bfloat16(x: npt.ArrayLike, out: npt.NDArray[np.generic] | None = None, *,
                      num_threads: int | None = None) -> npt.NDArray[np.generic]:
    """Convert float32 to bfloat16 (``ml_dtypes.bfloat16``), rounding to nearest even.

    Bit-exact with ``x.astype(ml_dtypes.bfloat16)``: NaN becomes the quiet NaN with x's sign,
    values past the largest bfloat16 round to +-inf.

    Parameters
    ----------
    x : array_like of float32, any shape
    out : ndarray of ml_dtypes.bfloat16 with x's shape, optional
    num_threads : int, optional
        As in :func:`float_to_half`.

    Returns
    -------
    ndarray of ml_dtypes.bfloat16, x's shape

    Raises
    ------
    TypeError
        ``x`` not float32, or ``out`` not ``ml_dtypes.bfloat16``.
    ValueError
        ``out`` of another shape than ``x``, or not writeable; a bad ``num_threads``.

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> perfkernels.float_to_bfloat16(np.array([1.0, 3.0], np.float32)).astype(np.float32)
    array([1., 3.], dtype=float32)
    """
    cdef cnp.ndarray src, dst
    src, dst = _prepare(x, out, "x", F32, "float32", BFLOAT16, BF16_NUM)
    _convert(TO_BF16, src, dst, num_threads)
    return finish_out(out, dst)


def bfloat16_to_float(b: npt.ArrayLike, out: npt.NDArray[np.float32] | None = None, *,
                      num_threads: int | None = None) -> npt.NDArray[np.float32]:
    """Convert bfloat16 (``ml_dtypes.bfloat16``) to float32, exactly.

    Parameters
    ----------
    b : array_like of ml_dtypes.bfloat16, any shape
    out : ndarray of float32 with b's shape, optional
    num_threads : int, optional
        As in :func:`float_to_half`.

    Returns
    -------
    ndarray of float32, b's shape

    Raises
    ------
    TypeError
        ``b`` not ``ml_dtypes.bfloat16``, or ``out`` not float32.
    ValueError
        ``out`` of another shape than ``b``, or not writeable; a bad ``num_threads``.

    Examples
    --------
    >>> import numpy as np, ml_dtypes, perfkernels
    >>> perfkernels.bfloat16_to_float(np.array([1.5], ml_dtypes.bfloat16))
    array([1.5], dtype=float32)
    """
    cdef cnp.ndarray src, dst
    src, dst = _prepare(b, out, "b", BF16, "bfloat16 (ml_dtypes.bfloat16)", np.float32, cnp.NPY_FLOAT32)
    _convert(FROM_BF16, src, dst, num_threads)
    return finish_out(out, dst)
