/* The quantized-table kernels of each ISA level, in priority order.  Baseline flags only. */
#include "perfkernels/quantized.h"

static const pk_quantized_kernels quantized_table[PK_ISA_COUNT] = {
    [PK_ISA_SCALAR] = {pk_quantize_rowwise_scalar, pk_dequantize_rowwise_scalar,
                        pk_embedding_bag_quantized_scalar},
#if PK_X86_64
    [PK_ISA_AVX2] = {pk_quantize_rowwise_avx2, pk_dequantize_rowwise_avx2,
                      pk_embedding_bag_quantized_avx2},
    [PK_ISA_AVX512] = {pk_quantize_rowwise_avx512, pk_dequantize_rowwise_avx512,
                      pk_embedding_bag_quantized_avx512},
#endif
};

const pk_quantized_kernels *pk_quantized_table(int isa)
{
    if (isa < 0 || isa >= PK_ISA_COUNT || quantized_table[isa].quantize_rowwise == NULL) return NULL;
    return &quantized_table[isa];
}
