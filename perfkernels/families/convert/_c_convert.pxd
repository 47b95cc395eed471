# C declarations of include/perfkernels/convert.h.
from libc.stdint cimport uint16_t

cdef extern from "perfkernels/convert.h":
    ctypedef struct pk_convert_kernels:
        void (*float_to_half)(const float *src, uint16_t *dst, size_t n, int clip) noexcept nogil
        void (*half_to_float)(const uint16_t *src, float *dst, size_t n) noexcept nogil
        void (*float_to_bf16)(const float *src, uint16_t *dst, size_t n) noexcept nogil
        void (*bf16_to_float)(const uint16_t *src, float *dst, size_t n) noexcept nogil
    const pk_convert_kernels *pk_convert_table(int isa) noexcept nogil
