/* The LSTM unit of every level this build contains (the rows of isa_list.h).  Baseline flags only. */
#include "perfkernels/lstm.h"

PK_DEFINE_KERNEL_TABLE(pk_lstm_kernels, pk_lstm_table, PK_LSTM_KERNELS)
