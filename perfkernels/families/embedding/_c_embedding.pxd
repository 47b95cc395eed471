# C declarations of include/perfkernels/embedding.h.
from libc.stdint cimport int64_t
from perfkernels._c_common cimport pk_status
from perfkernels._c_bags cimport pk_bags

cdef extern from "perfkernels/embedding.h":
    ctypedef pk_status (*pk_embedding_bag_fn)(const pk_bags *bags, const void *table, int64_t rows,
                                              int64_t dim, int64_t row_stride,
                                              int64_t *bad_pos) noexcept nogil
    ctypedef struct pk_embedding_kernels:
        pk_embedding_bag_fn bag_f32
        pk_embedding_bag_fn bag_f16
        pk_embedding_bag_fn bag_bf16
    const pk_embedding_kernels *pk_embedding_table(int isa) noexcept nogil


cdef extern from "embedding/bags_call.h":
    ctypedef struct pk_float_bags_args:
        pk_embedding_bag_fn fn
        const void *table
        int64_t rows, dim, row_stride
    pk_status pk_float_bags_call(const void *args, const pk_bags *bags,
                                 int64_t *bad_pos) noexcept nogil
