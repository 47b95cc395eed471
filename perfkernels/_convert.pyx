"""float32 <-> float16 and float32 <-> bfloat16 conversion."""
include "_arrays.pxi"

from libc.stdint cimport uint16_t
import ml_dtypes

from perfkernels._c_convert cimport pk_convert_kernels, pk_convert_table

cdef const pk_convert_kernels *_kernels = NULL

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
cdef int BF16_NUM = BFLOAT16.num
cdef tuple F32 = (cnp.NPY_FLOAT32,)
cdef tuple F16 = (cnp.NPY_FLOAT16,)
cdef tuple BF16 = (BF16_NUM,)


register_family("conversion", <kernel_table_getter>pk_convert_table, <const void **>&_kernels)


cdef tuple _prepare(object x, object out, str xname, tuple in_types, str in_name,
                    object out_dtype, int out_num):
    cdef cnp.ndarray src = as_input(x, xname, in_types, in_name)
    cdef tuple shape = (<object>src).shape
    cdef cnp.ndarray dst
    if out is None:
        dst = np.empty(shape, dtype=out_dtype)
    else:
        dst = check_out(out, out_num, str(np.dtype(out_dtype)), shape, (src,))
    return src, dst


def float_to_half(x, out=None, *, clip=False):
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

    Returns
    -------
    ndarray of float16, x's shape

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> perfkernels.float_to_half(np.array([1.0, 70000.0], np.float32), clip=True)
    array([    1., 65504.], dtype=float16)
    """
    cdef cnp.ndarray src, dst
    src, dst = _prepare(x, out, "x", F32, "float32", np.float16, cnp.NPY_FLOAT16)
    cdef const float *s = <const float *>cnp.PyArray_DATA(src)
    cdef uint16_t *d = <uint16_t *>cnp.PyArray_DATA(dst)
    cdef size_t n = <size_t>cnp.PyArray_SIZE(src)
    cdef int c = 1 if clip else 0
    cdef const pk_convert_kernels *k = _kernels
    with nogil:
        k.float_to_half(s, d, n, c)
    return finish_out(out, dst)


def half_to_float(h, out=None):
    """Convert float16 to float32, exactly (subnormals, infinities and NaN payloads included).

    Parameters
    ----------
    h : array_like of float16, any shape
    out : ndarray of float32 with h's shape, optional

    Returns
    -------
    ndarray of float32, h's shape

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> perfkernels.half_to_float(np.array([0.5, np.inf], np.float16))
    array([0.5, inf], dtype=float32)
    """
    cdef cnp.ndarray src, dst
    src, dst = _prepare(h, out, "h", F16, "float16", np.float32, cnp.NPY_FLOAT32)
    cdef const uint16_t *s = <const uint16_t *>cnp.PyArray_DATA(src)
    cdef float *d = <float *>cnp.PyArray_DATA(dst)
    cdef size_t n = <size_t>cnp.PyArray_SIZE(src)
    cdef const pk_convert_kernels *k = _kernels
    with nogil:
        k.half_to_float(s, d, n)
    return finish_out(out, dst)


def float_to_bfloat16(x, out=None):
    """Convert float32 to bfloat16 (``ml_dtypes.bfloat16``), rounding to nearest even.

    Bit-exact with ``x.astype(ml_dtypes.bfloat16)``: NaN becomes the quiet NaN with x's sign,
    values past the largest bfloat16 round to +-inf.

    Parameters
    ----------
    x : array_like of float32, any shape
    out : ndarray of ml_dtypes.bfloat16 with x's shape, optional

    Returns
    -------
    ndarray of ml_dtypes.bfloat16, x's shape

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> perfkernels.float_to_bfloat16(np.array([1.0, 3.0], np.float32)).astype(np.float32)
    array([1., 3.], dtype=float32)
    """
    cdef cnp.ndarray src, dst
    src, dst = _prepare(x, out, "x", F32, "float32", BFLOAT16, BF16_NUM)
    cdef const float *s = <const float *>cnp.PyArray_DATA(src)
    cdef uint16_t *d = <uint16_t *>cnp.PyArray_DATA(dst)
    cdef size_t n = <size_t>cnp.PyArray_SIZE(src)
    cdef const pk_convert_kernels *k = _kernels
    with nogil:
        k.float_to_bf16(s, d, n)
    return finish_out(out, dst)


def bfloat16_to_float(b, out=None):
    """Convert bfloat16 (``ml_dtypes.bfloat16``) to float32, exactly.

    Parameters
    ----------
    b : array_like of ml_dtypes.bfloat16, any shape
    out : ndarray of float32 with b's shape, optional

    Returns
    -------
    ndarray of float32, b's shape

    Examples
    --------
    >>> import numpy as np, ml_dtypes, perfkernels
    >>> perfkernels.bfloat16_to_float(np.array([1.5], ml_dtypes.bfloat16))
    array([1.5], dtype=float32)
    """
    cdef cnp.ndarray src, dst
    src, dst = _prepare(b, out, "b", BF16, "bfloat16 (ml_dtypes.bfloat16)", np.float32, cnp.NPY_FLOAT32)
    cdef const uint16_t *s = <const uint16_t *>cnp.PyArray_DATA(src)
    cdef float *d = <float *>cnp.PyArray_DATA(dst)
    cdef size_t n = <size_t>cnp.PyArray_SIZE(src)
    cdef const pk_convert_kernels *k = _kernels
    with nogil:
        k.bf16_to_float(s, d, n)
    return finish_out(out, dst)
