# C declarations of perfkernels/csrc/common/bags_parallel.h (header-only: a module that cimports
# this gets the header's static functions compiled in).
from libc.stdint cimport int64_t
from perfkernels._c_common cimport pk_status
from perfkernels._c_bags cimport pk_bags
from perfkernels._c_parallel cimport pk_parallel_api

cdef extern from "common/bags_parallel.h":
    ctypedef pk_status (*pk_bags_call)(const void *args, const pk_bags *bags,
                                       int64_t *bad_pos) noexcept nogil
    ctypedef struct pk_bags_part:
        pk_bags bags
        pk_bags_call call
        const void *args
        int64_t index_cost
        int64_t bag_cost
        int64_t rows
    pk_status pk_bags_run(const pk_parallel_api *pool, int n_threads, const pk_bags_part *parts,
                          int n_parts, void *snapshot, int64_t *bad_pos,
                          int *bad_part) noexcept nogil
