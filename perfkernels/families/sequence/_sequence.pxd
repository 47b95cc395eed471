# What other extension modules call of the sequence family (the torch layer's C fast path,
# perfkernels/torch/_tensor_bags.pyx):
#
#     from perfkernels.families.sequence._sequence cimport rows_into
#
#     bad = rows_into(table, rows, row_stride, row_bytes, indices, index_64, n, out, nt)
#
# copies row indices[j] (row_bytes bytes of the row that starts j * row_stride bytes into the
# table) to out + j * row_bytes for j < n, as perfkernels.embedding does (threads for large calls,
# the GIL released there); returns -1, or the first position whose index is out of [0, rows)
# (the rows before it may be written).
from libc.stdint cimport int64_t

cdef int64_t rows_into(const void *table, int64_t rows, int64_t row_stride, int64_t row_bytes,
                       const void *indices, bint index_64, int64_t n, char *out,
                       int nt) except -2
