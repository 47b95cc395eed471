# C declarations of include/perfkernels/bags.h.
from libc.stdint cimport int64_t

cdef extern from "perfkernels/bags.h":
    ctypedef struct pk_bags:
        const void *indices
        int64_t n_indices
        int index_64
        const int64_t *offsets
        int64_t num_bags
        const float *weights
        int positional
        int mean
        int64_t padding_idx
        float *out
        int64_t out_stride
    int64_t pk_bags_index(const pk_bags *bags, int64_t j) noexcept nogil
    int64_t pk_bags_first_bad_index(const pk_bags *bags, int64_t rows) noexcept nogil
    int64_t pk_bags_first_bad_in(const pk_bags *bags, int64_t b0, int64_t b1,
                                 int64_t rows) noexcept nogil
