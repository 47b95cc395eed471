"""A NumPy-backed stand-in for the part of CuPy that perfkernels.cuda uses, whose RawModule /
RawKernel run the kernels in the warp simulator (cuda_sim.h, built by build.py).

"Device memory" is a separate heap (posix_memalign, 256-byte aligned like CuPy's pool, exactly the
requested size so that AddressSanitizer sees an over-read by one byte, filled with 0xff bytes so
that an unwritten output shows up as NaN / -1).  As with CuPy:
  - device arrays refuse implicit conversion to NumPy (``.get()`` copies to the host);
  - a zero-size allocation has data.ptr == 0;
  - kernel arguments are marshalled as RawKernel does (an ndarray is its data pointer, a NumPy
    scalar its bytes, a Python int an int64, a float a float64), and the simulator checks them
    against the kernel's parameter types (CuPy cannot: a wrong size silently shifts arguments);
    a pointer that is not inside a live device allocation is refused (the GPU would fault);
  - ``asarray`` takes ``__cuda_array_interface__`` objects without a copy, ``from_dlpack`` takes
    DLPack capsules of CUDA memory (kDLCUDA) and refuses others.
Every launch is appended to ``launches`` (kernel name, grid, block, stream) so tests can check the
launch configurations the runtime chose.
"""
from __future__ import annotations

import ctypes
import sys
import types
import weakref
from dataclasses import dataclass

import numpy as np

from . import build

try:
    import ml_dtypes
    _BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    _BF16 = None

_libc = ctypes.CDLL(None)
_libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]
ALIGNMENT = 256


class _Block:
    """One device allocation (freed when the last array using it goes)."""

    def __init__(self, nbytes: int):
        p = ctypes.c_void_p()
        if _libc.posix_memalign(ctypes.byref(p), ALIGNMENT, max(1, nbytes)):
            raise MemoryError(f"out of (simulated) device memory allocating {nbytes} bytes")
        self.ptr, self.nbytes = p.value, nbytes
        ctypes.memset(self.ptr, 0xFF, nbytes)
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (self.ptr, False),
                                    "version": 3}
        _live[self.ptr] = weakref.ref(self)

    def __del__(self):
        # at interpreter exit the module globals may already be gone: the OS frees the memory
        if _live is not None:
            _live.pop(self.ptr, None)
        if _libc is not None:
            _libc.free(self.ptr)


_live: dict[int, weakref.ref] = {}


def _block_of(ptr: int, nbytes: int):
    """The live allocation holding [ptr, ptr + nbytes), or None."""
    for start, ref in list(_live.items()):
        blk = ref()
        if blk is not None and start <= ptr and ptr + nbytes <= start + blk.nbytes:
            return blk
    return None


def _device_view(ptr: int, shape, dtype, strides=None, what="array"):
    """A NumPy view of device memory at ``ptr`` (which must be inside a live allocation)."""
    dtype = np.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    if strides is None:
        strides, acc = [], dtype.itemsize
        for s in reversed(shape):
            strides.insert(0, acc)
            acc *= max(s, 1)
    size = int(np.prod(shape)) if shape else 1
    if size == 0:
        return np.empty(shape, dtype)
    lo = ptr + sum(min(0, (s - 1) * st) for s, st in zip(shape, strides))
    hi = ptr + sum(max(0, (s - 1) * st) for s, st in zip(shape, strides)) + dtype.itemsize
    blk = _block_of(lo, hi - lo)
    if blk is None:
        raise ValueError(f"{what}: [{lo:#x}, {hi:#x}) is not inside a device allocation")
    origin = _at(np.asarray(blk), ptr - blk.ptr, dtype)
    return np.lib.stride_tricks.as_strided(origin, shape=shape, strides=tuple(strides))


def _at(raw: np.ndarray, offset: int, dtype) -> np.ndarray:
    """A 1-element array of ``dtype`` at byte ``offset`` of ``raw`` (the origin of a strided view)."""
    return np.ndarray((1,), dtype=dtype, buffer=raw, offset=offset)


def _check_dtype(dtype) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.kind not in "biuf" and dt != _BF16:
        raise TypeError(f"Unsupported dtype {dt}")
    if _BF16 is not None and dt == _BF16 and not state.bfloat16:
        raise ValueError(f"Unsupported dtype {dt}")
    return dt


def _alloc(shape, dtype) -> "ndarray":
    dt = _check_dtype(dtype)
    shape = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
    n = int(np.prod(shape)) if shape else 1
    if n == 0:
        return ndarray(np.empty(shape, dt), null=True)
    blk = _Block(n * dt.itemsize)
    return ndarray(np.asarray(blk).view(dt).reshape(shape))


@dataclass
class _Flags:
    c_contiguous: bool
    f_contiguous: bool
    owndata: bool = False


class _MemoryPointer:
    def __init__(self, ptr: int):
        self.ptr = ptr


class ndarray:
    """A device array: a NumPy view of simulated device memory."""
    __slots__ = ("_a", "_null", "__weakref__")

    def __init__(self, a: np.ndarray, null: bool = False):
        self._a, self._null = a, null

    # -- attributes
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: _Flags(self._a.flags.c_contiguous, self._a.flags.f_contiguous))
    T = property(lambda self: ndarray(self._a.T))

    @property
    def data(self):
        return _MemoryPointer(0 if self._null else self._a.ctypes.data)

    def __repr__(self):
        return f"fake_cupy.ndarray({self._a!r})"

    # -- no implicit host conversion, as CuPy
    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()` "
                        "to construct a NumPy array explicitly.")

    def get(self, stream=None, out=None):
        return np.array(self._a, copy=True)

    def __len__(self):
        return len(self._a)

    def __bool__(self):
        return bool(self._a)

    def __int__(self):
        return int(self._a)

    def __float__(self):
        return float(self._a)

    def __index__(self):
        return self._a.__index__()

    # -- views and copies (copies are fresh device allocations)
    def view(self, dtype=None):
        dt = _check_dtype(dtype)
        return ndarray(self._a.view(dt), null=self._null)

    def _copy_of(self, host_like: np.ndarray) -> "ndarray":
        out = _alloc(host_like.shape, host_like.dtype)
        out._a[...] = host_like
        return out

    def copy(self, order="C"):
        return self._copy_of(self._a)

    def astype(self, dtype, copy=True):
        dt = _check_dtype(dtype)
        if not copy and dt == self.dtype:
            return self
        return self._copy_of(self._a.astype(dt))

    def reshape(self, *shape, order="C"):
        if len(shape) == 1 and not np.isscalar(shape[0]):
            shape = tuple(shape[0])
        r = self._a.reshape(shape)
        if not np.shares_memory(r, self._a) and self._a.size:
            return self._copy_of(r)
        return ndarray(r, null=self._null)

    def ravel(self):
        return self.reshape(-1)

    def __getitem__(self, key):
        key = _unwrap(key)
        r = self._a[key]
        if not isinstance(r, np.ndarray):               # an element: a 0-d view, as CuPy
            r = self._a[key + (...,) if isinstance(key, tuple) else (key, ...)]
        if r.size and not np.shares_memory(r, self._a):  # fancy indexing: a copy
            return self._copy_of(r)
        return ndarray(r, null=self._null)

    def __setitem__(self, key, value):
        self._a[_unwrap(key)] = _unwrap(value)

    def all(self):
        return self._copy_of(np.asarray(self._a.all()))

    def any(self):
        return self._copy_of(np.asarray(self._a.any()))

    # -- interchange
    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "descr": [("", self.dtype.str)],
                "data": (self.data.ptr, False), "version": 3,
                "strides": None if self._a.flags.c_contiguous else self.strides,
                "stream": state.current_stream.ptr or 1}

    def __dlpack_device__(self):
        return (_KDL_CUDA, 0)

    def __dlpack__(self, stream=None, **kwargs):
        return _to_dlpack(self)


def _unwrap(x):
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, tuple):
        return tuple(_unwrap(v) for v in x)
    return x


def _binary(op):
    def f(self, other):
        return self._copy_of(np.asarray(op(self._a, _unwrap(other))))
    return f


for _name, _op in [("__eq__", np.equal), ("__ne__", np.not_equal), ("__lt__", np.less),
                   ("__le__", np.less_equal), ("__gt__", np.greater), ("__ge__", np.greater_equal),
                   ("__add__", np.add), ("__sub__", np.subtract), ("__mul__", np.multiply),
                   ("__and__", np.logical_and)]:
    setattr(ndarray, _name, _binary(_op))
ndarray.__hash__ = None


# ---- array creation -----------------------------------------------------------------------------

def empty(shape, dtype=np.float64, order="C"):
    return _alloc(shape, dtype)


def full(shape, fill_value, dtype=None):
    a = _alloc(shape, dtype if dtype is not None else np.asarray(fill_value).dtype)
    a._a[...] = fill_value
    return a


def zeros(shape, dtype=np.float64):
    return full(shape, 0, dtype)


def ones(shape, dtype=np.float64):
    return full(shape, 1, dtype)


def _from_cai(obj) -> ndarray:
    cai = obj.__cuda_array_interface__
    if cai.get("version", 0) < 2:
        raise ValueError("__cuda_array_interface__ version < 2")
    if cai.get("mask") is not None:
        raise ValueError("masked __cuda_array_interface__ is not supported")
    dt = _check_dtype(np.dtype(cai["typestr"]))
    ptr = int(cai["data"][0])
    shape = tuple(cai["shape"])
    if int(np.prod(shape)) == 0:
        return ndarray(np.empty(shape, dt), null=ptr == 0)
    return ndarray(_device_view(ptr, shape, dt, cai.get("strides"), "__cuda_array_interface__"))


def asarray(a, dtype=None):
    if isinstance(a, ndarray):
        out = a
    elif hasattr(a, "__cuda_array_interface__"):
        out = _from_cai(a)
    else:                                        # host data: a copy to the device
        host = np.asarray(a)
        _check_dtype(host.dtype)
        out = _alloc(host.shape, host.dtype)
        out._a[...] = host
    return out if dtype is None else out.astype(dtype, copy=False)


array = asarray


def ascontiguousarray(a, dtype=None):
    a = asarray(a, dtype)
    return a if a._a.flags.c_contiguous else a.copy()


def cumsum(a, axis=None, dtype=None):
    return a._copy_of(np.cumsum(a._a, axis=axis, dtype=dtype))


def may_share_memory(a, b, max_work=None):
    return np.may_share_memory(_unwrap(a), _unwrap(b))


def shares_memory(a, b, max_work=None):
    return np.shares_memory(_unwrap(a), _unwrap(b))


# ---- DLPack (CUDA device memory only) -----------------------------------------------------------

_KDL_CPU, _KDL_CUDA = 1, 2


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_capi = ctypes.pythonapi
_capi.PyCapsule_New.restype = ctypes.py_object
_capi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_capi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capi.PyCapsule_IsValid.restype = ctypes.c_int
_capi.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capi.PyCapsule_SetName.restype = ctypes.c_int
_capi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_DLTENSOR, _USED = b"dltensor", b"used_dltensor"
_produced: dict[int, tuple] = {}                  # keeps exported tensors' structs alive
_DL_CODES = {"i": 0, "u": 1, "f": 2, "b": 6}


def _to_dlpack(a: ndarray):
    m = _DLManagedTensor()
    shape = (ctypes.c_int64 * max(1, a.ndim))(*a.shape)
    strides = (ctypes.c_int64 * max(1, a.ndim))(*(s // a.itemsize for s in a.strides))
    code = 4 if _BF16 is not None and a.dtype == _BF16 else _DL_CODES[a.dtype.kind]
    m.dl_tensor.data = a.data.ptr
    m.dl_tensor.device = _DLDevice(_KDL_CUDA, 0)
    m.dl_tensor.ndim = a.ndim
    m.dl_tensor.dtype = _DLDataType(code, a.itemsize * 8, 1)
    m.dl_tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    m.dl_tensor.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    _produced[ctypes.addressof(m)] = (m, shape, strides, a)
    return _capi.PyCapsule_New(ctypes.addressof(m), _DLTENSOR, None)


def from_dlpack(x) -> ndarray:
    if not hasattr(x, "__dlpack__"):
        raise TypeError(f"{type(x).__name__} has no __dlpack__")
    dev = x.__dlpack_device__() if hasattr(x, "__dlpack_device__") else None
    if dev is not None and int(dev[0]) != _KDL_CUDA:
        raise RuntimeError(f"Unsupported device type {int(dev[0])} (only CUDA device memory, "
                           f"kDLCUDA = {_KDL_CUDA}, is accepted)")
    cap = x.__dlpack__(stream=state.current_stream.ptr or 1)
    if not _capi.PyCapsule_IsValid(cap, _DLTENSOR):
        raise ValueError("not a DLPack capsule, or one already consumed")
    m = _DLManagedTensor.from_address(_capi.PyCapsule_GetPointer(cap, _DLTENSOR))
    t = m.dl_tensor
    if t.device.device_type != _KDL_CUDA:
        raise RuntimeError(f"Unsupported device type {t.device.device_type}")
    kinds = {v: k for k, v in _DL_CODES.items()}
    if t.dtype.code == 4 and t.dtype.bits == 16:
        dt = _BF16
    else:
        dt = np.dtype(f"{kinds[t.dtype.code]}{t.dtype.bits // 8}") if t.dtype.code != 6 else np.dtype(bool)
    dt = _check_dtype(dt)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = None if not t.strides else tuple(t.strides[i] * dt.itemsize for i in range(t.ndim))
    _capi.PyCapsule_SetName(cap, _USED)
    ptr = (t.data or 0) + t.byte_offset
    if int(np.prod(shape)) == 0:
        return ndarray(np.empty(shape, dt), null=ptr == 0)
    return ndarray(_device_view(ptr, shape, dt, strides, "DLPack tensor"))


# ---- streams ------------------------------------------------------------------------------------

class Stream:
    _next = 0x1000

    def __init__(self, null=False, non_blocking=False, ptr=None):
        if ptr is None:
            ptr = 0 if null else Stream._next
            Stream._next += 0x10
        self.ptr = ptr
        self._prev = []

    def __enter__(self):
        self._prev.append(state.current_stream)
        state.current_stream = self
        return self

    def __exit__(self, *exc):
        state.current_stream = self._prev.pop()

    def synchronize(self):
        pass

    def use(self):
        state.current_stream = self
        return self


class ExternalStream(Stream):
    def __init__(self, ptr, device_id=-1):
        super().__init__(ptr=int(ptr))


def get_current_stream(device_id=-1):
    return state.current_stream


class _Runtime:
    class CUDARuntimeError(RuntimeError):
        pass

    @staticmethod
    def getDeviceCount():
        return 1

    @staticmethod
    def getDevice():
        return 0

    @staticmethod
    def getDeviceProperties(dev):
        return {"multiProcessorCount": state.sm_count, "name": b"perfkernels warp simulator",
                "warpSize": 32, "maxThreadsPerBlock": 1024}


# ---- kernels ------------------------------------------------------------------------------------

@dataclass
class Launch:
    name: str
    grid: tuple
    block: tuple
    stream: int


def _marshal(arg, i: int, name: str) -> tuple[str, int, bytes]:
    if isinstance(arg, ndarray):
        ptr = arg.data.ptr
        if ptr and _block_of(ptr, 0) is None:
            raise ValueError(f"{name}: argument {i} points outside device memory ({ptr:#x})")
        return ("p", 8, ptr.to_bytes(8, "little"))
    if isinstance(arg, np.ndarray):
        raise TypeError(f"{name}: argument {i} is a host numpy.ndarray; kernels take device arrays")
    if isinstance(arg, (bool, np.bool_)):
        return ("b", 1, bytes([bool(arg)]))
    if isinstance(arg, np.generic):
        kind = arg.dtype.kind
        if kind not in "iuf":
            raise TypeError(f"{name}: argument {i} has unsupported type {arg.dtype}")
        return (kind, arg.dtype.itemsize, arg.tobytes())
    if isinstance(arg, int):                       # CuPy passes Python ints as int64 ...
        return ("i", 8, np.int64(arg).tobytes())
    if isinstance(arg, float):                     # ... and floats as float64
        return ("f", 8, np.float64(arg).tobytes())
    raise TypeError(f"{name}: unsupported kernel argument {i} of type {type(arg).__name__}")


class RawKernel:
    def __init__(self, library: build.Library, name: str):
        self.library, self.name = library, name

    def __call__(self, grid, block, args, *, shared_mem=0, stream=None,
                 enable_cooperative_groups=False):
        if not isinstance(grid, tuple) or not isinstance(block, tuple):
            raise TypeError("grid and block must be tuples")
        if not isinstance(args, tuple):
            raise TypeError("args must be a tuple")
        for v in grid + block:
            if not isinstance(v, (int, np.integer)):
                raise TypeError(f"{self.name}: grid/block entries must be ints; got {type(v).__name__}")
        marshalled = [_marshal(a, i, self.name) for i, a in enumerate(args)]
        s = stream if stream is not None else state.current_stream
        state.launches.append(Launch(self.name, tuple(int(v) for v in grid),
                                     tuple(int(v) for v in block), s.ptr))
        build.launch(self.library, self.name, grid, block, marshalled, seed=state.seed)


class RawModule:
    def __init__(self, code=None, path=None, options=(), backend="nvrtc", translate_cucomplex=False,
                 *, enable_cooperative_groups=False, name_expressions=None, jitify=False):
        if code is None:
            raise ValueError("the simulator builds RawModule(code=...) only")
        self.options = tuple(options)
        lib = state.libraries.get(code)
        if lib is None:                            # a source the session did not prebuild
            lib = build.Library(build.build(code, list(name_expressions or ()), "module.cu",
                                            sanitize=state.sanitize))
            state.libraries[code] = lib
        for n in name_expressions or ():
            if n not in lib.kernels:
                raise RuntimeError(f"NVRTC: name expression {n!r} was not compiled")
        self.library = lib
        self.name_expressions = tuple(name_expressions or ())

    def get_function(self, name):
        if name not in self.name_expressions:
            raise KeyError(f"{name} is not among this module's name_expressions")
        return RawKernel(self.library, name)


# ---- the module object ---------------------------------------------------------------------------

class _State:
    def __init__(self):
        self.seed = 0
        self.sm_count = 2
        self.bfloat16 = False
        self.sanitize = False
        self.libraries: dict[str, build.Library] = {}
        self.launches: list[Launch] = []
        self.current_stream = Stream(null=True)


state = _State()


def module() -> types.ModuleType:
    """The stand-in, as a module object to put in ``sys.modules["cupy"]``."""
    m = types.ModuleType("cupy")
    m.__file__ = __file__
    for name in ("ndarray", "empty", "full", "zeros", "ones", "asarray", "array",
                 "ascontiguousarray", "cumsum", "may_share_memory", "shares_memory", "from_dlpack",
                 "RawModule", "RawKernel"):
        setattr(m, name, globals()[name])
    for t in ("bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "float32", "float64"):
        setattr(m, t, getattr(np, t))
    cuda = types.ModuleType("cupy.cuda")
    cuda.runtime = _Runtime
    cuda.Stream, cuda.ExternalStream, cuda.get_current_stream = Stream, ExternalStream, get_current_stream
    m.cuda = cuda
    m.simulator = state
    return m


def is_installed() -> bool:
    return getattr(sys.modules.get("cupy"), "simulator", None) is state
