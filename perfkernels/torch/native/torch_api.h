/* The stable-ABI functions of torch, as a table of pointers filled when the library is loaded
 * (torch_api.cpp), and the small C++ helpers the ops are written with: owned tensor handles,
 * the StableIValue conversions, and the exception every failed check throws. */
#ifndef PERFKERNELS_TORCH_API_H
#define PERFKERNELS_TORCH_API_H

#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "stable_abi.h"

namespace pk_torch {

struct Api {
#define PK_API_MEMBER(ret, name, params) ret(*name) params = nullptr;
    PK_TORCH_API(PK_API_MEMBER)
#undef PK_API_MEMBER
};

/* The table; every member is set when loaded() is true. */
extern Api api;
/* Fills the table from the libtorch_cpu in the process; "" on success, else what is missing. */
std::string load_api();

/* A failed check: std::runtime_error, which torch turns into RuntimeError in Python. */
[[noreturn]] inline void fail(const std::string &message) { throw std::runtime_error(message); }

inline void check_call(AOTITorchError err, const char *what)
{
    if (err != 0) fail(std::string("perfkernels: torch's ") + what + " failed");
}

/* An owned tensor handle (deleted on scope exit). */
class Tensor {
public:
    Tensor() = default;
    explicit Tensor(AtenTensorHandle h) : h_(h) {}
    Tensor(Tensor &&o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
    Tensor &operator=(Tensor &&o) noexcept
    {
        std::swap(h_, o.h_);
        return *this;
    }
    Tensor(const Tensor &) = delete;
    Tensor &operator=(const Tensor &) = delete;
    ~Tensor()
    {
        if (h_) api.aoti_torch_delete_tensor_object(h_);
    }
    AtenTensorHandle get() const { return h_; }
    AtenTensorHandle release() { return std::exchange(h_, nullptr); }
    explicit operator bool() const { return h_ != nullptr; }

private:
    AtenTensorHandle h_ = nullptr;
};

/* --- reading the stack (each takes ownership of what the slot holds) --- */

inline Tensor take_tensor(StableIValue v) { return Tensor(reinterpret_cast<AtenTensorHandle>(v)); }

inline Tensor take_optional_tensor(StableIValue v)
{
    if (v == 0) return Tensor();
    StableIValue *inner = reinterpret_cast<StableIValue *>(v);
    Tensor t(reinterpret_cast<AtenTensorHandle>(*inner));
    delete inner;
    return t;
}

inline int64_t to_int(StableIValue v)
{
    int64_t x;
    std::memcpy(&x, &v, sizeof x);
    return x;
}

inline bool to_bool(StableIValue v)
{
    bool b;
    std::memcpy(&b, &v, sizeof b);
    return b;
}

inline std::optional<int64_t> take_optional_int(StableIValue v)
{
    if (v == 0) return std::nullopt;
    StableIValue *inner = reinterpret_cast<StableIValue *>(v);
    const int64_t x = to_int(*inner);
    delete inner;
    return x;
}

inline std::string take_string(StableIValue v)
{
    StringHandle s = reinterpret_cast<StringHandle>(v);
    size_t n = 0;
    const char *data = nullptr;
    const bool ok = api.torch_string_length(s, &n) == 0 && api.torch_string_c_str(s, &data) == 0;
    std::string out = ok ? std::string(data, n) : std::string();
    api.torch_delete_string(s);
    if (!ok) fail("perfkernels: could not read a string argument");
    return out;
}

/* A list's items; `take` converts (and takes ownership of) one item. */
template <class T, class F>
std::vector<T> take_list(StableIValue v, F take)
{
    StableListHandle l = reinterpret_cast<StableListHandle>(v);
    size_t n = 0;
    std::vector<StableIValue> raw;
    if (api.torch_list_size(l, &n) == 0) {
        raw.resize(n);
        for (size_t i = 0; i < n; i++)
            if (api.torch_list_get_item(l, i, &raw[i]) != 0) raw[i] = 0;
    }
    api.torch_delete_list(l);
    std::vector<T> out;
    out.reserve(raw.size());
    for (StableIValue item : raw) out.push_back(take(item));
    return out;
}

}  // namespace pk_torch

#endif
