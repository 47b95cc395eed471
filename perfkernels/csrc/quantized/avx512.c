/* Row-wise quantized tables for AVX-512: 16-float vectors (quantized/body.h over simd/avx512.h). */
#include "simd/avx512.h"
#ifdef PK_ISA
#include "quantized/body.h"
#endif
