"""Compile the .cu sources without a GPU: with ``nvcc`` (as a C++ translation unit, each template
instantiation the runtime uses taken by address so that nvcc really compiles it) and with NVRTC
loaded directly through ctypes (the exact path CuPy takes at run time: no host headers, the local
headers pasted in, the same name expressions).  Used by tests/test_cuda.py; no CuPy needed.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from . import _runtime


def instantiations(file: str, full: bool = False) -> list[str]:
    """The template instantiations (name expressions) of ``file`` the runtime can ask for (a
    covering subset by default: every format, load width, lane count and VPL at least once)."""
    return host_module(file).instantiations(full)


def host_module(file: str):
    """The module that launches the kernels of ``file``: its family's ``_cuda.py``."""
    import importlib
    family = _runtime.path(file).parent.name
    return importlib.import_module(f"perfkernels.families.{family}._cuda")


def nvcc_path() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.path.exists(os.path.join(root, "bin", "nvcc")):
            return os.path.join(root, "bin", "nvcc")
    return None


def nvcc_compile(file: str, arch: str = "sm_90", full: bool = False,
                 extra: tuple[str, ...] = ()) -> tuple[bool, str]:
    """``nvcc -std=c++17 -arch=<arch> -c`` on ``file`` plus a unit that instantiates its kernels;
    returns (ok, compiler output)."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise FileNotFoundError("nvcc is not on this machine")
    names = instantiations(file, full)
    with tempfile.TemporaryDirectory() as tmp:
        unit = Path(tmp) / f"instantiate_{Path(file).stem}.cu"
        unit.write_text(
            f'#include "{_runtime.path(file)}"\n'
            "// Taking each kernel's address makes nvcc instantiate and compile it.\n"
            "void *pk_instantiated_kernels[] = {\n"
            + "".join(f"    (void *)&{n},\n" for n in names) + "};\n")
        cmd = [nvcc, "-std=c++17", f"-arch={arch}", "-Werror", "all-warnings", f"-I{_runtime.SOURCE_DIR}",
               "-c", str(unit),
               "-o", str(Path(tmp) / "unit.o"), *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    return proc.returncode == 0, " ".join(cmd) + "\n" + proc.stdout + proc.stderr


def nvrtc_library() -> str | None:
    candidates = []
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            candidates += sorted(glob.glob(os.path.join(root, "lib64", "libnvrtc.so*")))
    nvcc = nvcc_path()
    if nvcc:
        candidates += sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(
            os.path.realpath(nvcc))), "lib64", "libnvrtc.so*")))
    try:  # the NVRTC wheel (nvidia-cuda-nvrtc), which CuPy itself can use
        import nvidia
        for root in nvidia.__path__:
            candidates += sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so*")))
    except ImportError:
        pass
    name = ctypes.util.find_library("nvrtc")
    if name:
        candidates.append(name)
    for c in candidates:
        if "builtins" in os.path.basename(c) or "alt" in os.path.basename(c):
            continue
        try:
            ctypes.CDLL(c)
            return c
        except OSError:
            continue
    return None


def nvrtc_compile(file: str, arch: str = "compute_90", full: bool = False) -> tuple[bool, str]:
    """Compile ``file`` as CuPy will (NVRTC, ``-std=c++17``, the name expressions registered);
    returns (ok, log)."""
    lib_path = nvrtc_library()
    if lib_path is None:
        raise FileNotFoundError("libnvrtc is not on this machine")
    lib = ctypes.CDLL(lib_path)
    prog = ctypes.c_void_p()
    src = _runtime.source(file).encode()

    def check(status, what):
        if status != 0:
            lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"{what}: {lib.nvrtcGetErrorString(status).decode()}")

    check(lib.nvrtcCreateProgram(ctypes.byref(prog), src, file.encode(), 0, None, None),
          "nvrtcCreateProgram")
    try:
        names = instantiations(file, full)
        for n in names:
            check(lib.nvrtcAddNameExpression(prog, n.encode()), f"nvrtcAddNameExpression({n})")
        opts = [o.encode() for o in (*_runtime.NVRTC_OPTIONS, f"-arch={arch}")]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        status = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        text = log.value.decode(errors="replace")
        if status != 0:
            return False, text
        for n in names:
            lowered = ctypes.c_char_p()
            check(lib.nvrtcGetLoweredName(prog, n.encode(), ctypes.byref(lowered)),
                  f"nvrtcGetLoweredName({n})")
        return True, text
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
