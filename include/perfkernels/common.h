/* perfkernels: definitions shared by every kernel family.
 *
 * Kernels never print, abort or allocate on the hot path: they return a pk_status, and where the
 * problem is an index, its position, so the Python wrapper can build the message.
 */
#ifndef PERFKERNELS_COMMON_H
#define PERFKERNELS_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__x86_64__) || defined(_M_X64)
#define PK_X86_64 1
#else
#define PK_X86_64 0
#endif

/* ISA levels in priority order; the numbers index every family's dispatch table. */
typedef enum pk_isa {
    PK_ISA_SCALAR = 0, /* portable C, any architecture */
    PK_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    PK_ISA_AVX512 = 2, /* AVX-512 F + BW + DQ + VL */
    PK_ISA_COUNT = 3
} pk_isa;

typedef enum pk_status {
    PK_OK = 0,
    PK_ERR_INDEX = 1,     /* an index is negative or >= rows; *bad_pos says where */
    PK_ERR_VALUE = 2,     /* a malformed argument the wrapper should have caught */
    PK_ERR_NONFINITE = 3  /* NaN or inf where a finite value is required; *bad_pos says the row */
} pk_status;

#ifdef __cplusplus
}
#endif
#endif
