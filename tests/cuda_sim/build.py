"""Build perfkernels' .cu sources for the warp simulator (cuda_sim.h) with g++, as shared libraries
with a small C ABI, and launch their kernels through ctypes.

The source compiled is exactly the text NVRTC compiles at run time (``_runtime.source``: the .cu
file with its local headers pasted in), with each known inline-PTX statement replaced by the
simulator's equivalent (an unknown ``asm`` fails the build).  Every template instantiation the
runtime can ask for (``instantiations(full=True)``, the list the nvcc/NVRTC compile checks use) is
compiled, in a few translation units built in parallel, once per source text and flags, into a
cache directory (``PK_CUDA_SIM_CACHE`` or the system temp dir).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
HEADER = HERE / "cuda_sim.h"

#: Inline PTX the kernels may use -> (output constraint, input constraint, C++ that replaces it).
#: ``{out}`` / ``{in}`` are the operands.  The replacements are the hardware's semantics.
KNOWN_ASM = {
    "cvt.f32.f16 %0, %1;": ("=f", "h", "{out} = pk_sim::cvt_f32_f16({in});"),
    "cvt.rn.f16.f32 %0, %1;": ("=h", "f", "{out} = pk_sim::cvt_rn_f16_f32({in});"),
}
_ASM = re.compile(r'\basm\s*(?:volatile\s*)?\(\s*"([^"]*)"\s*:\s*"([^"]*)"\s*\(\s*(\w+)\s*\)\s*'
                  r':\s*"([^"]*)"\s*\(([^;]*?)\)\s*\)\s*;')
_ANY_ASM = re.compile(r"\b(?:asm|__asm__|__asm)\b")

# -O1 keeps the fibers fast and the build short; no FMA contraction (each float operation is
# rounded as written, as the __f*_rn intrinsics require), no fast-math.
BASE_FLAGS = ["-std=c++17", "-O1", "-fPIC", "-shared", "-ffp-contract=off", "-fvisibility=hidden",
              "-Wall", "-Wno-unknown-pragmas", "-Wno-unused-variable", "-Wno-unused-but-set-variable",
              "-Werror"]
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                  "-fno-omit-frame-pointer", "-g"]

_ABI = r"""
extern "C" {
__attribute__((visibility("default"))) int pk_sim_kernel_count() { return (int)(sizeof(pk_sim_entries) / sizeof(pk_sim_entries[0])); }
__attribute__((visibility("default"))) const char *pk_sim_kernel_name(int i) { return pk_sim_entries[i].name; }
__attribute__((visibility("default"))) int pk_sim_launch(int i, const pk_sim::Arg *args, int nargs,
        unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
        unsigned long long seed, char *err, int err_len)
{
    return pk_sim_entries[i].launch(args, nargs, dim3(gx, gy, gz), dim3(bx, by, bz), seed, err, err_len);
}
}
"""


class BuildError(RuntimeError):
    pass


def substitute_asm(text: str, origin: str = "<source>") -> str:
    """``text`` with each known inline-PTX statement replaced; raises BuildError on any other."""
    def sub(m: re.Match) -> str:
        instr, out_c, out_v, in_c, in_v = m.groups()
        known = KNOWN_ASM.get(instr)
        if known is None or (out_c, in_c) != known[:2]:
            raise BuildError(f"{origin}: the simulator does not know the inline PTX {m.group(0)!r}; "
                             f"add its exact semantics to KNOWN_ASM in {__file__}")
        return known[2].format(out=out_v, **{"in": f"({in_v.strip()})"})
    result = _ASM.sub(sub, text)
    left = _ANY_ASM.search(result)
    if left:
        line = result.count("\n", 0, left.start()) + 1
        snippet = result[left.start():result.find("\n", left.start())]
        raise BuildError(f"{origin}: line {line}: unrecognised inline assembly {snippet!r}")
    return result


def launch_bounds(text: str) -> dict[str, int]:
    """{kernel: max threads per block} from ``__launch_bounds__(N)`` before a kernel's name."""
    return {m.group(2): int(m.group(1)) for m in
            re.finditer(r"__launch_bounds__\(\s*(\d+)[^)]*\)\s*(\w+)\s*\(", text)}


def translation_unit(source_text: str, names: list[str], origin: str) -> str:
    bounds = launch_bounds(source_text)
    entries = []
    for n in names:
        base = n.split("<")[0].strip()
        limit = bounds.get(base, 1024)
        entries.append(
            f'    pk_sim::Entry{{"{n}", {limit}, [](const pk_sim::Arg *a, int k, dim3 g, dim3 b, '
            f'std::uint64_t s, char *e, int el) {{ return pk_sim::launch_entry<&{n}>(a, k, g, b, s, e, '
            f'el, {limit}); }}}},')
    return (f'#include "{HEADER}"\n#line 1 "{origin}"\n' + substitute_asm(source_text, origin)
            + "\nstatic const pk_sim::Entry pk_sim_entries[] = {\n" + "\n".join(entries) + "\n};\n"
            + _ABI)


def compiler() -> str | None:
    return os.environ.get("PK_CUDA_SIM_CXX") or shutil.which("g++")


def cache_dir() -> Path:
    root = Path(os.environ.get("PK_CUDA_SIM_CACHE") or Path(tempfile.gettempdir()) / "perfkernels-cuda-sim")
    root.mkdir(parents=True, exist_ok=True)
    return root


def _compile(cxx: str, unit: str, flags: list[str], out: Path) -> Path:
    if out.exists():
        return out
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src = Path(tmp) / "unit.cpp"
        src.write_text(unit)
        tmp_out = Path(tmp) / out.name
        proc = subprocess.run([cxx, *flags, str(src), "-o", str(tmp_out)], capture_output=True,
                              text=True)
        if proc.returncode:
            raise BuildError(f"g++ failed for {out.name}:\n{proc.stderr[-6000:]}")
        os.replace(tmp_out, out)                      # atomic: concurrent sessions share the cache
    return out


class Library:
    """The kernels of one source (several shared objects), by name expression."""

    def __init__(self, paths: list[Path]):
        self.kernels: dict[str, tuple[ctypes.CDLL, int]] = {}
        for p in paths:
            lib = ctypes.CDLL(str(p))
            lib.pk_sim_kernel_name.restype = ctypes.c_char_p
            lib.pk_sim_launch.restype = ctypes.c_int
            for i in range(lib.pk_sim_kernel_count()):
                self.kernels[lib.pk_sim_kernel_name(i).decode()] = (lib, i)


class Arg(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_char), ("size", ctypes.c_int), ("bytes", ctypes.c_ubyte * 8)]


class LaunchError(RuntimeError):
    """The simulator refused or aborted a launch (bad arguments or configuration, a warp-rule
    violation, a misaligned access, a deadlock)."""


def launch(library: Library, name: str, grid, block, args: list[tuple[str, int, bytes]],
           seed: int = 0) -> None:
    """Run kernel ``name`` on ``grid`` x ``block`` with ``args`` as (kind, size, little-endian
    bytes); raises LaunchError with the simulator's message."""
    if name not in library.kernels:
        raise LaunchError(f"kernel {name!r} is not among the compiled instantiations")
    lib, index = library.kernels[name]
    arr = (Arg * max(1, len(args)))()
    for a, (kind, size, raw) in zip(arr, args):
        a.kind, a.size = kind.encode(), size
        ctypes.memmove(a.bytes, raw, len(raw))
    g = tuple(grid) + (1,) * (3 - len(grid))
    b = tuple(block) + (1,) * (3 - len(block))
    err = ctypes.create_string_buffer(2048)
    rc = lib.pk_sim_launch(index, arr, len(args), *(ctypes.c_uint(int(v)) for v in g),
                           *(ctypes.c_uint(int(v)) for v in b), ctypes.c_ulonglong(seed), err, len(err))
    if rc:
        raise LaunchError(f"{name}: {err.value.decode(errors='replace')}")


def build_many(sources: list[tuple[str, list[str], str]], *, sanitize: bool = False,
               per_unit: int = 48, jobs: int = 2) -> list[list[Path]]:
    """Compile each (source text, kernel names, origin) into shared objects of at most
    ``per_unit`` kernels, ``jobs`` compilers at a time, cached by content; returns the paths per
    source."""
    cxx = compiler()
    if cxx is None:
        raise BuildError("g++ is not on this machine")
    flags = BASE_FLAGS + (SANITIZE_FLAGS if sanitize else [])
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    header = HEADER.read_text()
    work, owners = [], []
    for k, (text, names, origin) in enumerate(sources):
        n_units = max(1, -(-len(names) // per_unit))
        for part in (names[u::n_units] for u in range(n_units)):
            unit = translation_unit(text, part, origin)
            key = hashlib.sha256("\0".join([unit, header, " ".join(flags), version]).encode())
            work.append((unit, cache_dir() / f"{Path(origin).stem}-{key.hexdigest()[:20]}.so"))
            owners.append(k)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        paths = list(pool.map(lambda w: _compile(cxx, w[0], flags, w[1]), work))
    result: list[list[Path]] = [[] for _ in sources]
    for k, p in zip(owners, paths):
        result[k].append(p)
    return result


def build(source_text: str, names: list[str], origin: str, *, sanitize: bool = False) -> list[Path]:
    """:func:`build_many` for one source."""
    return build_many([(source_text, names, origin)], sanitize=sanitize)[0]
