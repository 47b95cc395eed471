/* The quantized-table kernels of every level this build contains (the rows of isa_list.h).  Baseline flags only. */
#include "perfkernels/quantized.h"

PK_DEFINE_KERNEL_TABLE(pk_quantized_kernels, pk_quantized_table, PK_QUANTIZED_KERNELS)
