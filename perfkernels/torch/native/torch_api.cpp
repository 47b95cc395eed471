/* Resolving torch's stable C ABI at load time.
 *
 * The library links no torch library: in a Python process torch's libraries are loaded with
 * RTLD_LOCAL (their symbols are not visible to a later library), and a C++ program may load them
 * any way it likes.  So the functions are looked up by name in the libtorch_cpu that is already
 * loaded (dlopen with RTLD_NOLOAD finds it by its soname without loading a second copy), then in
 * the global scope (a program linked with -ltorch_cpu).  One function of libc10 is found the same
 * way: torchCheckFail, through which raise_error() throws torch's c10::Error. */
#include <dlfcn.h>

#include "torch_api.h"

namespace pk_torch {

Api api;

namespace {

/* c10::detail::torchCheckFail(const char *func, const char *file, uint32_t line, const char *msg):
 * throws c10::Error(SourceLocation{func, file, line}, msg).  Every TORCH_CHECK of every compiled
 * extension calls it, so libc10 exports it under this name in every release (2.10 to 2.13 at
 * least); the const char * overload keeps std::string's ABI out of the call. */
using CheckFail = void (*)(const char *, const char *, uint32_t, const char *);
constexpr const char kCheckFailSymbol[] = "_ZN3c106detail14torchCheckFailEPKcS2_jS2_";
CheckFail g_check_fail = nullptr;

/* Finds torchCheckFail in the libc10 already in the process (as load_api() finds the stable ABI
 * in libtorch_cpu), else in the global scope; leaves g_check_fail null if neither has it. */
void load_check_fail()
{
    void *lib = dlopen("libc10.so", RTLD_LAZY | RTLD_NOLOAD);
    void *sym = lib ? dlsym(lib, kCheckFailSymbol) : nullptr;
    if (!sym) sym = dlsym(RTLD_DEFAULT, kCheckFailSymbol);
    if (lib) dlclose(lib);   /* drops the reference NOLOAD took; c10 stays loaded */
    g_check_fail = reinterpret_cast<CheckFail>(sym);
}

}  // namespace

[[noreturn]] void fail(const std::string &message, const char *func, const char *file,
                       unsigned line)
{
    throw Failure(message, func, file, line);
}

namespace {

/* Throws std::runtime_error(message): a function of its own, so that raise_error(), through
 * whose frame torch's c10::Error unwinds, has no landing pad (the exception's construction has
 * one). */
[[noreturn]] __attribute__((noinline)) void throw_runtime_error(const char *message)
{
    throw std::runtime_error(message);
}

/* What run_caught() kept, per thread, until raise_pending() raises it. */
struct Pending {
    std::string message;
    const char *func = "";
    const char *file = "";
    unsigned line = 0;
};
thread_local Pending t_pending;

}  // namespace

[[noreturn]] void raise_error(const char *message, const char *func, const char *file,
                              unsigned line)
{
    if (CheckFail check_fail = g_check_fail) check_fail(func, file, line, message);
    throw_runtime_error(message);   /* no c10 found (or torchCheckFail returned) */
}

bool run_caught(pk_boxed_kernel fn, StableIValue *stack, uint64_t num_args,
                uint64_t num_outputs) noexcept
{
    Pending &p = t_pending;
    try {
        fn(stack, num_args, num_outputs);
        return true;
    } catch (const Failure &e) {
        p.message = e.what();
        p.func = e.func;
        p.file = e.file;
        p.line = e.line;
    } catch (const std::exception &e) {   /* std::bad_alloc and the like */
        p.message = std::string("perfkernels: ") + e.what();
        p.func = __func__;
        p.file = __FILE__;
        p.line = __LINE__;
    } catch (...) {
        p.message = "perfkernels: an unknown C++ exception";
        p.func = __func__;
        p.file = __FILE__;
        p.line = __LINE__;
    }
    return false;
}

[[noreturn]] __attribute__((noinline)) void raise_pending()
{
    const Pending &p = t_pending;
    raise_error(p.message.c_str(), p.func, p.file, p.line);
}

const char *error_kind() { return g_check_fail ? "c10::Error" : "std::runtime_error"; }

std::string load_api()
{
    load_check_fail();
    void *lib = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD);
    std::string missing;
#define PK_API_LOAD(ret, name, params)                                                            \
    {                                                                                             \
        void *sym = lib ? dlsym(lib, #name) : nullptr;                                            \
        if (!sym) sym = dlsym(RTLD_DEFAULT, #name);                                               \
        if (sym)                                                                                  \
            api.name = reinterpret_cast<ret(*) params>(sym);                                      \
        else                                                                                      \
            missing += (missing.empty() ? "" : ", ") + std::string(#name);                        \
    }
    PK_TORCH_API(PK_API_LOAD)
#undef PK_API_LOAD
    if (lib) dlclose(lib);   /* drops the reference NOLOAD took; torch stays loaded */
    if (missing.empty()) return "";
    if (!lib)
        return "libtorch_cpu.so is not loaded in this process (import torch, or link or dlopen "
               "libtorch_cpu.so, before loading the perfkernels native library)";
    return "this torch lacks the stable ABI functions " + missing + " (torch 2.10 or later needed)";
}

}  // namespace pk_torch

extern "C" {

/* What a failed check throws in this process: "c10::Error" or "std::runtime_error" (the
 * fallback where libc10's torchCheckFail was not found). */
__attribute__((visibility("default"))) const char *pk_native_error_kind(void)
{
    return pk_torch::error_kind();
}

}
