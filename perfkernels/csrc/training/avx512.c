/* Training updates for AVX-512 F + BW + DQ + VL: 16-float vectors with masked tails
 * (training/body.h over simd/avx512.h). */
#include "simd/avx512.h"
#ifdef PK_ISA
#include "training/body.h"
#endif
