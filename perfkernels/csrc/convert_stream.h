/* When the output is larger than this, the SIMD conversion kernels write it with non-temporal
 * stores: it would not stay in cache anyway, and streaming saves the read-for-ownership of every
 * destination line (about a third of the traffic of a float32 -> float16 pass). */
#ifndef PERFKERNELS_CONVERT_STREAM_H
#define PERFKERNELS_CONVERT_STREAM_H
#define PK_STREAM_MIN_OUT_BYTES ((size_t)4 << 20)
#endif
