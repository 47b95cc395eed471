/* The conversion kernels of each ISA level, in priority order (c-blosc2 style: a row may borrow
 * another level's kernel where that one is not faster).  Baseline flags only. */
#include "perfkernels/convert.h"

static const pk_convert_kernels convert_table[PK_ISA_COUNT] = {
    [PK_ISA_SCALAR] = {pk_float_to_half_scalar, pk_half_to_float_scalar,
                       pk_float_to_bf16_scalar, pk_bf16_to_float_scalar},
#if PK_X86_64
    [PK_ISA_AVX2] = {pk_float_to_half_avx2, pk_half_to_float_avx2,
                     pk_float_to_bf16_avx2, pk_bf16_to_float_avx2},
    [PK_ISA_AVX512] = {pk_float_to_half_avx512, pk_half_to_float_avx512,
                       pk_float_to_bf16_avx512, pk_bf16_to_float_avx512},
#endif
};

const pk_convert_kernels *pk_convert_table(int isa)
{
    if (isa < 0 || isa >= PK_ISA_COUNT || convert_table[isa].float_to_half == NULL) return NULL;
    return &convert_table[isa];
}
