/* Embedding-bag kernels for AVX-512: 16-float vectors (embedding/body.h over simd/avx512.h). */
#include "simd/avx512.h"
#ifdef PK_ISA
#include "embedding/body.h"
#endif
