// cuda_sim.h: a warp simulator that lets g++ (C++17) compile perfkernels' unmodified CUDA C++
// kernels for the host and run them on the CPU.  Test code only (never shipped in the wheel).
//
// Every thread of a block is a cooperative fiber (ucontext).  A fiber runs until it reaches a
// warp-synchronous call (__shfl*_sync, __syncwarp, __ballot_sync, ...) or __syncthreads, then
// waits there.  A warp call completes when every lane named in its mask is waiting on the same
// call with the same mask; the results are computed with CUDA's exact semantics (PTX shfl.sync:
// width, srcLane taken modulo width, segment bounds) and the lanes go on.  The simulator fails
// the launch, with a message naming block, warp and lanes, when
//   - a lane calls with a mask that leaves itself out,
//   - a lane reads (shuffles from) a lane outside the mask,
//   - a lane named in the mask has exited, or lanes meet with different masks or operations,
//   - nothing can run any more (deadlock), or __syncthreads is reached by only part of a block,
//   - __ldg or a CUDA vector store gets a pointer without the type's CUDA alignment,
//   - a shuffle width is not a power of two in [1, 32], or a launch configuration is invalid.
// A seed permutes the order in which fibers run (and blocks), so order-dependent results show.
//
// Blocks run one after another on the calling OS thread, so `__shared__` is a function-local
// static (shared by the block's fibers) and atomics are plain read-modify-writes.
#ifndef PK_CUDA_SIM_H
#define PK_CUDA_SIM_H

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <ucontext.h>
#include <utility>
#include <vector>

#include <math.h>

#if defined(__SANITIZE_ADDRESS__)
#define PK_SIM_ASAN 1
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#else
#define PK_SIM_ASAN 0
#endif

// ---- qualifiers ---------------------------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __shared__ static
#define __constant__ static
#define __launch_bounds__(...)
// g++ knows __restrict__ already.

// ---- vector types with CUDA's alignment --------------------------------------------------------

namespace pk_sim {
[[noreturn]] inline void fail(const std::string &msg);
inline void check_aligned(const void *p, std::size_t align, const char *what)
{
    if (reinterpret_cast<std::uintptr_t>(p) % align != 0) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "misaligned address %p for %s (CUDA requires %zu-byte alignment)",
                      p, what, align);
        fail(buf);
    }
}
}  // namespace pk_sim

// A store through a vector-type pointer (`*reinterpret_cast<float4 *>(p) = v`) runs the copy
// assignment with `this == p`: it checks the alignment the GPU would fault on.
#define PK_SIM_VEC2(name, T, A)                                                                    \
    struct alignas(A) name {                                                                       \
        T x, y;                                                                                    \
        name &operator=(const name &o) { pk_sim::check_aligned(this, A, #name " store");           \
                                         x = o.x; y = o.y; return *this; }                         \
    };                                                                                             \
    inline name make_##name(T a, T b) { name r; r.x = a; r.y = b; return r; }
#define PK_SIM_VEC4(name, T, A)                                                                    \
    struct alignas(A) name {                                                                       \
        T x, y, z, w;                                                                              \
        name &operator=(const name &o) { pk_sim::check_aligned(this, A, #name " store");           \
                                         x = o.x; y = o.y; z = o.z; w = o.w; return *this; }       \
    };                                                                                             \
    inline name make_##name(T a, T b, T c, T d) { name r; r.x = a; r.y = b; r.z = c; r.w = d; return r; }

PK_SIM_VEC2(char2, signed char, 2)
PK_SIM_VEC4(char4, signed char, 4)
PK_SIM_VEC2(uchar2, unsigned char, 2)
PK_SIM_VEC4(uchar4, unsigned char, 4)
PK_SIM_VEC2(short2, short, 4)
PK_SIM_VEC4(short4, short, 8)
PK_SIM_VEC2(ushort2, unsigned short, 4)
PK_SIM_VEC4(ushort4, unsigned short, 8)
PK_SIM_VEC2(int2, int, 8)
PK_SIM_VEC4(int4, int, 16)
PK_SIM_VEC2(uint2, unsigned int, 8)
PK_SIM_VEC4(uint4, unsigned int, 16)
PK_SIM_VEC2(float2, float, 8)
PK_SIM_VEC4(float4, float, 16)
PK_SIM_VEC2(longlong2, long long, 16)
PK_SIM_VEC2(ulonglong2, unsigned long long, 16)
PK_SIM_VEC2(double2, double, 16)

struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

// ---- fp16 / bf16 (the hardware conversions, in software) -----------------------------------------

namespace pk_sim {

template <typename To, typename From> inline To bits(const From &f)
{
    static_assert(sizeof(To) == sizeof(From), "bit cast between different sizes");
    To t;
    std::memcpy(&t, &f, sizeof t);
    return t;
}

// cvt.f32.f16: exact; a NaN becomes the canonical NaN 0x7fffffff as the hardware does.
inline float cvt_f32_f16(std::uint16_t h)
{
    const std::uint32_t sign = (std::uint32_t)(h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    std::uint32_t u;
    if (exp == 0x1f) {
        u = man ? 0x7fffffffu : (sign | 0x7f800000u);
    } else if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else {                                  // subnormal: normalise
            int e = -1;
            std::uint32_t m = man;
            do { m <<= 1; ++e; } while (!(m & 0x400u));
            u = sign | ((std::uint32_t)(127 - 15 - e) << 23) | ((m & 0x3ffu) << 13);
        }
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    return bits<float>(u);
}

// cvt.rn.f16.f32: round to nearest even, overflow to infinity, subnormal results kept; a NaN
// becomes the canonical NaN 0x7fff as the hardware does.
inline std::uint16_t cvt_rn_f16_f32(float f)
{
    const std::uint32_t u = bits<std::uint32_t>(f);
    const std::uint16_t sign = (std::uint16_t)((u >> 16) & 0x8000u);
    const std::uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fffu;
    if (a >= 0x477ff000u) return sign | 0x7c00u;          // >= 65520 rounds to infinity
    if (a < 0x33000001u) return sign;                      // <= 2^-25 (ties to even 0)
    int exp = (int)(a >> 23) - 127;
    std::uint32_t man = (a & 0x7fffffu) | 0x800000u;
    int shift;                                             // bits of man dropped
    std::uint32_t base;
    if (exp < -14) { shift = 13 + (-14 - exp); base = 0; }
    else { shift = 13; base = (std::uint32_t)(exp + 15) << 10; man &= 0x7fffffu; }
    std::uint32_t q = man >> shift, rem = man & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;     // a carry into the exponent is right
    return (std::uint16_t)(sign | (base + q));
}

inline float bf16_to_float(std::uint16_t b) { return bits<float>((std::uint32_t)b << 16); }
// cvt.rn.bf16.f32: round to nearest even; NaN -> canonical 0x7fff.
inline std::uint16_t float_to_bf16_rn(float f)
{
    const std::uint32_t u = bits<std::uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
    return (std::uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace pk_sim

struct alignas(2) __half { unsigned short __x; };
struct alignas(2) __nv_bfloat16 { unsigned short __x; };
inline float __half2float(__half h) { return pk_sim::cvt_f32_f16(h.__x); }
inline __half __float2half_rn(float f) { return __half{pk_sim::cvt_rn_f16_f32(f)}; }
inline __half __float2half(float f) { return __float2half_rn(f); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline float __bfloat162float(__nv_bfloat16 b) { return pk_sim::bf16_to_float(b.__x); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{pk_sim::float_to_bf16_rn(f)}; }
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16{u}; }

// ---- float intrinsics ---------------------------------------------------------------------------
// The simulator is built with -ffp-contract=off and without FMA instructions, so each of these
// is one IEEE operation rounded to nearest as on the GPU.  (nvcc contracts a*b+c in ordinary
// expressions into FMAs; the simulator does not, so it may differ there by an ulp.)

inline float __uint_as_float(unsigned int u) { return pk_sim::bits<float>(u); }
inline unsigned int __float_as_uint(float f) { return pk_sim::bits<unsigned int>(f); }
inline float __int_as_float(int i) { return pk_sim::bits<float>(i); }
inline int __float_as_int(float f) { return pk_sim::bits<int>(f); }
inline double __longlong_as_double(long long i) { return pk_sim::bits<double>(i); }
inline long long __double_as_longlong(double d) { return pk_sim::bits<long long>(d); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __saturatef(float x) { return x != x ? 0.0f : std::min(std::max(x, 0.0f), 1.0f); }
// expf, tanhf, fmaf, rintf, fminf, fmaxf ...: the C library's (<math.h>); fmaf is fused.

// ---- the simulator ------------------------------------------------------------------------------

namespace pk_sim {

enum class Op : int { none, shfl_idx, shfl_up, shfl_down, shfl_xor, syncwarp, ballot, any, all };
inline const char *op_name(Op op)
{
    switch (op) {
    case Op::shfl_idx: return "__shfl_sync";
    case Op::shfl_up: return "__shfl_up_sync";
    case Op::shfl_down: return "__shfl_down_sync";
    case Op::shfl_xor: return "__shfl_xor_sync";
    case Op::syncwarp: return "__syncwarp";
    case Op::ballot: return "__ballot_sync";
    case Op::any: return "__any_sync";
    case Op::all: return "__all_sync";
    default: return "?";
    }
}

enum class State : int { runnable, warp_wait, block_wait, exited };

struct Fiber {
    ucontext_t ctx;
    uint3 tid;
    int linear = 0, warp = 0, lane = 0;
    State state = State::runnable;
    Op op = Op::none;
    unsigned mask = 0;
    std::uint64_t value = 0, result = 0;
    int arg = 0, width = 32;                       // srcLane / delta / laneMask, width
    char *stack = nullptr;
    void *fake_stack = nullptr;                    // AddressSanitizer's, while switched out
};

// A failure found by the scheduler itself (outside any fiber): unwinds to the launcher.
struct Failure {};

struct Sim {
    // set by the launcher
    dim3 grid, block;
    uint3 block_idx{0, 0, 0};
    std::uint64_t seed = 0;
    std::size_t stack_bytes = 0;
    std::vector<char> stacks;
    std::vector<Fiber> fibers;
    Fiber *current = nullptr;
    ucontext_t scheduler;
    void (*body)(void *) = nullptr;
    void *body_arg = nullptr;
    bool failed = false;
    std::string error;
#if PK_SIM_ASAN
    void *sched_fake_stack = nullptr;
    const void *sched_stack_bottom = nullptr;
    std::size_t sched_stack_size = 0;
#endif
};

inline Sim &sim() { static Sim s; return s; }
inline Fiber &self() { return *sim().current; }

// Back to the scheduler (the fiber waits, exits or the launch failed).
inline void yield_to_scheduler(bool exiting = false)
{
    Sim &s = sim();
#if PK_SIM_ASAN
    Fiber *f = s.current;
    __sanitizer_start_switch_fiber(exiting ? nullptr : &f->fake_stack, s.sched_stack_bottom,
                                   s.sched_stack_size);
    swapcontext(&f->ctx, &s.scheduler);
    __sanitizer_finish_switch_fiber(f->fake_stack, nullptr, nullptr);
#else
    (void)exiting;
    swapcontext(&s.current->ctx, &s.scheduler);
#endif
}

[[noreturn]] inline void fail(const std::string &msg)
{
    Sim &s = sim();
    if (!s.failed) {
        s.failed = true;
        char where[160];
        if (s.current)
            std::snprintf(where, sizeof where, "block (%u,%u,%u) thread (%u,%u,%u) warp %d lane %d: ",
                          s.block_idx.x, s.block_idx.y, s.block_idx.z, s.current->tid.x,
                          s.current->tid.y, s.current->tid.z, s.current->warp, s.current->lane);
        else
            std::snprintf(where, sizeof where, "block (%u,%u,%u): ", s.block_idx.x, s.block_idx.y,
                          s.block_idx.z);
        s.error = where + msg;
    }
    if (s.current) {
        for (;;) yield_to_scheduler(true);        // the scheduler never resumes a failed launch
    }
    throw Failure{};                               // found by the scheduler: back to the launcher
}

inline std::string hex_mask(unsigned m)
{
    char b[16];
    std::snprintf(b, sizeof b, "0x%08x", m);
    return b;
}

// A warp-synchronous call by the current lane: wait until the mask's lanes all arrived.
inline std::uint64_t warp_op(Op op, unsigned mask, std::uint64_t value, int arg, int width)
{
    Fiber &f = self();
    if (!(mask & (1u << f.lane)))
        fail(std::string(op_name(op)) + " called with mask " + hex_mask(mask) +
             ", which leaves out the calling lane " + std::to_string(f.lane));
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail(std::string(op_name(op)) + " width " + std::to_string(width) +
             " is not a power of two in [1, 32]");
    f.op = op; f.mask = mask; f.value = value; f.arg = arg; f.width = width;
    f.state = State::warp_wait;
    yield_to_scheduler();
    return f.result;
}

// PTX shfl.sync: the lane read and whether it is in bounds (else the lane's own value is kept).
inline int shfl_source(Op op, int lane, int b, int width, bool &in_bounds)
{
    const int c = op == Op::shfl_up ? (32 - width) << 8 : ((32 - width) << 8) | 0x1f;
    const int bval = b & 0x1f, cval = c & 0x1f, segmask = (c >> 8) & 0x1f;
    const int max_lane = (lane & segmask) | (cval & ~segmask), min_lane = lane & segmask;
    int j = lane;
    switch (op) {
    case Op::shfl_up: j = lane - bval; in_bounds = j >= max_lane; break;
    case Op::shfl_down: j = lane + bval; in_bounds = j <= max_lane; break;
    case Op::shfl_xor: j = lane ^ bval; in_bounds = j <= max_lane; break;
    default: j = min_lane | (bval & ~segmask); in_bounds = j <= max_lane; break;
    }
    return in_bounds ? j : lane;
}

}  // namespace pk_sim

// ---- thread geometry ----------------------------------------------------------------------------

#define threadIdx (static_cast<const uint3 &>(pk_sim::self().tid))
#define blockIdx (static_cast<const uint3 &>(pk_sim::sim().block_idx))
#define blockDim (static_cast<const dim3 &>(pk_sim::sim().block))
#define gridDim (static_cast<const dim3 &>(pk_sim::sim().grid))
#define warpSize 32

// ---- warp intrinsics (CUDA's overload set) ------------------------------------------------------

namespace pk_sim {
template <typename T> inline T shfl(Op op, unsigned mask, T var, int arg, int width)
{
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "shuffle type");
    std::uint64_t v = 0;
    std::memcpy(&v, &var, sizeof(T));
    const std::uint64_t r = warp_op(op, mask, v, arg, width);
    T out;
    std::memcpy(&out, &r, sizeof(T));
    return out;
}
}  // namespace pk_sim

#define PK_SIM_SHFL(T)                                                                             \
    inline T __shfl_sync(unsigned mask, T var, int src, int width = 32)                           \
    { return pk_sim::shfl<T>(pk_sim::Op::shfl_idx, mask, var, src, width); }                      \
    inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32)                 \
    { return pk_sim::shfl<T>(pk_sim::Op::shfl_up, mask, var, (int)delta, width); }                \
    inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32)               \
    { return pk_sim::shfl<T>(pk_sim::Op::shfl_down, mask, var, (int)delta, width); }              \
    inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32)                 \
    { return pk_sim::shfl<T>(pk_sim::Op::shfl_xor, mask, var, lane_mask, width); }
PK_SIM_SHFL(int)
PK_SIM_SHFL(unsigned int)
PK_SIM_SHFL(long)
PK_SIM_SHFL(unsigned long)
PK_SIM_SHFL(long long)
PK_SIM_SHFL(unsigned long long)
PK_SIM_SHFL(float)
PK_SIM_SHFL(double)
PK_SIM_SHFL(__half)
PK_SIM_SHFL(__nv_bfloat16)
#undef PK_SIM_SHFL

inline void __syncwarp(unsigned mask = 0xffffffffu) { pk_sim::warp_op(pk_sim::Op::syncwarp, mask, 0, 0, 32); }
inline unsigned __ballot_sync(unsigned mask, int pred)
{ return (unsigned)pk_sim::warp_op(pk_sim::Op::ballot, mask, pred != 0, 0, 32); }
inline int __any_sync(unsigned mask, int pred) { return (int)pk_sim::warp_op(pk_sim::Op::any, mask, pred != 0, 0, 32); }
inline int __all_sync(unsigned mask, int pred) { return (int)pk_sim::warp_op(pk_sim::Op::all, mask, pred != 0, 0, 32); }

inline void __syncthreads()
{
    pk_sim::self().state = pk_sim::State::block_wait;
    pk_sim::yield_to_scheduler();
}
[[noreturn]] inline void __trap() { pk_sim::fail("__trap()"); }

// ---- loads through the read-only cache ----------------------------------------------------------

namespace pk_sim {
template <typename T> struct ldg_type : std::false_type {};
#define PK_SIM_LDG(T) template <> struct ldg_type<T> : std::true_type {};
PK_SIM_LDG(char) PK_SIM_LDG(signed char) PK_SIM_LDG(unsigned char) PK_SIM_LDG(short)
PK_SIM_LDG(unsigned short) PK_SIM_LDG(int) PK_SIM_LDG(unsigned int) PK_SIM_LDG(long)
PK_SIM_LDG(unsigned long) PK_SIM_LDG(long long) PK_SIM_LDG(unsigned long long) PK_SIM_LDG(float)
PK_SIM_LDG(double) PK_SIM_LDG(char2) PK_SIM_LDG(char4) PK_SIM_LDG(uchar2) PK_SIM_LDG(uchar4)
PK_SIM_LDG(short2) PK_SIM_LDG(short4) PK_SIM_LDG(ushort2) PK_SIM_LDG(ushort4) PK_SIM_LDG(int2)
PK_SIM_LDG(int4) PK_SIM_LDG(uint2) PK_SIM_LDG(uint4) PK_SIM_LDG(float2) PK_SIM_LDG(float4)
PK_SIM_LDG(longlong2) PK_SIM_LDG(ulonglong2) PK_SIM_LDG(double2) PK_SIM_LDG(__half)
PK_SIM_LDG(__nv_bfloat16)
#undef PK_SIM_LDG
}  // namespace pk_sim

template <typename T> inline T __ldg(const T *p)
{
    static_assert(pk_sim::ldg_type<T>::value, "CUDA has no __ldg overload for this type");
    pk_sim::check_aligned(p, alignof(T), "__ldg");
    T v;
    std::memcpy(static_cast<void *>(&v), p, sizeof(T));   // the alignment was checked above
    return v;
}

// ---- atomics (one OS thread runs a block's fibers, so these are plain read-modify-writes) -------

namespace pk_sim {
template <typename T, typename F> inline T atomic_rmw(T *p, F f)
{
    check_aligned(p, sizeof(T), "atomic");
    const T old = *p;
    *p = f(old);
    return old;
}
}  // namespace pk_sim
#define PK_SIM_ATOMICS(T)                                                                          \
    inline T atomicAdd(T *p, T v) { return pk_sim::atomic_rmw(p, [&](T o) { return (T)(o + v); }); } \
    inline T atomicSub(T *p, T v) { return pk_sim::atomic_rmw(p, [&](T o) { return (T)(o - v); }); } \
    inline T atomicMin(T *p, T v) { return pk_sim::atomic_rmw(p, [&](T o) { return v < o ? v : o; }); } \
    inline T atomicMax(T *p, T v) { return pk_sim::atomic_rmw(p, [&](T o) { return v > o ? v : o; }); } \
    inline T atomicExch(T *p, T v) { return pk_sim::atomic_rmw(p, [&](T) { return v; }); }        \
    inline T atomicCAS(T *p, T cmp, T v) { return pk_sim::atomic_rmw(p, [&](T o) { return o == cmp ? v : o; }); }
PK_SIM_ATOMICS(int)
PK_SIM_ATOMICS(unsigned int)
PK_SIM_ATOMICS(long long)
PK_SIM_ATOMICS(unsigned long long)
#undef PK_SIM_ATOMICS
inline float atomicAdd(float *p, float v) { return pk_sim::atomic_rmw(p, [&](float o) { return o + v; }); }
inline double atomicAdd(double *p, double v) { return pk_sim::atomic_rmw(p, [&](double o) { return o + v; }); }

// ---- the scheduler ------------------------------------------------------------------------------

namespace pk_sim {

inline std::uint64_t splitmix(std::uint64_t &s)
{
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

inline void fiber_main()
{
    Sim &s = sim();
#if PK_SIM_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &s.sched_stack_bottom, &s.sched_stack_size);
#endif
    s.body(s.body_arg);
    s.current->state = State::exited;
    for (;;) yield_to_scheduler(true);
}

// Complete every warp call whose lanes have all arrived; false when nothing could complete.
inline bool resolve_warps()
{
    Sim &s = sim();
    bool progressed = false;
    const int nthreads = (int)s.fibers.size();
    for (int w = 0; w * 32 < nthreads; ++w) {
        Fiber *lanes[32] = {};
        for (int l = 0; l < 32 && w * 32 + l < nthreads; ++l) lanes[l] = &s.fibers[w * 32 + l];
        unsigned done = 0;
        for (int l = 0; l < 32; ++l) {
            Fiber *f = lanes[l];
            if (!f || f->state != State::warp_wait || (done & (1u << l))) continue;
            const unsigned m = f->mask;
            bool ready = true;
            for (int k = 0; k < 32; ++k) {
                if (!(m & (1u << k))) continue;
                Fiber *g = lanes[k];
                if (!g || g->state == State::exited) {
                    s.current = nullptr;
                    fail("warp " + std::to_string(w) + " lane " + std::to_string(l) + " waits in " +
                         op_name(f->op) + " with mask " + hex_mask(m) + " on lane " +
                         std::to_string(k) + (g ? ", which has exited" : ", which does not exist"));
                }
                if (g->state != State::warp_wait) { ready = false; continue; }
                if (g->mask != m || g->op != f->op || g->width != f->width) {
                    s.current = nullptr;
                    fail("warp " + std::to_string(w) + ": lane " + std::to_string(l) + " waits in " +
                         op_name(f->op) + " (mask " + hex_mask(m) + ", width " +
                         std::to_string(f->width) + ") while lane " + std::to_string(k) +
                         " of that mask waits in " + op_name(g->op) + " (mask " + hex_mask(g->mask) +
                         ", width " + std::to_string(g->width) + ")");
                }
            }
            if (!ready) continue;
            // Another waiting lane whose mask names lanes of this group, but differs, would meet
            // them with a different mask (undefined behaviour in CUDA).
            for (int j = 0; j < 32; ++j) {
                Fiber *g = lanes[j];
                if (!g || g->state != State::warp_wait || g->mask == m || !(g->mask & m)) continue;
                const int k = __builtin_ctz(g->mask & m);
                s.current = nullptr;
                fail("warp " + std::to_string(w) + ": lane " + std::to_string(j) + " waits in " +
                     op_name(g->op) + " (mask " + hex_mask(g->mask) + ", width " +
                     std::to_string(g->width) + ") while lane " + std::to_string(k) +
                     " of that mask waits in " + op_name(lanes[k]->op) + " (mask " + hex_mask(m) +
                     ", width " + std::to_string(lanes[k]->width) + ")");
            }
            std::uint64_t ballot = 0;
            for (int k = 0; k < 32; ++k)
                if ((m & (1u << k)) && lanes[k]->value) ballot |= 1u << k;
            for (int k = 0; k < 32; ++k) {
                if (!(m & (1u << k))) continue;
                Fiber *g = lanes[k];
                switch (g->op) {
                case Op::shfl_idx: case Op::shfl_up: case Op::shfl_down: case Op::shfl_xor: {
                    bool in_bounds;
                    const int j = shfl_source(g->op, k, g->arg, g->width, in_bounds);
                    if (!(m & (1u << j))) {
                        s.current = nullptr;
                        fail("warp " + std::to_string(w) + " lane " + std::to_string(k) + ": " +
                             op_name(g->op) + " reads lane " + std::to_string(j) +
                             ", outside the mask " + hex_mask(m));
                    }
                    g->result = lanes[j]->value;
                    break;
                }
                case Op::ballot: g->result = ballot; break;
                case Op::any: g->result = ballot != 0; break;
                case Op::all: g->result = ballot == m; break;
                default: g->result = 0; break;
                }
            }
            for (int k = 0; k < 32; ++k)
                if (m & (1u << k)) { lanes[k]->state = State::runnable; lanes[k]->op = Op::none; }
            done |= m;
            progressed = true;
        }
    }
    return progressed;
}

inline bool resolve_block_barrier()
{
    Sim &s = sim();
    int waiting = 0, exited = 0;
    for (Fiber &f : s.fibers) {
        if (f.state == State::block_wait) ++waiting;
        else if (f.state == State::exited) ++exited;
        else return false;                         // someone is still running or in a warp call
    }
    if (!waiting) return false;
    if (exited) {
        s.current = nullptr;
        fail("__syncthreads reached by " + std::to_string(waiting) + " threads while " +
             std::to_string(exited) + " threads of the block have exited");
    }
    for (Fiber &f : s.fibers) f.state = State::runnable;
    return true;
}

inline std::string describe_waits()
{
    Sim &s = sim();
    std::string out;
    int shown = 0;
    for (Fiber &f : s.fibers) {
        if (f.state == State::exited || f.state == State::runnable) continue;
        if (shown++ == 8) { out += " ..."; break; }
        out += " [warp " + std::to_string(f.warp) + " lane " + std::to_string(f.lane) + ": " +
               (f.state == State::block_wait ? std::string("__syncthreads")
                                             : std::string(op_name(f.op)) + " mask " + hex_mask(f.mask)) + "]";
    }
    return out;
}

inline void switch_to(Fiber &f)
{
    Sim &s = sim();
    s.current = &f;
#if PK_SIM_ASAN
    __sanitizer_start_switch_fiber(&s.sched_fake_stack, f.stack, s.stack_bytes);
    swapcontext(&s.scheduler, &f.ctx);
    __sanitizer_finish_switch_fiber(s.sched_fake_stack, nullptr, nullptr);
#else
    swapcontext(&s.scheduler, &f.ctx);
#endif
    s.current = nullptr;
}

inline void run_block(uint3 block_idx)
{
    Sim &s = sim();
    s.block_idx = block_idx;
    const int n = (int)(s.block.x * s.block.y * s.block.z);
    s.fibers.assign(n, Fiber{});
    if (s.stacks.size() < (std::size_t)n * s.stack_bytes) s.stacks.resize((std::size_t)n * s.stack_bytes);
#if PK_SIM_ASAN
    // Frames of fibers abandoned by an earlier block may have left their redzones poisoned.
    __asan_unpoison_memory_region(s.stacks.data(), s.stacks.size());
#endif
    for (int t = 0; t < n; ++t) {
        Fiber &f = s.fibers[t];
        f.linear = t;
        f.tid = uint3{t % s.block.x, (t / s.block.x) % s.block.y, t / (s.block.x * s.block.y)};
        f.warp = t / 32;
        f.lane = t % 32;
        f.stack = s.stacks.data() + (std::size_t)t * s.stack_bytes;
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack;
        f.ctx.uc_stack.ss_size = s.stack_bytes;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, fiber_main, 0);
    }
    std::uint64_t rng = s.seed * 0x2545f4914f6cdd1dull + block_idx.x * 0x9e37u + block_idx.y * 0x85ebu
                      + block_idx.z;
    std::vector<int> order(n);
    for (int t = 0; t < n; ++t) order[t] = t;
    for (;;) {
        if (s.seed)                                // seed 0: thread order, else a fresh permutation
            for (int t = n - 1; t > 0; --t) std::swap(order[t], order[splitmix(rng) % (t + 1)]);
        bool ran = false;
        for (int t : order) {
            Fiber &f = s.fibers[t];
            if (f.state != State::runnable) continue;
            switch_to(f);
            ran = true;
            if (s.failed) return;
        }
        const bool released = resolve_warps() | resolve_block_barrier();
        if (s.failed) return;
        if (ran || released) continue;
        bool all_exited = true;
        for (Fiber &f : s.fibers) all_exited &= f.state == State::exited;
        if (all_exited) return;
        fail("deadlock: no thread can run;" + describe_waits());
    }
}

// ---- launching a kernel with the arguments CuPy would pass ---------------------------------------

// One kernel argument as CuPy's RawKernel marshals it: a device pointer (an ndarray), or a scalar
// of a NumPy type (kind 'i' signed, 'u' unsigned, 'f' float, 'b' bool) and its size.
struct Arg {
    char kind;
    int size;
    unsigned char bytes[8];
};

template <typename T> inline bool convert_arg(const Arg &a, int i, T &out, std::string &err)
{
    const std::string where = "argument " + std::to_string(i) + ": ";
    if constexpr (std::is_pointer<T>::value) {
        if (a.kind == 'p') { std::memcpy(&out, a.bytes, sizeof(T)); return true; }
        std::uint64_t v = 0;
        std::memcpy(&v, a.bytes, a.size < 8 ? a.size : 8);
        if ((a.kind == 'u' || a.kind == 'i') && a.size == 8 && v == 0) { out = nullptr; return true; }
        err = where + "the kernel takes a pointer; got a scalar of kind '" + std::string(1, a.kind) +
              "' and " + std::to_string(a.size) + " bytes (only a 64-bit 0 may stand for nullptr)";
        return false;
    } else {
        const bool want_float = std::is_floating_point<T>::value;
        const bool is_float = a.kind == 'f';
        if (a.kind == 'p' || want_float != is_float || (int)sizeof(T) != a.size) {
            err = where + "the kernel takes a " + std::to_string(sizeof(T)) + "-byte " +
                  (want_float ? "float" : "integer") + "; got " +
                  (a.kind == 'p' ? std::string("an array") :
                   "a " + std::to_string(a.size) + "-byte scalar of kind '" + std::string(1, a.kind) + "'");
            return false;
        }
        std::memcpy(&out, a.bytes, sizeof(T));
        return true;
    }
}

template <auto F> struct Kernel;
template <typename... A, void (*F)(A...)> struct Kernel<F> {
    using Tuple = std::tuple<std::decay_t<A>...>;
    static void body(void *args) { std::apply(F, *static_cast<Tuple *>(args)); }

    template <std::size_t... I>
    static bool unpack(const Arg *args, Tuple &t, std::string &err, std::index_sequence<I...>)
    {
        return (convert_arg(args[I], (int)I, std::get<I>(t), err) && ...);
    }

    static int launch(const Arg *args, int nargs, Tuple &t, std::string &err)
    {
        if (nargs != (int)sizeof...(A)) {
            err = "the kernel takes " + std::to_string(sizeof...(A)) + " arguments; got " +
                  std::to_string(nargs);
            return 1;
        }
        if constexpr (sizeof...(A) > 0)
            if (!unpack(args, t, err, std::index_sequence_for<A...>{})) return 1;
        return 0;
    }
};

struct Entry {
    const char *name;
    int max_threads;                               // __launch_bounds__, or 1024
    int (*launch)(const Arg *, int, dim3, dim3, std::uint64_t, char *, int);
};

inline int run_grid(dim3 grid, dim3 block, std::uint64_t seed, int max_threads, void (*body)(void *),
                    void *arg, char *err, int err_len)
{
    Sim &s = sim();
    s.failed = false;
    s.error.clear();
    s.current = nullptr;
    const unsigned long long threads = 1ull * block.x * block.y * block.z;
    std::string bad;
    if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z)
        bad = "a grid or block dimension is 0";
    else if (grid.x > 0x7fffffffu || grid.y > 65535u || grid.z > 65535u)
        bad = "grid dimensions exceed (2^31 - 1, 65535, 65535)";
    else if (block.x > 1024 || block.y > 1024 || block.z > 64 || threads > 1024)
        bad = "block dimensions exceed (1024, 1024, 64) or 1024 threads";
    else if ((long long)threads > max_threads)
        bad = std::to_string(threads) + " threads per block exceed the kernel's __launch_bounds__(" +
              std::to_string(max_threads) + ")";
    if (!bad.empty()) {
        std::snprintf(err, err_len, "invalid launch configuration grid (%u,%u,%u) block (%u,%u,%u): %s",
                      grid.x, grid.y, grid.z, block.x, block.y, block.z, bad.c_str());
        return 1;
    }
    s.grid = grid;
    s.block = block;
    s.seed = seed;
    s.body = body;
    s.body_arg = arg;
    s.stack_bytes = PK_SIM_ASAN ? (256u << 10) : (64u << 10);
    // Blocks in an order permuted by the seed (seed 0: in order).
    const unsigned long long nblocks = 1ull * grid.x * grid.y * grid.z;
    std::vector<unsigned long long> blocks(nblocks);
    for (unsigned long long k = 0; k < nblocks; ++k) blocks[k] = k;
    std::uint64_t rng = seed ^ 0xa0761d6478bd642full;
    if (seed)
        for (unsigned long long k = nblocks - 1; k > 0; --k) std::swap(blocks[k], blocks[splitmix(rng) % (k + 1)]);
    try {
        for (unsigned long long b : blocks) {
            run_block(uint3{(unsigned)(b % grid.x), (unsigned)((b / grid.x) % grid.y),
                            (unsigned)(b / (1ull * grid.x * grid.y))});
            if (s.failed) break;
        }
    } catch (const Failure &) {
    }
    if (s.failed) {
        std::snprintf(err, err_len, "%s", s.error.c_str());
        return 2;
    }
    return 0;
}

template <auto F> inline int launch_entry(const Arg *args, int nargs, dim3 grid, dim3 block,
                                          std::uint64_t seed, char *err, int err_len, int max_threads)
{
    typename Kernel<F>::Tuple t{};
    std::string e;
    if (Kernel<F>::launch(args, nargs, t, e)) {
        std::snprintf(err, err_len, "%s", e.c_str());
        return 1;
    }
    return run_grid(grid, block, seed, max_threads, &Kernel<F>::body, &t, err, err_len);
}

}  // namespace pk_sim

#endif  // PK_CUDA_SIM_H
