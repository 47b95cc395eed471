/* The LSTM unit for AVX-512: 16-float vectors (lstm/body.h over simd/avx512.h). */
#include "simd/avx512.h"
#ifdef PK_ISA
#include "lstm/body.h"
#endif
