/* The stable-ABI functions of torch, as a table of pointers filled when the library is loaded
 * (torch_api.cpp), and the small C++ helpers the ops are written with: owned tensor handles,
 * the StableIValue conversions, and fail(), which every failed check calls. */
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

/* A failed check inside the library: the message and the source location of fail()'s caller.
 * It never leaves the library: guarded() catches it at the op's entry and raises torch's error. */
class Failure : public std::runtime_error {
public:
    Failure(const std::string &message, const char *func, const char *file, unsigned line)
        : std::runtime_error(message), func(func), file(file), line(line) {}
    const char *func;
    const char *file;
    unsigned line;
};

/* A failed check: throws a Failure carrying `message` and fail()'s caller as source location,
 * which the op's entry (guarded(), below) turns into torch's own exception. */
[[noreturn]] void fail(const std::string &message, const char *func = __builtin_FUNCTION(),
                       const char *file = __builtin_FILE(), unsigned line = __builtin_LINE());

/* Raises torch's error for `message`: a c10::Error whose message (what_without_backtrace()) is
 * `message` and whose source location is func/file/line, the exception torch's own TORCH_CHECK
 * throws, so a C++ program catches `const c10::Error &` and Python sees a RuntimeError.  The
 * library links no c10: load_api() looks up c10::detail::torchCheckFail (the function every
 * TORCH_CHECK calls, which builds and throws the c10::Error inside libc10) in the libc10
 * already in the process.  Where it is not found (a libc10 whose symbol is missing, or called
 * before load_api()), it throws std::runtime_error(message) instead, which Python also sees as a
 * RuntimeError.  error_kind() says which of the two it throws. */
[[noreturn]] void raise_error(const char *message, const char *func = __builtin_FUNCTION(),
                              const char *file = __builtin_FILE(), unsigned line = __builtin_LINE());

/* Runs an op; on an exception, keeps its message and location for raise_pending() and returns
 * false.  Nothing thrown inside the library unwinds out of it. */
bool run_caught(pk_boxed_kernel fn, StableIValue *stack, uint64_t num_args,
                uint64_t num_outputs) noexcept;

/* raise_error() for what run_caught() kept last on this thread. */
[[noreturn]] void raise_pending();

/* The entry torch calls for op F.  The library's C++ runtime may be its own (the wheel's
 * library links libc++ statically, torch uses libstdc++), and an exception must then never
 * unwind between the two: every exception thrown in the library is caught by run_caught()
 * before it reaches torch, and torch's c10::Error, thrown inside libc10, unwinds only through
 * this frame and raise_pending()'s, which hold nothing to clean up (no landing pads, so torch's
 * unwinder never calls this library's exception personality). */
template <pk_boxed_kernel F>
void guarded(StableIValue *stack, uint64_t num_args, uint64_t num_outputs)
{
    if (!run_caught(F, stack, num_args, num_outputs)) raise_pending();
}

/* "c10::Error" or "std::runtime_error": what raise_error() throws in this process. */
const char *error_kind();

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
