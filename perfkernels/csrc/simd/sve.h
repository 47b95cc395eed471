/* The sve level: simd/neon.h's primitives (4 float32 lanes), compiled with SVE enabled
 * (-march=armv8.2-a+sve) and exported under the sve suffix.
 *
 * The family bodies keep their accumulators in arrays of vectors and choose passes by VL when
 * compiling; SVE's vector types are sizeless (no arrays, no sizeof, the length known only at run
 * time), so the bodies cannot be instantiated over them as they are written.  What SVE brings at
 * this level: the float32 bags of common/bags_sve.h (written for SVE, length-agnostic, taken
 * where the vectors are wider than NEON's), and GCC's own vectorisation of the plain loops
 * (scalar tails, the scalar parts of the bodies) in predicated SVE code.  The registry chooses
 * this level only on CPUs whose kernel reports HWCAP_SVE. */
#ifndef PK_SIMD_SVE_H
#define PK_SIMD_SVE_H

#include "simd/common.h"

#if PK_BUILT_sve
#if !defined(__ARM_FEATURE_SVE)
#error "files including simd/sve.h must be compiled with -march=armv8.2-a+sve"
#endif
#define PK_NEON_AS_SVE 1
#include "simd/neon.h"
#endif

#endif
