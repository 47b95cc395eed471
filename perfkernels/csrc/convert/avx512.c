/* Conversion kernels for AVX-512: 16-float vectors (convert/body.h over simd/avx512.h). */
#include "simd/avx512.h"
#ifdef PK_ISA
#include "convert/body.h"
#endif
