/* Row-wise quantized tables for AVX2 + FMA + F16C: 8-float vectors (quantized/body.h over simd/avx2.h). */
#include "simd/avx2.h"
#ifdef PK_ISA
#include "quantized/body.h"
#endif
