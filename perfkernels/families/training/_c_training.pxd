# C declarations of include/perfkernels/training.h.
from libc.stdint cimport int64_t, uint64_t
from perfkernels._c_common cimport pk_status
from perfkernels._c_bags cimport pk_bags
from perfkernels._c_parallel cimport pk_parallel_api

cdef extern from "perfkernels/training.h":
    ctypedef struct pk_sparse_optim:
        int optimizer
        float lr, eps, weight_decay
        int stochastic_rounding
        uint64_t seed
        float *state
        int64_t state_stride
    ctypedef struct pk_training_work:
        uint64_t *keys
        uint64_t *keys_tmp
        int64_t *entry_bag
        float *entry_coef
        float *bag_scale
        int64_t *group_start
        int64_t *histogram
        int per_entry
        int payload_bits
        int64_t num_entries
        int64_t num_groups
    enum:
        PK_OPT_SGD
        PK_OPT_ADAGRAD
        PK_OPT_ROWWISE_ADAGRAD
        PK_TRAINING_HISTOGRAM
    ctypedef void (*pk_training_update_fn)(const pk_training_work *work, int64_t g_begin,
                                           int64_t g_end, const float *grad, int64_t grad_stride,
                                           void *table, int64_t dim, int64_t row_stride,
                                           const pk_sparse_optim *opt, float *scratch) noexcept nogil
    ctypedef struct pk_training_kernels:
        pk_training_update_fn update_f32
        pk_training_update_fn update_f16
        pk_training_update_fn update_bf16
    const pk_training_kernels *pk_training_table(int isa) noexcept nogil
    pk_status pk_training_group(const pk_bags *bags, int64_t rows, pk_training_work *work,
                                int64_t *bad_pos, const pk_parallel_api *thread_pool, int threads,
                                int chunks) noexcept nogil
    int64_t pk_training_histogram(int64_t chunks) noexcept nogil
    int pk_training_fits(int64_t rows, int64_t n_indices, int64_t num_bags) noexcept nogil
