/* The SIMD conversion kernels write their output with non-temporal stores when input + output
 * (6 bytes per element for every conversion here) exceed this: such an output would not stay in
 * cache anyway, and streaming saves the read-for-ownership of every destination line.  Below it
 * (L2/L3-resident data, typical L3 is 16-32 MiB) ordinary stores are faster and leave the result
 * in cache for whoever reads it next. */
#ifndef PERFKERNELS_CONVERT_STREAM_H
#define PERFKERNELS_CONVERT_STREAM_H
#define PK_STREAM_MIN_BYTES ((size_t)24 << 20)
#define PK_SHOULD_STREAM(n) ((n) * 6 >= PK_STREAM_MIN_BYTES)
#endif
