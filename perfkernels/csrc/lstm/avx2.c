/* The LSTM unit for AVX2 + FMA: 8-float vectors (lstm/body.h over simd/avx2.h). */
#include "simd/avx2.h"
#ifdef PK_ISA
#include "lstm/body.h"
#endif
