# The C driver of the lookups fused with DLRM's dot interaction (multi/fused.h), as the NumPy
# frontend (_multi.pyx) and the torch layer's fast path (_tensor_bags.pyx) both call it.
from libc.stdint cimport int32_t, int64_t

from perfkernels._c_common cimport pk_status
from perfkernels._c_parallel cimport pk_parallel_api
from perfkernels._c_bags_parallel cimport pk_bags_part
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
        int64_t n_samples
    pk_status pk_dot_interaction_run(const pk_parallel_api *pool, int n_threads,
                                     pk_dot_interaction_job *job, int64_t *bad_pos,
                                     int *bad_part) noexcept nogil
