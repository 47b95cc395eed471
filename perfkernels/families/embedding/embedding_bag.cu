// perfkernels CUDA: embedding bags on float32 / float16 / bfloat16 tables and on row-wise quantized
// tables (8-bit with fp32 scale+bias, 4- and 2-bit with fp16 scale+bias), as docs/semantics.md
// describes.
//
// Two launches per call, in stream order:
//   pk_bags_prepare   checks every index with one unsigned compare, turns offsets / lengths into
//                     num_bags + 1 bag starts and checks them; the smallest bad position of each
//                     kind goes to errors[0..2] (atomicMin), which the host reads to raise.
//   pk_embedding_bag  returns at once if prepare found any error (so out is never written then),
//                     else: a group of LANES threads (a warp or part of one) per bag; the group
//                     loads LANES indices (and weights) cooperatively, broadcasts them with
//                     __shfl_sync, keeps U rows of W-byte loads in flight per lane and accumulates
//                     in fp32 registers.  Each lane owns VPL loads of every row; gridDim.y splits
//                     rows wider than LANES * VPL loads into column chunks.
// Specialised by template on the table format, the load width W, the index type, LANES and VPL
// (the host picks W, LANES and VPL from D and the table's alignment).
#include "pk_common.cuh"

enum { PK_F32 = 0, PK_F16 = 1, PK_BF16 = 2, PK_Q8 = 3, PK_Q4 = 4, PK_Q2 = 5 };

template <int FMT> struct pk_format;
template <> struct pk_format<PK_F32>  { enum { bits = 32, quantized = 0 }; };
template <> struct pk_format<PK_F16>  { enum { bits = 16, quantized = 0 }; };
template <> struct pk_format<PK_BF16> { enum { bits = 16, quantized = 0 }; };
template <> struct pk_format<PK_Q8>   { enum { bits = 8,  quantized = 1 }; };
template <> struct pk_format<PK_Q4>   { enum { bits = 4,  quantized = 1 }; };
template <> struct pk_format<PK_Q2>   { enum { bits = 2,  quantized = 1 }; };

// Element e (0 <= e < W * 8 / bits) of a loaded unit, as a float (codes as their integer value).
template <int FMT, int W>
__device__ __forceinline__ float pk_element(const pk_raw<W> &r, int e)
{
    constexpr int bits = pk_format<FMT>::bits;
    const pk_u32 word = r.w[(e * bits) / 32];
    const int shift = (e * bits) % 32;
    if (FMT == PK_F32) return __uint_as_float(word);
    if (FMT == PK_F16) return pk_half_to_float((pk_u16)(word >> shift));
    if (FMT == PK_BF16) return pk_bf16_to_float((pk_u16)(word >> shift));
    return (float)((word >> shift) & ((1u << (bits % 32)) - 1u));
}

// Scale and bias stored after a quantized row's codes (little-endian, at byte meta_off).
// ALIGNED: the host chose W >= 4, which implies meta_off and the row are 4-byte aligned.
template <int FMT, bool ALIGNED>
__device__ __forceinline__ void pk_scale_bias(const pk_u8 *row, int meta_off, float &scale, float &bias)
{
    const pk_u8 *p = row + meta_off;
    if (FMT == PK_Q8) {
        if (ALIGNED) {
            scale = __ldg(reinterpret_cast<const float *>(p));
            bias = __ldg(reinterpret_cast<const float *>(p) + 1);
        } else {
            scale = __uint_as_float(pk_load_u32_unaligned(p));
            bias = __uint_as_float(pk_load_u32_unaligned(p + 4));
        }
    } else {
        pk_u32 both = ALIGNED ? __ldg(reinterpret_cast<const unsigned int *>(p))
                              : pk_load_u32_unaligned(p);
        scale = pk_half_to_float((pk_u16)(both & 0xffffu));
        bias = pk_half_to_float((pk_u16)(both >> 16));
    }
}

template <typename Idx, typename Off>
__global__ void pk_bags_prepare(const Idx *__restrict__ indices, pk_i64 n, pk_i64 rows,
                                const Off *__restrict__ offsets, int offsets_mode, pk_i64 num_bags,
                                pk_i64 *__restrict__ starts, pk_i64 positional_weights,
                                pk_u64 *__restrict__ errors)
{
    // offsets_mode 0: no offsets (2-D indices, nothing to check but the indices);
    // 1: offsets[num_bags], the last bag ends at n;  2: offsets[num_bags + 1], last must be n;
    // 3: offsets is the inclusive cumulative sum of lengths[num_bags], total must be n.
    const pk_i64 total = offsets_mode ? (n > num_bags + 1 ? n : num_bags + 1) : n;
    const pk_i64 step = (pk_i64)gridDim.x * blockDim.x;
    for (pk_i64 i = (pk_i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        if (i < n && (pk_u64)(pk_i64)indices[i] >= (pk_u64)rows) pk_report(&errors[0], i);
        if (offsets_mode == 0 || i > num_bags) continue;
        pk_i64 s, prev = 0;
        if (offsets_mode == 1) {
            s = i < num_bags ? (pk_i64)offsets[i] : n;
            if (i > 0) prev = (pk_i64)offsets[i - 1];
        } else if (offsets_mode == 2) {
            s = (pk_i64)offsets[i];
            if (i > 0) prev = (pk_i64)offsets[i - 1];
        } else {
            s = i > 0 ? (pk_i64)offsets[i - 1] : 0;
            if (i > 1) prev = (pk_i64)offsets[i - 2];
        }
        starts[i] = s;
        bool bad = (i == 0 && s != 0) || (i > 0 && s < prev) || (i == num_bags && s != n);
        if (bad) pk_report(&errors[1], i);
        if (i > 0 && positional_weights >= 0 && s - prev > positional_weights)
            pk_report(&errors[2], i - 1);
    }
}

template <int FMT, int W, typename Idx, int LANES, int VPL>
__global__ void __launch_bounds__(256)
pk_embedding_bag(const pk_u8 *__restrict__ table, pk_i64 rows, pk_i64 row_stride, int dim,
                 int meta_off, const Idx *__restrict__ indices, const pk_i64 *__restrict__ starts,
                 pk_i64 fixed_len, pk_i64 num_bags, const float *__restrict__ weights,
                 int weight_mode, int mean, pk_i64 padding_idx, float *__restrict__ out,
                 pk_i64 out_stride, int out_vec, const pk_u64 *__restrict__ errors)
{
    constexpr int E = W * 8 / pk_format<FMT>::bits;       // elements per load
    constexpr int U = VPL >= 8 ? 1 : 8 / VPL;              // rows in flight per lane
    constexpr bool Q = pk_format<FMT>::quantized;

    if (errors[0] != PK_NO_ERROR || errors[1] != PK_NO_ERROR || errors[2] != PK_NO_ERROR) return;
    const pk_i64 bag = ((pk_i64)blockIdx.x * blockDim.x + threadIdx.x) / LANES;
    if (bag >= num_bags) return;                           // whole groups leave together
    const int lane = threadIdx.x & (LANES - 1);
    const unsigned mask = LANES == 32 ? 0xffffffffu
                                      : ((1u << LANES) - 1u) << ((threadIdx.x & 31) & ~(LANES - 1));
    const int n_units = (dim + E - 1) / E;
    const int unit0 = blockIdx.y * (LANES * VPL) + lane;

    pk_i64 start, end;
    if (starts) { start = starts[bag]; end = starts[bag + 1]; }
    else { start = bag * fixed_len; end = start + fixed_len; }

    float acc[VPL][E];
#pragma unroll
    for (int v = 0; v < VPL; ++v)
#pragma unroll
        for (int e = 0; e < E; ++e) acc[v][e] = 0.0f;
    int count = 0;

    for (pk_i64 base = start; base < end; base += LANES) {
        const pk_i64 j = base + lane;
        pk_i64 my_idx = -1;
        float my_w = 1.0f;
        if (j < end) {
            my_idx = (pk_i64)indices[j];
            if (weight_mode == 1) my_w = weights[j];
            else if (weight_mode == 2) my_w = weights[j - start];
        }
        const int n_here = (int)(end - base < LANES ? end - base : LANES);
        for (int k = 0; k < n_here; k += U) {
            pk_raw<W> raw[U][VPL];
            float w[U], scale[U], bias[U];
            bool use[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int src = (k + u) & (LANES - 1);
                const pk_i64 idx = __shfl_sync(mask, my_idx, src, LANES);
                w[u] = __shfl_sync(mask, my_w, src, LANES);
                use[u] = k + u < n_here && idx != padding_idx && (pk_u64)idx < (pk_u64)rows;
                const pk_u8 *row = table + (use[u] ? idx : 0) * row_stride;
                scale[u] = 1.0f;
                bias[u] = 0.0f;
                if (Q && use[u]) pk_scale_bias<FMT, (W >= 4)>(row, meta_off, scale[u], bias[u]);
#pragma unroll
                for (int v = 0; v < VPL; ++v) {
                    const int unit = unit0 + v * LANES;
#pragma unroll
                    for (int q = 0; q < (W >= 4 ? W / 4 : 1); ++q) raw[u][v].w[q] = 0u;
                    if (use[u] && unit < n_units) raw[u][v] = pk_load<W>(row + (pk_i64)unit * W);
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (!use[u]) continue;
                ++count;
                const float a = Q ? w[u] * scale[u] : w[u];
                const float b = w[u] * bias[u];
#pragma unroll
                for (int v = 0; v < VPL; ++v)
#pragma unroll
                    for (int e = 0; e < E; ++e) {
                        float x = pk_element<FMT, W>(raw[u][v], e);
                        acc[v][e] = Q ? fmaf(a, x, acc[v][e] + b) : fmaf(a, x, acc[v][e]);
                    }
            }
        }
    }

    const float inv = (mean && count > 0) ? 1.0f / (float)count : 1.0f;
    float *orow = out + bag * out_stride;
#pragma unroll
    for (int v = 0; v < VPL; ++v) {
        const int unit = unit0 + v * LANES;
        if (unit >= n_units) continue;
        const int col0 = unit * E;
        if ((E % 4) == 0 && out_vec && col0 + E <= dim) {
#pragma unroll
            for (int e = 0; e < E; e += 4)
                *reinterpret_cast<float4 *>(orow + col0 + e) =
                    make_float4(acc[v][e] * inv, acc[v][e + 1] * inv, acc[v][e + 2] * inv, acc[v][e + 3] * inv);
        } else {
#pragma unroll
            for (int e = 0; e < E; ++e)
                if (col0 + e < dim) orow[col0 + e] = mean ? acc[v][e] * inv : acc[v][e];
        }
    }
}
