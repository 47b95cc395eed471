// Calls PyTorch's SVE embedding-bag kernel (caffe2/perfkernels/embedding_lookup_idx_sve.cc,
// compiled out of tree by benchmarks/arm_pytorch_sve_count.sh; nothing of it is kept here) the
// way tests/emulated/arm_driver.c's `bench` mode calls ours, so QEMU can count both the same way.
//
//   pytorch_sve_driver LEVEL KIND D ROWS
//
// LEVEL sve: one call; none: the same setup, no call; check: one call, then compare with a
// float64 sum (exit 1 when off).  KIND f32: float32 rows; q8: 8-bit rows (D uint8 codes a row;
// PyTorch's kernel takes each row's float scale and bias from a separate scale_bias array of two
// floats a row).  One bag of ROWS random rows of a 4096-row table, int64 indices, unweighted
// sum, no mean.  As in arm_driver's bench, the tables are zero-filled (calloc) unless LEVEL is
// check, so the emulator does not trace a fill of the whole table; the kernel's instructions do
// not depend on the values.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace caffe2 {
// the signatures of the generated file's non-template entry points
bool EmbeddingLookupIdx_int64_t_float_float_false__sve(
    int64_t block_size, int64_t output_size, int64_t index_size, int64_t data_size,
    const float* input, const int64_t* indices, const int64_t* offsets, const float* weights,
    const float* scale_bias, bool normalize_by_lengths, float* out);
bool EmbeddingLookupIdx_int64_t_uint8_t_float_false__sve(
    int64_t block_size, int64_t output_size, int64_t index_size, int64_t data_size,
    const uint8_t* input, const int64_t* indices, const int64_t* offsets, const float* weights,
    const float* scale_bias, bool normalize_by_lengths, float* out);
}  // namespace caffe2

static uint64_t state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd() {  // xorshift64*
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545f4914f6cdd1dull;
}

int main(int argc, char** argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: %s sve|none|check f32|q8 D ROWS\n", argv[0]);
        return 2;
    }
    enum { TABLE_ROWS = 4096 };
    const char* level = argv[1];
    const bool q8 = std::strcmp(argv[2], "q8") == 0;
    const int64_t dim = std::atoll(argv[3]), n = std::atoll(argv[4]);
    const bool call = std::strcmp(level, "none") != 0, check = std::strcmp(level, "check") == 0;
    int64_t* idx = static_cast<int64_t*>(std::malloc(static_cast<size_t>(n) * 8));
    const int64_t offsets[2] = {0, n};
    for (int64_t j = 0; j < n; j++) idx[j] = static_cast<int64_t>(rnd() % TABLE_ROWS);
    float* out = static_cast<float*>(std::calloc(static_cast<size_t>(dim), 4));
    const size_t cells = static_cast<size_t>(TABLE_ROWS) * static_cast<size_t>(dim);
    float* f = nullptr;
    uint8_t* codes = nullptr;
    float* sb = nullptr;
    bool ok = true;
    if (!q8) {
        f = static_cast<float*>(std::calloc(cells, 4));
        for (size_t c = 0; check && c < cells; c++) f[c] = static_cast<float>(rnd() % 2001) / 1000.0f - 1.0f;
        if (call)
            ok = caffe2::EmbeddingLookupIdx_int64_t_float_float_false__sve(
                dim, 1, n, TABLE_ROWS, f, idx, offsets, nullptr, nullptr, false, out);
    } else {
        codes = static_cast<uint8_t*>(std::calloc(cells, 1));
        sb = static_cast<float*>(std::calloc(TABLE_ROWS * 2, 4));
        for (size_t c = 0; check && c < cells; c++) codes[c] = static_cast<uint8_t>(rnd());
        for (int r = 0; check && r < TABLE_ROWS; r++) {
            sb[2 * r] = static_cast<float>(rnd() % 1000 + 1) / 100000.0f;       // scale
            sb[2 * r + 1] = static_cast<float>(rnd() % 2001) / 1000.0f - 1.0f;  // bias
        }
        if (call)
            ok = caffe2::EmbeddingLookupIdx_int64_t_uint8_t_float_false__sve(
                dim, 1, n, TABLE_ROWS, codes, idx, offsets, nullptr, sb, false, out);
    }
    int bad = !ok;
    if (check) {
        double worst = 0;
        for (int64_t d = 0; d < dim; d++) {
            double want = 0, mag = 0;
            for (int64_t j = 0; j < n; j++) {
                const size_t at = static_cast<size_t>(idx[j]) * static_cast<size_t>(dim) + d;
                const double v = q8 ? sb[2 * idx[j]] * static_cast<double>(codes[at]) + sb[2 * idx[j] + 1]
                                    : static_cast<double>(f[at]);
                want += v;
                mag += std::fabs(v);
            }
            const double err = std::fabs(out[d] - want) / (mag > 1 ? mag : 1);
            if (err > worst) worst = err;
        }
        bad |= !(worst < 1e-5);
        std::printf("check %s D=%lld rows=%lld: kernel %s, worst error %.3g of the rows' sum of |x|\n",
                    argv[2], static_cast<long long>(dim), static_cast<long long>(n), ok ? "ok" : "FAILED",
                    worst);
    }
    std::printf("bench pytorch-%s %s D=%lld rows=%lld status %d\n", level, argv[2],
                static_cast<long long>(dim), static_cast<long long>(n), bad);
    return bad;
}
