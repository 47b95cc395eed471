/* perfkernels: definitions shared by every kernel family.
 *
 * Kernels never print, abort or allocate on the hot path: they return a pk_status, and where the
 * problem is an index, its position, so the Python wrapper can build the message.
 */
#ifndef PERFKERNELS_COMMON_H
#define PERFKERNELS_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "perfkernels/isa_list.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ISA levels in priority order (isa_list.h); the numbers index every family's dispatch table. */
typedef enum pk_isa { PK_ISA_LIST(PK_ISA_ENUM_, ~) PK_ISA_COUNT } pk_isa;

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
