/* The LSTM unit kernels of each ISA level, in priority order.  Baseline flags only. */
#include "perfkernels/lstm.h"

static const pk_lstm_kernels lstm_table[PK_ISA_COUNT] = {
    [PK_ISA_SCALAR] = {pk_lstm_forward_scalar, pk_lstm_backward_scalar, pk_lstm_math_scalar},
#if PK_X86_64
    [PK_ISA_AVX2] = {pk_lstm_forward_avx2, pk_lstm_backward_avx2, pk_lstm_math_avx2},
    [PK_ISA_AVX512] = {pk_lstm_forward_avx512, pk_lstm_backward_avx512, pk_lstm_math_avx512},
#endif
};

const pk_lstm_kernels *pk_lstm_table(int isa)
{
    if (isa < 0 || isa >= PK_ISA_COUNT || lstm_table[isa].forward == NULL) return NULL;
    return &lstm_table[isa];
}
