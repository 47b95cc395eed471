"""Fused embedding-bag backward + sparse optimizer step (training)."""
from libc.float cimport FLT_MAX
from libc.stdint cimport int64_t

import math
import operator
import os
import threading

import ml_dtypes
import numpy as np
cimport numpy as cnp

from perfkernels._c_common cimport pk_status
from perfkernels._c_bags cimport pk_bags
from perfkernels.families.training._c_training cimport (
    pk_sparse_optim, PK_OPT_SGD, PK_OPT_ADAGRAD, PK_OPT_ROWWISE_ADAGRAD, PK_OPT_ADAM,
    PK_OPT_ROWWISE_ADAM, PK_OPT_ADAMW, PK_OPT_MOMENTUM, pk_training_kernels, pk_training_table,
    pk_training_fits, pk_training_call, pk_training_plan, pk_training_plan_call, pk_training_run,
    pk_sparse_optim_adam)
from perfkernels._arrays cimport as_float32
from perfkernels._bags cimport BAGS_SCRATCH, prepare_bags, check_bags_status
from perfkernels._parallel cimport pool, resolve_threads

from perfkernels import _dispatch

cnp.import_array()

cdef const pk_training_kernels *_kernels = NULL

cdef int BF16_NUM = np.dtype(ml_dtypes.bfloat16).num
cdef str _TABLE_ACCEPTED = "float32, float16 or bfloat16 (ml_dtypes.bfloat16)"
cdef dict _OPTIMIZERS = {"sgd": PK_OPT_SGD, "adagrad": PK_OPT_ADAGRAD,
                         "rowwise_adagrad": PK_OPT_ROWWISE_ADAGRAD, "adam": PK_OPT_ADAM,
                         "rowwise_adam": PK_OPT_ROWWISE_ADAM, "adamw": PK_OPT_ADAMW}
#: the optimizers that keep a step count and two moments
ADAM_FAMILY = ("adam", "rowwise_adam", "adamw")


def _set_isa(int level):
    global _kernels
    cdef const pk_training_kernels *table = pk_training_table(level)
    if table == NULL:
        raise RuntimeError(f"training kernels for ISA level {level} are not in this build")
    _kernels = table


_dispatch.register(_set_isa)


cdef int _check_rows_apart(cnp.ndarray a, str name) except -1:
    """ValueError when rows of `a` (updated in place, row by row on several threads) share memory:
    a zero or short row stride (np.lib.stride_tricks.as_strided) would make several rows one,
    and their updates would race and be lost."""
    cdef cnp.npy_intp extent = cnp.PyArray_ITEMSIZE(a)
    if cnp.PyArray_NDIM(a) == 2:
        extent *= cnp.PyArray_DIM(a, 1)
    if cnp.PyArray_DIM(a, 0) > 1 and extent > 0 and cnp.PyArray_STRIDE(a, 0) < extent:
        raise ValueError(f"{name} overlaps itself: its rows are {cnp.PyArray_STRIDE(a, 0)} bytes "
                         f"apart but {extent} bytes long (strides {(<object>a).strides}); it is "
                         "updated in place, so every row needs its own memory")
    return 0


cdef cnp.ndarray _table_in_place(object weight):
    """weight as the 2-D float32/float16/bfloat16 array the kernel updates in place: it must be
    writeable, aligned and have unit stride along D (rows any multiple of the element size apart,
    at least a row's length: rows that share memory are refused).  Nothing is copied: a copy would not update the caller's table."""
    cdef cnp.ndarray a
    cdef int t
    cdef cnp.npy_intp itemsize, s0
    if not cnp.PyArray_Check(weight):
        raise TypeError(f"weight must be a numpy.ndarray of {_TABLE_ACCEPTED} (it is updated in "
                        f"place); got {type(weight).__name__}")
    a = <cnp.ndarray>weight
    t = cnp.PyArray_TYPE(a)
    if t != cnp.NPY_FLOAT32 and t != cnp.NPY_FLOAT16 and t != BF16_NUM:
        raise TypeError(f"weight must have dtype {_TABLE_ACCEPTED}; got {a.dtype}")
    if cnp.PyArray_NDIM(a) != 2:
        raise ValueError(f"weight must be 2-D [rows, D]; got shape {(<object>a).shape}")
    if not cnp.PyArray_ISWRITEABLE(a):
        raise ValueError("weight is read-only: it is updated in place")
    itemsize = cnp.PyArray_ITEMSIZE(a)
    s0 = cnp.PyArray_STRIDE(a, 0)
    # an empty table's strides are arbitrary (NumPy's copy of a [0, D] array has strides (0, 0)):
    # nothing is read or written through them
    if not (cnp.PyArray_ISALIGNED(a) and cnp.PyArray_ISNOTSWAPPED(a)
            and (cnp.PyArray_SIZE(a) == 0 or (
                (cnp.PyArray_STRIDE(a, 1) == itemsize or cnp.PyArray_DIM(a, 1) <= 1)
                and s0 >= 0 and s0 % itemsize == 0))):
        raise ValueError(f"weight must be aligned, native byte order, with unit stride along D "
                         f"(it is updated in place, so it cannot be copied); got strides "
                         f"{(<object>a).strides}, aligned={bool(cnp.PyArray_ISALIGNED(a))}")
    _check_rows_apart(a, "weight")
    return a


cdef cnp.ndarray _state_part(object state, str name, str optimizer, bint full, int64_t rows,
                            int64_t dim, cnp.ndarray table):
    """One optimizer state array, checked: float32 [rows, D] (full) or [rows], writeable,
    aligned, unit stride along D, its rows apart, not sharing memory with the table."""
    cdef cnp.ndarray s
    shape = (rows, dim) if full else (<object>rows,)
    what = "float32 [rows, D]" if full else "float32 [rows]"
    if not cnp.PyArray_Check(state):
        raise TypeError(f"{name} must be a numpy.ndarray ({what}, updated in place); got "
                        f"{type(state).__name__}")
    s = <cnp.ndarray>state
    if cnp.PyArray_TYPE(s) != cnp.NPY_FLOAT32:
        raise TypeError(f"{name} must have dtype float32; got {s.dtype}")
    if (<object>s).shape != shape:
        raise ValueError(f"{name} has shape {(<object>s).shape}; optimizer={optimizer!r} needs "
                         f"{shape} ({what})")
    if not cnp.PyArray_ISWRITEABLE(s):
        raise ValueError(f"{name} is read-only: it is updated in place")
    if not (cnp.PyArray_ISALIGNED(s) and cnp.PyArray_ISNOTSWAPPED(s)
            and (cnp.PyArray_SIZE(s) == 0 or (
                cnp.PyArray_STRIDE(s, 0) >= 0 and cnp.PyArray_STRIDE(s, 0) % 4 == 0
                and (not full or cnp.PyArray_STRIDE(s, 1) == 4 or dim <= 1)))):
        raise ValueError(f"{name} must be aligned, native byte order, with unit stride along D "
                         f"(it is updated in place); got strides {(<object>s).strides}")
    _check_rows_apart(s, name)
    if rows > 0 and dim > 0 and np.may_share_memory(s, table):
        raise ValueError(f"{name} shares memory with weight")
    return s


cdef cnp.ndarray _state_in_place(object state, str optimizer, int64_t rows, int64_t dim,
                                 cnp.ndarray table, bint momentum):
    """The optimizer state for `optimizer`, checked: None for sgd (without momentum); float32
    [rows, D] (adagrad, sgd with momentum) or [rows] (rowwise_adagrad)."""
    if optimizer == "sgd" and not momentum:
        if state is not None:
            raise ValueError("optimizer='sgd' keeps no state without momentum: state must be None")
        return None
    full = optimizer != "rowwise_adagrad"
    what = "float32 [rows, D]" if full else "float32 [rows]"
    if state is None:
        raise ValueError(f"optimizer={optimizer!r}{' with momentum' if momentum else ''} needs "
                         f"state, a {what} array (zeros to start)")
    return _state_part(state, "state", optimizer, full, rows, dim, table)


cdef tuple _adam_state(object state, str optimizer, int64_t rows, int64_t dim,
                       cnp.ndarray table):
    """(m, v) of the Adam family, checked: m float32 [rows, D]; v float32 [rows, D], or [rows]
    for rowwise_adam; m and v apart."""
    what = ("(m, v), float32 [rows, D] and [rows]" if optimizer == "rowwise_adam"
            else "(m, v), both float32 [rows, D]")
    if state is None:
        raise ValueError(f"optimizer={optimizer!r} needs state, a pair {what} (zeros to start)")
    if not isinstance(state, (tuple, list)) or len(state) != 2:
        raise TypeError(f"optimizer={optimizer!r} needs state, a pair {what}; got "
                        f"{type(state).__name__}")
    m = _state_part(state[0], "state[0] (m)", optimizer, True, rows, dim, table)
    v = _state_part(state[1], "state[1] (v)", optimizer, optimizer != "rowwise_adam", rows, dim,
                    table)
    if rows > 0 and dim > 0 and np.may_share_memory(m, v):
        raise ValueError("state[0] (m) and state[1] (v) share memory")
    return m, v


cdef double _beta(object value, str name) except? -1:
    """A beta of the Adam family: a real number in [0, 1)."""
    cdef double v
    if isinstance(value, (bool, np.bool_, str, bytes)) or not hasattr(type(value), "__float__"):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__}")
    try:
        v = float(value)
    except OverflowError:   # an int past double's range
        raise ValueError(f"{name} = {value} must be in [0, 1)") from None
    if not (0.0 <= v < 1.0):
        raise ValueError(f"{name} = {v} must be in [0, 1)")
    return v


cdef float _finite(object value, str name) except? -1:
    """A hyper-parameter as float32: a real number (not a bool or a string), finite, >= 0 and
    within float32's range, else TypeError / ValueError naming it."""
    cdef double v
    if isinstance(value, (bool, np.bool_, str, bytes)) or not hasattr(type(value), "__float__"):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__}")
    try:
        v = float(value)
    except OverflowError:   # an int past double's range (10**400)
        raise ValueError(f"{name} = {value} is too large for float32 (at most {FLT_MAX:.7g})") from None
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a real number; got {type(value).__name__}") from exc
    if not math.isfinite(v):
        raise ValueError(f"{name} = {v} must be finite")
    if v < 0:
        raise ValueError(f"{name} = {v} must be >= 0")
    if v > FLT_MAX:   # the kernels compute in float32: it would become inf there
        raise ValueError(f"{name} = {v} is too large for float32 (at most {FLT_MAX:.7g})")
    return <float>v


cdef int _adam_constants(pk_sparse_optim *opt, str optimizer, object lr, object weight_decay,
                         object step, object betas) except -1:
    """The Adam family's per-step constants (computed in float64, as torch does, then float32)."""
    cdef double b1, b2
    if step is None:
        raise ValueError(f"optimizer={optimizer!r} needs step, the table's step count including "
                         "this update (1 for the first)")
    if isinstance(step, (bool, np.bool_)):
        raise TypeError(f"step must be an integer; got {type(step).__name__}")
    try:
        step = operator.index(step)
    except TypeError as exc:
        raise TypeError(f"step must be an integer; got {type(step).__name__}") from exc
    if step < 1:
        raise ValueError(f"step = {step} must be >= 1 (the count including this update)")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise TypeError(f"betas must be a pair (beta1, beta2); got {betas!r}")
    b1 = _beta(betas[0], "betas[0]")
    b2 = _beta(betas[1], "betas[1]")
    if opt.eps <= 0:
        raise ValueError(f"eps = {opt.eps} must be > 0 for optimizer={optimizer!r}")
    pk_sparse_optim_adam(opt, float(lr), float(weight_decay), min(step, 2**62), b1, b2,
                         1 if optimizer == "adamw" else 0)
    return 0


def embedding_bag_backward_update(
    weight: TableArray, indices: IndexArray, offsets: IndexArray | None = None, *,
    grad_output: Float32Array,
    optimizer: Literal["sgd", "adagrad", "rowwise_adagrad", "adam", "rowwise_adam",
                       "adamw"] = "sgd",
    state: Float32Array | tuple[Float32Array, Float32Array] | None = None, lr: float,
    eps: float = 1e-8, weight_decay: float = 0.0, step: int | None = None,
    betas: tuple[float, float] = (0.9, 0.999), momentum: float = 0.0, nesterov: bool = False,
    lengths: IndexArray | None = None, per_sample_weights: npt.ArrayLike | None = None,
    mode: Mode = "sum", include_last_offset: bool = False, padding_idx: int | None = None,
    positional_weights: bool = False, num_threads: int | None = None,
    stochastic_rounding: bool = False, seed: int | None = None) -> None:
    """Backward of an embedding bag fused with a sparse optimizer step: update, in place, the rows
    of ``weight`` (and ``state``) that the bags touched.

    The bags are those of :func:`perfkernels.embedding_bag` with the same arguments; ``grad_output``
    is the gradient of the loss with respect to its output.  Row r's gradient is

        ``g[r] = sum over entries j with indices[j] == r of scale_b * w_j * grad_output[b]``

    (``b`` the bag of entry j, ``scale_b`` 1 for ``"sum"`` and ``1 / count_b`` for ``"mean"``,
    ``w_j`` the per-sample or positional weight, padding entries skipped), summed in float32 in
    index order.  Duplicates are summed first and every touched row is updated once (FBGEMM's
    "exact" optimizers; ``torch.optim`` on a coalesced sparse gradient does the same):

    - ``"sgd"``: ``w -= lr * (g + weight_decay * w)``
    - ``"adagrad"`` (element-wise moment, caffe2 SparseAdagrad, ``torch.optim.Adagrad``):
      ``g += weight_decay * w; h += g * g; w -= lr * g / (sqrt(h) + eps)``
    - ``"rowwise_adagrad"`` (one moment per row, caffe2 RowWiseSparseAdagrad, FBGEMM
      EXACT_ROWWISE_ADAGRAD): ``g += weight_decay * w; h += mean(g * g); w -= lr * g / (sqrt(h) + eps)``

    The Adam family and momentum update the touched rows only ("lazy", as
    ``torch.optim.SparseAdam``); ``step`` is the table's step count t including this update
    (1 for the first; the caller keeps it, one count per table, as SparseAdam's
    ``state["step"]``), ``b1, b2 = betas``:

    - ``"adam"`` (exactly ``torch.optim.SparseAdam``; ``weight_decay`` as ``torch.optim.Adam``'s
      L2 term ``g += weight_decay * w``): ``m += (1 - b1) (g - m); v += (1 - b2) (g * g - v);
      w -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)``
    - ``"adamw"``: decoupled weight decay on the touched rows, ``torch.optim.AdamW``'s order:
      ``w *= 1 - lr * weight_decay``, then ``"adam"``'s update without the L2 term
    - ``"rowwise_adam"`` (FBGEMM PARTIAL_ROWWISE_ADAM: ``m`` per element, ``v`` one value per row):
      ``m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) mean(g * g);
      w -= lr * (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * w)``
    - ``"sgd"`` with ``momentum > 0`` (``torch.optim.SGD``, dampening 0): ``g += weight_decay * w;
      b = momentum b + g; w -= lr * b`` (``nesterov``: ``w -= lr * (g + momentum b)``)

    Where caffe2 and FBGEMM differ we follow FBGEMM: ``lr`` is positive and subtracted (caffe2
    passes a negative rate and adds), and weight decay is FBGEMM's L2 mode, added to the gradient
    before the moment (caffe2's SparseAdagrad applies no decay; caffe2's row-wise form matches).
    Rows not in the batch, and their state, are untouched.  The arithmetic is float32 whatever
    the table type; float16 / bfloat16 rows are read as float32, updated and rounded back to
    nearest even (or stochastically, see ``stochastic_rounding``).

    The result is the same for any ``num_threads``: each row is summed and updated by one thread,
    its duplicates in index order.  Vector ISA levels use fused multiply-adds, so different ISA
    levels may differ in the last bits.

    Parameters
    ----------
    weight : ndarray [rows, D] of float32, float16 or ml_dtypes.bfloat16
        The table, updated in place: writeable, aligned, unit stride along D (a column slice of a
        wider table is fine).  Never copied.
    indices, offsets, lengths, per_sample_weights, mode, include_last_offset, padding_idx, positional_weights
        The bags, exactly as for :func:`perfkernels.embedding_bag`.
    grad_output : ndarray [num_bags, D] of float32
        The gradient of the loss with respect to the bags' output.
    optimizer : {"sgd", "adagrad", "rowwise_adagrad", "adam", "rowwise_adam", "adamw"}
    state : ndarray of float32, a pair of them, or None
        The optimizer state, updated in place: None for ``"sgd"`` (its momentum buffer
        ``[rows, D]`` with ``momentum > 0``), ``[rows, D]`` for ``"adagrad"``, ``[rows]`` for
        ``"rowwise_adagrad"`` (start from zeros, or ``initial_accumulator_value`` as torch does),
        ``(m, v)`` for the Adam family: ``m`` ``[rows, D]``, ``v`` ``[rows, D]`` (``[rows]`` for
        ``"rowwise_adam"``), zeros to start.
    lr : float
        Learning rate, finite and >= 0.
    step : int
        The Adam family: this update's step count t (>= 1), for the bias corrections.
    betas : (float, float)
        The Adam family: ``(b1, b2)``, each in [0, 1) (default torch's (0.9, 0.999)).
    momentum : float
        ``"sgd"`` only: the momentum, finite and >= 0 (0: plain sgd, no state).
    nesterov : bool
        ``"sgd"`` with ``momentum > 0`` only: Nesterov momentum.
    eps : float
        Added to ``sqrt(h)`` (adagrad variants), finite and >= 0 (> 0 for the Adam family).  torch.optim.Adagrad's default is
        1e-10, FBGEMM's 1e-8.
    weight_decay : float
        L2 penalty, finite and >= 0, applied to the touched rows only.
    num_threads : int, optional
        Threads for this call (default: ``perfkernels.get_num_threads()``).  The grouping sort and
        the row updates are split across the package's thread pool when the batch is large enough
        to pay for it; the thread count never changes the result.
    stochastic_rounding : bool
        16-bit tables: round each new value up or down with probability proportional to its
        distance from the two neighbouring 16-bit values (bfloat16: 16 random bits added below
        the kept ones, then truncation, as FBGEMM does), so small updates are not lost on average.
        Ignored for float32 tables.
    seed : int, optional
        Stochastic rounding's random bits are a hash of (seed, row, column); ``None`` draws a fresh
        seed per call.  Pass a different seed each step for unbiased rounding.

    Returns
    -------
    None

    Raises
    ------
    TypeError
        A dtype other than the ones above, or weight / state not an ndarray.
    ValueError
        Malformed bags (as for embedding_bag), grad_output of the wrong shape, state of the wrong
        shape for the optimizer, read-only or badly strided weight / state, an unknown optimizer,
        a non-finite or negative lr / eps / weight_decay (or one past float32's range, where the
        float32 arithmetic would make it inf), a bad num_threads.
    IndexError
        An index that is negative or ``>= rows``.  On any error nothing is written: every
        argument and every index is checked before the first row is updated.

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> weight = np.ones((4, 2), dtype=np.float32)
    >>> grad = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    >>> perfkernels.embedding_bag_backward_update(weight, np.array([0, 2, 2]), np.array([0, 1]),
    ...                                           grad_output=grad, optimizer="sgd", lr=0.5)
    >>> weight      # row 0: 1 - 0.5 * [1, 2]; row 2 (twice in bag 1): 1 - 0.5 * 2 * [3, 4]
    array([[ 0.5,  0. ],
           [ 1. ,  1. ],
           [-2. , -3. ],
           [ 1. ,  1. ]], dtype=float32)
    """
    cdef pk_bags bags
    cdef int64_t scratch_offsets[BAGS_SCRATCH]
    cdef pk_sparse_optim opt
    cdef pk_training_call call
    cdef pk_training_plan plan
    cdef int64_t bad = -1, n, threads
    cdef pk_status status
    cdef cnp.ndarray table = _table_in_place(weight)
    cdef int64_t rows = cnp.PyArray_DIM(table, 0)
    cdef int64_t dim = cnp.PyArray_DIM(table, 1)
    cdef int64_t row_stride = cnp.PyArray_STRIDE(table, 0) // cnp.PyArray_ITEMSIZE(table)
    cdef cnp.ndarray st, grad, space
    cdef int t = cnp.PyArray_TYPE(table)

    if optimizer not in _OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(map(repr, _OPTIMIZERS))}; "
                         f"got {optimizer!r}")
    opt.optimizer = _OPTIMIZERS[optimizer]
    opt.lr = _finite(lr, "lr")
    opt.eps = _finite(eps, "eps")
    opt.weight_decay = _finite(weight_decay, "weight_decay")
    opt.momentum = _finite(momentum, "momentum")
    opt.nesterov = 0
    opt.beta1 = opt.beta2 = opt.bias1 = opt.bias2 = opt.step_size = opt.decay = 0.0
    opt.state2 = NULL
    opt.state2_stride = 0
    if not isinstance(nesterov, (bool, np.bool_)):
        raise TypeError(f"nesterov must be a bool; got {type(nesterov).__name__}")
    if optimizer != "sgd" and (opt.momentum != 0 or nesterov):
        raise ValueError(f"momentum and nesterov are options of optimizer='sgd'; got "
                         f"momentum={momentum}, nesterov={nesterov} with optimizer={optimizer!r}")
    if nesterov and opt.momentum == 0:
        raise ValueError("nesterov=True needs momentum > 0")
    if optimizer == "sgd" and opt.momentum != 0:
        opt.optimizer = PK_OPT_MOMENTUM
        opt.nesterov = 1 if nesterov else 0
    if optimizer in ADAM_FAMILY:
        _adam_constants(&opt, optimizer, lr, weight_decay, step, betas)
        m, v = _adam_state(state, optimizer, rows, dim, table)
        st = m
        opt.state2 = <float *>cnp.PyArray_DATA(v)
        opt.state2_stride = cnp.PyArray_STRIDE(v, 0) // 4
    else:
        if step is not None:
            raise ValueError(f"step is an option of the Adam family; optimizer={optimizer!r} "
                             "keeps no step count")
        st = _state_in_place(state, optimizer, rows, dim, table, opt.momentum != 0)
        v = None
    opt.state = NULL if st is None else <float *>cnp.PyArray_DATA(st)
    opt.state_stride = 0 if st is None else cnp.PyArray_STRIDE(st, 0) // 4
    threads = resolve_threads(num_threads)
    opt.stochastic_rounding = 1 if (stochastic_rounding and t != cnp.NPY_FLOAT32) else 0
    if seed is None:
        opt.seed = int.from_bytes(os.urandom(8), "little") if opt.stochastic_rounding else 0
    else:
        try:
            opt.seed = operator.index(seed) & 0xFFFFFFFFFFFFFFFF
        except TypeError as exc:
            raise TypeError(f"seed must be an integer or None; got {type(seed).__name__}") from exc

    keep = prepare_bags(&bags, indices, offsets, lengths, per_sample_weights, mode,
                        include_last_offset, padding_idx, positional_weights, rows,
                        scratch_offsets, BAGS_SCRATCH)
    grad = as_float32(grad_output, "grad_output")
    if (<object>grad).shape != (bags.num_bags, dim):
        raise ValueError(f"grad_output has shape {(<object>grad).shape}; expected "
                         f"{(bags.num_bags, dim)} ([num_bags, D])")
    if grad is grad_output and bags.num_bags > 0 and dim > 0 and (
            np.may_share_memory(grad, table) or (st is not None and np.may_share_memory(grad, st))
            or (v is not None and np.may_share_memory(grad, v))):
        grad = grad.copy()   # it is read while rows are written
    n = bags.n_indices
    if not pk_training_fits(rows, n, bags.num_bags):
        raise ValueError(f"{n} indices into a table of {rows} rows: the row and entry numbers "
                         "need more than 64 bits together")

    call.bags = &bags
    call.rows = rows
    call.grad = <const float *>cnp.PyArray_DATA(grad)
    call.grad_stride = dim
    call.table = cnp.PyArray_DATA(table)
    call.dim = dim
    call.row_stride = row_stride
    call.update = (_kernels.training_update_f32 if t == cnp.NPY_FLOAT32 else
                   (_kernels.training_update_f16 if t == cnp.NPY_FLOAT16
                    else _kernels.training_update_bf16))
    call.opt = &opt
    pk_training_plan_call(&call, <int>threads, &plan)
    space = _workspace(plan.workspace_bytes)
    with nogil:
        status = pk_training_run(&call, &plan, cnp.PyArray_DATA(space), pool, &bad)
    check_bags_status(&bags, status, bad, rows, "embedding_bag_backward_update")
    return None


_local = threading.local()


cdef cnp.ndarray _workspace(int64_t nbytes):
    """A buffer of at least `nbytes` bytes, kept per thread and grown when a call needs more, so
    repeated calls reuse memory that is already mapped (a fresh multi-megabyte array costs page
    faults and zeroing every call) and concurrent calls from different threads never share one."""
    buf = getattr(_local, "buffer", None)
    if buf is None or cnp.PyArray_NBYTES(buf) < nbytes:
        buf = np.empty(max(nbytes, 2 * (0 if buf is None else cnp.PyArray_NBYTES(buf))),
                       dtype=np.uint8)
        _local.buffer = buf
    return buf
