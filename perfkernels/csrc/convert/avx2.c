/* Conversion kernels for AVX2 + F16C: 8-float vectors (convert/body.h over simd/avx2.h). */
#include "simd/avx2.h"
#ifdef PK_ISA
#include "convert/body.h"
#endif
