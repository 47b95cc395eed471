/* The conversion kernels of every level this build contains (the rows of isa_list.h).  Baseline flags only. */
#include "perfkernels/convert.h"

PK_DEFINE_KERNEL_TABLE(pk_convert_kernels, pk_convert_table, PK_CONVERT_KERNELS)
