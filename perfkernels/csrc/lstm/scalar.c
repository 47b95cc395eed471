/* The LSTM unit for portable C (any architecture): vectors of one float (lstm/body.h over simd/scalar.h). */
#include "simd/scalar.h"
#ifdef PK_ISA
#include "lstm/body.h"
#endif
