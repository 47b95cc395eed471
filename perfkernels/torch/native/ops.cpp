/* perfkernels' torch ops, registered from native code on PyTorch's stable C ABI.
 *
 * Loading this library (torch.ops.load_library from Python, or dlopen from a C++ program that
 * already has libtorch_cpu) defines the ops of the namespace `perfkernels` and registers their
 * CPU kernels, so a graph that calls them (torch.compile, torch.export, an AOTInductor package, a
 * traced TorchScript model) runs without Python.  Fake (meta) kernels and autograd formulas are
 * registered by perfkernels.torch from Python: they are only needed while tracing or training.
 *
 * The kernels are the package's own C kernels (embedding and quantized families, compiled into
 * this library at every ISA level, picked at load time from the CPU's features); the bag
 * splitter of common/bags_parallel.h runs them on torch's intra-op thread pool.  Every argument
 * is checked before a kernel runs; a bad one calls fail() (torch_api.h) with a message naming it,
 * and the op's entry (guarded()) raises a c10::Error carrying that message, as TORCH_CHECK does
 * (std::runtime_error where the process's libc10 lacks the function that throws it); RuntimeError
 * in Python either way.
 * An index out of range is found by the kernel before its row is read and reported with its
 * flattened position and value; the half-written result is dropped.
 */
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "torch_api.h"

extern "C" {
#include "common/bags_call.h"
#include "perfkernels/cpu.h"
#include "perfkernels/lstm.h"
#include "multi/fused.h"
#include "perfkernels/interaction.h"
#include "perfkernels/sequence.h"
#include "perfkernels/training.h"
}

/* pk_level_requires[isa]: the CPU features (cpu_features() names) each ISA level needs at run
 * time, NULL-terminated; written by the build from perfkernels/_registry.py */
#include "native/levels.h"

using namespace pk_torch;

namespace {

/* ------------------------------------------------------------------ ISA level and thread pool */

std::atomic<int> g_isa{0};

int best_isa()
{
    const uint64_t have = pk_cpu_detect();
    auto has = [&](const char *name) {
        for (int f = 0; f < PK_CPU_FEATURE_COUNT; f++)
            if (std::strcmp(pk_cpu_feature_name(f), name) == 0) return ((have >> f) & 1u) != 0;
        return false;
    };
    int best = 0;
    for (int isa = 0; isa < PK_ISA_COUNT; isa++) {
        if (!pk_isa_compiled(isa)) continue;
        bool ok = true;
        for (const char *const *r = pk_level_requires[isa]; *r; r++) ok = ok && has(*r);
        if (ok) best = isa;
    }
    return best;
}

struct PoolJob {
    pk_parallel_fn fn;
    void *ctx;
};

void pool_body(int64_t begin, int64_t end, void *ctx)
{
    const PoolJob *job = static_cast<const PoolJob *>(ctx);
    job->fn(job->ctx, begin, end);
}

/* pk_parallel_api's parallel_for on torch's intra-op pool: each task runs on exactly one thread,
 * so a bag is summed by one thread in one order, whatever the thread count. */
int torch_pool_parallel_for(int64_t n_tasks, int n_threads, pk_parallel_fn fn, void *ctx)
{
    if (n_threads <= 1 || n_tasks <= 1) {
        fn(ctx, 0, n_tasks);
        return 1;
    }
    PoolJob job{fn, ctx};
    if (api.torch_parallel_for(0, n_tasks, 1, pool_body, &job) != 0) fn(ctx, 0, n_tasks);
    return n_threads;
}

pk_parallel_api make_pool()
{
    pk_parallel_api p;
    std::memset(&p, 0, sizeof p);
    p.abi_version = 4;
    p.parallel_for = torch_pool_parallel_for;
    return p;
}

const pk_parallel_api g_pool = make_pool();

int torch_threads()
{
    uint32_t n = 1;
    if (api.torch_get_num_threads(&n) != 0 || n < 1) n = 1;
    return (int)std::min<uint32_t>(n, PK_PARALLEL_MAX_THREADS);
}

/* ------------------------------------------------------------------ tensors */

struct View {
    char *data;
    int64_t ndim;
    int64_t size[2];
    int64_t stride[2];
    int32_t dtype;
};

std::string dtype_name(int32_t d)
{
    if (d == api.aoti_torch_dtype_float32()) return "torch.float32";
    if (d == api.aoti_torch_dtype_float64()) return "torch.float64";
    if (d == api.aoti_torch_dtype_float16()) return "torch.float16";
    if (d == api.aoti_torch_dtype_bfloat16()) return "torch.bfloat16";
    if (d == api.aoti_torch_dtype_int32()) return "torch.int32";
    if (d == api.aoti_torch_dtype_int64()) return "torch.int64";
    if (d == api.aoti_torch_dtype_uint8()) return "torch.uint8";
    return "dtype code " + std::to_string(d);
}

/* A CPU tensor of 1 or 2 dimensions (`dims`: 1, 2, or 3 for either). */
View view(const Tensor &t, const char *name, int dims)
{
    View v{};
    int32_t device = 0;
    int64_t *sizes = nullptr, *strides = nullptr;
    void *data = nullptr;
    check_call(api.aoti_torch_get_device_type(t.get(), &device), "get_device_type");
    if (device != api.aoti_torch_device_type_cpu())
        fail(std::string("perfkernels: ") + name + " must be a CPU tensor (the native kernels are "
             "CPU kernels; CUDA tensors are served from Python)");
    check_call(api.aoti_torch_get_dim(t.get(), &v.ndim), "get_dim");
    if (!((v.ndim == 1 && (dims & 1)) || (v.ndim == 2 && (dims & 2))))
        fail(std::string("perfkernels: ") + name + " must be " +
             (dims == 1 ? "1-D" : dims == 2 ? "2-D" : "1-D or 2-D") + "; got " +
             std::to_string(v.ndim) + "-D");
    check_call(api.aoti_torch_get_sizes(t.get(), &sizes), "get_sizes");
    check_call(api.aoti_torch_get_strides(t.get(), &strides), "get_strides");
    check_call(api.aoti_torch_get_dtype(t.get(), &v.dtype), "get_dtype");
    check_call(api.aoti_torch_get_data_ptr(t.get(), &data), "get_data_ptr");
    v.data = static_cast<char *>(data);
    for (int64_t i = 0; i < v.ndim; i++) {
        v.size[i] = sizes[i];
        v.stride[i] = strides[i];
    }
    if (v.ndim == 1) {
        v.size[1] = 1;
        v.stride[1] = 1;
    }
    return v;
}

int64_t numel(const View &v) { return v.size[0] * (v.ndim == 2 ? v.size[1] : 1); }

bool is_contiguous(const View &v)
{
    if (v.ndim == 1) return v.size[0] <= 1 || v.stride[0] == 1;
    return numel(v) == 0 || ((v.size[1] <= 1 || v.stride[1] == 1) &&
                             (v.size[0] <= 1 || v.stride[0] == v.size[1]));
}

/* The elements of v in row-major order (a copy only when v is not contiguous). */
template <class T>
const T *contiguous(const View &v, std::vector<T> &copy)
{
    if (is_contiguous(v)) return reinterpret_cast<const T *>(v.data);
    copy.resize((size_t)numel(v));
    size_t k = 0;
    for (int64_t i = 0; i < v.size[0]; i++)
        for (int64_t j = 0; j < v.size[1]; j++)
            copy[k++] = reinterpret_cast<const T *>(v.data)[i * v.stride[0] + j * v.stride[1]];
    return copy.data();
}

/* Integer indices (int32 or int64), contiguous. */
struct Ints {
    const void *data;
    bool is64;
    int64_t n;
    std::vector<int32_t> c32;
    std::vector<int64_t> c64;
    int64_t operator[](int64_t i) const
    {
        return is64 ? static_cast<const int64_t *>(data)[i]
                    : (int64_t) static_cast<const int32_t *>(data)[i];
    }
};

void read_ints(const View &v, const char *name, Ints &out)
{
    if (v.dtype == api.aoti_torch_dtype_int64()) {
        out.is64 = true;
        out.data = contiguous<int64_t>(v, out.c64);
    } else if (v.dtype == api.aoti_torch_dtype_int32()) {
        out.is64 = false;
        out.data = contiguous<int32_t>(v, out.c32);
    } else {
        fail(std::string("perfkernels: ") + name + " must be int32 or int64; got " +
             dtype_name(v.dtype));
    }
    out.n = numel(v);
}

/* A new contiguous CPU matrix [rows, cols] of `dtype` (float32 by default). */
Tensor new_output(int64_t rows, int64_t cols, int32_t dtype = -1)
{
    const int64_t sizes[2] = {rows, cols}, strides[2] = {cols, 1};
    AtenTensorHandle h = nullptr;
    check_call(api.aoti_torch_empty_strided(2, sizes, strides,
                                            dtype < 0 ? api.aoti_torch_dtype_float32() : dtype,
                                            api.aoti_torch_device_type_cpu(), 0, &h),
               "empty_strided");
    return Tensor(h);
}

float *output_data(const Tensor &t)
{
    void *p = nullptr;
    check_call(api.aoti_torch_get_data_ptr(t.get(), &p), "get_data_ptr");
    return static_cast<float *>(p);
}

/* ------------------------------------------------------------------ bag arguments */

/* The bags of one lookup, normalised as the kernels read them (bags.h). */
struct Bags {
    Ints indices;
    std::vector<int64_t> offsets;   /* num_bags + 1 */
    std::vector<float> weights;
    pk_bags bags;
};

[[noreturn]] void offsets_error(const std::string &what) { fail("perfkernels: " + what); }

/* PyTorch's offsets (count entries, include_last_offset or not) -> num_bags + 1 offsets. */
void normalise_offsets(const Ints &off, bool include_last, int64_t n, std::vector<int64_t> &dst)
{
    const int64_t count = off.n;
    dst.clear();
    if (count == 0) {
        if (include_last)
            offsets_error("offsets is empty: with include_last_offset=True it needs at least one "
                          "entry (the end of the last bag, len(indices))");
        if (n != 0)
            offsets_error("offsets is empty (no bags) but there are " + std::to_string(n) +
                          " indices");
        dst.push_back(0);
        return;
    }
    int64_t prev = off[0];
    if (prev != 0) offsets_error("offsets[0] = " + std::to_string(prev) + ": the first offset must be 0");
    dst.reserve((size_t)count + 1);
    dst.push_back(0);
    for (int64_t i = 1; i < count; i++) {
        const int64_t v = off[i];
        if (v < prev)
            offsets_error("offsets[" + std::to_string(i) + "] = " + std::to_string(v) +
                          " < offsets[" + std::to_string(i - 1) + "] = " + std::to_string(prev) +
                          ": offsets must be non-decreasing");
        dst.push_back(v);
        prev = v;
    }
    if (include_last) {
        if (prev != n)
            offsets_error("offsets[" + std::to_string(count - 1) + "] = " + std::to_string(prev) +
                          " != len(indices) = " + std::to_string(n) +
                          ": with include_last_offset=True the last offset must equal len(indices)");
    } else {
        if (prev > n)
            offsets_error("offsets[" + std::to_string(count - 1) + "] = " + std::to_string(prev) +
                          " > len(indices) = " + std::to_string(n) +
                          ": offsets must not exceed the number of indices");
        dst.push_back(n);
    }
}

void read_weights(const Tensor &psw, const View &ix, std::vector<float> &dst)
{
    View w = view(psw, "per_sample_weights", 3);
    if (w.ndim != ix.ndim || w.size[0] != ix.size[0] || w.size[1] != ix.size[1])
        fail("perfkernels: per_sample_weights must have the shape of indices (one weight per "
             "index)");
    const int64_t n = numel(w);
    dst.resize((size_t)n);
    if (w.dtype == api.aoti_torch_dtype_float32()) {
        std::vector<float> copy;
        const float *p = contiguous<float>(w, copy);
        std::copy(p, p + n, dst.begin());
    } else {
        fail("perfkernels: per_sample_weights must be float32; got " + dtype_name(w.dtype));
    }
}

int64_t normalise_padding(std::optional<int64_t> padding_idx, int64_t rows)
{
    if (!padding_idx) return -1;
    const int64_t p = *padding_idx;
    if (p < -rows || p >= rows)
        fail("perfkernels: padding_idx = " + std::to_string(p) + " is out of range for a table of " +
             std::to_string(rows) + " rows (valid: -" + std::to_string(rows) +
             " <= padding_idx < " + std::to_string(rows) + ")");
    return p < 0 ? p + rows : p;
}

void prepare(Bags &b, const Tensor &indices, const Tensor &offsets, const Tensor &psw,
             const std::string &mode, bool include_last_offset, std::optional<int64_t> padding_idx,
             int64_t rows)
{
    std::memset(&b.bags, 0, sizeof b.bags);
    if (mode == "sum")
        b.bags.mean = 0;
    else if (mode == "mean")
        b.bags.mean = 1;
    else
        fail("perfkernels: mode must be 'sum' or 'mean'; got '" + mode + "'");
    const View ix = view(indices, "indices", 3);
    read_ints(ix, "indices", b.indices);
    const int64_t n = b.indices.n;
    if (ix.ndim == 2) {
        if (offsets)
            fail("perfkernels: indices is 2-D (one bag per row): offsets must be None");
        if (ix.size[1] == 0)   /* torch's embedding_bag refuses it (its arange's step is 0) */
            fail("perfkernels: indices is 2-D with no columns; torch's embedding_bag refuses "
                 "it: step must be nonzero");
        b.offsets.resize((size_t)ix.size[0] + 1);
        for (int64_t i = 0; i <= ix.size[0]; i++) b.offsets[(size_t)i] = i * ix.size[1];
    } else {
        if (!offsets)
            fail("perfkernels: 1-D indices need offsets to say where the bags are (or pass 2-D "
                 "indices [num_bags, bag_length])");
        Ints off;
        read_ints(view(offsets, "offsets", 1), "offsets", off);
        normalise_offsets(off, include_last_offset, n, b.offsets);
    }
    if (psw) read_weights(psw, ix, b.weights);
    b.bags.indices = b.indices.data;
    b.bags.n_indices = n;
    b.bags.index_64 = b.indices.is64;
    b.bags.offsets = b.offsets.data();
    b.bags.num_bags = (int64_t)b.offsets.size() - 1;
    b.bags.weights = psw ? b.weights.data() : nullptr;
    b.bags.positional = 0;
    b.bags.padding_idx = normalise_padding(padding_idx, rows);
}

[[noreturn]] void index_error(const Ints &indices, int64_t pos, int64_t rows)
{
    fail("Index " + std::to_string(pos) + " of input takes value " +
         std::to_string(indices[pos]) + " which is not in the valid range [0, " +
         std::to_string(rows) + ")");
}

void run(const Bags &b, const pk_bags_part *parts, int n_parts, const int64_t *rows)
{
    int64_t bad = 0;
    int bad_part = 0;
    const pk_status s = pk_bags_run(&g_pool, torch_threads(), parts, n_parts, nullptr, &bad,
                                    &bad_part);
    if (s == PK_ERR_INDEX) index_error(b.indices, bad, rows[bad_part]);
    if (s != PK_OK) fail("perfkernels: a bag kernel failed with status " + std::to_string((int)s));
}

/* ------------------------------------------------------------------ tables as bag parts */

/* A table as a bag part: a float table (float32 / float16 / bfloat16 rows of
 * unit-stride elements, copied otherwise) when bits is 0, else rows of packed codes of `dim`
 * columns at 8, 4 or 2 bits.  The copies live here as long as the part is used. */
struct TablePart {
    pk_table_bags_args args;
    int64_t rows = 0, dim = 0, elem = 4;
    bool packed = false;
    std::vector<uint32_t> c32;
    std::vector<uint16_t> c16;
    std::vector<uint8_t> c8;
};

void table_part(const Tensor &weight, int64_t bits, int64_t packed_dim, const std::string &name,
                TablePart &T)
{
    const View w = view(weight, name.c_str(), 2);
    T.rows = w.size[0];
    if (bits == 0) {
        const pk_embedding_kernels *k = pk_embedding_table(g_isa.load(std::memory_order_relaxed));
        pk_embedding_bag_fn fn;
        if (w.dtype == api.aoti_torch_dtype_float32()) {
            fn = k->embedding_bag_f32;
            T.elem = 4;
        } else if (w.dtype == api.aoti_torch_dtype_float16()) {
            fn = k->embedding_bag_f16;
            T.elem = 2;
        } else if (w.dtype == api.aoti_torch_dtype_bfloat16()) {
            fn = k->embedding_bag_bf16;
            T.elem = 2;
        } else {
            fail("perfkernels: " + name + " must be float32, float16 or bfloat16; got " +
                 dtype_name(w.dtype));
        }
        T.dim = w.size[1];
        const void *data = w.data;
        int64_t row_stride = T.rows <= 1 ? T.dim : w.stride[0];
        if (!(T.dim <= 1 || w.stride[1] == 1) || row_stride < 0) {
            data = T.elem == 4 ? (const void *)contiguous<uint32_t>(w, T.c32)
                               : (const void *)contiguous<uint16_t>(w, T.c16);
            row_stride = T.dim;
        }
        T.args = pk_table_bags_float(fn, data, T.rows, T.dim, row_stride);
        return;
    }
    if (bits != 8 && bits != 4 && bits != 2)
        fail("perfkernels: bits of " + name + " must be 0 (a float table), 8, 4 or 2; got " +
             std::to_string(bits));
    if (w.dtype != api.aoti_torch_dtype_uint8())
        fail("perfkernels: " + name + " must be uint8 (rows of packed codes); got " +
             dtype_name(w.dtype));
    const int64_t row_bytes = w.size[1];
    if (packed_dim < 1 || packed_dim > ((int64_t)1 << 40) ||
        (int64_t)pk_quantized_row_bytes((int)bits, (size_t)packed_dim) != row_bytes)
        fail("perfkernels: " + name + "'s rows of " + std::to_string(row_bytes) +
             " bytes do not hold dim = " + std::to_string(packed_dim) + " codes of " +
             std::to_string(bits) + " bits and their scale and bias");
    T.packed = true;
    T.elem = 1;
    T.dim = packed_dim;
    T.args = pk_table_bags_packed(
        pk_quantized_table(g_isa.load(std::memory_order_relaxed))->embedding_bag_quantized,
        (int)bits, contiguous<uint8_t>(w, T.c8), T.rows, row_bytes, packed_dim);
}

/* The part of feature f: `num_bags` bags of `T`, offsets (num_bags + 1, into `ix`'s entries). */
pk_bags_part make_part(const TablePart &T, const Ints &ix, const int64_t *offsets, int64_t num_bags,
                       bool mean, int64_t padding_idx)
{
    pk_bags_part part;
    std::memset(&part, 0, sizeof part);
    pk_bags &b = part.bags;
    b.indices = ix.data;
    b.n_indices = ix.n;
    b.index_64 = ix.is64;
    b.offsets = offsets;
    b.num_bags = num_bags;
    b.weights = nullptr;
    b.positional = 0;
    b.mean = mean ? 1 : 0;
    b.padding_idx = padding_idx < 0 ? -1 : padding_idx;
    part.call = pk_table_bags_call;
    part.args = &T.args;
    part.index_cost = (T.packed ? T.args.row_stride : T.dim * T.elem) + (ix.is64 ? 8 : 4);
    part.bag_cost = T.dim * 4 + 8;
    part.rows = T.rows;
    return part;
}

/* The per-table options of a collection (mean, padding_idx: one each per table) and its slots
 * (features[i] of num_keys looked up in tables[i]), checked. */
void check_collection(const std::vector<TablePart> &tabs, const std::vector<int64_t> &mean,
                      const std::vector<int64_t> &padding, const std::vector<int64_t> &features,
                      const std::vector<int64_t> &tables, int64_t num_keys)
{
    const size_t n_tables = tabs.size();
    if (mean.size() != n_tables || padding.size() != n_tables)
        fail("perfkernels: mean and padding_idx need one entry per table (" +
             std::to_string(n_tables) + "); got " + std::to_string(mean.size()) + " and " +
             std::to_string(padding.size()));
    if (features.size() != tables.size())
        fail("perfkernels: features and tables must have the same length; got " +
             std::to_string(features.size()) + " and " + std::to_string(tables.size()));
    if (num_keys < 1) fail("perfkernels: num_keys must be >= 1; got " + std::to_string(num_keys));
    for (size_t t = 0; t < n_tables; t++)
        if (padding[t] >= tabs[t].rows)
            fail("perfkernels: padding_idx[" + std::to_string(t) + "] = " +
                 std::to_string(padding[t]) + " is out of range for a table of " +
                 std::to_string(tabs[t].rows) + " rows");
    for (size_t i = 0; i < features.size(); i++) {
        if (features[i] < 0 || features[i] >= num_keys)
            fail("perfkernels: features[" + std::to_string(i) + "] = " + std::to_string(features[i]) +
                 " is not a key of the jagged tensor (0 <= feature < " + std::to_string(num_keys) + ")");
        if (tables[i] < 0 || tables[i] >= (int64_t)n_tables)
            fail("perfkernels: tables[" + std::to_string(i) + "] = " + std::to_string(tables[i]) +
                 " is not a table (0 <= table < " + std::to_string(n_tables) + ")");
    }
}

/* A collection's float tables as parts, and its options checked (check_collection). */
std::vector<TablePart> collection_tables(const std::vector<Tensor> &weights,
                                         const std::vector<int64_t> &mean,
                                         const std::vector<int64_t> &padding,
                                         const std::vector<int64_t> &features,
                                         const std::vector<int64_t> &tables, int64_t num_keys)
{
    std::vector<TablePart> tabs(weights.size());
    for (size_t t = 0; t < weights.size(); t++)
        table_part(weights[t], 0, 0, "weights[" + std::to_string(t) + "]", tabs[t]);
    check_collection(tabs, mean, padding, features, tables, num_keys);
    return tabs;
}

/* A jagged tensor's offsets (num_keys * batch + 1 entries into n_values values), normalised into
 * dst; returns the batch. */
int64_t jagged_offsets(const Tensor &offsets, int64_t num_keys, int64_t n_values,
                       std::vector<int64_t> &dst)
{
    Ints off;
    read_ints(view(offsets, "offsets", 1), "offsets", off);
    if (off.n < 1 || (off.n - 1) % num_keys != 0)
        fail("perfkernels: offsets has " + std::to_string(off.n) + " entries; a jagged tensor of " +
             std::to_string(num_keys) + " keys needs num_keys * batch + 1");
    normalise_offsets(off, true, n_values, dst);
    return (off.n - 1) / num_keys;
}

/* ------------------------------------------------------------------ the ops */

/* The part of one table's bags `b` (prepared), written into `out` rows of `out_stride`. */
pk_bags_part bag_part(const TablePart &T, const Bags &b, float *out, int64_t out_stride)
{
    pk_bags_part part = make_part(T, b.indices, b.bags.offsets, b.bags.num_bags, b.bags.mean != 0,
                                  b.bags.padding_idx);
    part.bags.weights = b.bags.weights;
    part.bags.out = out;
    part.bags.out_stride = out_stride;
    return part;
}

/* The arguments of a one-table bag op after its table: stack[1] ... stack[6]. */
struct BagArgs {
    Tensor indices, offsets, psw;
    std::string mode;
    bool include_last_offset;
    std::optional<int64_t> padding_idx;
};

BagArgs take_bag_args(StableIValue *stack)
{
    BagArgs a;
    a.indices = take_tensor(stack[1]);
    a.offsets = take_optional_tensor(stack[2]);
    a.psw = take_optional_tensor(stack[3]);
    a.mode = take_string(stack[4]);
    a.include_last_offset = to_bool(stack[5]);
    a.padding_idx = take_optional_int(stack[6]);
    return a;
}

/* The bags of `a` in the table T, as a new [num_bags, D] result in stack[0]. */
void bags_of_table(StableIValue *stack, const TablePart &T, const BagArgs &a)
{
    Bags b;
    prepare(b, a.indices, a.offsets, a.psw, a.mode, a.include_last_offset, a.padding_idx, T.rows);
    Tensor out = new_output(b.bags.num_bags, T.dim);
    const pk_bags_part part = bag_part(T, b, output_data(out), T.dim);
    run(b, &part, 1, &T.rows);
    stack[0] = reinterpret_cast<StableIValue>(out.release());
}

/* embedding_bag(Tensor weight, Tensor indices, Tensor? offsets, Tensor? per_sample_weights,
 *               str mode, bool include_last_offset, SymInt? padding_idx) -> Tensor */
void embedding_bag(StableIValue *stack, uint64_t, uint64_t)
{
    Tensor weight = take_tensor(stack[0]);
    const BagArgs a = take_bag_args(stack);
    TablePart T;
    table_part(weight, 0, 0, "weight", T);
    bags_of_table(stack, T, a);
}

/* embedding_bag_quantized(Tensor packed, Tensor indices, Tensor? offsets,
 *     Tensor? per_sample_weights, str mode, bool include_last_offset, SymInt? padding_idx,
 *     SymInt bits, SymInt dim) -> Tensor */
void embedding_bag_quantized(StableIValue *stack, uint64_t, uint64_t)
{
    Tensor packed = take_tensor(stack[0]);
    const BagArgs a = take_bag_args(stack);
    const int64_t bits = to_int(stack[7]), dim = to_int(stack[8]);
    if (bits != 8 && bits != 4 && bits != 2)
        fail("perfkernels: bits must be 8, 4 or 2; got " + std::to_string(bits));
    TablePart T;
    table_part(packed, bits, dim, "packed", T);
    bags_of_table(stack, T, a);
}

/* embedding_bag_collection(Tensor[] weights, Tensor values, Tensor offsets,
 *     Tensor? per_sample_weights, SymInt num_keys, SymInt[] features, SymInt[] tables,
 *     SymInt[] mean, SymInt[] padding_idx) -> Tensor
 * Output slot i: the B bags of KJT feature features[i] looked up in weights[tables[i]], written
 * side by side into one [B, sum of the dims] result, all in one split of the work. */
/* The lookup of a collection whose tables are `tabs` (checked), the rest of the arguments at
 * stack[first] ...: values, offsets, per_sample_weights, num_keys, features, tables, mean,
 * padding_idx. */
void collection_lookup(StableIValue *stack, const std::vector<TablePart> &tabs, int first,
                       const std::vector<int64_t> &features, const std::vector<int64_t> &tables,
                       const std::vector<int64_t> &mean, const std::vector<int64_t> &padding,
                       int64_t num_keys)
{
    Tensor values = take_tensor(stack[first]), offsets = take_tensor(stack[first + 1]);
    Tensor psw = take_optional_tensor(stack[first + 2]);
    Bags b;
    std::memset(&b.bags, 0, sizeof b.bags);
    const View vv = view(values, "values", 1);
    read_ints(vv, "values", b.indices);
    const int64_t batch = jagged_offsets(offsets, num_keys, b.indices.n, b.offsets);
    if (psw) read_weights(psw, vv, b.weights);

    int64_t total_dim = 0;
    for (int64_t t : tables) total_dim += tabs[(size_t)t].dim;
    Tensor out = new_output(batch, total_dim);
    float *dst = output_data(out);
    std::vector<pk_bags_part> parts(features.size());
    std::vector<int64_t> part_rows(features.size());
    int64_t col = 0;
    for (size_t i = 0; i < features.size(); i++) {
        const size_t t = (size_t)tables[i];
        parts[i] = make_part(tabs[t], b.indices, b.offsets.data() + features[i] * batch, batch,
                             mean[t] != 0, padding[t]);
        parts[i].bags.weights = psw ? b.weights.data() : nullptr;
        parts[i].bags.out = dst + col;
        parts[i].bags.out_stride = total_dim;
        part_rows[i] = tabs[t].rows;
        col += tabs[t].dim;
    }
    if (!parts.empty()) run(b, parts.data(), (int)parts.size(), part_rows.data());
    stack[0] = reinterpret_cast<StableIValue>(out.release());
}

/* embedding_bag_collection(Tensor[] weights, Tensor values, Tensor offsets,
 *     Tensor? per_sample_weights, SymInt num_keys, SymInt[] features, SymInt[] tables,
 *     SymInt[] mean, SymInt[] padding_idx) -> Tensor
 * Output slot i: the B bags of KJT feature features[i] looked up in weights[tables[i]], written
 * side by side into one [B, sum of the dims] result, all in one split of the work. */
void embedding_bag_collection(StableIValue *stack, uint64_t, uint64_t)
{
    std::vector<Tensor> weights = take_list<Tensor>(stack[0], take_tensor);
    const int64_t num_keys = to_int(stack[4]);
    const std::vector<int64_t> features = take_list<int64_t>(stack[5], to_int);
    const std::vector<int64_t> tables = take_list<int64_t>(stack[6], to_int);
    const std::vector<int64_t> mean = take_list<int64_t>(stack[7], to_int);
    const std::vector<int64_t> padding = take_list<int64_t>(stack[8], to_int);
    const std::vector<TablePart> tabs =
        collection_tables(weights, mean, padding, features, tables, num_keys);
    collection_lookup(stack, tabs, 1, features, tables, mean, padding, num_keys);
}

/* embedding_bag_collection_packed(Tensor[] weights, SymInt[] bits, SymInt[] dims, Tensor values,
 *     Tensor offsets, Tensor? per_sample_weights, SymInt num_keys, SymInt[] features,
 *     SymInt[] tables, SymInt[] mean, SymInt[] padding_idx) -> Tensor
 * The same over tables of any format: table t is row-wise quantized to bits[t] bits (rows of
 * packed codes, dims[t] values a row) or, where bits[t] is 0, a float table (dims[t] unused). */
void embedding_bag_collection_packed(StableIValue *stack, uint64_t, uint64_t)
{
    std::vector<Tensor> weights = take_list<Tensor>(stack[0], take_tensor);
    const std::vector<int64_t> bits = take_list<int64_t>(stack[1], to_int);
    const std::vector<int64_t> dims = take_list<int64_t>(stack[2], to_int);
    const int64_t num_keys = to_int(stack[6]);
    const std::vector<int64_t> features = take_list<int64_t>(stack[7], to_int);
    const std::vector<int64_t> tables = take_list<int64_t>(stack[8], to_int);
    const std::vector<int64_t> mean = take_list<int64_t>(stack[9], to_int);
    const std::vector<int64_t> padding = take_list<int64_t>(stack[10], to_int);
    if (bits.size() != weights.size() || dims.size() != weights.size())
        fail("perfkernels: bits and dims need one entry per table (" +
             std::to_string(weights.size()) + "); got " + std::to_string(bits.size()) + " and " +
             std::to_string(dims.size()));
    std::vector<TablePart> tabs(weights.size());
    for (size_t t = 0; t < weights.size(); t++)
        table_part(weights[t], bits[t], dims[t], "weights[" + std::to_string(t) + "]", tabs[t]);
    check_collection(tabs, mean, padding, features, tables, num_keys);
    collection_lookup(stack, tabs, 3, features, tables, mean, padding, num_keys);
}

/* ------------------------------------------------------------------ LSTM unit */

double to_double(StableIValue v)
{
    double x;
    std::memcpy(&x, &v, sizeof x);
    return x;
}

/* A float32 CPU matrix [rows, cols] (copied when not contiguous). */
const float *float_matrix(const Tensor &t, const char *name, int64_t rows, int64_t cols,
                          std::vector<float> &copy)
{
    const View v = view(t, name, 2);
    if (v.dtype != api.aoti_torch_dtype_float32())
        fail(std::string("perfkernels: ") + name + " must be float32; got " + dtype_name(v.dtype));
    if (v.size[0] != rows || v.size[1] != cols)
        fail(std::string("perfkernels: ") + name + " has shape [" + std::to_string(v.size[0]) +
             ", " + std::to_string(v.size[1]) + "]; expected [" + std::to_string(rows) + ", " +
             std::to_string(cols) + "]");
    return contiguous<float>(v, copy);
}

struct LstmJob {
    pk_lstm_params p;
    const float *a[5];
    float *o[3];
    bool backward;
};

void lstm_rows(const LstmJob &j, int64_t lo, int64_t hi)
{
    pk_lstm_params p = j.p;
    const size_t d = p.d, r = (size_t)lo;
    p.n = (size_t)(hi - lo);
    const pk_lstm_kernels *k = pk_lstm_table(g_isa.load(std::memory_order_relaxed));
    if (j.backward)
        k->lstm_backward(&p, j.a[0] + r * d, j.a[1] + r * 4 * d, j.a[2] + r * d, j.a[3] + r * d,
                         j.a[4] + r * d, j.o[0] + r * d, j.o[1] + r * d, j.o[2] + r * 4 * d);
    else
        k->lstm_forward(&p, j.a[0] + r * d, j.a[1] + r * d, j.a[2] + r * 4 * d, j.o[0] + r * d,
                        j.o[1] + r * d);
}

void lstm_body(int64_t lo, int64_t hi, void *ctx) { lstm_rows(*static_cast<LstmJob *>(ctx), lo, hi); }

/* Rows are independent: split across torch's threads when each gets enough memory traffic. */
void lstm_run(LstmJob &j)
{
    const int64_t n = (int64_t)j.p.n;
    const int64_t row_bytes = (int64_t)j.p.d * 4 * (j.backward ? 14 : 8);
    const int threads = pk_parallel_threads_for(n * row_bytes, torch_threads());
    if (threads <= 1 || n <= 1) {
        lstm_rows(j, 0, n);
        return;
    }
    const int64_t grain = (n + threads - 1) / threads;
    if (api.torch_parallel_for(0, n, grain, lstm_body, &j) != 0) lstm_rows(j, 0, n);
}

pk_lstm_params lstm_params(int64_t n, int64_t d, double forget_bias)
{
    pk_lstm_params p;
    std::memset(&p, 0, sizeof p);
    p.n = (size_t)n;
    p.d = (size_t)d;
    p.forget_bias = (float)forget_bias;
    p.gate_order = PK_LSTM_IFGO;   /* PyTorch's i, f, g, o */
    return p;
}

/* lstm_unit(Tensor c_prev, Tensor gates, float forget_bias=0.) -> (Tensor, Tensor) */
void lstm_unit(StableIValue *stack, uint64_t, uint64_t)
{
    Tensor c_prev = take_tensor(stack[0]), gates = take_tensor(stack[1]);
    const double forget_bias = to_double(stack[2]);
    const View cv = view(c_prev, "c_prev", 2);
    const int64_t n = cv.size[0], d = cv.size[1];
    std::vector<float> c1, c2;
    LstmJob j;
    j.p = lstm_params(n, d, forget_bias);
    j.backward = false;
    j.a[1] = float_matrix(c_prev, "c_prev", n, d, c1);
    j.a[0] = j.a[1];   /* h_prev: read only for rows past a sequence's end, none here */
    j.a[2] = float_matrix(gates, "gates", n, 4 * d, c2);
    Tensor h = new_output(n, d), c = new_output(n, d);
    j.o[0] = output_data(h);
    j.o[1] = output_data(c);
    lstm_run(j);
    stack[0] = reinterpret_cast<StableIValue>(h.release());
    stack[1] = reinterpret_cast<StableIValue>(c.release());
}

/* lstm_unit_backward(Tensor c_prev, Tensor gates, Tensor c, Tensor dh, Tensor dc,
 *                    float forget_bias=0.) -> (Tensor, Tensor): (dc_prev, dgates) */
void lstm_unit_backward(StableIValue *stack, uint64_t, uint64_t)
{
    Tensor c_prev = take_tensor(stack[0]), gates = take_tensor(stack[1]);
    Tensor c = take_tensor(stack[2]), dh = take_tensor(stack[3]), dc = take_tensor(stack[4]);
    const double forget_bias = to_double(stack[5]);
    const View cv = view(c_prev, "c_prev", 2);
    const int64_t n = cv.size[0], d = cv.size[1];
    std::vector<float> k0, k1, k2, k3, k4;
    LstmJob j;
    j.p = lstm_params(n, d, forget_bias);
    j.backward = true;
    j.a[0] = float_matrix(c_prev, "c_prev", n, d, k0);
    j.a[1] = float_matrix(gates, "gates", n, 4 * d, k1);
    j.a[2] = float_matrix(c, "c", n, d, k2);
    j.a[3] = float_matrix(dh, "dh", n, d, k3);
    j.a[4] = float_matrix(dc, "dc", n, d, k4);
    std::vector<float> dh_prev((size_t)(n * d));   /* the kernel writes it; this op drops it */
    Tensor dc_prev = new_output(n, d), dgates = new_output(n, 4 * d);
    j.o[0] = dh_prev.data();
    j.o[1] = output_data(dc_prev);
    j.o[2] = output_data(dgates);
    lstm_run(j);
    stack[0] = reinterpret_cast<StableIValue>(dc_prev.release());
    stack[1] = reinterpret_cast<StableIValue>(dgates.release());
}

/* ------------------------------------------------------------------ lookups fused with the interaction */

/* The pairs (li, lj) of an n-row interaction in the model's order: "dlrm" is facebookresearch
 * DLRM's lower triangle row by row (the diagonal too with self_interaction), "torchrec" is
 * TorchRec's torch.triu_indices(n, n, offset=1) (offset 0 with self_interaction). */
struct Pairs {
    std::vector<int32_t> li, lj;
};

const Pairs &pair_lists(int64_t n, const std::string &order, bool itself)
{
    thread_local std::vector<std::pair<std::string, Pairs>> cache;
    const std::string key = order + (itself ? "+" : "-") + std::to_string(n);
    for (const auto &entry : cache)
        if (entry.first == key) return entry.second;
    Pairs p;
    if (order == "dlrm") {
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < i + (itself ? 1 : 0); j++) {
                p.li.push_back((int32_t)i);
                p.lj.push_back((int32_t)j);
            }
    } else if (order == "torchrec") {
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = i + (itself ? 0 : 1); j < n; j++) {
                p.li.push_back((int32_t)i);
                p.lj.push_back((int32_t)j);
            }
    } else {
        fail("perfkernels: pairs must be 'dlrm' or 'torchrec'; got '" + order + "'");
    }
    if (cache.size() >= 16) cache.erase(cache.begin());
    cache.emplace_back(key, std::move(p));
    return cache.back().second;
}

/* The dense input: float32 [B, Dd] rows (copied when not contiguous, converted from float64). */
const float *dense_rows(const Tensor &dense, View &d, std::vector<float> &copy)
{
    d = view(dense, "dense", 2);
    if (d.dtype == api.aoti_torch_dtype_float32()) return contiguous<float>(d, copy);
    if (d.dtype == api.aoti_torch_dtype_float64()) {
        std::vector<double> c64;
        const double *p = contiguous<double>(d, c64);
        copy.assign(p, p + numel(d));
        return copy.data();
    }
    fail("perfkernels: dense must be float32 or float64; got " + dtype_name(d.dtype));
}

/* Every feature's lookups and the interaction: "cat" writes [dense | pooled_0 | ...], "dot" writes
 * [dense | the pairs' dot products] (every table of dense's width).  Every index is checked before
 * a kernel runs; the first bad one (feature by feature) is reported with its position in that
 * feature's index list (`index_of[f]`) and its table's rows. */
Tensor interaction(const float *dense, int64_t batch, int64_t dense_dim,
                   std::vector<pk_bags_part> &parts, const std::vector<const Ints *> &index_of,
                   const std::string &kind, const std::string &order, bool itself)
{
    const int n_parts = (int)parts.size();
    const bool cat = kind == "cat";
    if (!cat && kind != "dot")
        fail("perfkernels: interaction must be 'dot' or 'cat'; got '" + kind + "'");
    int64_t width = dense_dim;
    const Pairs *pairs = nullptr;
    for (int f = 0; f < n_parts; f++) {
        const int64_t dim = static_cast<const pk_table_bags_args *>(parts[(size_t)f].args)->dim;
        if (cat) {
            width += dim;
        } else if (dim != dense_dim) {
            fail("perfkernels: the dot interaction needs every table as wide as dense (" +
                 std::to_string(dense_dim) + "); table " + std::to_string(f) + " has " +
                 std::to_string(dim) + " columns");
        }
    }
    if (!cat) {
        pairs = &pair_lists(n_parts + 1, order, itself);
        width += (int64_t)pairs->li.size();
    }
    for (int f = 0; f < n_parts; f++) {
        const int64_t bad = pk_bags_first_bad_in(&parts[(size_t)f].bags, 0, batch, parts[(size_t)f].rows);
        if (bad >= 0) index_error(*index_of[(size_t)f], bad, parts[(size_t)f].rows);
    }
    Tensor out = new_output(batch, width);
    float *o = output_data(out);
    int64_t bad = 0;
    int bad_part = 0;
    pk_status s = PK_OK;
    if (cat) {
        for (int64_t b = 0; b < batch; b++)
            std::memcpy(o + b * width, dense + b * dense_dim, (size_t)dense_dim * sizeof(float));
        int64_t col = dense_dim;
        for (int f = 0; f < n_parts; f++) {
            pk_bags_part &p = parts[(size_t)f];
            p.bags.out = o + col;
            p.bags.out_stride = width;
            col += static_cast<const pk_table_bags_args *>(p.args)->dim;
        }
        if (n_parts > 0 && batch > 0)
            s = pk_bags_run(&g_pool, torch_threads(), parts.data(), n_parts, nullptr, &bad, &bad_part);
    } else {
        pk_dot_interaction_job job;
        std::memset(&job, 0, sizeof job);
        job.parts = parts.data();
        job.n_parts = n_parts;
        job.dense = dense;
        job.dense_stride = dense_dim;
        job.dim = dense_dim;
        job.li = pairs->li.data();
        job.lj = pairs->lj.data();
        job.n_pairs = (int64_t)pairs->li.size();
        job.dot = pk_interaction_table(g_isa.load(std::memory_order_relaxed))->interaction_dot;
        job.out = o;
        job.out_stride = width;
        job.n_samples = batch;
        s = pk_dot_interaction_run(&g_pool, torch_threads(), &job, &bad, &bad_part);
    }
    if (s == PK_ERR_INDEX) index_error(*index_of[(size_t)bad_part], bad, parts[(size_t)bad_part].rows);
    if (s != PK_OK) fail("perfkernels: a fused lookup failed with status " + std::to_string((int)s));
    return out;
}

/* embedding_bags_interaction(Tensor dense, Tensor[] weights, Tensor[] indices, Tensor[] offsets,
 *     bool include_last_offset, str interaction, str pairs, bool self_interaction, SymInt[] mean,
 *     SymInt[] padding_idx, SymInt[] bits, SymInt[] dims, SymInt group) -> Tensor
 * (and embedding_bags_interaction_inference, the same op without autograd).  Feature f: the bags
 * of indices[f] / offsets[f] in weights[f] (a packed table of dims[f] columns where bits[f] is 8,
 * 4 or 2), mode mean where mean[f], padding_idx[f] (-1: none). */
void embedding_bags_interaction(StableIValue *stack, uint64_t, uint64_t)
{
    Tensor dense = take_tensor(stack[0]);
    std::vector<Tensor> weights = take_list<Tensor>(stack[1], take_tensor);
    std::vector<Tensor> indices = take_list<Tensor>(stack[2], take_tensor);
    std::vector<Tensor> offsets = take_list<Tensor>(stack[3], take_tensor);
    const bool include_last = to_bool(stack[4]);
    const std::string kind = take_string(stack[5]), order = take_string(stack[6]);
    const bool itself = to_bool(stack[7]);
    const std::vector<int64_t> mean = take_list<int64_t>(stack[8], to_int);
    const std::vector<int64_t> padding = take_list<int64_t>(stack[9], to_int);
    const std::vector<int64_t> bits = take_list<int64_t>(stack[10], to_int);
    const std::vector<int64_t> dims = take_list<int64_t>(stack[11], to_int);
    (void)to_int(stack[12]);   /* group: read by the Python backward only */

    const size_t F = weights.size();
    auto same = [&](size_t n, const char *what) {
        if (n != F)
            fail(std::string("perfkernels: ") + what + " needs one entry per table (" +
                 std::to_string(F) + "); got " + std::to_string(n));
    };
    same(indices.size(), "indices");
    same(offsets.size(), "offsets");
    same(mean.size(), "mean");
    same(padding.size(), "padding_idx");
    if (!bits.empty()) same(bits.size(), "bits");
    if (!dims.empty()) same(dims.size(), "dims");
    View d;
    std::vector<float> dense_copy;
    const float *drows = dense_rows(dense, d, dense_copy);
    const int64_t batch = d.size[0];
    std::vector<TablePart> tabs(F);
    std::vector<Ints> ix(F);
    std::vector<std::vector<int64_t>> offs(F);
    std::vector<pk_bags_part> parts(F);
    std::vector<const Ints *> index_of(F);
    for (size_t f = 0; f < F; f++) {
        const std::string n = "[" + std::to_string(f) + "]";
        const int64_t b = bits.empty() ? 0 : bits[f];
        table_part(weights[f], b, b && !dims.empty() ? dims[f] : 0, "weights" + n, tabs[f]);
        read_ints(view(indices[f], ("indices" + n).c_str(), 1), ("indices" + n).c_str(), ix[f]);
        Ints off;
        read_ints(view(offsets[f], ("offsets" + n).c_str(), 1), ("offsets" + n).c_str(), off);
        if (off.n - (include_last ? 1 : 0) != batch)
            fail("perfkernels: offsets" + n + " has " + std::to_string(off.n) + " entries; " +
                 std::to_string(batch) + " bags (the rows of dense) need " +
                 std::to_string(batch + (include_last ? 1 : 0)));
        try {
            normalise_offsets(off, include_last, ix[f].n, offs[f]);
        } catch (const std::exception &e) {   /* the same message, naming the feature */
            const std::string what = e.what(), prefix = "perfkernels: ";
            fail(prefix + "feature " + std::to_string(f) + ": " +
                 (what.compare(0, prefix.size(), prefix) == 0 ? what.substr(prefix.size()) : what));
        }
        if (padding[f] >= tabs[f].rows)
            fail("perfkernels: padding_idx" + n + " = " + std::to_string(padding[f]) +
                 " is out of range for a table of " + std::to_string(tabs[f].rows) + " rows");
        parts[f] = make_part(tabs[f], ix[f], offs[f].data(), batch, mean[f] != 0, padding[f]);
        index_of[f] = &ix[f];
    }
    Tensor out = interaction(drows, batch, d.size[1], parts, index_of, kind, order, itself);
    stack[0] = reinterpret_cast<StableIValue>(out.release());
}

/* collection_interaction(Tensor dense, Tensor[] weights, Tensor values, Tensor offsets,
 *     SymInt num_keys, SymInt[] features, SymInt[] tables, str interaction, str pairs,
 *     bool self_interaction, SymInt[] mean, SymInt[] padding_idx, SymInt group) -> Tensor
 * A KeyedJaggedTensor's lookups (offsets: num_keys * B + 1) fused with the interaction: output
 * slot i is feature features[i] looked up in weights[tables[i]] (mean, padding_idx per table). */
void collection_interaction(StableIValue *stack, uint64_t, uint64_t)
{
    Tensor dense = take_tensor(stack[0]);
    std::vector<Tensor> weights = take_list<Tensor>(stack[1], take_tensor);
    Tensor values = take_tensor(stack[2]), offsets = take_tensor(stack[3]);
    const int64_t num_keys = to_int(stack[4]);
    const std::vector<int64_t> features = take_list<int64_t>(stack[5], to_int);
    const std::vector<int64_t> tables = take_list<int64_t>(stack[6], to_int);
    const std::string kind = take_string(stack[7]), order = take_string(stack[8]);
    const bool itself = to_bool(stack[9]);
    const std::vector<int64_t> mean = take_list<int64_t>(stack[10], to_int);
    const std::vector<int64_t> padding = take_list<int64_t>(stack[11], to_int);
    (void)to_int(stack[12]);

    const std::vector<TablePart> tabs =
        collection_tables(weights, mean, padding, features, tables, num_keys);
    View d;
    std::vector<float> dense_copy;
    const float *drows = dense_rows(dense, d, dense_copy);
    Ints ix;
    read_ints(view(values, "values", 1), "values", ix);
    std::vector<int64_t> offs;
    const int64_t batch = jagged_offsets(offsets, num_keys, ix.n, offs);
    if (batch != d.size[0])
        fail("perfkernels: the jagged tensor has " + std::to_string(batch) +
             " samples but dense has " + std::to_string(d.size[0]) + " rows");
    std::vector<pk_bags_part> parts(features.size());
    std::vector<const Ints *> index_of(features.size(), &ix);
    for (size_t i = 0; i < features.size(); i++) {
        const size_t t = (size_t)tables[i];
        parts[i] = make_part(tabs[t], ix, offs.data() + features[i] * batch, batch, mean[t] != 0,
                             padding[t]);
    }
    Tensor out = interaction(drows, batch, d.size[1], parts, index_of, kind, order, itself);
    stack[0] = reinterpret_cast<StableIValue>(out.release());
}

/* ------------------------------------------------------------------ unpooled lookups */

/* Integer indices of any shape (int32 or int64), row-major (copied when not contiguous). */
struct IndexTensor {
    Ints ints;
    std::vector<int64_t> shape;
};

void read_index_tensor(const Tensor &t, IndexTensor &out)
{
    int32_t device = 0, dtype = 0;
    int64_t ndim = 0, *sizes = nullptr, *strides = nullptr;
    void *data = nullptr;
    check_call(api.aoti_torch_get_device_type(t.get(), &device), "get_device_type");
    if (device != api.aoti_torch_device_type_cpu())
        fail("perfkernels: indices must be a CPU tensor (the native kernels are CPU kernels)");
    check_call(api.aoti_torch_get_dim(t.get(), &ndim), "get_dim");
    check_call(api.aoti_torch_get_sizes(t.get(), &sizes), "get_sizes");
    check_call(api.aoti_torch_get_strides(t.get(), &strides), "get_strides");
    check_call(api.aoti_torch_get_dtype(t.get(), &dtype), "get_dtype");
    check_call(api.aoti_torch_get_data_ptr(t.get(), &data), "get_data_ptr");
    const bool is64 = dtype == api.aoti_torch_dtype_int64();
    if (!is64 && dtype != api.aoti_torch_dtype_int32())
        fail("perfkernels: indices must be int32 or int64; got " + dtype_name(dtype));
    out.shape.assign(sizes, sizes + ndim);
    int64_t n = 1;
    for (int64_t s : out.shape) n *= s;
    bool contiguous = true;
    int64_t expect = 1;
    for (int64_t i = ndim - 1; i >= 0; i--) {
        if (sizes[i] != 1 && strides[i] != expect) contiguous = false;
        expect *= sizes[i];
    }
    out.ints.is64 = is64;
    out.ints.n = n;
    out.ints.data = data;
    if (contiguous || n == 0) return;
    /* a strided gather, row-major over the shape */
    const size_t elem = is64 ? 8 : 4;
    char *dst;
    if (is64) {
        out.ints.c64.resize((size_t)n);
        dst = reinterpret_cast<char *>(out.ints.c64.data());
    } else {
        out.ints.c32.resize((size_t)n);
        dst = reinterpret_cast<char *>(out.ints.c32.data());
    }
    std::vector<int64_t> at((size_t)ndim, 0);
    for (int64_t k = 0; k < n; k++) {
        int64_t off = 0;
        for (int64_t i = 0; i < ndim; i++) off += at[(size_t)i] * strides[i];
        std::memcpy(dst + (size_t)k * elem, static_cast<const char *>(data) + off * (int64_t)elem, elem);
        for (int64_t i = ndim - 1; i >= 0; i--) {
            if (++at[(size_t)i] < sizes[i]) break;
            at[(size_t)i] = 0;
        }
    }
    out.ints.data = dst;
}

/* A new contiguous tensor of shape `shape` + [dim] and dtype `dtype`. */
Tensor new_rows_output(const std::vector<int64_t> &shape, int64_t dim, int32_t dtype)
{
    std::vector<int64_t> sizes(shape), strides(shape.size() + 1);
    sizes.push_back(dim);
    int64_t s = 1;
    for (size_t i = sizes.size(); i-- > 0;) {
        strides[i] = s;
        s *= std::max<int64_t>(sizes[i], 1);
    }
    AtenTensorHandle h = nullptr;
    check_call(api.aoti_torch_empty_strided((int64_t)sizes.size(), sizes.data(), strides.data(),
                                            dtype, api.aoti_torch_device_type_cpu(), 0, &h),
               "empty_strided");
    return Tensor(h);
}

/* After an unpooled lookup's kernel refused an index (each kernel checks an index before it
 * reads the row, so the lookups make no pass over the indices of their own): torch's message
 * for the first index outside [0, rows).  The half-written result is dropped. */
[[noreturn]] void bad_rows(const Ints &ix, int64_t rows)
{
    for (int64_t j = 0; j < ix.n; j++) {
        const int64_t v = ix[j];
        if (v < 0 || v >= rows)
            fail("index out of range in self: perfkernels: indices (flattened) [" + std::to_string(j) +
                 "] = " + std::to_string(v) + " is not in the valid range [0, " +
                 std::to_string(rows) + ")");
    }
    fail("perfkernels: an embedding lookup failed (an index changed during the call)");
}

/* Runs f(lo, hi) over [0, n) on torch's threads when `bytes` of traffic pay for them. */
template <class F>
void split_rows(int64_t n, int64_t bytes, F f)
{
    const int threads = pk_parallel_threads_for(bytes, torch_threads());
    if (threads <= 1 || n <= 1) {
        f(0, n);
        return;
    }
    struct Job {
        F *f;
    } job{&f};
    auto body = [](int64_t lo, int64_t hi, void *ctx) { (*static_cast<Job *>(ctx)->f)(lo, hi); };
    if (api.torch_parallel_for(0, n, (n + threads - 1) / threads, body, &job) != 0) f(0, n);
}

/* A float table read by the unpooled lookups: rows of `dim` elements of `elem` bytes,
 * row_stride elements apart (a copy when its rows are not unit-stride). */
struct RowTable {
    const void *data = nullptr;
    int64_t rows = 0, dim = 0, elem = 4, row_stride = 0;
    int32_t dtype = 0;
    std::vector<uint32_t> c32;
    std::vector<uint16_t> c16;
};

void row_table(const Tensor &weight, const std::string &name, RowTable &T)
{
    const View w = view(weight, name.c_str(), 2);
    if (w.dtype == api.aoti_torch_dtype_float32())
        T.elem = 4;
    else if (w.dtype == api.aoti_torch_dtype_float16() || w.dtype == api.aoti_torch_dtype_bfloat16())
        T.elem = 2;
    else
        fail("perfkernels: " + name + " must be float32, float16 or bfloat16; got " + dtype_name(w.dtype));
    T.dtype = w.dtype;
    T.rows = w.size[0];
    T.dim = w.size[1];
    T.data = w.data;
    T.row_stride = T.rows <= 1 ? T.dim : w.stride[0];
    if (!(T.dim <= 1 || w.stride[1] == 1) || T.row_stride < 0) {
        T.data = T.elem == 4 ? (const void *)contiguous<uint32_t>(w, T.c32)
                             : (const void *)contiguous<uint16_t>(w, T.c16);
        T.row_stride = T.dim;
    }
}

/* Rows [lo, hi) of the lookup `ix` in T, written to out's rows [lo, hi). */
pk_status copy_rows(pk_embedding_rows_fn fn, const RowTable &T, const Ints &ix, int64_t lo,
                    int64_t hi, char *out)
{
    int64_t bad = 0;
    const size_t isz = ix.is64 ? 8 : 4;
    return fn(T.data, T.rows, T.row_stride * T.elem, T.dim * T.elem,
              static_cast<const char *>(ix.data) + (size_t)lo * isz, ix.is64, hi - lo,
              out + lo * T.dim * T.elem, &bad);
}

/* embedding(Tensor weight, Tensor indices, SymInt padding_idx) -> Tensor
 * weight[indices]: rows copied as stored (float32, float16 or bfloat16), shape
 * indices.shape + [D].  padding_idx matters to the gradient only. */
void embedding(StableIValue *stack, uint64_t, uint64_t)
{
    Tensor weight = take_tensor(stack[0]), indices = take_tensor(stack[1]);
    (void)to_int(stack[2]);
    RowTable T;
    row_table(weight, "weight", T);
    IndexTensor ix;
    read_index_tensor(indices, ix);
    Tensor out = new_rows_output(ix.shape, T.dim, T.dtype);
    void *o = nullptr;
    check_call(api.aoti_torch_get_data_ptr(out.get(), &o), "get_data_ptr");
    const pk_embedding_rows_fn fn =
        pk_sequence_table(g_isa.load(std::memory_order_relaxed))->embedding_rows;
    std::atomic<int> failed{0};
    split_rows(ix.ints.n, ix.ints.n * T.dim * T.elem * 2, [&](int64_t lo, int64_t hi) {
        if (copy_rows(fn, T, ix.ints, lo, hi, static_cast<char *>(o)) != PK_OK) failed.store(1);
    });
    if (failed.load()) bad_rows(ix.ints, T.rows);
    stack[0] = reinterpret_cast<StableIValue>(out.release());
}

/* embedding_collection(Tensor[] weights, Tensor values, Tensor offsets, SymInt num_keys,
 *     SymInt[] tables, SymInt group) -> Tensor
 * Every feature of a jagged tensor looked up unpooled, in one call: row j of the [n, D] result
 * is weights[tables[k]][values[j]] for the key k whose values hold j (offsets: the jagged
 * tensor's num_keys * batch + 1 offsets; key k's values are [offsets[k * batch],
 * offsets[(k + 1) * batch])).  The tables share one dtype and one D.  The result's rows of one
 * key are that feature's jagged values; the split across threads runs over all of them.  group:
 * the id of the modules whose gradient rules the backward (Python) applies; unused here. */
void embedding_collection(StableIValue *stack, uint64_t, uint64_t)
{
    const std::vector<Tensor> weights = take_list<Tensor>(stack[0], take_tensor);
    Tensor values = take_tensor(stack[1]), offsets = take_tensor(stack[2]);
    const int64_t num_keys = to_int(stack[3]);
    const std::vector<int64_t> tables = take_list<int64_t>(stack[4], to_int);
    (void)to_int(stack[5]);
    if (weights.empty()) fail("perfkernels: weights is empty: a collection needs a table");
    std::vector<RowTable> tabs(weights.size());
    for (size_t t = 0; t < weights.size(); t++) {
        row_table(weights[t], "weights[" + std::to_string(t) + "]", tabs[t]);
        if (tabs[t].dtype != tabs[0].dtype || tabs[t].dim != tabs[0].dim)
            fail("perfkernels: the tables of one call share a dtype and a dim: weights[" +
                 std::to_string(t) + "] is " + dtype_name(tabs[t].dtype) + " [" +
                 std::to_string(tabs[t].rows) + ", " + std::to_string(tabs[t].dim) +
                 "], weights[0] " + dtype_name(tabs[0].dtype) + " [" + std::to_string(tabs[0].rows) +
                 ", " + std::to_string(tabs[0].dim) + "]");
    }
    if (num_keys < 1) fail("perfkernels: num_keys must be >= 1; got " + std::to_string(num_keys));
    if ((int64_t)tables.size() != num_keys)
        fail("perfkernels: tables needs one entry per key (" + std::to_string(num_keys) + "); got " +
             std::to_string(tables.size()));
    for (size_t k = 0; k < tables.size(); k++)
        if (tables[k] < 0 || tables[k] >= (int64_t)weights.size())
            fail("perfkernels: tables[" + std::to_string(k) + "] = " + std::to_string(tables[k]) +
                 " is not a table (0 <= table < " + std::to_string(weights.size()) + ")");
    Ints ix;
    read_ints(view(values, "values", 1), "values", ix);
    std::vector<int64_t> off;
    const int64_t batch = jagged_offsets(offsets, num_keys, ix.n, off);
    std::vector<int64_t> bound((size_t)num_keys + 1);
    for (int64_t k = 0; k <= num_keys; k++) bound[(size_t)k] = off[(size_t)(k * batch)];
    const int64_t dim = tabs[0].dim, elem = tabs[0].elem;
    Tensor out = new_rows_output({ix.n}, dim, tabs[0].dtype);
    char *o = nullptr;
    check_call(api.aoti_torch_get_data_ptr(out.get(), reinterpret_cast<void **>(&o)), "get_data_ptr");
    const pk_embedding_rows_fn fn =
        pk_sequence_table(g_isa.load(std::memory_order_relaxed))->embedding_rows;
    std::atomic<int> failed{0};
    split_rows(ix.n, ix.n * dim * elem * 2, [&](int64_t lo, int64_t hi) {
        /* the keys whose values meet [lo, hi), each from its own table */
        int64_t k = std::upper_bound(bound.begin(), bound.end(), lo) - bound.begin() - 1;
        for (; k < num_keys && bound[(size_t)k] < hi; k++) {
            const int64_t a = std::max(lo, bound[(size_t)k]), b = std::min(hi, bound[(size_t)k + 1]);
            if (a < b && copy_rows(fn, tabs[(size_t)tables[(size_t)k]], ix, a, b, o) != PK_OK)
                failed.store(1);
        }
    });
    if (failed.load()) {   /* a kernel refused an index (before reading its row): which */
        for (int64_t k = 0; k < num_keys; k++) {
            const RowTable &T = tabs[(size_t)tables[(size_t)k]];
            for (int64_t j = bound[(size_t)k]; j < bound[(size_t)k + 1]; j++) {
                const int64_t v = ix[j];
                if (v < 0 || v >= T.rows)
                    fail("index out of range in self: perfkernels: values[" + std::to_string(j) +
                         "] = " + std::to_string(v) + " (key " + std::to_string(k) + ") is not in "
                         "the valid range [0, " + std::to_string(T.rows) + ") of table " +
                         std::to_string(tables[(size_t)k]));
            }
        }
        fail("perfkernels: an embedding lookup failed (an index changed during the call)");
    }
    stack[0] = reinterpret_cast<StableIValue>(out.release());
}

/* embedding_quantized(Tensor packed, Tensor indices, SymInt bits, SymInt dim) -> Tensor
 * float32 rows of the packed table (row-wise 8/4/2-bit codes with their scale and bias), shape
 * indices.shape + [dim]. */
void embedding_quantized(StableIValue *stack, uint64_t, uint64_t)
{
    Tensor packed = take_tensor(stack[0]), indices = take_tensor(stack[1]);
    const int64_t bits = to_int(stack[2]), dim = to_int(stack[3]);
    if (bits != 8 && bits != 4 && bits != 2)
        fail("perfkernels: bits must be 8, 4 or 2; got " + std::to_string(bits));
    TablePart T;
    table_part(packed, bits, dim, "packed", T);
    IndexTensor ix;
    read_index_tensor(indices, ix);
    Tensor out = new_rows_output(ix.shape, dim, api.aoti_torch_dtype_float32());
    float *o = output_data(out);
    const pk_embedding_rows_quantized_fn fn =
        pk_sequence_table(g_isa.load(std::memory_order_relaxed))->embedding_rows_quantized;
    const size_t isz = ix.ints.is64 ? 8 : 4;
    std::atomic<int> failed{0};
    const uint8_t *rows = static_cast<const uint8_t *>(T.args.table);
    split_rows(ix.ints.n, ix.ints.n * (T.args.row_stride + dim * 4), [&](int64_t lo, int64_t hi) {
        int64_t bad = 0;
        if (fn((int)bits, rows, T.rows, T.args.row_stride, dim,
               static_cast<const char *>(ix.ints.data) + (size_t)lo * isz, ix.ints.is64, hi - lo,
               o + lo * dim, &bad) != PK_OK)
            failed.store(1);
    });
    if (failed.load()) bad_rows(ix.ints, T.rows);
    stack[0] = reinterpret_cast<StableIValue>(out.release());
}

/* ------------------------------------------------------------------ conversions */

/* A 2-D table's elements in row-major order (copied when not contiguous), for the conversions. */
template <class T>
const T *table_elements(const Tensor &t, const char *name, View &v, std::vector<T> &copy)
{
    v = view(t, name, 2);
    return contiguous<T>(v, copy);
}

/* quantize_rowwise(Tensor weight, SymInt bits) -> Tensor
 * float32 or float16 rows -> uint8 rows of packed codes and their scale and bias (the layout of
 * torch.ops.quantized.embedding_bag_{byte,4bit,2bit}_prepack, bit for bit). */
void quantize_rowwise(StableIValue *stack, uint64_t, uint64_t)
{
    Tensor weight = take_tensor(stack[0]);
    const int64_t bits = to_int(stack[1]);
    if (bits != 8 && bits != 4 && bits != 2)
        fail("perfkernels: bits must be 8, 4 or 2; got " + std::to_string(bits));
    View w = view(weight, "weight", 2);
    const bool half = w.dtype == api.aoti_torch_dtype_float16();
    if (!half && w.dtype != api.aoti_torch_dtype_float32())
        fail("perfkernels: weight must be float32 or float16; got " + dtype_name(w.dtype));
    std::vector<uint32_t> c32;
    std::vector<uint16_t> c16;
    const void *data = half ? (const void *)table_elements<uint16_t>(weight, "weight", w, c16)
                            : (const void *)table_elements<uint32_t>(weight, "weight", w, c32);
    const int64_t rows = w.size[0], dim = w.size[1];
    if (dim < 1) fail("perfkernels: weight must have at least one column; got 0");
    const int64_t row_bytes = (int64_t)pk_quantized_row_bytes((int)bits, (size_t)dim);
    Tensor out = new_output(rows, row_bytes, api.aoti_torch_dtype_uint8());
    void *o = nullptr;
    check_call(api.aoti_torch_get_data_ptr(out.get(), &o), "get_data_ptr");
    size_t bad_row = 0;
    const pk_status s = pk_quantized_table(g_isa.load(std::memory_order_relaxed))
        ->quantize_rowwise((int)bits, half ? 1 : 0, data, (size_t)rows, (size_t)dim,
                           static_cast<uint8_t *>(o), &bad_row);
    if (s == PK_ERR_NONFINITE)
        fail("perfkernels: weight row " + std::to_string(bad_row) + " holds NaN or inf: it has "
             "no finite range to quantize");
    if (s != PK_OK) fail("perfkernels: quantize_rowwise failed with status " + std::to_string((int)s));
    stack[0] = reinterpret_cast<StableIValue>(out.release());
}

/* dequantize_rowwise(Tensor packed, SymInt bits, SymInt dim) -> Tensor
 * float32 rows q * scale + bias of a packed table. */
void dequantize_rowwise(StableIValue *stack, uint64_t, uint64_t)
{
    Tensor packed = take_tensor(stack[0]);
    const int64_t bits = to_int(stack[1]), dim = to_int(stack[2]);
    if (bits != 8 && bits != 4 && bits != 2)
        fail("perfkernels: bits must be 8, 4 or 2; got " + std::to_string(bits));
    TablePart T;
    table_part(packed, bits, dim, "packed", T);
    Tensor out = new_output(T.rows, dim);
    pk_quantized_table(g_isa.load(std::memory_order_relaxed))
        ->dequantize_rowwise((int)bits, static_cast<const uint8_t *>(T.args.table), (size_t)T.rows,
                             (size_t)T.args.row_stride,
                             (size_t)dim, output_data(out));
    stack[0] = reinterpret_cast<StableIValue>(out.release());
}

/* ------------------------------------------------------------------ fused optimizer step */

/* A hyper-parameter as the kernels take it: finite, >= 0 and within float32's range. */
float hyper(double v, const char *name)
{
    if (!std::isfinite(v)) fail(std::string("perfkernels: ") + name + " = " + std::to_string(v) + " must be finite");
    if (v < 0) fail(std::string("perfkernels: ") + name + " = " + std::to_string(v) + " must be >= 0");
    if (v > FLT_MAX)
        fail(std::string("perfkernels: ") + name + " = " + std::to_string(v) +
             " is too large for float32 (the kernels compute in float32)");
    return (float)v;
}

/* The bytes [begin, end) a matrix view spans. */
std::pair<const char *, const char *> extent(const View &v, int64_t elem)
{
    if (numel(v) == 0) return {v.data, v.data};
    const int64_t last = (v.size[0] - 1) * v.stride[0] + (v.size[1] - 1) * v.stride[1];
    return {v.data, v.data + (last + 1) * elem};
}

bool overlap(const View &a, int64_t ea, const View &b, int64_t eb)
{
    const auto x = extent(a, ea), y = extent(b, eb);
    return x.first < y.second && y.first < x.second;
}

/* An array updated in place, row by row on several threads: unit stride along D, its rows
 * apart (a zero or short row stride would make several rows one, and their updates race). */
void check_in_place(const View &v, const std::string &name, int64_t elem)
{
    if (numel(v) == 0) return;
    const bool unit = v.ndim == 1 || v.size[1] <= 1 || v.stride[1] == 1;
    const int64_t row = v.ndim == 2 ? v.size[1] : 1;
    if (!unit || v.stride[0] < 0 || (v.size[0] > 1 && v.stride[0] < row))
        fail("perfkernels: " + name + " must have unit stride along D and rows that do not "
             "overlap (it is updated in place, so it cannot be copied); got strides [" +
             std::to_string(v.stride[0]) + ", " + std::to_string(v.stride[1]) + "]");
    if (reinterpret_cast<uintptr_t>(v.data) % (uintptr_t)elem != 0)
        fail("perfkernels: " + name + " is not aligned to its element size");
}

/* One optimizer state tensor: float32 [rows, D] (full) or [rows], updated in place. */
View state_view(const Tensor &t, const std::string &name, const std::string &optimizer,
                bool full, int64_t rows, int64_t dim)
{
    if (!t)
        fail("perfkernels: optimizer '" + optimizer + "' needs " + name + ", float32 " +
             (full ? "[rows, D]" : "[rows]") + " (zeros to start)");
    const View v = view(t, name.c_str(), full ? 2 : 1);
    if (v.dtype != api.aoti_torch_dtype_float32())
        fail("perfkernels: " + name + " must be float32; got " + dtype_name(v.dtype));
    if (v.size[0] != rows || (full && v.size[1] != dim))
        fail("perfkernels: " + name + " has shape [" + std::to_string(v.size[0]) +
             (full ? ", " + std::to_string(v.size[1]) : std::string()) + "]; optimizer '" +
             optimizer + "' needs [" + std::to_string(rows) +
             (full ? ", " + std::to_string(dim) : std::string()) + "]");
    check_in_place(v, name, 4);
    return v;
}

/* A workspace per thread, grown when a call needs more: repeated steps reuse mapped memory, and
 * concurrent calls from different threads never share one. */
void *training_workspace(int64_t bytes)
{
    thread_local std::vector<char> space;
    if ((int64_t)space.size() < bytes) space.resize((size_t)std::max<int64_t>(bytes, 2 * (int64_t)space.size()));
    return space.data();
}

/* The options of a fused optimizer step that every table of a call shares. */
struct StepOptions {
    std::string optimizer;
    double lr, eps, weight_decay, beta1, beta2, momentum;
    bool nesterov, stochastic;
};

StepOptions take_step_options(StableIValue *stack, int optimizer, int lr, int beta1, int momentum)
{
    StepOptions o;
    o.optimizer = take_string(stack[optimizer]);
    o.lr = to_double(stack[lr]);
    o.eps = to_double(stack[lr + 1]);
    o.weight_decay = to_double(stack[lr + 2]);
    o.beta1 = to_double(stack[beta1]);
    o.beta2 = to_double(stack[beta1 + 1]);
    o.momentum = to_double(stack[momentum]);
    o.nesterov = to_bool(stack[momentum + 1]);
    o.stochastic = to_bool(stack[momentum + 2]);
    return o;
}

/* One table's fused step, every argument checked, ready to run (run_step). */
struct TableStep {
    pk_sparse_optim opt;
    Bags b;
    std::vector<float> grad_copy;
    pk_training_call call;
    int64_t rows;
};

/* Check one table's step and fill `s`; `n` follows each argument's name in the messages ("" for
 * the one-table op, "[f]" for table f of the many-table op). */
void prepare_step(TableStep &s, const Tensor &weight, const Tensor &indices, const Tensor &offsets,
                  const Tensor &psw, const std::string &mode, bool include_last_offset,
                  std::optional<int64_t> padding_idx, const Tensor &grad_output,
                  const StepOptions &o, const Tensor &state, const Tensor &state2,
                  std::optional<int64_t> step, int64_t seed, const std::string &n)
{
    const std::string &optimizer = o.optimizer;
    pk_sparse_optim &opt = s.opt;
    std::memset(&opt, 0, sizeof opt);
    const bool adam = optimizer == "adam" || optimizer == "rowwise_adam" || optimizer == "adamw";
    if (optimizer == "sgd")
        opt.optimizer = o.momentum != 0 ? PK_OPT_MOMENTUM : PK_OPT_SGD;
    else if (optimizer == "adagrad")
        opt.optimizer = PK_OPT_ADAGRAD;
    else if (optimizer == "rowwise_adagrad")
        opt.optimizer = PK_OPT_ROWWISE_ADAGRAD;
    else if (optimizer == "adam")
        opt.optimizer = PK_OPT_ADAM;
    else if (optimizer == "rowwise_adam")
        opt.optimizer = PK_OPT_ROWWISE_ADAM;
    else if (optimizer == "adamw")
        opt.optimizer = PK_OPT_ADAMW;
    else
        fail("perfkernels: optimizer must be one of 'sgd', 'adagrad', 'rowwise_adagrad', 'adam', "
             "'rowwise_adam', 'adamw'; got '" + optimizer + "'");
    opt.lr = hyper(o.lr, "lr");
    opt.eps = hyper(o.eps, "eps");
    opt.weight_decay = hyper(o.weight_decay, "weight_decay");
    opt.momentum = hyper(o.momentum, "momentum");
    if (optimizer != "sgd" && (o.momentum != 0 || o.nesterov))
        fail("perfkernels: momentum and nesterov are options of optimizer 'sgd'; got momentum = " +
             std::to_string(o.momentum) + " with optimizer '" + optimizer + "'");
    if (o.nesterov && o.momentum == 0) fail("perfkernels: nesterov=True needs momentum > 0");
    opt.nesterov = o.nesterov ? 1 : 0;

    const View w = view(weight, ("weight" + n).c_str(), 2);
    int64_t elem = 4;
    pk_training_update_fn update = nullptr;
    const pk_training_kernels *k = pk_training_table(g_isa.load(std::memory_order_relaxed));
    if (w.dtype == api.aoti_torch_dtype_float32()) {
        update = k->training_update_f32;
    } else if (w.dtype == api.aoti_torch_dtype_float16()) {
        update = k->training_update_f16;
        elem = 2;
    } else if (w.dtype == api.aoti_torch_dtype_bfloat16()) {
        update = k->training_update_bf16;
        elem = 2;
    } else {
        fail("perfkernels: weight" + n + " must be float32, float16 or bfloat16; got " +
             dtype_name(w.dtype));
    }
    check_in_place(w, "weight" + n, elem);
    const int64_t rows = w.size[0], dim = w.size[1];

    std::vector<View> states;
    if (adam) {
        if (!step)
            fail("perfkernels: optimizer '" + optimizer + "' needs step" + n + ", the table's "
                 "step count including this update (1 for the first)");
        if (*step < 1)
            fail("perfkernels: step" + n + " = " + std::to_string(*step) + " must be >= 1 (the "
                 "count including this update)");
        if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1))
            fail("perfkernels: betas = (" + std::to_string(o.beta1) + ", " +
                 std::to_string(o.beta2) + ") must each be in [0, 1)");
        if (opt.eps <= 0)
            fail("perfkernels: eps = " + std::to_string(o.eps) + " must be > 0 for optimizer '" +
                 optimizer + "'");
        pk_sparse_optim_adam(&opt, o.lr, o.weight_decay, *step, o.beta1, o.beta2,
                             optimizer == "adamw");
        states.push_back(state_view(state, "state" + n + " (m)", optimizer, true, rows, dim));
        states.push_back(state_view(state2, "state2" + n + " (v)", optimizer,
                                    optimizer != "rowwise_adam", rows, dim));
    } else {
        if (step) fail("perfkernels: step is an option of the Adam family; optimizer '" + optimizer +
                       "' keeps no step count");
        if (state2) fail("perfkernels: optimizer '" + optimizer + "' keeps one state: state2" + n +
                         " must be None");
        if (opt.optimizer == PK_OPT_SGD) {
            if (state) fail("perfkernels: optimizer 'sgd' keeps no state without momentum: state" +
                            n + " must be None");
        } else {
            states.push_back(state_view(state, "state" + n, optimizer,
                                        optimizer != "rowwise_adagrad", rows, dim));
        }
    }
    for (size_t i = 0; i < states.size(); i++) {
        if (overlap(states[i], 4, w, elem))
            fail("perfkernels: the optimizer state shares memory with weight" + n);
        for (size_t j = 0; j < i; j++)
            if (overlap(states[i], 4, states[j], 4))
                fail("perfkernels: state" + n + " and state2" + n + " share memory");
    }
    if (!states.empty()) {
        opt.state = reinterpret_cast<float *>(states[0].data);
        opt.state_stride = states[0].stride[0];
    }
    if (states.size() > 1) {
        opt.state2 = reinterpret_cast<float *>(states[1].data);
        opt.state2_stride = states[1].stride[0];
    }
    opt.stochastic_rounding = o.stochastic && elem == 2 ? 1 : 0;
    opt.seed = (uint64_t)seed;

    Bags &b = s.b;
    prepare(b, indices, offsets, psw, mode, include_last_offset, padding_idx, rows);
    const View g = view(grad_output, ("grad_output" + n).c_str(), 2);
    if (g.dtype != api.aoti_torch_dtype_float32())
        fail("perfkernels: grad_output" + n + " must be float32; got " + dtype_name(g.dtype));
    if (g.size[0] != b.bags.num_bags || g.size[1] != dim)
        fail("perfkernels: grad_output" + n + " has shape [" + std::to_string(g.size[0]) + ", " +
             std::to_string(g.size[1]) + "]; expected [" + std::to_string(b.bags.num_bags) + ", " +
             std::to_string(dim) + "] ([num_bags, D])");
    bool shared = overlap(g, 4, w, elem);
    for (const View &st : states) shared = shared || overlap(g, 4, st, 4);
    /* rows of unit stride are read where they are (a slice of the gradient of a concatenation,
     * as DLRM's backward gives each table, costs no copy); else, or when it shares memory with
     * what is written, a contiguous copy */
    const float *grad = reinterpret_cast<const float *>(g.data);
    int64_t grad_stride = g.size[0] <= 1 ? dim : g.stride[0];
    if (shared || !(dim <= 1 || g.stride[1] == 1) || grad_stride < 0) {
        const float *c = contiguous<float>(g, s.grad_copy);
        if (s.grad_copy.empty()) s.grad_copy.assign(c, c + numel(g));
        grad = s.grad_copy.data();
        grad_stride = dim;
    }
    if (!pk_training_fits(rows, b.bags.n_indices, b.bags.num_bags))
        fail("perfkernels: " + std::to_string(b.bags.n_indices) + " indices into a table of " +
             std::to_string(rows) + " rows: the row and entry numbers need more than 64 bits");

    pk_training_call &call = s.call;
    call.bags = nullptr;     /* set by run_step: `s` may still move */
    call.rows = rows;
    call.grad = grad;
    call.grad_stride = grad_stride;
    call.table = w.data;
    call.dim = dim;
    call.row_stride = rows <= 1 ? dim : w.stride[0];
    call.update = update;
    call.opt = &opt;
    s.rows = rows;
}

/* The first index of `b` outside [0, rows), or -1. */
int64_t first_bad_index(const Bags &b, int64_t rows)
{
    for (int64_t i = 0; i < b.indices.n; i++) {
        const int64_t v = b.indices[i];
        if (v < 0 || v >= rows) return i;
    }
    return -1;
}

void run_step(TableStep &s)
{
    s.call.bags = &s.b.bags;
    s.call.opt = &s.opt;
    pk_training_plan plan;
    pk_training_plan_call(&s.call, torch_threads(), &plan);
    int64_t bad = 0;
    const pk_status st = pk_training_run(&s.call, &plan, training_workspace(plan.workspace_bytes),
                                         &g_pool, &bad);
    if (st == PK_ERR_INDEX) index_error(s.b.indices, bad, s.rows);
    if (st != PK_OK)
        fail("perfkernels: the fused optimizer step failed with status " + std::to_string((int)st));
}

/* embedding_bag_backward_update(Tensor(a!) weight, Tensor indices, Tensor? offsets,
 *     Tensor? per_sample_weights, str bag_mode, bool include_last_offset, SymInt? padding_idx,
 *     Tensor grad_output, str optimizer, Tensor(b!)? state, Tensor(c!)? state2, float lr,
 *     float eps, float weight_decay, int? step, float beta1, float beta2, float momentum,
 *     bool nesterov, bool stochastic_rounding, int seed) -> ()
 * The backward of weight's bags fused with a sparse optimizer step: the touched rows of weight
 * (and of state, state2) updated in place, as perfkernels.embedding_bag_backward_update does;
 * every argument and every index checked before the first row is written.  (bag_mode, not mode:
 * torch.compile's functionalisation of a mutating op passes its arguments by name to a function
 * with a parameter of its own called mode.) */
void embedding_bag_backward_update(StableIValue *stack, uint64_t, uint64_t)
{
    Tensor weight = take_tensor(stack[0]);
    const BagArgs a = take_bag_args(stack);
    Tensor grad_output = take_tensor(stack[7]);
    const StepOptions o = take_step_options(stack, 8, 11, 15, 17);
    Tensor state = take_optional_tensor(stack[9]), state2 = take_optional_tensor(stack[10]);
    const std::optional<int64_t> step = take_optional_int(stack[14]);
    const int64_t seed = to_int(stack[20]);
    TableStep s;
    prepare_step(s, weight, a.indices, a.offsets, a.psw, a.mode, a.include_last_offset,
                 a.padding_idx, grad_output, o, state, state2, step, seed, "");
    run_step(s);
}

/* embedding_bags_backward_update(Tensor(a!)[] weights, Tensor[] indices, Tensor[] offsets,
 *     SymInt[] mean, bool include_last_offset, SymInt[] padding_idx, Tensor[] grad_outputs,
 *     str optimizer, Tensor(b!)[] states, Tensor(c!)[] states2, float lr, float eps,
 *     float weight_decay, SymInt[] steps, float beta1, float beta2, float momentum,
 *     bool nesterov, bool stochastic_rounding, SymInt[] seeds) -> ()
 * The fused step of several tables with one optimizer in one call (a training step of a model
 * with many tables pays one dispatch, not one per table): table f is stepped as
 * embedding_bag_backward_update steps it with weights[f], indices[f], offsets[f] (1-D, the
 * include_last_offset convention given), mean[f] ("mean" when nonzero, else "sum"),
 * padding_idx[f] (-1: none), grad_outputs[f], states[f] / states2[f] (empty lists when the
 * optimizer keeps no such state), steps[f] (the Adam family; else empty) and seeds[f].  The
 * tables are stepped in order (a table given twice steps twice), and every argument and index
 * of every table is checked before the first row is written. */
void embedding_bags_backward_update(StableIValue *stack, uint64_t, uint64_t)
{
    std::vector<Tensor> weights = take_list<Tensor>(stack[0], take_tensor);
    std::vector<Tensor> indices = take_list<Tensor>(stack[1], take_tensor);
    std::vector<Tensor> offsets = take_list<Tensor>(stack[2], take_tensor);
    const std::vector<int64_t> mean = take_list<int64_t>(stack[3], to_int);
    const bool include_last = to_bool(stack[4]);
    const std::vector<int64_t> padding = take_list<int64_t>(stack[5], to_int);
    std::vector<Tensor> grads = take_list<Tensor>(stack[6], take_tensor);
    const StepOptions o = take_step_options(stack, 7, 10, 14, 16);
    std::vector<Tensor> states = take_list<Tensor>(stack[8], take_tensor);
    std::vector<Tensor> states2 = take_list<Tensor>(stack[9], take_tensor);
    const std::vector<int64_t> steps = take_list<int64_t>(stack[13], to_int);
    const std::vector<int64_t> seeds = take_list<int64_t>(stack[19], to_int);

    const size_t F = weights.size();
    auto same = [&](size_t n, const char *what, bool may_be_empty) {
        if (n != F && !(may_be_empty && n == 0))
            fail(std::string("perfkernels: ") + what + " needs one entry per table (" +
                 std::to_string(F) + ")" + (may_be_empty ? " or none" : "") + "; got " +
                 std::to_string(n));
    };
    same(indices.size(), "indices", false);
    same(offsets.size(), "offsets", false);
    same(mean.size(), "mean", false);
    same(padding.size(), "padding_idx", false);
    same(grads.size(), "grad_outputs", false);
    same(states.size(), "states", true);
    same(states2.size(), "states2", true);
    same(steps.size(), "steps", true);
    same(seeds.size(), "seeds", false);
    const Tensor none;
    std::vector<TableStep> s(F);
    for (size_t f = 0; f < F; f++) {
        const std::string n = "[" + std::to_string(f) + "]";
        if (padding[f] < -1)
            fail("perfkernels: padding_idx" + n + " = " + std::to_string(padding[f]) +
                 " must be -1 (none) or a row");
        prepare_step(s[f], weights[f], indices[f], offsets[f], none, mean[f] ? "mean" : "sum",
                     include_last,
                     padding[f] < 0 ? std::nullopt : std::optional<int64_t>(padding[f]),
                     grads[f], o, states.empty() ? none : states[f],
                     states2.empty() ? none : states2[f],
                     steps.empty() ? std::nullopt : std::optional<int64_t>(steps[f]), seeds[f], n);
    }
    for (size_t f = 0; f < F; f++) {
        const int64_t bad = first_bad_index(s[f].b, s[f].rows);
        if (bad >= 0) index_error(s[f].b.indices, bad, s[f].rows);
    }
    for (size_t f = 0; f < F; f++) run_step(s[f]);
}

/* ------------------------------------------------------------------ registration */

struct Op {
    const char *name;
    const char *schema;
    pk_boxed_kernel fn;
};

/* The schemas are those the package registered from Python before these ops were native, so
 * graphs saved then keep loading. */
const Op OPS[] = {
    {"embedding_bag",
     "embedding_bag(Tensor weight, Tensor indices, Tensor? offsets, Tensor? per_sample_weights, "
     "str mode, bool include_last_offset, SymInt? padding_idx) -> Tensor",
     guarded<embedding_bag>},
    {"embedding_bag_quantized",
     "embedding_bag_quantized(Tensor packed, Tensor indices, Tensor? offsets, "
     "Tensor? per_sample_weights, str mode, bool include_last_offset, SymInt? padding_idx, "
     "SymInt bits, SymInt dim) -> Tensor",
     guarded<embedding_bag_quantized>},
    {"embedding_bag_collection",
     "embedding_bag_collection(Tensor[] weights, Tensor values, Tensor offsets, "
     "Tensor? per_sample_weights, SymInt num_keys, SymInt[] features, SymInt[] tables, "
     "SymInt[] mean, SymInt[] padding_idx) -> Tensor",
     guarded<embedding_bag_collection>},
    /* the same kernels without autograd: what a graph that records no gradient calls (a
     * Python autograd kernel costs several microseconds a call even under no_grad) */
    {"embedding_bag_inference",
     "embedding_bag_inference(Tensor weight, Tensor indices, Tensor? offsets, "
     "Tensor? per_sample_weights, str mode, bool include_last_offset, SymInt? padding_idx) "
     "-> Tensor",
     guarded<embedding_bag>},
    {"embedding_bag_collection_inference",
     "embedding_bag_collection_inference(Tensor[] weights, Tensor values, Tensor offsets, "
     "Tensor? per_sample_weights, SymInt num_keys, SymInt[] features, SymInt[] tables, "
     "SymInt[] mean, SymInt[] padding_idx) -> Tensor",
     guarded<embedding_bag_collection>},
    /* a collection of quantized (and float) tables: inference only */
    {"embedding_bag_collection_packed",
     "embedding_bag_collection_packed(Tensor[] weights, SymInt[] bits, SymInt[] dims, "
     "Tensor values, Tensor offsets, Tensor? per_sample_weights, SymInt num_keys, "
     "SymInt[] features, SymInt[] tables, SymInt[] mean, SymInt[] padding_idx) -> Tensor",
     guarded<embedding_bag_collection_packed>},
    {"quantize_rowwise", "quantize_rowwise(Tensor weight, SymInt bits) -> Tensor",
     guarded<quantize_rowwise>},
    {"dequantize_rowwise", "dequantize_rowwise(Tensor packed, SymInt bits, SymInt dim) -> Tensor",
     guarded<dequantize_rowwise>},
    {"lstm_unit", "lstm_unit(Tensor c_prev, Tensor gates, float forget_bias=0.) -> (Tensor, Tensor)",
     guarded<lstm_unit>},
    {"lstm_unit_backward",
     "lstm_unit_backward(Tensor c_prev, Tensor gates, Tensor c, Tensor dh, Tensor dc, "
     "float forget_bias=0.) -> (Tensor, Tensor)",
     guarded<lstm_unit_backward>},
    {"embedding_bags_interaction",
     "embedding_bags_interaction(Tensor dense, Tensor[] weights, Tensor[] indices, "
     "Tensor[] offsets, bool include_last_offset, str interaction, str pairs, "
     "bool self_interaction, SymInt[] mean, SymInt[] padding_idx, SymInt[] bits, "
     "SymInt[] dims, SymInt group) -> Tensor",
     guarded<embedding_bags_interaction>},
    {"embedding_bags_interaction_inference",
     "embedding_bags_interaction_inference(Tensor dense, Tensor[] weights, Tensor[] indices, "
     "Tensor[] offsets, bool include_last_offset, str interaction, str pairs, "
     "bool self_interaction, SymInt[] mean, SymInt[] padding_idx, SymInt[] bits, "
     "SymInt[] dims, SymInt group) -> Tensor",
     guarded<embedding_bags_interaction>},
    {"collection_interaction",
     "collection_interaction(Tensor dense, Tensor[] weights, Tensor values, Tensor offsets, "
     "SymInt num_keys, SymInt[] features, SymInt[] tables, str interaction, str pairs, "
     "bool self_interaction, SymInt[] mean, SymInt[] padding_idx, SymInt group) -> Tensor",
     guarded<collection_interaction>},
    {"embedding", "embedding(Tensor weight, Tensor indices, SymInt padding_idx) -> Tensor",
     guarded<embedding>},
    {"embedding_inference",
     "embedding_inference(Tensor weight, Tensor indices, SymInt padding_idx) -> Tensor",
     guarded<embedding>},
    {"embedding_quantized",
     "embedding_quantized(Tensor packed, Tensor indices, SymInt bits, SymInt dim) -> Tensor",
     guarded<embedding_quantized>},
    {"embedding_collection",
     "embedding_collection(Tensor[] weights, Tensor values, Tensor offsets, SymInt num_keys, "
     "SymInt[] tables, SymInt group) -> Tensor",
     guarded<embedding_collection>},
    {"embedding_collection_inference",
     "embedding_collection_inference(Tensor[] weights, Tensor values, Tensor offsets, "
     "SymInt num_keys, SymInt[] tables, SymInt group) -> Tensor",
     guarded<embedding_collection>},
    {"embedding_bag_backward_update",
     "embedding_bag_backward_update(Tensor(a!) weight, Tensor indices, Tensor? offsets, "
     "Tensor? per_sample_weights, str bag_mode, bool include_last_offset, SymInt? padding_idx, "
     "Tensor grad_output, str optimizer, Tensor(b!)? state, Tensor(c!)? state2, float lr, "
     "float eps, float weight_decay, int? step, float beta1, float beta2, float momentum, "
     "bool nesterov, bool stochastic_rounding, int seed) -> ()",
     guarded<embedding_bag_backward_update>},
    {"embedding_bags_backward_update",
     "embedding_bags_backward_update(Tensor(a!)[] weights, Tensor[] indices, Tensor[] offsets, "
     "SymInt[] mean, bool include_last_offset, SymInt[] padding_idx, Tensor[] grad_outputs, "
     "str optimizer, Tensor(b!)[] states, Tensor(c!)[] states2, float lr, float eps, "
     "float weight_decay, SymInt[] steps, float beta1, float beta2, float momentum, "
     "bool nesterov, bool stochastic_rounding, SymInt[] seeds) -> ()",
     guarded<embedding_bags_backward_update>},
};

/* Defines the ops and registers their CPU kernels when the library is loaded; the libraries
 * are released (and the ops unregistered) when it is unloaded. */
class Registration {
public:
    Registration()
    {
        status_ = load_api();
        if (!status_.empty()) {
            std::fprintf(stderr, "perfkernels native ops not registered: %s\n", status_.c_str());
            return;
        }
        g_isa.store(best_isa());
        if (api.aoti_torch_library_init_fragment("perfkernels", __FILE__, __LINE__, &def_) != 0 ||
            api.aoti_torch_library_init_impl("perfkernels", "CPU", __FILE__, __LINE__, &impl_) != 0) {
            status_ = "torch refused to open the library of namespace perfkernels";
            return;
        }
        for (const Op &op : OPS) {
            if (api.aoti_torch_library_def(def_, op.schema) != 0) {
                status_ = std::string("torch refused the schema ") + op.schema;
                return;
            }
            if (api.torch_library_impl(impl_, op.name, op.fn, PK_TORCH_ABI_VERSION) != 0) {
                status_ = std::string("torch refused the CPU kernel of ") + op.name;
                return;
            }
        }
    }
    ~Registration()
    {
        if (impl_) api.aoti_torch_delete_library_object(impl_);
        if (def_) api.aoti_torch_delete_library_object(def_);
    }
    const std::string &status() const { return status_; }

private:
    TorchLibraryHandle def_ = nullptr, impl_ = nullptr;
    std::string status_;
};

const Registration g_registration;

}  // namespace

/* The few C entry points of the library (for perfkernels.torch, through ctypes). */
extern "C" {

/* "" when every op is registered, else why not. */
__attribute__((visibility("default"))) const char *pk_native_status(void)
{
    return g_registration.status().c_str();
}

/* The ISA level the kernels run at (perfkernels.use_isa sets it); -1 if not built/unknown. */
__attribute__((visibility("default"))) int pk_native_set_isa(int isa)
{
    if (isa < 0 || isa >= PK_ISA_COUNT || !pk_isa_compiled(isa)) return -1;
    g_isa.store(isa);
    return isa;
}

__attribute__((visibility("default"))) int pk_native_isa(void) { return g_isa.load(); }

}
