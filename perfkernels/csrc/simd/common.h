/* What every SIMD primitive header (simd/scalar.h, simd/avx2.h, simd/avx512.h) shares.
 *
 * A primitive header is included first by an ISA file (perfkernels/csrc/<family>/<isa>.c); it
 * defines PK_ISA (the level's name, the suffix of the symbols the file exports) only when the
 * target can build that level, and the family body is included under `#ifdef PK_ISA`.
 *
 * Every helper in the layer and in the bodies is `static` (PK_INLINE): an inline function with
 * external linkage compiled with -mavx512f in one file could be the copy the linker keeps for the
 * AVX2 and scalar callers too (the trap NumPy fell into), running AVX-512 code on a CPU without it.
 */
#ifndef PK_SIMD_COMMON_H
#define PK_SIMD_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "perfkernels/common.h"

#define PK_INLINE static inline __attribute__((always_inline))

/* `#pragma GCC unroll` does not expand macros; this does, so counts can be written as V_REGS / 2. */
#define PK_PRAGMA_(x) _Pragma(#x)
#define PK_UNROLL(n) PK_PRAGMA_(GCC unroll n)

#define PK_CAT_(a, b) a##_##b
#define PK_CAT(a, b) PK_CAT_(a, b)
/* The exported name of a kernel on the level being compiled: PK_ISA_FN(pk_lstm_forward). */
#define PK_ISA_FN(name) PK_CAT(name, PK_ISA)

/* Prefetch into every cache level (T0) or into L2 and beyond (T1); never faults, so an address
 * not yet checked is harmless. */
PK_INLINE void pk_prefetch_t0(const void *p) { __builtin_prefetch(p, 0, 3); }
PK_INLINE void pk_prefetch_t1(const void *p) { __builtin_prefetch(p, 0, 2); }

#endif
