# C declarations of include/perfkernels/quantized.h.
from libc.stdint cimport uint8_t, int64_t
from perfkernels._c_common cimport pk_status
from perfkernels._c_bags cimport pk_bags

cdef extern from "perfkernels/quantized.h":
    size_t pk_quantized_row_bytes(int bits, size_t dim) noexcept nogil
    ctypedef struct pk_quantized_kernels:
        pk_status (*quantize_rowwise)(int bits, int half_input, const void *weight, size_t rows,
                                      size_t dim, uint8_t *packed, size_t *bad_row) noexcept nogil
        void (*dequantize_rowwise)(int bits, const uint8_t *packed, size_t rows, size_t row_bytes,
                                   size_t dim, float *out) noexcept nogil
        pk_status (*embedding_bag)(int bits, const pk_bags *bags, const uint8_t *packed,
                                   int64_t rows, int64_t row_bytes, int64_t dim,
                                   int64_t *bad_pos) noexcept nogil
    const pk_quantized_kernels *pk_quantized_table(int isa) noexcept nogil
    ctypedef pk_status (*pk_embedding_bag_quantized_fn)(int bits, const pk_bags *bags,
                                                        const uint8_t *packed, int64_t rows,
                                                        int64_t row_bytes, int64_t dim,
                                                        int64_t *bad_pos) noexcept nogil


cdef extern from "quantized/bags_call.h":
    ctypedef struct pk_quantized_bags_args:
        pk_embedding_bag_quantized_fn fn
        int bits
        const uint8_t *packed
        int64_t rows, row_bytes, dim
    pk_status pk_quantized_bags_call(const void *args, const pk_bags *bags,
                                     int64_t *bad_pos) noexcept nogil
