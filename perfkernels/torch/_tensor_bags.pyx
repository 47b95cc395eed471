"""The embedding module's eager fast path in C: one float-table lookup read straight from tensors.

A tiny lookup (a bag of one index) costs the C kernel about 0.1 us; reaching it through NumPy
costs ten times that (``Tensor.numpy()`` is about 0.5 us a tensor, ``data_ptr()``, ``shape``,
``stride()`` and the dtype read one by one as much).  :func:`lookup` reads each tensor in one C
call instead: DLPack's C exchange API (``torch.Tensor.__dlpack_c_exchange_api__``, DLPack 1.x,
torch 2.10 and later), whose ``dltensor_from_py_object_no_sync`` fills a ``DLTensor`` (data
pointer, device, dtype, shape, strides) without allocating.  The structs are declared below, so
nothing is built against torch's headers and torch stays an optional runtime dependency.  Where
torch has no such API, :func:`lookup` answers None to every lookup without a gradient (the
caller's full path, through ``Tensor.numpy()``, serves them).

While a profiler runs (``torch.profiler``) it answers None to every lookup, so that the full
path records the call as ``perfkernels::embedding_bag``.  It takes only the plain cases and
answers None for anything else, having computed and written
nothing, so that the caller runs its full path (``_embedding_bag.py``), which holds every rule:

* without a gradient: CPU tensors of type ``torch.Tensor`` (a Parameter too, for the table),
  contiguous int32/int64 indices and offsets, float32 ``per_sample_weights``, a
  float32/float16/bfloat16 table with unit-stride rows, no negative views, modes "sum" and
  "mean", the bag checks of the NumPy API passed (offsets starting at 0, non-decreasing, within
  the input), every index in range.  The kernel runs on the calling thread for a tiny call,
  else with the GIL released on the thread pool, as ``perfkernels.embedding_bag`` does;
* with a gradient, where torch's own kernel and autograd serve the lookup (a float32 CPU table,
  a sparse or a small gradient, no ``per_sample_weights``, no custom weight backward: see
  ``_bags.torch_autograd_is_faster``): 1-D input with 1-D offsets goes straight to
  ``torch.embedding_bag``, the op ``torch.nn.functional.embedding_bag`` ends in, without the
  functional's Python checks (every one of them passes on such arguments).  Not while a torch
  function mode is active (the mode sees the functional, as with torch's module), and never on
  an exception (the full path then raises it, in torch's words).
"""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from cpython.dict cimport PyDict_GetItemWithError
from cpython.exc cimport PyErr_Clear
from cpython.object cimport PyObject
from cpython.pycapsule cimport PyCapsule_GetPointer
cimport numpy as cnp
from perfkernels._memory cimport pool_empty

import torch

from perfkernels import _dispatch
from perfkernels.families.embedding import _embedding
from perfkernels.families.interaction import _interaction

from perfkernels._c_common cimport pk_status, PK_OK
from perfkernels._c_bags cimport pk_bags
from perfkernels._bags cimport BAGS_SCRATCH, TINY_BAGS, normalise_offsets, run_bags
from perfkernels._parallel cimport pool, resolve_threads
from perfkernels._c_bags_parallel cimport pk_bags_part
from perfkernels._c_parallel cimport pk_parallel_api
from libc.stdlib cimport malloc, free
from perfkernels.families.embedding._c_embedding cimport pk_embedding_bag_fn, pk_embedding_kernels
from perfkernels._c_bags_call cimport pk_table_bags_args, pk_table_bags_call, pk_table_bags_float
from perfkernels.families.sequence._sequence cimport rows_into

cnp.import_array()

# DLPack 1.x (dlpack.h): the DLTensor and the head of the C exchange API, up to the member used.
cdef extern from *:
    """
    typedef struct { int32_t device_type; int32_t device_id; } pk_dl_device;
    typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } pk_dl_dtype;
    typedef struct {
        void *data; pk_dl_device device; int32_t ndim; pk_dl_dtype dtype;
        int64_t *shape; int64_t *strides; uint64_t byte_offset;
    } pk_dl_tensor;
    typedef struct { uint32_t major; uint32_t minor; } pk_dl_version;
    typedef struct pk_dl_api_header {
        pk_dl_version version; struct pk_dl_api_header *prev_api;
    } pk_dl_api_header;
    typedef int (*pk_dl_view_fn)(void *py_object, pk_dl_tensor *out);
    typedef struct {
        pk_dl_api_header header;
        void *managed_tensor_allocator;
        void *managed_tensor_from_py_object_no_sync;
        void *managed_tensor_to_py_object_no_sync;
        pk_dl_view_fn dltensor_from_py_object_no_sync;
    } pk_dl_api;
    """
    ctypedef struct pk_dl_device:
        int32_t device_type
    ctypedef struct pk_dl_dtype:
        uint8_t code
        uint8_t bits
        uint16_t lanes
    ctypedef struct pk_dl_tensor:
        void *data
        pk_dl_device device
        int32_t ndim
        pk_dl_dtype dtype
        int64_t *shape
        int64_t *strides
        uint64_t byte_offset
    ctypedef struct pk_dl_version:
        uint32_t major
    ctypedef struct pk_dl_api_header:
        pk_dl_version version
        pk_dl_api_header *prev_api
    ctypedef int (*pk_dl_view_fn)(void *py_object, pk_dl_tensor *out) noexcept
    ctypedef struct pk_dl_api:
        pk_dl_api_header header
        pk_dl_view_fn dltensor_from_py_object_no_sync

cdef enum:
    DL_CPU = 1      # kDLCPU
    DL_INT = 0      # kDLInt
    DL_FLOAT = 2    # kDLFloat
    DL_BFLOAT = 4   # kDLBfloat


cdef pk_dl_view_fn _find_view_fn() noexcept:
    """torch's dltensor_from_py_object_no_sync (DLPack major version 1), or NULL."""
    cdef pk_dl_api_header *api
    try:
        capsule = getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)
        if capsule is None:
            return NULL
        api = <pk_dl_api_header *>PyCapsule_GetPointer(capsule, b"dlpack_exchange_api")
    except Exception:
        return NULL
    while api != NULL and api.version.major != 1:
        api = api.prev_api
    return NULL if api == NULL else (<pk_dl_api *>api).dltensor_from_py_object_no_sync


cdef pk_dl_view_fn _view_fn = _find_view_fn()

cdef const pk_embedding_kernels *_kernels = NULL

from perfkernels._c_bags cimport pk_bags_first_bad_in
from perfkernels.families.interaction._c_interaction cimport (pk_interaction_dot_fn,
                                                              pk_interaction_kernels)
from perfkernels.families.multi.fused cimport run_interaction

cdef const pk_interaction_kernels *_dot_kernels = NULL


def _set_isa(int level):
    global _kernels, _dot_kernels
    _kernels = <const pk_embedding_kernels *>PyCapsule_GetPointer(
        _embedding._kernel_table(level), b"perfkernels.embedding_kernels")
    _dot_kernels = <const pk_interaction_kernels *>PyCapsule_GetPointer(
        _interaction._kernel_table(level), b"perfkernels.interaction_kernels")


_dispatch.register(_set_isa)

# torch's objects, compared by identity or called on every lookup
cdef object _Tensor = torch.Tensor
cdef object _Parameter = torch.nn.Parameter
cdef object _float32 = torch.float32
cdef object _float16 = torch.float16
cdef object _bfloat16 = torch.bfloat16
cdef object _is_neg = torch.Tensor.is_neg
cdef object _from_numpy = torch.from_numpy
cdef object _is_grad_enabled = torch.is_grad_enabled
cdef object _function_mode_enabled = torch._C._is_torch_function_mode_enabled
cdef object _torch_embedding_bag = torch.embedding_bag
# while a profiler runs, every lookup takes the full path, which records it by name
cdef object _profiler_enabled = torch._C._autograd._profiler_enabled
cdef int64_t _dense_grad_min_values = 0


def set_dense_grad_min_values(int64_t n):
    """The size (indices x D) from which a dense-gradient lookup runs ours, not torch's kernel
    (``_bags.DENSE_GRAD_MIN_VALUES``; set once by the torch layer)."""
    global _dense_grad_min_values
    _dense_grad_min_values = n


def has_tensor_views():
    """Whether this torch lets lookups without a gradient take the fast path (DLPack's C exchange
    API is there)."""
    return _view_fn != NULL


# one CPU tensor of 1 or 2 dimensions, as the kernels read it
cdef struct _View:
    char *data
    int64_t size0, size1        # 1-D: size1 = 1
    int64_t stride0, stride1    # in elements
    int ndim
    uint8_t code, bits          # DLPack's type code and width
    bint contiguous


cdef bint _describe(object t, _View *v) noexcept:
    """Fill v from a CPU tensor of 1 or 2 dimensions (t a torch.Tensor, or a subclass of it); False,
    with no exception set, for anything else (another device, a sparse or storage-less tensor, a
    dtype DLPack has no code for)."""
    cdef pk_dl_tensor d
    if _view_fn == NULL:
        return False
    if _view_fn(<void *>t, &d) != 0:
        PyErr_Clear()
        return False
    if d.device.device_type != DL_CPU or d.ndim < 1 or d.ndim > 2 or d.dtype.lanes != 1:
        return False
    v.ndim = d.ndim
    v.code, v.bits = d.dtype.code, d.dtype.bits
    v.size0 = d.shape[0]
    v.size1 = d.shape[1] if d.ndim == 2 else 1
    if d.strides == NULL:       # DLPack: compact row-major
        v.stride0, v.stride1 = v.size1, 1
    else:
        v.stride0 = d.strides[0]
        v.stride1 = d.strides[1] if d.ndim == 2 else 1
    v.data = <char *>d.data + d.byte_offset
    # torch's rule (sizes of 1 and empty tensors take any stride), and aligned for the element
    # (torch.frombuffer can start a tensor anywhere)
    v.contiguous = ((v.size0 * v.size1 == 0
                     or ((v.size1 == 1 or v.stride1 == 1)
                         and (v.size0 == 1 or v.stride0 == v.size1)))
                    and <uintptr_t>v.data % (v.bits // 8 if v.bits >= 8 else 1) == 0)
    if v.data == NULL and v.size0 * v.size1 != 0:       # torch's zero tensors have no memory
        return False
    return True


cdef bint _readable(object t, _View *v) noexcept:
    """_describe for a tensor whose memory holds its values: not a negative view
    (``x.conj().imag``, ``torch._neg_view``), whose memory holds their negation."""
    if not _describe(t, v):
        return False
    try:
        return not _is_neg(t)
    except Exception:
        return False


cdef bint _index_tensor(object t, _View *v) noexcept:
    """_readable for a contiguous int32 / int64 torch.Tensor."""
    return (type(t) is _Tensor and _readable(t, v) and v.code == DL_INT
            and (v.bits == 32 or v.bits == 64) and v.contiguous)


cdef enum:
    TABLE_F32, TABLE_F16, TABLE_BF16


cdef int _float_table(object weight, _View *w) noexcept:
    """The format of a table the kernels read in place (TABLE_F32 / F16 / BF16), with w filled,
    or -1: a CPU float32 / float16 / bfloat16 torch.Tensor or Parameter of 2 dimensions, rows of
    unit stride, aligned for its element, not a negative view."""
    cdef int fmt
    if (type(weight) is not _Parameter and type(weight) is not _Tensor) or not _readable(weight, w):
        return -1
    if w.code == DL_FLOAT and w.bits == 32:
        fmt = TABLE_F32
    elif w.code == DL_FLOAT and w.bits == 16:
        fmt = TABLE_F16
    elif w.code == DL_BFLOAT and w.bits == 16:
        fmt = TABLE_BF16
    else:
        return -1
    if (w.ndim != 2 or (w.stride1 != 1 and w.size1 > 1) or w.stride0 < 0
            or <uintptr_t>w.data % (w.bits // 8)):
        return -1
    return fmt


def module_lookup(module, input, offsets, per_sample_weights):
    """``perfkernels.torch.EmbeddingBag.forward(input, offsets, per_sample_weights)`` of
    ``module`` when it is one of the plain cases (see the module docstring), else None.  Its
    options are read here, in C: a tiny lookup costs about as much as reading them in Python."""
    cdef dict d = module.__dict__
    if _option(d, module, "max_norm") is not None or _option(d, module, "scale_grad_by_freq"):
        return None
    parameters = _option(d, module, "_parameters")
    weight = parameters.get("weight") if type(parameters) is dict else None
    return _lookup(weight, input, offsets, per_sample_weights, _option(d, module, "mode"),
                   _option(d, module, "include_last_offset"), _option(d, module, "padding_idx"),
                   _option(d, module, "output_dtype"), _option(d, module, "weighted_mean"),
                   _option(d, module, "sparse"), _option(d, module, "weight_backward") is None)


cdef inline object _option(dict d, object module, str name):
    """module.<name>: from the instance dict d (where nn.Module keeps plain attributes: one dict
    look-up, against a getattr through nn.Module's __getattr__ hook), else by getattr (a class
    default such as output_dtype)."""
    cdef PyObject *value = PyDict_GetItemWithError(d, name)
    if value != NULL:
        return <object>value
    return getattr(module, name)


def lookup(weight, input, offsets, per_sample_weights, mode, bint include_last_offset,
           padding_idx, output_dtype, bint weighted_mean, bint sparse, bint torch_kernel_ok):
    """One lookup with these options (``max_norm`` None, ``scale_grad_by_freq`` False) when it
    is one of the plain cases (see the module docstring), else None.

    ``output_dtype``: the result's dtype (None: the table's).  ``weighted_mean``: our opt-in for
    ``per_sample_weights`` in mode "mean".  ``torch_kernel_ok``: no custom weight backward, so a
    lookup with a gradient may run torch's own kernel.
    """
    return _lookup(weight, input, offsets, per_sample_weights, mode, include_last_offset,
                   padding_idx, output_dtype, weighted_mean, sparse, torch_kernel_ok)


cdef object _lookup(weight, input, offsets, per_sample_weights, mode, bint include_last_offset,
                    padding_idx, output_dtype, bint weighted_mean, bint sparse,
                    bint torch_kernel_ok):
    cdef _View w, ix, off, psw
    cdef int mean, itemsize, nt, fmt
    cdef pk_embedding_bag_fn fn
    cdef int64_t rows, dim, n, count = 0, max_len = 0, b, pad, bad = -1
    cdef pk_bags bags
    cdef int64_t scratch[BAGS_SCRATCH]
    cdef int64_t *dst
    cdef cnp.ndarray norm = None, out
    cdef cnp.npy_intp shape[2]
    cdef pk_table_bags_args args
    cdef pk_status status

    if _profiler_enabled():     # the full path records the op (``_bags.lookup``)
        return None
    fmt = _float_table(weight, &w)
    if fmt == TABLE_F32:
        fn = _kernels.embedding_bag_f32
        table_dtype = _float32
    elif fmt == TABLE_F16:
        fn = _kernels.embedding_bag_f16
        table_dtype = _float16
    elif fmt == TABLE_BF16:
        fn = _kernels.embedding_bag_bf16
        table_dtype = _bfloat16
    else:
        return None
    itemsize = w.bits // 8
    rows, dim = w.size0, w.size1
    if output_dtype is None:
        output_dtype = table_dtype
    if mode == "sum":
        mean = 0
    elif mode == "mean":
        mean = 1
    else:
        return None
    try:
        grad = _is_grad_enabled() and (weight.requires_grad or (
            per_sample_weights is not None and per_sample_weights.requires_grad))
    except Exception:
        return None

    if grad:
        # torch's own kernel and autograd (_bags.torch_autograd_is_faster), called as the
        # functional calls it
        if (torch_kernel_ok and per_sample_weights is None and table_dtype is _float32
                and output_dtype is _float32 and dim > 0
                and type(input) is _Tensor and type(offsets) is _Tensor
                and _describe(input, &ix) and _describe(offsets, &off)
                and ix.ndim == 1 and off.ndim == 1
                and (sparse or ix.size0 * dim < _dense_grad_min_values)):
            try:
                if not _function_mode_enabled():
                    return _torch_embedding_bag(weight, input, offsets, False, mean, sparse, None,
                                                include_last_offset, padding_idx)[0]
            except Exception:
                pass
        return None

    # the bags, normalised as perfkernels.embedding_bag normalises them
    if not _index_tensor(input, &ix):
        return None
    n = ix.size0 * ix.size1
    if ix.ndim == 2:
        if offsets is not None or ix.size1 == 0:    # torch refuses 2-D input without columns
            return None
        bags.num_bags = ix.size0
    else:
        if not _index_tensor(offsets, &off) or off.ndim != 1:
            return None
        count = off.size0
        bags.num_bags = max(count - 1 if include_last_offset else count, 0)
    if bags.num_bags + 1 <= BAGS_SCRATCH:
        dst = scratch
    else:
        shape[0] = bags.num_bags + 1
        norm = pool_empty(1, shape, cnp.NPY_INT64)
        dst = <int64_t *>cnp.PyArray_DATA(norm)
    if ix.ndim == 2:
        for b in range(bags.num_bags + 1):
            dst[b] = b * ix.size1
    else:
        try:
            bags.num_bags = normalise_offsets(off.data, off.bits == 64, count,
                                              include_last_offset, n, dst, &max_len)
        except ValueError:      # the full path gives torch's answer for these offsets
            return None
    bags.offsets = dst
    bags.indices = ix.data
    bags.n_indices = n
    bags.index_64 = ix.bits == 64
    bags.mean = mean
    bags.positional = 0

    # the weights: float32 (the output's dtype, torch's rule), one per index, in mode "sum"
    # unless the module opted in to weights in mode "mean"
    if per_sample_weights is None:
        bags.weights = NULL
    elif (output_dtype is _float32 and (not mean or weighted_mean)
            and type(per_sample_weights) is _Tensor and _readable(per_sample_weights, &psw)
            and psw.code == DL_FLOAT and psw.bits == 32 and psw.contiguous
            and psw.ndim == ix.ndim and psw.size0 == ix.size0 and psw.size1 == ix.size1):
        bags.weights = <const float *>psw.data
    else:
        return None

    if padding_idx is None:
        bags.padding_idx = -1
    elif type(padding_idx) is int and -rows <= padding_idx < rows:
        pad = padding_idx
        bags.padding_idx = pad + rows if pad < 0 else pad
    else:
        return None

    shape[0] = <cnp.npy_intp>bags.num_bags
    shape[1] = <cnp.npy_intp>dim
    out = pool_empty(2, shape, cnp.NPY_FLOAT32)
    bags.out = <float *>cnp.PyArray_DATA(out)
    bags.out_stride = dim
    if bags.num_bags * dim + n >= TINY_BAGS:
        nt = resolve_threads(None)
        args = pk_table_bags_float(fn, w.data, rows, dim, w.stride0)
        with nogil:
            status = run_bags(&bags, pk_table_bags_call, &args, rows, dim * itemsize, dim, nt,
                              NULL, &bad)
    else:
        status = fn(&bags, w.data, rows, dim, w.stride0, &bad)
    if status != PK_OK:         # a bad index: the full path raises torch's error
        return None
    result = _from_numpy(out)
    return result if output_dtype is _float32 else result.to(output_dtype)



# --------------------------------------------------------------------------- unpooled lookups

def embedding_module_lookup(module, input):
    """``perfkernels.torch.Embedding.forward(input)`` of ``module`` when it is a plain lookup
    without a gradient, else None (nothing computed or written; the module's full path answers).

    Plain: no ``max_norm``, no ``scale_grad_by_freq``, an int ``padding_idx`` or None (it does
    not change the rows), no gradient to record, no torch function mode, no profiler (the full
    path records the op); the table a CPU float32 / float16 / bfloat16 ``Tensor`` or
    ``Parameter`` of 2 dimensions with unit-stride rows; ``input`` a contiguous CPU int32 / int64
    ``torch.Tensor`` of 1 or 2 dimensions with every index in range.  The rows are copied by the
    sequence family's kernel, as ``perfkernels.embedding`` copies them (threads for large calls),
    into the memory pool."""
    cdef _View w, ix
    cdef dict d = module.__dict__
    cdef int64_t rows, dim, itemsize, n, bad
    cdef int fmt
    cdef cnp.npy_intp shape[3]
    cdef int typenum
    cdef cnp.ndarray out
    if _option(d, module, "max_norm") is not None or _option(d, module, "scale_grad_by_freq"):
        return None
    pad = _option(d, module, "padding_idx")
    if pad is not None and type(pad) is not int:
        return None
    if _profiler_enabled() or _function_mode_enabled():
        return None
    parameters = _option(d, module, "_parameters")
    weight = parameters.get("weight") if type(parameters) is dict else None
    fmt = _float_table(weight, &w)
    if fmt == TABLE_F32:
        typenum, table_dtype = cnp.NPY_FLOAT32, _float32
    elif fmt == TABLE_F16:
        typenum, table_dtype = cnp.NPY_FLOAT16, _float16
    elif fmt == TABLE_BF16:
        typenum, table_dtype = cnp.NPY_INT16, _bfloat16      # viewed as bfloat16 below
    else:
        return None
    itemsize = w.bits // 8
    rows, dim = w.size0, w.size1
    try:
        if _is_grad_enabled() and weight.requires_grad:
            return None
    except Exception:
        return None
    if not _index_tensor(input, &ix):
        return None
    n = ix.size0 * ix.size1
    shape[0] = <cnp.npy_intp>ix.size0
    if ix.ndim == 2:
        shape[1] = <cnp.npy_intp>ix.size1
    shape[ix.ndim] = <cnp.npy_intp>dim
    out = pool_empty(ix.ndim + 1, shape, typenum)
    bad = rows_into(w.data, rows, w.stride0 * itemsize, dim * itemsize, ix.data, ix.bits == 64,
                    n, <char *>cnp.PyArray_DATA(out), resolve_threads(None))
    if bad >= 0:                # a bad index: the full path raises torch's error
        return None
    result = _from_numpy(out)
    return result.view(_bfloat16) if table_dtype is _bfloat16 else result


# --------------------------------------------------------------------------- fused interaction

def interaction_lookup(dense, list weights, list indices, list offsets, bint include_last_offset,
                       bint cat, li, lj, list mean, list padding_idx, bint keep_pooled=False):
    """perfkernels.embedding_bags_interaction read straight from tensors, for the optimized
    model's eager calls without a gradient: F float-table lookups (``indices[f]`` /
    ``offsets[f]`` in ``weights[f]``) and the interaction with ``dense`` (``cat``: concatenated;
    else the dot products of the pairs ``li``, ``lj``, int32 arrays), or None, having written
    nothing, for anything but the plain cases (the caller's full path then answers, or raises
    torch's error): CPU tensors, float32 contiguous ``dense``, float32 / float16 / bfloat16
    tables with unit-stride rows, contiguous 1-D int32 / int64 indices and offsets passing the
    NumPy API's bag checks, every index in range.  ``keep_pooled`` (``"dot"`` only): return
    ``(output, pooled)``, ``pooled`` the ``[B, F, D]`` float32 rows that entered the pairs (what
    the backward needs, so it does not look them up again)."""
    cdef _View x, w, ix, off
    cdef Py_ssize_t F = len(weights), f
    cdef int64_t B, Dd, width, P = 0, count, n, max_len = 0, col, total = 0, bad = -1, pad
    cdef int bad_part = -1, nt
    cdef pk_bags_part *parts = NULL
    cdef pk_table_bags_args *args = NULL
    cdef pk_embedding_bag_fn ffn
    cdef int64_t *offs = NULL
    cdef pk_bags *bg
    cdef pk_status status = PK_OK
    cdef cnp.ndarray out, ali, alj
    cdef const int32_t *li_p = NULL
    cdef const int32_t *lj_p = NULL
    cdef cnp.npy_intp shape[2]
    cdef float *o
    cdef float *pooled_p = NULL
    cdef cnp.ndarray pooled = None
    cdef cnp.npy_intp pshape[3]
    if (_view_fn == NULL or len(indices) != F or len(offsets) != F or F == 0
            or type(dense) is not _Tensor or not _readable(dense, &x) or x.ndim != 2
            or x.code != DL_FLOAT or x.bits != 32 or not x.contiguous):
        return None
    B, Dd = x.size0, x.size1
    if cat:
        width = Dd
    else:
        ali, alj = li, lj
        P = ali.shape[0]
        width = Dd + P
    parts = <pk_bags_part *>malloc(F * sizeof(pk_bags_part))
    args = <pk_table_bags_args *>malloc(F * sizeof(pk_table_bags_args))
    # the normalised offsets from the pool (26 tables at batch 2048 need 426 KiB: a fresh
    # malloc of that size can be a new mapping, and page faults, on every call)
    cdef cnp.npy_intp offs_len = F * (B + 1)
    offs_array = pool_empty(1, &offs_len, cnp.NPY_INT64)
    offs = <int64_t *>cnp.PyArray_DATA(offs_array)
    if parts == NULL or args == NULL:
        free(parts)
        free(args)
        return None
    try:
        col = Dd
        for f in range(F):
            weight = weights[f]
            if ((type(weight) is not _Parameter and type(weight) is not _Tensor)
                    or not _readable(weight, &w) or w.ndim != 2):
                return None
            if w.code == DL_FLOAT and w.bits == 32:
                ffn = _kernels.embedding_bag_f32
            elif w.code == DL_FLOAT and w.bits == 16:
                ffn = _kernels.embedding_bag_f16
            elif w.code == DL_BFLOAT and w.bits == 16:
                ffn = _kernels.embedding_bag_bf16
            else:
                return None
            if ((w.stride1 != 1 and w.size1 > 1) or w.stride0 < 0
                    or <uintptr_t>w.data % (w.bits // 8) or (not cat and w.size1 != Dd)):
                return None
            if (not _index_tensor(indices[f], &ix) or ix.ndim != 1
                    or not _index_tensor(offsets[f], &off) or off.ndim != 1):
                return None
            n = ix.size0
            count = off.size0
            if count - (1 if include_last_offset else 0) != B:
                return None
            try:
                normalise_offsets(off.data, off.bits == 64, count, include_last_offset, n,
                                  offs + f * (B + 1), &max_len)
            except ValueError:
                return None
            offs[f * (B + 1) + B] = n
            pad = padding_idx[f]
            if pad >= w.size0:
                return None
            args[f] = pk_table_bags_float(ffn, w.data, w.size0, w.size1, w.stride0)
            bg = &parts[f].bags
            bg.indices = ix.data
            bg.n_indices = n
            bg.index_64 = ix.bits == 64
            bg.offsets = offs + f * (B + 1)
            bg.num_bags = B
            bg.weights = NULL
            bg.positional = 0
            bg.mean = 1 if mean[f] else 0
            bg.padding_idx = pad if pad >= 0 else -1
            parts[f].call = pk_table_bags_call
            parts[f].args = &args[f]
            parts[f].index_cost = w.size1 * (w.bits // 8) + ix.bits // 8
            parts[f].bag_cost = w.size1 * 4 + 8
            parts[f].rows = w.size0
            total += n
            if cat:
                width += w.size1
        shape[0] = <cnp.npy_intp>B
        shape[1] = <cnp.npy_intp>width
        out = pool_empty(2, shape, cnp.NPY_FLOAT32)
        o = <float *>cnp.PyArray_DATA(out)
        for f in range(F):          # every index checked before anything is written
            if pk_bags_first_bad_in(&parts[f].bags, 0, B, parts[f].rows) >= 0:
                return None
        nt = resolve_threads(None) if B * width + total >= TINY_BAGS else 1
        if cat:
            for f in range(F):
                parts[f].bags.out = o + col
                parts[f].bags.out_stride = width
                col += args[f].dim
        else:
            li_p = <const int32_t *>cnp.PyArray_DATA(ali)
            lj_p = <const int32_t *>cnp.PyArray_DATA(alj)
            if keep_pooled:
                pshape[0], pshape[1], pshape[2] = B, F, Dd
                pooled = pool_empty(3, pshape, cnp.NPY_FLOAT32)
                pooled_p = <float *>cnp.PyArray_DATA(pooled)
        with nogil:
            status = run_interaction(pool, nt, parts, <int>F, cat, <const float *>x.data, Dd,
                                     li_p, lj_p, P, _dot_kernels.interaction_dot, o, width, B,
                                     &bad, &bad_part, pooled_p)
        if status != PK_OK:
            return None
        if pooled is not None:
            return _from_numpy(out), _from_numpy(pooled)
        return _from_numpy(out)
    finally:
        free(parts)
        free(args)
