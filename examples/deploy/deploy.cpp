// Run an exported model that calls perfkernels' ops from C++, without Python.
//
//   deploy LIBRARY MODEL INPUTS [--expected FILE] [--bench N] [--threads T]
//          [--bad-index | --bad-dtype]
//
// LIBRARY: perfkernels' native torch library (perfkernels.torch.native_library_path()), loaded
// with dlopen before the model: loading it registers the ops perfkernels::* with torch's
// dispatcher.  MODEL: an AOTInductor package (.pt2, run with AOTIModelPackageLoader) or a
// TorchScript file (.ts / .pt, run with torch::jit::load).  INPUTS (and --expected): tensors in
// the raw format of export.py.  Prints the output's values, the largest difference from
// --expected, and with --bench N the p50 / p90 / p99 of N calls.  --bad-index sets the first index to
// a value past every table, --bad-dtype makes the first index tensor float32; either shows the
// exception the model's call raises, then the one perfkernels::embedding_bag raises when called
// directly through torch's dispatcher with that bad index tensor ("c10::Error: MESSAGE" or
// "std::exception: MESSAGE"), and exits 0 when both were caught.
//
// Build (docs/deployment.md):
//   T=$(python -c 'import torch, os; print(os.path.dirname(torch.__file__))')
//   g++ -std=c++17 -O2 -D_GLIBCXX_USE_CXX11_ABI=1 deploy.cpp -o deploy \
//       -I$T/include -I$T/include/torch/csrc/api/include -L$T/lib \
//       -Wl,-rpath,$T/lib -ltorch -ltorch_cpu -lc10 -ldl
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/script.h>

namespace {

std::vector<at::Tensor> read_tensors(const std::string &path)
{
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open " + path);
    auto get = [&](void *p, size_t n) {
        if (!f.read(static_cast<char *>(p), (std::streamsize)n))
            throw std::runtime_error("truncated file " + path);
    };
    int32_t count = 0;
    get(&count, 4);
    std::vector<at::Tensor> out;
    for (int32_t i = 0; i < count; i++) {
        int32_t code = 0, ndim = 0;
        get(&code, 4);
        get(&ndim, 4);
        std::vector<int64_t> sizes((size_t)ndim);
        get(sizes.data(), sizes.size() * 8);
        at::Tensor t = at::empty(sizes, code == 0 ? at::kFloat : at::kLong);
        get(t.data_ptr(), t.nbytes());
        out.push_back(t);
    }
    return out;
}

struct Model {
    virtual ~Model() = default;
    virtual std::vector<at::Tensor> run(const std::vector<at::Tensor> &inputs) = 0;
};

struct Package : Model {
    torch::inductor::AOTIModelPackageLoader loader;
    explicit Package(const std::string &path) : loader(path) {}
    std::vector<at::Tensor> run(const std::vector<at::Tensor> &inputs) override
    {
        return loader.run(inputs);
    }
};

struct Script : Model {
    torch::jit::Module module;
    explicit Script(const std::string &path) : module(torch::jit::load(path)) { module.eval(); }
    std::vector<at::Tensor> run(const std::vector<at::Tensor> &inputs) override
    {
        std::vector<c10::IValue> args(inputs.begin(), inputs.end());
        return {module.forward(args).toTensor()};
    }
};

bool ends_with(const std::string &s, const std::string &end)
{
    return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

// Runs `call`, which must throw; prints what it threw after `label`.  A bad input to
// perfkernels' ops throws c10::Error (what TORCH_CHECK throws), or std::runtime_error where the
// library found no libc10 to throw it with; both derive from std::exception.
template <class F>
bool show_exception(const char *label, F call)
{
    try {
        call();
        std::printf("%s: no exception\n", label);
        return false;
    } catch (const c10::Error &e) {
        std::printf("%s: c10::Error: %s\n", label, e.what_without_backtrace());
    } catch (const std::exception &e) {
        std::printf("%s: std::exception: %s\n", label, e.what());
    }
    return true;
}

}  // namespace

int main(int argc, char **argv)
{
    if (argc < 4) {
        std::fprintf(stderr, "usage: %s LIBRARY MODEL INPUTS [--expected FILE] [--bench N] "
                             "[--threads T] [--bad-index | --bad-dtype]\n", argv[0]);
        return 2;
    }
    std::string expected_path;
    int bench = 0, threads = 0;
    bool bad_index = false, bad_dtype = false;
    for (int i = 4; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--expected" && i + 1 < argc) expected_path = argv[++i];
        else if (a == "--bench" && i + 1 < argc) bench = std::atoi(argv[++i]);
        else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
        else if (a == "--bad-index") bad_index = true;
        else if (a == "--bad-dtype") bad_dtype = true;
        else { std::fprintf(stderr, "unknown argument %s\n", a.c_str()); return 2; }
    }
    if (threads > 0) at::set_num_threads(threads);

    // 1. perfkernels' ops: libtorch is already loaded (this program links it), so the library
    //    finds torch's stable C functions and registers the ops as it loads.
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) { std::fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
    auto status = reinterpret_cast<const char *(*)()>(dlsym(lib, "pk_native_status"));
    if (status && *status()) { std::fprintf(stderr, "perfkernels: %s\n", status()); return 1; }

    // 2. the model
    const std::string path = argv[2];
    std::unique_ptr<Model> model;
    if (ends_with(path, ".pt2")) model = std::make_unique<Package>(path);
    else model = std::make_unique<Script>(path);
    std::vector<at::Tensor> inputs = read_tensors(argv[3]);

    if (bad_index || bad_dtype) {
        // inputs: dense, then the 26 index tensors, then the 26 offset tensors
        if (bad_index) {
            inputs[1] = inputs[1].clone();
            inputs[1].data_ptr<int64_t>()[0] = 1000000000;
        } else {
            inputs[1] = inputs[1].to(at::kFloat);
        }
        const bool model_threw = show_exception("model", [&] { model->run(inputs); });
        // the op itself, called as any C++ code calls an op, with the first table's size
        const c10::OperatorHandle op =
            c10::Dispatcher::singleton().findSchemaOrThrow("perfkernels::embedding_bag", "");
        const bool op_threw = show_exception("op", [&] {
            torch::jit::Stack stack{at::zeros({1000, 4}), inputs[1], inputs[1 + 26].clone(),
                                    c10::IValue(), std::string("sum"), false, c10::IValue()};
            op.callBoxed(&stack);
        });
        return model_threw && op_threw ? 0 : 1;
    }

    std::vector<at::Tensor> out = model->run(inputs);
    at::Tensor y = out.at(0).contiguous();
    std::printf("output %s:", c10::str(y.sizes()).c_str());
    for (int64_t i = 0; i < std::min<int64_t>(y.numel(), 8); i++)
        std::printf(" %.9g", y.data_ptr<float>()[i]);
    std::printf("\n");
    if (!expected_path.empty()) {
        at::Tensor want = read_tensors(expected_path).at(0);
        std::printf("max_abs_diff %.3g\n", (y - want.reshape(y.sizes())).abs().max().item<double>());
    }
    if (bench > 0) {
        std::vector<double> us;
        for (int i = 0; i < bench; i++) {
            const auto t0 = std::chrono::steady_clock::now();
            model->run(inputs);
            us.push_back(std::chrono::duration<double, std::micro>(
                std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(us.begin(), us.end());
        std::printf("p50_us %.1f p90_us %.1f p99_us %.1f\n", us[us.size() / 2],
                    us[us.size() * 9 / 10], us[us.size() * 99 / 100]);
    }
    return 0;
}
