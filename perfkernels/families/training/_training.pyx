"""Fused embedding-bag backward + sparse optimizer step (training)."""
from libc.float cimport FLT_MAX
from libc.stdint cimport int64_t, uint64_t, uintptr_t

import math
import operator
import os
import threading

import ml_dtypes
import numpy as np
cimport numpy as cnp

from perfkernels._c_common cimport pk_status
from perfkernels._c_bags cimport pk_bags
from perfkernels._c_parallel cimport pk_parallel_threads_for, PK_PARALLEL_BLOCKS_PER_THREAD
from perfkernels.families.training._c_training cimport (pk_sparse_optim, pk_training_work, PK_OPT_SGD,
                                      PK_OPT_ADAGRAD, PK_OPT_ROWWISE_ADAGRAD,
                                      pk_training_update_fn, pk_training_kernels,
                                      pk_training_table, pk_training_group, pk_training_histogram,
                                      pk_training_fits)
from perfkernels._arrays cimport as_float32
from perfkernels._bags cimport BAGS_SCRATCH, prepare_bags, check_bags_status
from perfkernels._parallel cimport pool, resolve_threads

from perfkernels import _dispatch

cnp.import_array()

cdef const pk_training_kernels *_kernels = NULL

cdef int BF16_NUM = np.dtype(ml_dtypes.bfloat16).num
cdef str _TABLE_ACCEPTED = "float32, float16 or bfloat16 (ml_dtypes.bfloat16)"
cdef dict _OPTIMIZERS = {"sgd": PK_OPT_SGD, "adagrad": PK_OPT_ADAGRAD,
                         "rowwise_adagrad": PK_OPT_ROWWISE_ADAGRAD}


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


cdef cnp.ndarray _state_in_place(object state, str optimizer, int64_t rows, int64_t dim,
                                 cnp.ndarray table):
    """The optimizer state for `optimizer`, checked: None for sgd; float32 [rows, D] (adagrad) or
    [rows] (rowwise_adagrad), writeable, aligned, unit stride along D."""
    cdef cnp.ndarray s
    cdef tuple shape
    if optimizer == "sgd":
        if state is not None:
            raise ValueError("optimizer='sgd' keeps no state: state must be None")
        return None
    shape = (rows, dim) if optimizer == "adagrad" else (<object>rows,)
    what = "float32 [rows, D]" if optimizer == "adagrad" else "float32 [rows]"
    if state is None:
        raise ValueError(f"optimizer={optimizer!r} needs state, a {what} array (zeros to start)")
    if not cnp.PyArray_Check(state):
        raise TypeError(f"state must be a numpy.ndarray ({what}, updated in place); got "
                        f"{type(state).__name__}")
    s = <cnp.ndarray>state
    if cnp.PyArray_TYPE(s) != cnp.NPY_FLOAT32:
        raise TypeError(f"state must have dtype float32; got {s.dtype}")
    if (<object>s).shape != shape:
        raise ValueError(f"state has shape {(<object>s).shape}; optimizer={optimizer!r} needs "
                         f"{shape} ({what})")
    if not cnp.PyArray_ISWRITEABLE(s):
        raise ValueError("state is read-only: it is updated in place")
    if not (cnp.PyArray_ISALIGNED(s) and cnp.PyArray_ISNOTSWAPPED(s)
            and (cnp.PyArray_SIZE(s) == 0 or (
                cnp.PyArray_STRIDE(s, 0) >= 0 and cnp.PyArray_STRIDE(s, 0) % 4 == 0
                and (optimizer != "adagrad" or cnp.PyArray_STRIDE(s, 1) == 4 or dim <= 1)))):
        raise ValueError(f"state must be aligned, native byte order, with unit stride along D "
                         f"(it is updated in place); got strides {(<object>s).strides}")
    _check_rows_apart(s, "state")
    if rows > 0 and dim > 0 and np.may_share_memory(s, table):
        raise ValueError("state shares memory with weight")
    return s


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


ctypedef struct _update_ctx:
    pk_training_update_fn fn
    const pk_training_work *work
    int64_t *task_group       # tasks + 1 group numbers: task t updates groups [tg[t], tg[t + 1])
    int64_t tasks
    const float *grad
    int64_t grad_stride
    void *table
    int64_t dim
    int64_t row_stride
    const pk_sparse_optim *opt
    float *scratch            # a scratch row per task (a task runs on one thread)
    int64_t scratch_stride


cdef void _update_task(void *vctx, int64_t t0, int64_t t1) noexcept nogil:
    cdef const _update_ctx *c = <const _update_ctx *>vctx
    cdef int64_t t
    for t in range(t0, t1):
        c.fn(c.work, c.task_group[t], c.task_group[t + 1], c.grad, c.grad_stride, c.table, c.dim,
             c.row_stride, c.opt, c.scratch + t * c.scratch_stride)


cdef int64_t _split_groups(const pk_training_work *work, int64_t tasks,
                           int64_t *task_group) noexcept nogil:
    """Cut the groups into at most `tasks` ranges of about equal entry counts (a Zipf-hot row is
    one group however many entries it has); returns the number of non-empty ranges.  Each row is
    updated by one task, so the split changes the speed, never the result."""
    cdef int64_t m = work.num_entries, u = 0, t, lo, hi, mid, target, count = 0
    cdef int64_t groups = work.num_groups
    if tasks > groups:
        tasks = groups
    task_group[0] = 0
    for t in range(1, tasks):
        target = m // tasks * t + m % tasks * t // tasks
        lo = u
        hi = groups
        while lo < hi:          # first group starting at or after target
            mid = (lo + hi) // 2
            if work.group_start[mid] < target:
                lo = mid + 1
            else:
                hi = mid
        if lo > task_group[count]:
            count += 1
            task_group[count] = lo
            u = lo
    if groups > task_group[count]:
        count += 1
    task_group[count] = groups
    return count


def embedding_bag_backward_update(
    weight: TableArray, indices: IndexArray, offsets: IndexArray | None = None, *,
    grad_output: Float32Array,
    optimizer: Literal["sgd", "adagrad", "rowwise_adagrad"] = "sgd",
    state: Float32Array | None = None, lr: float, eps: float = 1e-8, weight_decay: float = 0.0,
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
    indices, offsets, lengths, per_sample_weights, mode, include_last_offset, padding_idx,
    positional_weights
        The bags, exactly as for :func:`perfkernels.embedding_bag`.
    grad_output : ndarray [num_bags, D] of float32
        The gradient of the loss with respect to the bags' output.
    optimizer : {"sgd", "adagrad", "rowwise_adagrad"}
    state : ndarray of float32 or None
        The optimizer state, updated in place: None for ``"sgd"``, ``[rows, D]`` for
        ``"adagrad"``, ``[rows]`` for ``"rowwise_adagrad"`` (start from zeros, or
        ``initial_accumulator_value`` as torch does).
    lr : float
        Learning rate, finite and >= 0.
    eps : float
        Added to ``sqrt(h)`` (adagrad variants), finite and >= 0.  torch.optim.Adagrad's default is
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
        An index that is negative or ``>= rows``.

    On any error nothing is written: every argument and every index is checked before the first
    row is updated.

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
    cdef pk_training_work work
    cdef int64_t bad = -1, n, grad_stride, threads, chunk, begin, end
    cdef pk_status status
    cdef cnp.ndarray table = _table_in_place(weight)
    cdef int64_t rows = cnp.PyArray_DIM(table, 0)
    cdef int64_t dim = cnp.PyArray_DIM(table, 1)
    cdef int64_t row_stride = cnp.PyArray_STRIDE(table, 0) // cnp.PyArray_ITEMSIZE(table)
    cdef cnp.ndarray st, grad, space
    cdef int64_t sizes[8]
    cdef char *parts[8]
    cdef int chunks, k
    cdef _update_ctx uc
    cdef float *scratch_row
    cdef int t = cnp.PyArray_TYPE(table)
    cdef pk_training_update_fn fn
    cdef void *data

    if optimizer not in _OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(map(repr, _OPTIMIZERS))}; "
                         f"got {optimizer!r}")
    opt.optimizer = _OPTIMIZERS[optimizer]
    opt.lr = _finite(lr, "lr")
    opt.eps = _finite(eps, "eps")
    opt.weight_decay = _finite(weight_decay, "weight_decay")
    st = _state_in_place(state, optimizer, rows, dim, table)
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
            np.may_share_memory(grad, table) or (st is not None and np.may_share_memory(grad, st))):
        grad = grad.copy()   # it is read while rows are written
    grad_stride = dim
    n = bags.n_indices
    if not pk_training_fits(rows, n, bags.num_bags):
        raise ValueError(f"{n} indices into a table of {rows} rows: the row and entry numbers "
                         "need more than 64 bits together")

    # the workspace, sized for this call (the kernels never allocate)
    weighted = bags.weights != NULL
    sizes[0] = 8 * n                                       # keys
    sizes[1] = 8 * n                                       # keys_tmp
    sizes[2] = 8 * (n + 1)                                 # group_start
    # threads: worth it only when each gets enough memory traffic (keys sorted, G rows read, table
    # and state rows read and written); chunks: slices of the sort and update tasks, one block each
    k = pk_parallel_threads_for(n * (32 + 8 * dim), <int>threads)
    chunks = k * PK_PARALLEL_BLOCKS_PER_THREAD if k > 1 else 1
    sizes[3] = 8 * pk_training_histogram(chunks)           # histogram(s)
    sizes[4] = 8 * n if weighted else 0                    # entry_bag
    sizes[5] = 4 * n if weighted else 4 * bags.num_bags    # entry_coef or bag_scale
    sizes[6] = 4 * (2 * dim + 16) * chunks                 # a scratch row per update task
    sizes[7] = 8 * (chunks + 1)                            # the update tasks' first groups
    space = _workspace(sizes, 8, parts)
    work.keys = <uint64_t *>parts[0]
    work.keys_tmp = <uint64_t *>parts[1]
    work.group_start = <int64_t *>parts[2]
    work.histogram = <int64_t *>parts[3]
    work.entry_bag = <int64_t *>parts[4]
    work.entry_coef = <float *>parts[5]
    work.bag_scale = <float *>parts[5]
    scratch_row = <float *>parts[6]

    fn = (_kernels.training_update_f32 if t == cnp.NPY_FLOAT32 else
          (_kernels.training_update_f16 if t == cnp.NPY_FLOAT16 else _kernels.training_update_bf16))
    data = cnp.PyArray_DATA(table)
    with nogil:
        status = pk_training_group(&bags, rows, &work, &bad, pool, k, chunks)
    check_bags_status(&bags, status, bad, rows, "embedding_bag_backward_update")
    if dim == 0 or work.num_groups == 0:
        return None
    uc.fn = fn
    uc.work = &work
    uc.grad = <const float *>cnp.PyArray_DATA(grad)
    uc.grad_stride = grad_stride
    uc.table = data
    uc.dim = dim
    uc.row_stride = row_stride
    uc.opt = &opt
    uc.scratch = scratch_row
    uc.scratch_stride = 2 * dim + 16
    uc.task_group = <int64_t *>parts[7]
    with nogil:
        uc.tasks = _split_groups(&work, chunks, uc.task_group)
        if uc.tasks > 1:
            pool.parallel_for(uc.tasks, k, _update_task, &uc)
        else:
            _update_task(&uc, 0, 1)
    return None


_local = threading.local()


cdef cnp.ndarray _workspace(const int64_t *sizes, int count, char **parts):
    """One buffer holding `count` parts of sizes[i] bytes, each 64-byte aligned; parts[i] points
    at part i.  The buffer is kept per thread and grown when a call needs more, so repeated calls
    reuse memory that is already mapped (a fresh multi-megabyte array costs page faults and
    zeroing every call) and concurrent calls from different threads never share one."""
    cdef int64_t total = 64, off
    cdef int i
    cdef cnp.ndarray buf
    cdef char *base
    for i in range(count):
        total += (sizes[i] + 63) // 64 * 64
    buf = getattr(_local, "buffer", None)
    if buf is None or cnp.PyArray_NBYTES(buf) < total:
        buf = np.empty(max(total, 2 * (0 if buf is None else cnp.PyArray_NBYTES(buf))),
                       dtype=np.uint8)
        _local.buffer = buf
    base = <char *>cnp.PyArray_DATA(buf)
    off = (64 - (<uintptr_t>base) % 64) % 64
    for i in range(count):
        parts[i] = base + off
        off += (sizes[i] + 63) // 64 * 64
    return buf
