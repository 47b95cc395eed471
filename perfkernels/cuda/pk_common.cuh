// perfkernels CUDA: helpers shared by every kernel file.
//
// Self-contained on purpose: NVRTC (through cupy.RawModule) has no host headers, so nothing here
// includes <cstdint>, <cuda_fp16.h> or <cuda_bf16.h>.  The fp16/bf16 bit conversions are written
// out, which also makes them bit-exact with NumPy / ml_dtypes as the CPU package is.
// The Python loader pastes this file in place of its #include, so CuPy's binary cache sees every
// byte of the source; nvcc (the compile test) reads it as an ordinary header.
#ifndef PK_COMMON_CUH
#define PK_COMMON_CUH

typedef unsigned char pk_u8;
typedef unsigned short pk_u16;
typedef unsigned int pk_u32;
typedef long long pk_i64;
typedef unsigned long long pk_u64;

#define PK_NO_ERROR 0xffffffffffffffffull   // an error slot nobody wrote

// ---- fp16 / bf16 <-> fp32 -------------------------------------------------------------------

// float16 bits -> float32; exact, NaN payload kept (shifted) as NumPy does, not quieted.
__device__ __forceinline__ float pk_half_to_float(pk_u16 h)
{
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu))     // NaN: the hardware would canonicalise it
        return __uint_as_float(((pk_u32)(h & 0x8000u) << 16) | 0x7f800000u | ((pk_u32)(h & 0x3ffu) << 13));
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));  // exact for every other pattern
    return f;
}

// float32 -> float16 bits, round to nearest even (overflow -> inf, subnormals kept); NaN keeps
// NumPy's truncated payload (or 1 when the truncation would leave none) and its sign.
__device__ __forceinline__ pk_u16 pk_float_to_half(float x)
{
    pk_u32 u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        pk_u32 payload = (u & 0x7fffffu) >> 13;
        return (pk_u16)(((u >> 16) & 0x8000u) | 0x7c00u | (payload ? payload : 1u));
    }
    pk_u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

__device__ __forceinline__ float pk_bf16_to_float(pk_u16 b) { return __uint_as_float((pk_u32)b << 16); }

// float32 -> bfloat16 bits, round to nearest even; NaN -> sign | 0x7fc0 as ml_dtypes does.
__device__ __forceinline__ pk_u16 pk_float_to_bf16(float x)
{
    pk_u32 u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (pk_u16)(((u >> 16) & 0x8000u) | 0x7fc0u);
    return (pk_u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// ---- loads of W bytes (W = 1, 2, 4, 8, 16), the caller guarantees W-byte alignment ------------

template <int W> struct pk_raw { pk_u32 w[W >= 4 ? W / 4 : 1]; };

template <int W> __device__ __forceinline__ pk_raw<W> pk_load(const pk_u8 *p);
template <> __device__ __forceinline__ pk_raw<16> pk_load<16>(const pk_u8 *p)
{
    uint4 v = __ldg(reinterpret_cast<const uint4 *>(p));
    pk_raw<16> r; r.w[0] = v.x; r.w[1] = v.y; r.w[2] = v.z; r.w[3] = v.w; return r;
}
template <> __device__ __forceinline__ pk_raw<8> pk_load<8>(const pk_u8 *p)
{
    uint2 v = __ldg(reinterpret_cast<const uint2 *>(p));
    pk_raw<8> r; r.w[0] = v.x; r.w[1] = v.y; return r;
}
template <> __device__ __forceinline__ pk_raw<4> pk_load<4>(const pk_u8 *p)
{
    pk_raw<4> r; r.w[0] = __ldg(reinterpret_cast<const unsigned int *>(p)); return r;
}
template <> __device__ __forceinline__ pk_raw<2> pk_load<2>(const pk_u8 *p)
{
    pk_raw<2> r; r.w[0] = __ldg(reinterpret_cast<const unsigned short *>(p)); return r;
}
template <> __device__ __forceinline__ pk_raw<1> pk_load<1>(const pk_u8 *p)
{
    pk_raw<1> r; r.w[0] = __ldg(p); return r;
}

// Little-endian 2- and 4-byte values at any alignment (quantized rows' scale and bias).
__device__ __forceinline__ pk_u32 pk_load_u32_unaligned(const pk_u8 *p)
{
    return (pk_u32)__ldg(p) | ((pk_u32)__ldg(p + 1) << 8) | ((pk_u32)__ldg(p + 2) << 16)
         | ((pk_u32)__ldg(p + 3) << 24);
}
__device__ __forceinline__ pk_u16 pk_load_u16_unaligned(const pk_u8 *p)
{
    return (pk_u16)((pk_u32)__ldg(p) | ((pk_u32)__ldg(p + 1) << 8));
}

// ---- errors: the smallest bad position wins (deterministic messages) -------------------------

__device__ __forceinline__ void pk_report(pk_u64 *slot, pk_i64 position)
{
    atomicMin(slot, (pk_u64)position);
}

#endif  // PK_COMMON_CUH
