# C declarations of perfkernels/csrc/common/bags_call.h (header-only: a module that cimports this
# gets the header's static functions compiled in): the bag kernels of every table format as one
# call of the bag splitter.
from libc.stdint cimport int64_t
from perfkernels._c_common cimport pk_status
from perfkernels._c_bags cimport pk_bags
from perfkernels.families.embedding._c_embedding cimport pk_embedding_bag_fn
from perfkernels.families.quantized._c_quantized cimport pk_embedding_bag_quantized_fn

cdef extern from "common/bags_call.h":
    ctypedef struct pk_table_bags_args:
        pk_embedding_bag_fn float_fn
        pk_embedding_bag_quantized_fn packed_fn
        int bits
        const void *table
        int64_t rows, dim, row_stride
    pk_table_bags_args pk_table_bags_float(pk_embedding_bag_fn fn, const void *table, int64_t rows,
                                           int64_t dim, int64_t row_stride) noexcept nogil
    pk_table_bags_args pk_table_bags_packed(pk_embedding_bag_quantized_fn fn, int bits,
                                            const void *packed, int64_t rows, int64_t row_bytes,
                                            int64_t dim) noexcept nogil
    pk_status pk_table_bags_call(const void *args, const pk_bags *bags,
                                 int64_t *bad_pos) noexcept nogil
