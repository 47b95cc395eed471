"""Feature interaction: DLRM's pairwise dot products of a sample's feature rows."""
from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy
from cpython.pycapsule cimport PyCapsule_New
import numpy as np
cimport numpy as cnp
from perfkernels._memory cimport pool_new

from perfkernels.families.interaction._c_interaction cimport (
    pk_interaction_kernels, pk_interaction_table, pk_interaction_dot_fn,
    pk_interaction_dot_backward_fn)
from perfkernels._arrays cimport (as_float32, check_out, finish_out, kernel_table_getter,
                                  register_family)
from perfkernels._parallel cimport resolve_threads, ranges_threads, run_ranges

cnp.import_array()

cdef const pk_interaction_kernels *_kernels = NULL

register_family("interaction", <kernel_table_getter>pk_interaction_table, <const void **>&_kernels)


def _kernel_table(int level):
    """This level's kernel table (``const pk_interaction_kernels *``) as a PyCapsule, for the
    fused lookups + interaction of perfkernels.families.multi._multi."""
    return PyCapsule_New(<void *>pk_interaction_table(level), b"perfkernels.interaction_kernels",
                         NULL)


def pair_lists(n: int, pairs: object = "dlrm", self_interaction: bool = False) -> tuple:
    """The pairs (li, lj), int32 arrays, of an n-row interaction in a model's order.

    ``"dlrm"``: facebookresearch DLRM's ``interact_features`` (the lower triangle row by row:
    ``li = [i for i in range(n) for j in range(i + offset)]``, lj the j, offset 1 with
    ``arch_interaction_itself`` else 0); ``"torchrec"``: TorchRec's ``InteractionArch``
    (``torch.triu_indices(n, n, offset=1)``, the upper triangle row by row; offset 0 with
    ``self_interaction``).  A tuple ``(li, lj)`` is checked (same length, every entry in
    ``[0, n)``) and returned as int32."""
    if isinstance(pairs, str):
        if pairs == "dlrm":
            off = 1 if self_interaction else 0
            li = [i for i in range(n) for j in range(i + off)]
            lj = [j for i in range(n) for j in range(i + off)]
        elif pairs == "torchrec":
            off = 0 if self_interaction else 1
            li = [i for i in range(n) for j in range(i + off, n)]
            lj = [j for i in range(n) for j in range(i + off, n)]
        else:
            raise ValueError(f"pairs must be 'dlrm', 'torchrec' or a tuple (li, lj); got {pairs!r}")
        return np.array(li, dtype=np.int32), np.array(lj, dtype=np.int32)
    try:
        li, lj = pairs
    except (TypeError, ValueError):
        raise TypeError(f"pairs must be 'dlrm', 'torchrec' or a tuple (li, lj); got "
                        f"{type(pairs).__name__}") from None
    li, lj = np.asarray(li), np.asarray(lj)
    for name, a in (("li", li), ("lj", lj)):
        if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
            raise TypeError(f"pairs {name} must be a 1-D integer array; got {a.dtype} of shape "
                            f"{a.shape}")
        bad = np.flatnonzero((a < 0) | (a >= n))
        if bad.size:
            raise IndexError(f"pairs {name}[{bad[0]}] = {a[bad[0]]} is out of range for "
                             f"{n} rows")
    if li.shape != lj.shape:
        raise ValueError(f"pairs li and lj have {li.size} and {lj.size} entries; they need as many")
    return li.astype(np.int32), lj.astype(np.int32)


ctypedef struct _dot_job:
    pk_interaction_dot_fn fn
    const float *dense
    const float *sparse
    int64_t f, dim, n_pairs
    const int32_t *li
    const int32_t *lj
    float *out
    int64_t out_stride
    int failed


cdef void _dot_range(void *vjob, int64_t lo, int64_t hi, int64_t chunk) noexcept nogil:
    cdef _dot_job *job = <_dot_job *>vjob
    cdef int64_t b, d = job.dim
    cdef float *z = <float *>malloc((job.f + 1) * d * sizeof(float) + 4)
    cdef float *row
    if z == NULL:
        job.failed = 1
        return
    for b in range(lo, hi):
        memcpy(z, job.dense + b * d, d * sizeof(float))
        memcpy(z + d, job.sparse + b * job.f * d, job.f * d * sizeof(float))
        row = job.out + b * job.out_stride
        memcpy(row, z, d * sizeof(float))
        job.fn(z, d, job.li, job.lj, job.n_pairs, row + d)
    free(z)


def dot_interaction(dense: Float32Array, sparse: Float32Array, *, pairs: object = "dlrm",
                    self_interaction: bool = False, out: Float32Array | None = None,
                    num_threads: int | None = None) -> Float32Array:
    """DLRM's dot interaction: ``[B, D + P]``, the dense row then the P pairwise dot products.

    Per sample b, ``z = [dense[b], sparse[b, 0], ..., sparse[b, F - 1]]`` (F + 1 rows of D) and
    ``out[b] = [dense[b], z[li[0]] . z[lj[0]], ..., z[li[P-1]] . z[lj[P-1]]]``: what
    facebookresearch DLRM's ``interact_features`` (``"dot"``) and TorchRec's ``InteractionArch``
    compute (``torch.cat([x, torch.bmm(T, T.transpose(1, 2))[:, li, lj]], 1)``) without the
    ``[B, F + 1, F + 1]`` product.

    Parameters
    ----------
    dense : float32 ``[B, D]``
    sparse : float32 ``[B, F, D]`` (the pooled embeddings)
    pairs : ``"dlrm"`` (default), ``"torchrec"`` or a tuple ``(li, lj)``
        The pairs and their order: ``"dlrm"`` the lower triangle row by row (i > j, as
        facebookresearch DLRM), ``"torchrec"`` the upper triangle row by row (i < j), or the
        index lists themselves.
    self_interaction : bool
        Include the pairs (i, i) (DLRM's ``arch_interaction_itself``).
    out : float32 ``[B, D + P]``, optional
    num_threads : int, optional

    Returns
    -------
    ndarray of float32, ``[B, D + P]``

    Raises
    ------
    TypeError
        An input that is not float32-convertible, or ``pairs`` of the wrong type.
    ValueError
        Shapes that disagree (``sparse`` not ``[B, F, D]``, ``out`` not ``[B, D + P]``), an
        unknown ``pairs`` name or pair indices outside ``[0, F + 1)``, a bad ``num_threads``.

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> dense = np.array([[1, 2]], dtype=np.float32)                 # B = 1, D = 2
    >>> sparse = np.array([[[1, 0], [0, 1]]], dtype=np.float32)      # F = 2
    >>> perfkernels.dot_interaction(dense, sparse)   # dense, then z1.z0, z2.z0, z2.z1
    array([[1., 2., 1., 2., 0.]], dtype=float32)
    """
    cdef int nt = resolve_threads(num_threads)
    cdef cnp.ndarray x = as_float32(dense, "dense")
    cdef cnp.ndarray s = as_float32(sparse, "sparse")
    if cnp.PyArray_NDIM(x) != 2:
        raise ValueError(f"dense must be 2-D [B, D]; got shape {(<object>x).shape}")
    cdef int64_t B = x.shape[0], D = x.shape[1]
    if cnp.PyArray_NDIM(s) != 3 or s.shape[0] != B or s.shape[2] != D:
        raise ValueError(f"sparse must be [B, F, D] = [{B}, F, {D}] (dense is {B} x {D}); got "
                         f"shape {(<object>s).shape}")
    cdef int64_t F = s.shape[1]
    li, lj = pair_lists(F + 1, pairs, self_interaction)
    cdef cnp.ndarray ali = <cnp.ndarray>li, alj = <cnp.ndarray>lj
    cdef int64_t P = ali.shape[0]
    cdef tuple shape = (B, D + P)
    cdef cnp.ndarray dst = (pool_new(shape, cnp.NPY_FLOAT32) if out is None
                            else check_out(out, cnp.NPY_FLOAT32, "float32", shape, (x, s)))
    cdef _dot_job job
    job.fn = _kernels.interaction_dot
    job.dense = <const float *>cnp.PyArray_DATA(x)
    job.sparse = <const float *>cnp.PyArray_DATA(s)
    job.f, job.dim, job.n_pairs = F, D, P
    job.li = <const int32_t *>cnp.PyArray_DATA(ali)
    job.lj = <const int32_t *>cnp.PyArray_DATA(alj)
    job.out = <float *>cnp.PyArray_DATA(dst)
    job.out_stride = D + P
    job.failed = 0
    cdef int threads = ranges_threads(B * ((F + 1) * D + D + P) * 4, nt)
    with nogil:
        run_ranges(B, threads, 16, _dot_range, &job)
    if job.failed:
        raise MemoryError()
    return finish_out(out, dst)


ctypedef struct _dot_backward_job:
    pk_interaction_dot_backward_fn fn
    const float *grad
    int64_t grad_stride
    const float *dense
    const float **sparse            # F pointers: feature f's row b at sparse[f] + b * stride[f]
    const int64_t *sparse_stride
    int64_t f, dim, n_pairs
    const int32_t *li
    const int32_t *lj
    float *d_dense
    float *d_sparse                 # [B, F, D]
    int failed


cdef void _dot_backward_range(void *vjob, int64_t lo, int64_t hi, int64_t chunk) noexcept nogil:
    cdef _dot_backward_job *job = <_dot_backward_job *>vjob
    cdef int64_t b, f, k, d = job.dim, n = job.f + 1
    cdef float *z = <float *>malloc((2 * n * d + n * n) * sizeof(float) + 4)
    cdef float *dz
    cdef float *s
    cdef const float *g
    cdef float *o
    if z == NULL:
        job.failed = 1
        return
    dz = z + n * d
    s = dz + n * d
    for b in range(lo, hi):
        memcpy(z, job.dense + b * d, d * sizeof(float))
        for f in range(job.f):
            memcpy(z + (f + 1) * d, job.sparse[f] + b * job.sparse_stride[f], d * sizeof(float))
        g = job.grad + b * job.grad_stride
        job.fn(z, n, d, job.li, job.lj, job.n_pairs, g + d, s, dz)
        o = job.d_dense + b * d
        for k in range(d):
            o[k] = g[k] + dz[k]
        memcpy(job.d_sparse + b * job.f * d, dz + d, job.f * d * sizeof(float))
    free(z)


def dot_interaction_backward(grad: Float32Array, dense: Float32Array, sparse: object, *,
                             pairs: object = "dlrm", self_interaction: bool = False,
                             out: tuple | None = None, num_threads: int | None = None
                             ) -> tuple[Float32Array, Float32Array]:
    """Gradient of :func:`dot_interaction`: ``(d_dense [B, D], d_sparse [B, F, D])``.

    ``grad`` is the gradient of its output ``[B, D + P]``.  Per sample, with
    ``z = [dense[b], sparse[b, 0], ..., sparse[b, F - 1]]`` and G the ``[F + 1, F + 1]`` matrix
    holding ``grad[b, D + p]`` at ``(li[p], lj[p])``::

        dz = (G + G^T) z              (a pair (i, i) gives 2 grad z[i])
        d_dense[b] = grad[b, :D] + dz[0];   d_sparse[b, f] = dz[f + 1]

    what autograd gives for ``torch.cat([x, torch.bmm(T, T.transpose(1, 2))[:, li, lj]], 1)``,
    without the ``[B, F + 1, F + 1]`` matrices or the stacked ``T``.  Each row of dz sums its
    F + 1 terms in order: the result does not depend on the thread count.

    Parameters
    ----------
    grad : float32 ``[B, D + P]``
    dense : float32 ``[B, D]``
    sparse : float32 ``[B, F, D]``, or a sequence of F float32 ``[B, D]`` arrays
        The pooled embeddings, stacked or not (the forward's inputs).
    pairs, self_interaction
        As in the forward call.
    out : tuple ``(d_dense, d_sparse)`` of float32 ndarrays or None, optional
        Left untouched on error.
    num_threads : int, optional

    Returns
    -------
    d_dense : ndarray of float32, ``[B, D]``
    d_sparse : ndarray of float32, ``[B, F, D]``
    
    Raises
    ------
    TypeError, ValueError
        As :func:`dot_interaction`, and ``grad`` not ``[B, D + P]``.

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> dense = np.array([[1, 2]], dtype=np.float32)
    >>> sparse = np.array([[[1, 0], [0, 1]]], dtype=np.float32)
    >>> d_dense, d_sparse = perfkernels.dot_interaction_backward(
    ...     np.ones((1, 5), np.float32), dense, sparse)
    >>> d_dense
    array([[2., 2.]], dtype=float32)
    >>> d_sparse
    array([[[1., 3.],
            [2., 2.]]], dtype=float32)
    """
    cdef int nt = resolve_threads(num_threads)
    cdef cnp.ndarray x = as_float32(dense, "dense")
    cdef cnp.ndarray gr = as_float32(grad, "grad")
    if cnp.PyArray_NDIM(x) != 2:
        raise ValueError(f"dense must be 2-D [B, D]; got shape {(<object>x).shape}")
    cdef int64_t B = x.shape[0], D = x.shape[1], F, f
    cdef list parts
    cdef cnp.ndarray a
    if isinstance(sparse, (list, tuple)):
        parts = [as_float32(p, f"sparse[{i}]") for i, p in enumerate(sparse)]
        for i, a in enumerate(parts):
            if cnp.PyArray_NDIM(a) != 2 or a.shape[0] != B or a.shape[1] != D:
                raise ValueError(f"sparse[{i}] must be [B, D] = [{B}, {D}] (dense is {B} x {D}); "
                                 f"got shape {(<object>a).shape}")
        F = len(parts)
        strides = [D] * F
    else:
        a = as_float32(sparse, "sparse")
        if cnp.PyArray_NDIM(a) != 3 or a.shape[0] != B or a.shape[2] != D:
            raise ValueError(f"sparse must be [B, F, D] = [{B}, F, {D}] (dense is {B} x {D}); "
                             f"got shape {(<object>a).shape}")
        F = a.shape[1]
        if cnp.PyArray_IS_C_CONTIGUOUS(a):
            parts = None       # each feature's rows: every F * D floats from a's f-th row
        else:
            parts = [a[:, i] for i in range(F)]
        strides = [F * D] * F
    li, lj = pair_lists(F + 1, pairs, self_interaction)
    cdef cnp.ndarray ali = <cnp.ndarray>li, alj = <cnp.ndarray>lj
    cdef int64_t P = ali.shape[0]
    if cnp.PyArray_NDIM(gr) != 2 or gr.shape[0] != B or gr.shape[1] != D + P:
        raise ValueError(f"grad must be [B, D + P] = [{B}, {D + P}] ({P} pairs of {F + 1} rows); "
                         f"got shape {(<object>gr).shape}")
    cdef tuple shapes = ((B, D), (B, F, D))
    if out is None:
        out = (None, None)
    elif not isinstance(out, tuple) or len(out) != 2:
        raise TypeError(f"out must be a tuple (d_dense, d_sparse); got {type(out).__name__}")
    inputs = (x, gr, a) if parts is None else (x, gr, *parts)
    dst = [pool_new(shape, cnp.NPY_FLOAT32) if o is None
           else check_out(o, cnp.NPY_FLOAT32, "float32", shape, inputs)
           for o, shape in zip(out, shapes)]
    cdef cnp.ndarray dd = dst[0], ds = dst[1]
    cdef _dot_backward_job job
    cdef const float **ptrs = <const float **>malloc((F + 1) * sizeof(float *))
    cdef int64_t *row_strides = <int64_t *>malloc((F + 1) * sizeof(int64_t))
    if ptrs == NULL or row_strides == NULL:
        free(ptrs)
        free(row_strides)
        raise MemoryError()
    for f in range(F):
        if parts is None:
            ptrs[f] = <const float *>cnp.PyArray_DATA(a) + f * D
        else:
            ptrs[f] = <const float *>cnp.PyArray_DATA(<cnp.ndarray>parts[f])
        row_strides[f] = strides[f]
    job.fn = _kernels.interaction_dot_backward
    job.grad = <const float *>cnp.PyArray_DATA(gr)
    job.grad_stride = D + P
    job.dense = <const float *>cnp.PyArray_DATA(x)
    job.sparse = ptrs
    job.sparse_stride = row_strides
    job.f, job.dim, job.n_pairs = F, D, P
    job.li = <const int32_t *>cnp.PyArray_DATA(ali)
    job.lj = <const int32_t *>cnp.PyArray_DATA(alj)
    job.d_dense = <float *>cnp.PyArray_DATA(dd)
    job.d_sparse = <float *>cnp.PyArray_DATA(ds)
    job.failed = 0
    cdef int threads = ranges_threads(B * (3 * (F + 1) * D + P) * 4, nt)
    with nogil:
        run_ranges(B, threads, 16, _dot_backward_range, &job)
    free(ptrs)
    free(row_strides)
    if job.failed:
        raise MemoryError()
    return finish_out(out[0], dd), finish_out(out[1], ds)
