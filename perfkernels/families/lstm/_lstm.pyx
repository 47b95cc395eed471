"""The LSTM unit, forward and backward (caffe2 LSTMUnit / LSTMUnitGradient)."""
from libc.stdint cimport int32_t, int64_t
import numpy as np

from perfkernels.families.lstm import checks

cdef object _T_MAX = checks.T_MAX
cimport numpy as cnp
from perfkernels._memory cimport pool_new

from perfkernels._arrays cimport (as_input, check_out, finish_out, kernel_table_getter,
                                  register_family)
from perfkernels._parallel cimport resolve_threads, run_ranges, ranges_threads

cnp.import_array()

from perfkernels.families.lstm._c_lstm cimport (pk_lstm_params, pk_lstm_kernels, pk_lstm_table, PK_LSTM_IFOG,
                                  PK_LSTM_IFGO, PK_MATH_EXP, PK_MATH_SIGMOID, PK_MATH_TANH)

cdef const pk_lstm_kernels *_kernels = NULL

cdef tuple F32 = (cnp.NPY_FLOAT32,)
# Every signed integer type of 4 or 8 bytes: int64 is NPY_LONG or NPY_LONGLONG depending on the
# platform and on how the array was made, and both print as "int64".
cdef tuple INTS = (cnp.NPY_INT, cnp.NPY_LONG, cnp.NPY_LONGLONG, cnp.NPY_INT32, cnp.NPY_INT64)
cdef dict GATE_ORDERS = {"ifog": PK_LSTM_IFOG, "ifgo": PK_LSTM_IFGO}
_MATH = {"exp": PK_MATH_EXP, "sigmoid": PK_MATH_SIGMOID, "tanh": PK_MATH_TANH}


register_family("LSTM", <kernel_table_getter>pk_lstm_table, <const void **>&_kernels)


cdef inline float *_f32(cnp.ndarray a):
    return <float *>cnp.PyArray_DATA(a)


cdef cnp.ndarray _state(object x, str name, object shape):
    """A float32 [N, D] input; `shape` None means this one defines N and D."""
    cdef cnp.ndarray a = as_input(x, name, F32, "float32")
    if shape is None and a.ndim == 2 or shape is not None and (<object>a).shape == shape:
        return a  # the common valid case, without a Python call
    checks.state_shape(name, (<object>a).shape, shape)  # raises, with the shared message
    return a


cdef object _params(pk_lstm_params *p, Py_ssize_t n, Py_ssize_t d, object seq_lengths, object t,
                    object forget_bias, object drop_states, object gate_order):
    """Validate the keywords shared by forward and backward and fill `p`; returns the array that
    must stay alive while the kernel reads seq_lengths (or None)."""
    cdef cnp.ndarray lens = None
    if (type(t) is int and 0 <= t <= _T_MAX and type(forget_bias) is float
            and type(gate_order) is str and (gate_order == "ifog" or gate_order == "ifgo")):
        t_, fb = t, forget_bias  # the common valid case, without a Python call
    else:
        t_, fb = checks.keywords(t, forget_bias, gate_order)  # the shared rules and messages
    p.n = <size_t>n
    p.d = <size_t>d
    p.seq_lengths32 = NULL
    p.seq_lengths64 = NULL
    p.t = t_
    p.forget_bias = <float>fb
    p.drop_states = 1 if drop_states else 0
    p.gate_order = GATE_ORDERS[gate_order]
    if seq_lengths is not None:
        lens = as_input(seq_lengths, "seq_lengths", INTS, "int32 or int64")
        checks.seq_lengths_shape((<object>lens).shape, n)
        if cnp.PyArray_ITEMSIZE(lens) == 4:
            p.seq_lengths32 = <const int32_t *>cnp.PyArray_DATA(lens)
        else:
            p.seq_lengths64 = <const int64_t *>cnp.PyArray_DATA(lens)
    return lens


cdef tuple _outputs(object out, tuple names, tuple shapes, tuple inputs):
    """(caller's arrays or None, arrays the kernel writes), all validated before any kernel runs."""
    cdef Py_ssize_t k, j
    cdef list given = [None] * len(names)
    cdef list dst = []
    if out is not None:
        if not isinstance(out, tuple) or len(out) != len(names):
            raise TypeError(f"out must be a tuple of {len(names)} arrays or None "
                            f"({', '.join(names)}); got {type(out).__name__}"
                            + (f" of length {len(out)}" if isinstance(out, tuple) else ""))
        given = list(out)
    for k in range(len(names)):
        if given[k] is None:
            dst.append(pool_new(shapes[k], cnp.NPY_FLOAT32))
            continue
        for j in range(k):
            if given[j] is not None and np.may_share_memory(given[j], given[k]):
                raise ValueError(f"out arrays {names[j]} and {names[k]} overlap")
        try:
            dst.append(check_out(given[k], cnp.NPY_FLOAT32, "float32", shapes[k], inputs))
        except (TypeError, ValueError) as exc:
            raise type(exc)(str(exc).replace("out ", f"out[{k}] ({names[k]}) ", 1)) from None
    return given, dst


ctypedef struct _job:
    const pk_lstm_kernels *k
    pk_lstm_params p
    const float *a[5]    # inputs: forward h_prev, c_prev, gates; backward c_prev, gates, c, dh, dc
    float *o[3]          # outputs: forward h, c; backward dh_prev, dc_prev, dgates
    int backward


cdef void _lstm_range(void *vjob, int64_t lo, int64_t hi, int64_t chunk) noexcept nogil:
    """Rows [lo, hi) of one call: the same kernel on a view of the rows (rows are independent)."""
    cdef const _job *j = <const _job *>vjob
    cdef pk_lstm_params p = j.p
    cdef size_t d = p.d, r = <size_t>lo
    p.n = <size_t>(hi - lo)
    if p.seq_lengths32 != NULL:
        p.seq_lengths32 = p.seq_lengths32 + r
    if p.seq_lengths64 != NULL:
        p.seq_lengths64 = p.seq_lengths64 + r
    if j.backward:
        j.k.lstm_backward(&p, j.a[0] + r * d, j.a[1] + r * 4 * d, j.a[2] + r * d, j.a[3] + r * d,
                     j.a[4] + r * d, j.o[0] + r * d, j.o[1] + r * d, j.o[2] + r * 4 * d)
    else:
        j.k.lstm_forward(&p, j.a[0] + r * d, j.a[1] + r * d, j.a[2] + r * 4 * d,
                    j.o[0] + r * d, j.o[1] + r * d)


cdef void _run(_job *j, int nt) noexcept nogil:
    # bytes per row: forward reads 6d floats and writes 2d, backward reads 8d and writes 6d
    cdef int64_t n = <int64_t>j.p.n
    cdef int64_t row_bytes = <int64_t>j.p.d * 4 * (14 if j.backward else 8)
    run_ranges(n, ranges_threads(n * row_bytes, nt), 1, _lstm_range, j)


def lstm_unit(h_prev: Float32Array, c_prev: Float32Array, gates: Float32Array, *,
              seq_lengths: IndexArray | None = None, t: int = 0, forget_bias: float = 0.0,
              drop_states: bool = False, gate_order: GateOrder = "ifog",
              out: tuple[Float32Array | None, Float32Array | None] | None = None,
              num_threads: int | None = None) -> tuple[Float32Array, Float32Array]:
    """One LSTM step's pointwise part (caffe2 ``LSTMUnit``), in one pass over memory.

    For each valid row ``n`` (``seq_lengths is None or t < seq_lengths[n]``)::

        i = sigmoid(X_i); f = sigmoid(X_f + forget_bias); o = sigmoid(X_o); g = tanh(X_g)
        c = f * c_prev + i * g;  h = o * tanh(c)

    Invalid rows get ``(h, c) = (0, 0)`` with ``drop_states`` and ``(h_prev, c_prev)`` otherwise.
    sigmoid and tanh are perfkernels' own (vectorised on AVX2 and AVX-512, the same algorithm in
    portable C on the scalar level): maximum relative error against float64 1.5e-7 (sigmoid) and
    1.6e-7 (tanh, relative accuracy kept near 0), exact saturation to 0, 1 and +-1, no NaN for
    finite or infinite input.  Results of different ISA levels may differ in the last bits.

    Parameters
    ----------
    h_prev, c_prev : array_like of float32, shape (N, D)
    gates : array_like of float32, shape (N, 4 * D)
        Pre-activation gates, blocks of D in ``gate_order``.
    seq_lengths : array_like of int32 or int64, shape (N,), optional
    t : int >= 0
        The time step; row n is valid when ``t < seq_lengths[n]``.
    forget_bias : float
        Added to the forget gate's pre-activation.
    drop_states : bool
        Invalid rows give zeros instead of carrying ``h_prev, c_prev`` through.
    gate_order : {"ifog", "ifgo"}
        ``"ifog"``: caffe2 (input, forget, output, cell candidate); ``"ifgo"``: PyTorch
        ``LSTMCell`` (input, forget, cell candidate, output).
    out : tuple (h, c) of float32 ndarrays of shape (N, D) or None, optional
        As NumPy ufuncs' ``out=``: written in place and returned; an element may be None to allocate
        that output.  Left untouched if an error is raised.
    num_threads : int, optional
        Threads this call may use (default :func:`perfkernels.get_num_threads`); large calls are
        split in row ranges, each row computed by one thread.

    Returns
    -------
    h, c : ndarray of float32, shape (N, D)

    Raises
    ------
    TypeError
        An input or ``out`` array not float32 (``seq_lengths``: not an integer array).
    ValueError
        Shapes that disagree (``gates`` not ``[N, 4D]``), an unknown ``gate_order``, a bad
        ``out`` tuple or ``num_threads``; nothing is written then.

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> h, c = perfkernels.lstm_unit(np.zeros((1, 2), np.float32), np.ones((1, 2), np.float32),
    ...                              np.zeros((1, 8), np.float32))
    >>> c  # sigmoid(0) * 1 + sigmoid(0) * tanh(0)
    array([[0.5, 0.5]], dtype=float32)
    """
    cdef cnp.ndarray hp = _state(h_prev, "h_prev", None)
    cdef tuple shape = (<object>hp).shape
    cdef Py_ssize_t n = shape[0], d = shape[1]
    cdef cnp.ndarray cp = _state(c_prev, "c_prev", shape)
    cdef cnp.ndarray gx = _state(gates, "gates", (n, 4 * d))
    cdef int nt = resolve_threads(num_threads)
    cdef _job j
    keep = _params(&j.p, n, d, seq_lengths, t, forget_bias, drop_states, gate_order)
    given, dst = _outputs(out, ("h", "c"), (shape, shape), (hp, cp, gx))
    cdef cnp.ndarray h = dst[0], c = dst[1]
    j.k = _kernels
    j.backward = 0
    j.a[0] = _f32(hp)
    j.a[1] = _f32(cp)
    j.a[2] = _f32(gx)
    j.o[0] = _f32(h)
    j.o[1] = _f32(c)
    with nogil:
        _run(&j, nt)
    return finish_out(given[0], h), finish_out(given[1], c)


def lstm_unit_backward(c_prev: Float32Array, gates: Float32Array, c: Float32Array,
                       dh: Float32Array, dc: Float32Array, *,
                       seq_lengths: IndexArray | None = None, t: int = 0,
                       forget_bias: float = 0.0, drop_states: bool = False,
                       gate_order: GateOrder = "ifog",
                       out: tuple[Float32Array | None, Float32Array | None,
                                  Float32Array | None] | None = None,
                       num_threads: int | None = None
                       ) -> tuple[Float32Array, Float32Array, Float32Array]:
    """Gradient of :func:`lstm_unit` (caffe2 ``LSTMUnitGradient``), in one pass over memory.

    Given the forward inputs ``c_prev, gates``, its output ``c`` and the gradients ``dh, dc`` of
    its outputs, for each valid row::

        tc = tanh(c); dct = dc + dh * o * (1 - tc^2)
        dc_prev = dct * f;  dh_prev = 0
        di = dct * g * i(1-i); df = dct * c_prev * f(1-f); do = dh * tc * o(1-o); dg = dct * i * (1-g^2)

    ``dh_prev`` is zero for valid rows (caffe2's convention: h_prev's gradient flows through the
    fully connected layer that made ``gates``).  Invalid rows: ``dgates = 0`` and
    ``(dh_prev, dc_prev) = (0, 0)`` with ``drop_states``, ``(dh, dc)`` otherwise.

    Parameters
    ----------
    c_prev : array_like of float32, shape (N, D)
    gates : array_like of float32, shape (N, 4 * D)
    c : array_like of float32, shape (N, D)
        The ``c`` that :func:`lstm_unit` returned for these inputs.
    dh, dc : array_like of float32, shape (N, D)
    seq_lengths, t, forget_bias, drop_states, gate_order
        As in :func:`lstm_unit` (use the same values as the forward call).
    out : tuple (dh_prev, dc_prev, dgates) of float32 ndarrays or None, optional
        Shapes (N, D), (N, D), (N, 4 * D); an element may be None.  Left untouched on error.
    num_threads : int, optional
        As in :func:`lstm_unit`.

    Returns
    -------
    dh_prev, dc_prev : ndarray of float32, shape (N, D)
    dgates : ndarray of float32, shape (N, 4 * D), in ``gate_order``

    Raises
    ------
    TypeError
        An input or ``out`` array not float32 (``seq_lengths``: not an integer array).
    ValueError
        Shapes that disagree (``gates`` not ``[N, 4D]``, ``c``, ``dh``, ``dc`` not ``[N, D]``), an
        unknown ``gate_order``, a bad ``out`` tuple or ``num_threads``; nothing is written then.

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> x = np.zeros((1, 4), np.float32); one = np.ones((1, 1), np.float32)
    >>> h, c = perfkernels.lstm_unit(one, one, x)
    >>> dh_prev, dc_prev, dgates = perfkernels.lstm_unit_backward(one, x, c, one, one)
    >>> dc_prev  # (1 + 0.5 * (1 - tanh(0.5)^2)) * 0.5
    array([[0.6966...]], dtype=float32)
    """
    cdef cnp.ndarray cp = _state(c_prev, "c_prev", None)
    cdef tuple shape = (<object>cp).shape
    cdef Py_ssize_t n = shape[0], d = shape[1]
    cdef tuple gshape = (n, 4 * d)
    cdef cnp.ndarray gx = _state(gates, "gates", gshape)
    cdef cnp.ndarray cc = _state(c, "c", shape)
    cdef cnp.ndarray gh = _state(dh, "dh", shape)
    cdef cnp.ndarray gc = _state(dc, "dc", shape)
    cdef int nt = resolve_threads(num_threads)
    cdef _job j
    keep = _params(&j.p, n, d, seq_lengths, t, forget_bias, drop_states, gate_order)
    given, dst = _outputs(out, ("dh_prev", "dc_prev", "dgates"), (shape, shape, gshape),
                          (cp, gx, cc, gh, gc))
    cdef cnp.ndarray dhp = dst[0], dcp = dst[1], dgx = dst[2]
    j.k = _kernels
    j.backward = 1
    j.a[0] = _f32(cp)
    j.a[1] = _f32(gx)
    j.a[2] = _f32(cc)
    j.a[3] = _f32(gh)
    j.a[4] = _f32(gc)
    j.o[0] = _f32(dhp)
    j.o[1] = _f32(dcp)
    j.o[2] = _f32(dgx)
    with nogil:
        _run(&j, nt)
    return (finish_out(given[0], dhp), finish_out(given[1], dcp), finish_out(given[2], dgx))


def _math(str fn, x):
    """The elementwise exp / sigmoid / tanh of the active level on a float32 array (for tests)."""
    cdef cnp.ndarray src = as_input(x, "x", F32, "float32")
    cdef cnp.ndarray dst = pool_new((<object>src).shape, cnp.NPY_FLOAT32)
    cdef int code = _MATH[fn]
    cdef const float *s = _f32(src)
    cdef float *o = _f32(dst)
    cdef size_t n = <size_t>cnp.PyArray_SIZE(src)
    cdef const pk_lstm_kernels *k = _kernels
    with nogil:
        k.lstm_math(code, s, o, n)
    return dst
