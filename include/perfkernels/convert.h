/* perfkernels: float32 <-> float16 and float32 <-> bfloat16 conversion.
 *
 * Bit-exact with NumPy's astype(np.float16) / astype(np.float32) and with ml_dtypes' bfloat16 casts
 * for every input: round to nearest even; float16 NaN payloads are truncated/extended exactly as
 * NumPy does (a signalling NaN stays signalling, NumPy does not quiet it); bfloat16 NaN becomes
 * the quiet NaN 0x7fc0 with the input's sign, as ml_dtypes does.  `clip` saturates to +-65504
 * (infinities included) before rounding, as FBGEMM's do_clip; NaN stays NaN.
 * Arrays may be unaligned at element granularity; n may be 0.
 */
#ifndef PERFKERNELS_CONVERT_H
#define PERFKERNELS_CONVERT_H

#include "perfkernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*pk_float_to_half_fn)(const float *src, uint16_t *dst, size_t n, int clip);
typedef void (*pk_half_to_float_fn)(const uint16_t *src, float *dst, size_t n);
typedef void (*pk_float_to_bf16_fn)(const float *src, uint16_t *dst, size_t n);
typedef void (*pk_bf16_to_float_fn)(const uint16_t *src, float *dst, size_t n);

/* The kernels of one level: member x is the function pk_x_<level> (the build declares it for
 * every level and fills the table from this struct; perfkernels/_codegen.py). */
typedef struct pk_convert_kernels {
    pk_float_to_half_fn float_to_half;
    pk_half_to_float_fn half_to_float;
    pk_float_to_bf16_fn float_to_bf16;
    pk_bf16_to_float_fn bf16_to_float;
} pk_convert_kernels;

/* The kernels of one level, or NULL when this build does not contain that level. */
const pk_convert_kernels *pk_convert_table(int isa);

#ifdef __cplusplus
}
#endif
#endif
