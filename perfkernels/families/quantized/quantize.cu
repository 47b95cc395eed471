// perfkernels CUDA: row-wise quantization and dequantization, bit-exact with
// torch.ops.quantized.embedding_bag_{byte,4bit,2bit}_prepack like the CPU package.
//
// quantize: one warp per row; min and max by warp shuffles; each lane then writes whole bytes
// (one code for 8-bit, 8 / BITS packed codes for 4- and 2-bit); lanes 0..7 write scale and bias
// (the packed rows are D + 8 or ceil(D * BITS / 8) + 4 bytes, so byte stores: no alignment).
// Every float operation is spelled with an explicit rounding intrinsic (__fsub_rn, __fmul_rn,
// __fdiv_rn) so that no contraction into an FMA can change a code.
// dequantize: one thread per element, x = fma(q, scale, bias).
#include "pk_common.cuh"

template <bool HALF_IN>
__device__ __forceinline__ float pk_in(const void *src, pk_i64 k)
{
    return HALF_IN ? pk_half_to_float(static_cast<const pk_u16 *>(src)[k])
                   : static_cast<const float *>(src)[k];
}

__device__ __forceinline__ float pk_warp_min(float v)
{
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, s));
    return v;
}
__device__ __forceinline__ float pk_warp_max(float v)
{
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, s));
    return v;
}

template <int BITS, bool HALF_IN>
__global__ void pk_quantize_rowwise(const void *__restrict__ src, pk_i64 rows, int dim,
                                    pk_i64 src_stride, pk_u8 *__restrict__ dst, pk_i64 dst_stride)
{
    const int lane = threadIdx.x & 31;
    const pk_i64 warps = ((pk_i64)gridDim.x * blockDim.x) >> 5;
    for (pk_i64 r = ((pk_i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += warps) {
        const pk_i64 base = r * src_stride;
        float mn = __int_as_float(0x7f800000), mx = -__int_as_float(0x7f800000);
        for (int c = lane; c < dim; c += 32) {
            const float x = pk_in<HALF_IN>(src, base + c);
            mn = fminf(mn, x);
            mx = fmaxf(mx, x);
        }
        mn = pk_warp_min(mn);
        mx = pk_warp_max(mx);
        pk_u8 *out = dst + r * dst_stride;
        pk_u32 scale_bits, bias_bits;
        int meta_off, meta_bytes;
        if (BITS == 8) {
            const float range = __fsub_rn(mx, mn);
            const float scale = __fdiv_rn(range, 255.0f);
            const float inv = __fdiv_rn(255.0f, __fadd_rn(range, 1e-8f));
            for (int c = lane; c < dim; c += 32) {
                const float x = pk_in<HALF_IN>(src, base + c);
                out[c] = (pk_u8)(int)rintf(__fmul_rn(__fsub_rn(x, mn), inv));
            }
            scale_bits = __float_as_uint(scale);
            bias_bits = __float_as_uint(mn);
            meta_off = dim;
            meta_bytes = 4;
        } else {
            constexpr int per_byte = 8 / BITS;
            constexpr int qmax = (1 << BITS) - 1;
            const pk_u16 bias_h = pk_float_to_half(mn);
            const float bias = pk_half_to_float(bias_h);
            const float range = __fsub_rn(mx, bias);
            float scale = range == 0.0f ? 1.0f : __fdiv_rn(range, (float)qmax);
            pk_u16 scale_h = pk_float_to_half(scale);
            scale = pk_half_to_float(scale_h);
            float inv = __fdiv_rn(1.0f, scale);
            if (scale == 0.0f || (__float_as_uint(inv) & 0x7fffffffu) == 0x7f800000u) {  // 1/scale is inf
                scale_h = 0x3c00u;                     // 1.0
                inv = 1.0f;
            }
            const int nbytes = (dim + per_byte - 1) / per_byte;
            for (int b = lane; b < nbytes; b += 32) {
                pk_u32 packed = 0;
#pragma unroll
                for (int e = 0; e < per_byte; ++e) {
                    const int c = b * per_byte + e;
                    if (c >= dim) break;
                    const float x = pk_in<HALF_IN>(src, base + c);
                    float q = rintf(__fmul_rn(__fsub_rn(x, bias), inv));
                    q = fminf(fmaxf(q, 0.0f), (float)qmax);
                    packed |= (pk_u32)q << (e * BITS);
                }
                out[b] = (pk_u8)packed;
            }
            scale_bits = scale_h;
            bias_bits = bias_h;
            meta_off = nbytes;
            meta_bytes = 2;
        }
        if (lane < 2 * meta_bytes) {
            const pk_u32 v = lane < meta_bytes ? scale_bits : bias_bits;
            const int byte = lane < meta_bytes ? lane : lane - meta_bytes;
            out[meta_off + lane] = (pk_u8)(v >> (8 * byte));
        }
    }
}

template <int BITS>
__global__ void pk_dequantize_rowwise(const pk_u8 *__restrict__ src, pk_i64 rows, int dim,
                                      pk_i64 src_stride, int meta_off, float *__restrict__ dst)
{
    constexpr int per_byte = 8 / BITS;
    const pk_i64 total = rows * dim, step = (pk_i64)gridDim.x * blockDim.x;
    for (pk_i64 k = (pk_i64)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += step) {
        const pk_i64 r = k / dim;
        const int c = (int)(k - r * dim);
        const pk_u8 *row = src + r * src_stride;
        float scale, bias;
        if (BITS == 8) {
            scale = __uint_as_float(pk_load_u32_unaligned(row + meta_off));
            bias = __uint_as_float(pk_load_u32_unaligned(row + meta_off + 4));
        } else {
            scale = pk_half_to_float(pk_load_u16_unaligned(row + meta_off));
            bias = pk_half_to_float(pk_load_u16_unaligned(row + meta_off + 2));
        }
        const pk_u32 q = ((pk_u32)__ldg(row + c / per_byte) >> ((c % per_byte) * BITS)) & ((1u << BITS) - 1u);
        dst[k] = fmaf((float)q, scale, bias);
    }
}
