/* The training update kernels of every level this build contains (the rows of isa_list.h).
 * Baseline flags only. */
#include "perfkernels/training.h"

PK_DEFINE_KERNEL_TABLE(pk_training_kernels, pk_training_table, PK_TRAINING_KERNELS)
