/* Embedding-bag kernels for AVX2 + FMA + F16C: 8-float vectors (embedding/body.h over simd/avx2.h). */
#include "simd/avx2.h"
#ifdef PK_ISA
#include "embedding/body.h"
#endif
