// perfkernels CUDA: float32 <-> float16 and float32 <-> bfloat16 conversion, bit-exact
// with NumPy / ml_dtypes like the CPU package.
//
// A grid-stride loop over groups of 8 elements: with VEC (both pointers 16-byte aligned) a thread
// moves one 16-byte vector of 16-bit values and two of float32 per group; the n % 8 tail, and
// every element when VEC is off, goes one element at a time.
#include "pk_common.cuh"

enum { PK_FLOAT_TO_HALF = 0, PK_HALF_TO_FLOAT = 1, PK_FLOAT_TO_BF16 = 2, PK_BF16_TO_FLOAT = 3 };

#define PK_CLIP_MAX_HALF 65504.0f

template <int OP>
__device__ __forceinline__ pk_u16 pk_narrow(float x, int clip)
{
    if (OP == PK_FLOAT_TO_BF16) return pk_float_to_bf16(x);
    if (clip && x == x)                       // NaN compares false and passes through
        x = x > PK_CLIP_MAX_HALF ? PK_CLIP_MAX_HALF : (x < -PK_CLIP_MAX_HALF ? -PK_CLIP_MAX_HALF : x);
    return pk_float_to_half(x);
}

template <int OP>
__device__ __forceinline__ float pk_widen(pk_u16 h)
{
    return OP == PK_BF16_TO_FLOAT ? pk_bf16_to_float(h) : pk_half_to_float(h);
}

// float32 -> 16-bit (OP = PK_FLOAT_TO_HALF or PK_FLOAT_TO_BF16).
template <int OP, bool VEC>
__global__ void pk_convert_narrow(const float *__restrict__ src, pk_u16 *__restrict__ dst,
                                  pk_i64 n, int clip)
{
    const pk_i64 step = (pk_i64)gridDim.x * blockDim.x;
    const pk_i64 tid = (pk_i64)blockIdx.x * blockDim.x + threadIdx.x;
    pk_i64 done = 0;
    if (VEC) {
        const pk_i64 groups = n / 8;
        for (pk_i64 g = tid; g < groups; g += step) {
            const float4 a = __ldg(reinterpret_cast<const float4 *>(src) + 2 * g);
            const float4 b = __ldg(reinterpret_cast<const float4 *>(src) + 2 * g + 1);
            uint4 o;
            o.x = (pk_u32)pk_narrow<OP>(a.x, clip) | ((pk_u32)pk_narrow<OP>(a.y, clip) << 16);
            o.y = (pk_u32)pk_narrow<OP>(a.z, clip) | ((pk_u32)pk_narrow<OP>(a.w, clip) << 16);
            o.z = (pk_u32)pk_narrow<OP>(b.x, clip) | ((pk_u32)pk_narrow<OP>(b.y, clip) << 16);
            o.w = (pk_u32)pk_narrow<OP>(b.z, clip) | ((pk_u32)pk_narrow<OP>(b.w, clip) << 16);
            reinterpret_cast<uint4 *>(dst)[g] = o;
        }
        done = groups * 8;
    }
    for (pk_i64 i = done + tid; i < n; i += step) dst[i] = pk_narrow<OP>(src[i], clip);
}

// 16-bit -> float32 (OP = PK_HALF_TO_FLOAT or PK_BF16_TO_FLOAT).
template <int OP, bool VEC>
__global__ void pk_convert_widen(const pk_u16 *__restrict__ src, float *__restrict__ dst, pk_i64 n)
{
    const pk_i64 step = (pk_i64)gridDim.x * blockDim.x;
    const pk_i64 tid = (pk_i64)blockIdx.x * blockDim.x + threadIdx.x;
    pk_i64 done = 0;
    if (VEC) {
        const pk_i64 groups = n / 8;
        for (pk_i64 g = tid; g < groups; g += step) {
            const uint4 v = __ldg(reinterpret_cast<const uint4 *>(src) + g);
            float4 *o = reinterpret_cast<float4 *>(dst) + 2 * g;
            o[0] = make_float4(pk_widen<OP>((pk_u16)v.x), pk_widen<OP>((pk_u16)(v.x >> 16)),
                               pk_widen<OP>((pk_u16)v.y), pk_widen<OP>((pk_u16)(v.y >> 16)));
            o[1] = make_float4(pk_widen<OP>((pk_u16)v.z), pk_widen<OP>((pk_u16)(v.z >> 16)),
                               pk_widen<OP>((pk_u16)v.w), pk_widen<OP>((pk_u16)(v.w >> 16)));
        }
        done = groups * 8;
    }
    for (pk_i64 i = done + tid; i < n; i += step) dst[i] = pk_widen<OP>(src[i]);
}
