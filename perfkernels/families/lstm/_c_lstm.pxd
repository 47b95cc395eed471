# C declarations of include/perfkernels/lstm.h.
from libc.stdint cimport int32_t, int64_t

cdef extern from "perfkernels/lstm.h":
    ctypedef struct pk_lstm_params:
        size_t n
        size_t d
        const int32_t *seq_lengths32
        const int64_t *seq_lengths64
        int64_t t
        float forget_bias
        int drop_states
        int gate_order
    ctypedef struct pk_lstm_kernels:
        void (*forward)(const pk_lstm_params *p, const float *h_prev, const float *c_prev,
                        const float *gates, float *h, float *c) noexcept nogil
        void (*backward)(const pk_lstm_params *p, const float *c_prev, const float *gates,
                         const float *c, const float *dh, const float *dc, float *dh_prev,
                         float *dc_prev, float *dgates) noexcept nogil
        void (*math)(int fn, const float *x, float *y, size_t n) noexcept nogil
    const pk_lstm_kernels *pk_lstm_table(int isa) noexcept nogil
    int PK_LSTM_IFOG
    int PK_LSTM_IFGO
    int PK_MATH_EXP
    int PK_MATH_SIGMOID
    int PK_MATH_TANH
