/* Training updates for AVX2 + FMA + F16C: 8-float vectors (training/body.h over simd/avx2.h). */
#include "simd/avx2.h"
#ifdef PK_ISA
#include "training/body.h"
#endif
