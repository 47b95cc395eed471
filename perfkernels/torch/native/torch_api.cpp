/* Resolving torch's stable C ABI at load time.
 *
 * The library links no torch library: in a Python process torch's libraries are loaded with
 * RTLD_LOCAL (their symbols are not visible to a later library), and a C++ program may load them
 * any way it likes.  So the functions are looked up by name in the libtorch_cpu that is already
 * loaded (dlopen with RTLD_NOLOAD finds it by its soname without loading a second copy), then in
 * the global scope (a program linked with -ltorch_cpu). */
#include <dlfcn.h>

#include "torch_api.h"

namespace pk_torch {

Api api;

std::string load_api()
{
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
