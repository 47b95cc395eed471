// perfkernels CUDA: the LSTM unit, forward and backward (caffe2 LSTMUnit / LSTMUnitGradient;
// docs/semantics.md).  One thread per (row, column) element; consecutive threads take consecutive
// columns, so every access to h, c and each gate block is coalesced.  float32 throughout.
//
// sigmoid(x) = 1 / (1 + exp(-x)) with CUDA's expf (max error 2 ulp): exp overflows to inf for
// x < -88.7 and the quotient is then exactly 0, never NaN.  tanh is CUDA's tanhf (max error 2 ulp),
// no 2*sigmoid(2x) - 1 cancellation near 0.  Nothing is built with fast-math.
#include "pk_common.cuh"

__device__ __forceinline__ float pk_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// gate_order 0 (caffe2): i, f, o, g;  1 (PyTorch LSTMCell): i, f, g, o.  Block offsets in [0, 4).
__device__ __forceinline__ int pk_o_block(int gate_order) { return gate_order == 0 ? 2 : 3; }
__device__ __forceinline__ int pk_g_block(int gate_order) { return gate_order == 0 ? 3 : 2; }

__device__ __forceinline__ bool pk_row_valid(const pk_i64 *seq_lengths, pk_i64 row, pk_i64 t)
{
    return seq_lengths == nullptr || t < seq_lengths[row];
}

__global__ void pk_lstm_forward(const float *__restrict__ h_prev, const float *__restrict__ c_prev,
                                const float *__restrict__ gates, const pk_i64 *__restrict__ seq_lengths,
                                pk_i64 t, float forget_bias, int drop_states, int gate_order,
                                pk_i64 n, pk_i64 d, float *__restrict__ h, float *__restrict__ c)
{
    const pk_i64 total = n * d, step = (pk_i64)gridDim.x * blockDim.x;
    for (pk_i64 k = (pk_i64)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += step) {
        const pk_i64 row = k / d, col = k - row * d;
        if (!pk_row_valid(seq_lengths, row, t)) {
            h[k] = drop_states ? 0.0f : h_prev[k];
            c[k] = drop_states ? 0.0f : c_prev[k];
            continue;
        }
        const float *gr = gates + row * 4 * d + col;
        const float i = pk_sigmoid(gr[0]);
        const float f = pk_sigmoid(gr[d] + forget_bias);
        const float o = pk_sigmoid(gr[pk_o_block(gate_order) * d]);
        const float g = tanhf(gr[pk_g_block(gate_order) * d]);
        const float cn = f * c_prev[k] + i * g;
        c[k] = cn;
        h[k] = o * tanhf(cn);
    }
}

__global__ void pk_lstm_backward(const float *__restrict__ c_prev, const float *__restrict__ gates,
                                 const float *__restrict__ c, const float *__restrict__ dh,
                                 const float *__restrict__ dc, const pk_i64 *__restrict__ seq_lengths,
                                 pk_i64 t, float forget_bias, int drop_states, int gate_order,
                                 pk_i64 n, pk_i64 d, float *__restrict__ dh_prev,
                                 float *__restrict__ dc_prev, float *__restrict__ dgates)
{
    const pk_i64 total = n * d, step = (pk_i64)gridDim.x * blockDim.x;
    const int ob = pk_o_block(gate_order), gb = pk_g_block(gate_order);
    for (pk_i64 k = (pk_i64)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += step) {
        const pk_i64 row = k / d, col = k - row * d;
        const float *gr = gates + row * 4 * d + col;
        float *dgr = dgates + row * 4 * d + col;
        if (!pk_row_valid(seq_lengths, row, t)) {
            dgr[0] = 0.0f; dgr[d] = 0.0f; dgr[2 * d] = 0.0f; dgr[3 * d] = 0.0f;
            dh_prev[k] = drop_states ? 0.0f : dh[k];
            dc_prev[k] = drop_states ? 0.0f : dc[k];
            continue;
        }
        const float i = pk_sigmoid(gr[0]);
        const float f = pk_sigmoid(gr[d] + forget_bias);
        const float o = pk_sigmoid(gr[ob * d]);
        const float g = tanhf(gr[gb * d]);
        const float tc = tanhf(c[k]);
        const float dhk = dh[k];
        const float dct = dc[k] + dhk * o * (1.0f - tc * tc);
        dc_prev[k] = dct * f;
        dh_prev[k] = 0.0f;
        dgr[0] = dct * g * i * (1.0f - i);
        dgr[d] = dct * c_prev[k] * f * (1.0f - f);
        dgr[ob * d] = dhk * tc * o * (1.0f - o);
        dgr[gb * d] = dct * i * (1.0f - g * g);
    }
}
