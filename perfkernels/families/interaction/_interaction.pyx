"""Feature interaction: DLRM's pairwise dot products of a sample's feature rows."""
from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy
from cpython.pycapsule cimport PyCapsule_New
import numpy as np
cimport numpy as cnp
from perfkernels._memory cimport pool_new

from perfkernels.families.interaction._c_interaction cimport (pk_interaction_kernels,
                                                             pk_interaction_table,
                                                             pk_interaction_dot_fn)
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
        The pairs and their order (:func:`pair_lists`).
    self_interaction : bool
        Include the pairs (i, i) (DLRM's ``arch_interaction_itself``).
    out : float32 ``[B, D + P]``, optional
    num_threads : int, optional

    Returns
    -------
    ndarray of float32, ``[B, D + P]``
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
