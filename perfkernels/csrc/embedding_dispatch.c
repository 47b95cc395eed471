/* The embedding-bag kernels of each ISA level, in priority order.  Baseline flags only. */
#include "perfkernels/embedding.h"

static const pk_embedding_kernels embedding_table[PK_ISA_COUNT] = {
    [PK_ISA_SCALAR] = {pk_embedding_bag_f32_scalar, pk_embedding_bag_f16_scalar,
                       pk_embedding_bag_bf16_scalar},
#if PK_X86_64
    [PK_ISA_AVX2] = {pk_embedding_bag_f32_avx2, pk_embedding_bag_f16_avx2,
                     pk_embedding_bag_bf16_avx2},
    [PK_ISA_AVX512] = {pk_embedding_bag_f32_avx512, pk_embedding_bag_f16_avx512,
                       pk_embedding_bag_bf16_avx512},
#endif
};

const pk_embedding_kernels *pk_embedding_table(int isa)
{
    if (isa < 0 || isa >= PK_ISA_COUNT || embedding_table[isa].bag_f32 == NULL) return NULL;
    return &embedding_table[isa];
}
