/* The few functions of PyTorch's stable C ABI (the "stable shim" of libtorch_cpu) that the native
 * ops use, declared here so that the library builds without torch's headers and links no torch
 * library.  Each is resolved when the library is loaded, from the libtorch_cpu already in the
 * process (see torch_api.cpp); a missing one (a torch older than 2.10) is reported, not crashed on.
 *
 * The signatures are those of torch 2.10's torch/csrc/inductor/aoti_torch/c/shim.h and
 * torch/csrc/stable/c/shim.h, which the stable ABI keeps for every later release.  StableIValue
 * conventions are those of an extension built for 2.10 (the version passed to torch_library_impl):
 *   Tensor            an AtenTensorHandle the kernel owns (and must delete)
 *   Tensor? / int?    0 for None, else a heap StableIValue* (the kernel deletes it) holding the value
 *   int, bool         the value in the low bytes
 *   str               a StringHandle the kernel owns
 *   T[]               a StableListHandle the kernel owns, items as above
 * A kernel returns its outputs in the first slots of the same stack (a Tensor: a new handle).
 */
#ifndef PERFKERNELS_TORCH_STABLE_ABI_H
#define PERFKERNELS_TORCH_STABLE_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef int32_t AOTITorchError;       /* 0: success */
typedef uint64_t StableIValue;
typedef struct AtenTensorOpaque *AtenTensorHandle;
typedef struct TorchLibraryOpaque *TorchLibraryHandle;
typedef struct StringOpaque *StringHandle;
typedef struct StableListOpaque *StableListHandle;
typedef void (*pk_boxed_kernel)(StableIValue *stack, uint64_t num_args, uint64_t num_outputs);
typedef void (*pk_torch_parallel_body)(int64_t begin, int64_t end, void *ctx);

/* The stable ABI version this library is written against: torch 2.10.0 (TORCH_VERSION_2_10_0). */
#define PK_TORCH_ABI_VERSION ((((uint64_t)2) << 56) | (((uint64_t)10) << 48))

/* X(return type, name, parameter list): every function used, in one list. */
#define PK_TORCH_API(X)                                                                           \
    X(AOTITorchError, aoti_torch_library_init_fragment,                                            \
      (const char *ns, const char *file, uint32_t line, TorchLibraryHandle *ret))                  \
    X(AOTITorchError, aoti_torch_library_init_impl,                                                \
      (const char *ns, const char *k, const char *file, uint32_t line, TorchLibraryHandle *ret))   \
    X(AOTITorchError, aoti_torch_library_def, (TorchLibraryHandle self, const char *schema))       \
    X(AOTITorchError, torch_library_impl,                                                          \
      (TorchLibraryHandle self, const char *name, pk_boxed_kernel fn, uint64_t version))           \
    X(AOTITorchError, aoti_torch_delete_library_object, (TorchLibraryHandle self))                 \
    X(AOTITorchError, aoti_torch_delete_tensor_object, (AtenTensorHandle t))                       \
    X(AOTITorchError, aoti_torch_get_data_ptr, (AtenTensorHandle t, void **ret))                   \
    X(AOTITorchError, aoti_torch_get_dim, (AtenTensorHandle t, int64_t *ret))                      \
    X(AOTITorchError, aoti_torch_get_sizes, (AtenTensorHandle t, int64_t **ret))                   \
    X(AOTITorchError, aoti_torch_get_strides, (AtenTensorHandle t, int64_t **ret))                 \
    X(AOTITorchError, aoti_torch_get_dtype, (AtenTensorHandle t, int32_t *ret))                    \
    X(AOTITorchError, aoti_torch_get_device_type, (AtenTensorHandle t, int32_t *ret))              \
    X(AOTITorchError, aoti_torch_empty_strided,                                                    \
      (int64_t ndim, const int64_t *sizes, const int64_t *strides, int32_t dtype,                  \
       int32_t device_type, int32_t device_index, AtenTensorHandle *ret))                          \
    X(int32_t, aoti_torch_device_type_cpu, (void))                                                 \
    X(int32_t, aoti_torch_dtype_float32, (void))                                                   \
    X(int32_t, aoti_torch_dtype_float64, (void))                                                   \
    X(int32_t, aoti_torch_dtype_float16, (void))                                                   \
    X(int32_t, aoti_torch_dtype_bfloat16, (void))                                                  \
    X(int32_t, aoti_torch_dtype_int32, (void))                                                     \
    X(int32_t, aoti_torch_dtype_int64, (void))                                                     \
    X(int32_t, aoti_torch_dtype_uint8, (void))                                                     \
    X(AOTITorchError, torch_string_length, (StringHandle s, size_t *ret))                          \
    X(AOTITorchError, torch_string_c_str, (StringHandle s, const char **ret))                      \
    X(AOTITorchError, torch_delete_string, (StringHandle s))                                       \
    X(AOTITorchError, torch_list_size, (StableListHandle l, size_t *ret))                          \
    X(AOTITorchError, torch_list_get_item, (StableListHandle l, size_t i, StableIValue *ret))      \
    X(AOTITorchError, torch_delete_list, (StableListHandle l))                                     \
    X(AOTITorchError, torch_parallel_for,                                                          \
      (int64_t begin, int64_t end, int64_t grain, pk_torch_parallel_body fn, void *ctx))           \
    X(AOTITorchError, torch_get_num_threads, (uint32_t *ret))

#endif
