# The C driver of the lookups fused with DLRM's dot interaction (multi/fused.h), as the NumPy
# frontend (_multi.pyx) and the torch layer's fast path (_tensor_bags.pyx) both call it.
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memcpy

from perfkernels._c_common cimport pk_status
from perfkernels._c_parallel cimport pk_parallel_api
from perfkernels._c_bags_parallel cimport pk_bags_part, pk_bags_run
from perfkernels.families.interaction._c_interaction cimport pk_interaction_dot_fn

cdef extern from "multi/fused.h":
    ctypedef struct pk_dot_interaction_job:
        const pk_bags_part *parts
        int n_parts
        const float *dense
        int64_t dense_stride
        int64_t dim
        const int32_t *li
        const int32_t *lj
        int64_t n_pairs
        pk_interaction_dot_fn dot
        float *out
        int64_t out_stride
        float *pooled
        int64_t pooled_stride
        int64_t n_samples
    pk_status pk_dot_interaction_run(const pk_parallel_api *pool, int n_threads,
                                     pk_dot_interaction_job *job, int64_t *bad_pos,
                                     int *bad_part) noexcept nogil


cdef inline pk_status run_interaction(const pk_parallel_api *api, int n_threads,
                                      const pk_bags_part *parts, int n_parts, bint cat,
                                      const float *dense, int64_t dim, const int32_t *li,
                                      const int32_t *lj, int64_t n_pairs,
                                      pk_interaction_dot_fn dot, float *out, int64_t out_stride,
                                      int64_t n_samples, int64_t *bad_pos,
                                      int *bad_part, float *pooled=NULL) noexcept nogil:
    """The F lookups of `parts` with DLRM's interaction into out [n_samples, out_stride]: "cat"
    copies each sample's dense row [dim] in front of the pooled features (the parts' out already
    at their columns) and runs the lookups; "dot" runs the fused driver over the pairs li / lj,
    and where `pooled` is given also writes each sample's pooled rows there ([n_samples,
    n_parts, dim], for a backward)."""
    cdef int64_t b
    if cat:
        for b in range(n_samples):
            memcpy(out + b * out_stride, dense + b * dim, dim * sizeof(float))
        return pk_bags_run(api, n_threads, parts, n_parts, NULL, bad_pos, bad_part)
    cdef pk_dot_interaction_job job = pk_dot_interaction_job(
        parts=parts, n_parts=n_parts, dense=dense, dense_stride=dim, dim=dim, li=li, lj=lj,
        n_pairs=n_pairs, dot=dot, out=out, out_stride=out_stride, pooled=pooled,
        pooled_stride=n_parts * dim, n_samples=n_samples)
    return pk_dot_interaction_run(api, n_threads, &job, bad_pos, bad_part)
