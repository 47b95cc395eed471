// Kernels that check the warp simulator itself (tests/test_cuda_sim.py): shuffle semantics, the
// rules it enforces, shared memory and barriers, atomics, the fp16 conversions, alignment.
typedef unsigned short u16;

// op 0..3: __shfl_sync, __shfl_up_sync, __shfl_down_sync, __shfl_xor_sync, on every lane with
// its own srcLane / delta / laneMask args[t]; value = 1000 * t + 7.
__global__ void sim_shuffle(int op, int width, const int *args, int *out)
{
    const int t = threadIdx.x;
    const int v = 1000 * t + 7;
    int r = 0;
    if (op == 0) r = __shfl_sync(0xffffffffu, v, args[t], width);
    if (op == 1) r = __shfl_up_sync(0xffffffffu, v, (unsigned)args[t], width);
    if (op == 2) r = __shfl_down_sync(0xffffffffu, v, (unsigned)args[t], width);
    if (op == 3) r = __shfl_xor_sync(0xffffffffu, v, args[t], width);
    out[t] = r;
}

// 64-bit and float shuffles keep every bit.
__global__ void sim_shuffle_wide(const long long *a, const float *f, long long *ao, float *fo)
{
    const int t = threadIdx.x;
    ao[t] = __shfl_sync(0xffffffffu, a[t], 31 - (t & 31));
    fo[t] = __shfl_xor_sync(0xffffffffu, f[t], 1);
}

// Only the lanes in mask call; each reads srcLane args[t] with the given width.
__global__ void sim_shuffle_masked(unsigned mask, int width, const int *args, int *out)
{
    const int t = threadIdx.x;
    if ((mask >> (t & 31)) & 1u) out[t] = __shfl_sync(mask, 1000 * t + 7, args[t], width);
}

__global__ void sim_ballot(const int *pred, unsigned *ballot, int *any, int *all)
{
    const int t = threadIdx.x;
    ballot[t] = __ballot_sync(0xffffffffu, pred[t]);
    any[t] = __any_sync(0xffffffffu, pred[t]);
    all[t] = __all_sync(0xffffffffu, pred[t]);
}

// The rules.  case 0: a mask that leaves the caller out;  1: a lane exits before __syncwarp;
// 2: lanes meet with different masks;  3: deadlock (__syncthreads against __syncwarp);
// 4: __syncthreads after some threads returned;  5: a width that is not a power of two;
// 6: a shuffle width of 32 inside groups of 16 that each pass only their half as the mask.
__global__ void sim_violation(int which, int *out)
{
    const int t = threadIdx.x;
    if (which == 0) out[t] = __shfl_sync(0xfffffffeu, t, 0);
    if (which == 1) {
        if (t == 5) return;
        __syncwarp();
    }
    if (which == 2) __syncwarp((t & 31) < 16 ? 0x0000ffffu : 0xffffffffu);
    if (which == 3) {
        if (t == 0) __syncthreads();
        else __syncwarp();
    }
    if (which == 4) {
        if (t >= 32) return;
        __syncthreads();
    }
    if (which == 5) out[t] = __shfl_sync(0xffffffffu, t, 0, 12);
    if (which == 6) {
        const unsigned half = (t & 31) < 16 ? 0x0000ffffu : 0xffff0000u;
        out[t] = __shfl_sync(half, t, (t + 8) & 31, 32);
    }
    out[t] = 1;
}

// Shared memory, a barrier and a race.  reverse: out[t] = in[blockDim - 1 - t] through shared
// memory; race: every thread writes its index to out[0], whose final value depends on order.
__global__ void sim_shared_reverse(const int *in, int *out)
{
    __shared__ int buf[1024];
    const int t = threadIdx.x;
    buf[t] = in[blockIdx.x * blockDim.x + t];
    __syncthreads();
    out[blockIdx.x * blockDim.x + t] = buf[blockDim.x - 1 - t];
}

__global__ void sim_race(int *out)
{
    out[0] = blockIdx.x * blockDim.x + threadIdx.x;
}

__global__ void sim_atomics(unsigned long long *mn, int *count, float *sum)
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    atomicMin(mn, (unsigned long long)(1000 - t % 977));
    atomicAdd(count, 1);
    atomicAdd(sum, 0.5f);
}

// The hardware conversions (inline PTX, substituted by the harness).
__global__ void sim_cvt(const u16 *h, float *f, const float *x, u16 *hx, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float r;
        asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h[i]));
        f[i] = r;
        u16 q;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(q) : "f"(x[i]));
        hx[i] = q;
    }
}

// Alignment: case 0 an __ldg of a float4 at p + offset floats; 1 a float4 store there.
__global__ void sim_align(int which, const float *p, float *q, int offset)
{
    if (which == 0) q[0] = __ldg(reinterpret_cast<const float4 *>(p + offset)).x;
    if (which == 1) *reinterpret_cast<float4 *>(q + offset) = make_float4(1.0f, 2.0f, 3.0f, 4.0f);
}

// Reads p[n], one element past an n-element array (AddressSanitizer must report it).
__global__ void sim_read_past(const float *p, int n, float *out)
{
    out[0] = p[n];
}

__global__ void __launch_bounds__(64) sim_bounded(int *out)
{
    out[threadIdx.x] = threadIdx.x;
}

// Geometry: every thread writes its linear id at its global index.
__global__ void sim_geometry(int *out)
{
    const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    out[b * blockDim.x * blockDim.y * blockDim.z + t] = b * 10000 + t;
}
