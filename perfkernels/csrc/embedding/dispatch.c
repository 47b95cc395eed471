/* The embedding-bag kernels of every level this build contains (the rows of isa_list.h).  Baseline flags only. */
#include "perfkernels/embedding.h"

PK_DEFINE_KERNEL_TABLE(pk_embedding_kernels, pk_embedding_table, PK_EMBEDDING_KERNELS)
