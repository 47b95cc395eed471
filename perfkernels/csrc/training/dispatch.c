/* The training update kernels of each ISA level, in priority order.  Baseline flags only. */
#include "perfkernels/training.h"

static const pk_training_kernels training_table[PK_ISA_COUNT] = {
    [PK_ISA_scalar] = {pk_training_update_f32_scalar, pk_training_update_f16_scalar,
                       pk_training_update_bf16_scalar},
#if PK_X86_64
    [PK_ISA_avx2] = {pk_training_update_f32_avx2, pk_training_update_f16_avx2,
                     pk_training_update_bf16_avx2},
    [PK_ISA_avx512] = {pk_training_update_f32_avx512, pk_training_update_f16_avx512,
                       pk_training_update_bf16_avx512},
#endif
};

const pk_training_kernels *pk_training_table(int isa)
{
    if (isa < 0 || isa >= PK_ISA_COUNT || training_table[isa].update_f32 == NULL) return NULL;
    return &training_table[isa];
}
