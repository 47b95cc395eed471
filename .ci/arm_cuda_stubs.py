"""Stand-in CUDA libraries for PyPI's aarch64 torch wheel, so that it imports on a machine (or an
emulator) with no GPU and no NVIDIA packages: .ci/arm_python uses it for the torch oracle of the
Python tests under qemu-aarch64.

PyPI's aarch64 wheels of torch are CUDA builds: libtorch_cpu.so itself needs libcudart.so.13 and
libcupti.so.13, and libtorch_cuda.so (loaded by every ``import torch``) a dozen CUDA libraries
(GBs as pip packages).  For each library that torch's ELF files need and that neither torch/lib nor
the root provides, this writes a C file that defines every symbol torch takes from it (under the
symbol version torch asks for) and builds it with the cross compiler into torch/lib, where
torch's RUNPATH ($ORIGIN) finds it.  Every function returns cudaErrorNoDevice (100), a nonzero
status in every CUDA library's enum, and the error-string functions return a fixed message, so
``torch.cuda.is_available()`` is False and every CPU operator is torch's own code.  Nothing of
CUDA can run (it never does here: there is no GPU).

    python3 .ci/arm_cuda_stubs.py TORCH_DIR ROOT [CC]

TORCH_DIR: the installed torch package (…/site-packages/torch); ROOT: the arm64 root whose
libraries count as present; CC: the aarch64 C compiler (default aarch64-linux-gnu-gcc).
Runs on the build machine (readelf from binutils); executes nothing of aarch64.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

#: every CUDA library's status enum has 0 for success; 100 is cudaErrorNoDevice
STATUS = 100
MESSAGE = "no CUDA here: a stand-in library (.ci/arm_cuda_stubs.py) for torch under qemu-aarch64"
#: functions that return a string (const char *), not a status
STRING_FUNCTION = re.compile(r"(Error(String|Name)|StatusString|GetStatusName|GetString)$")
SYMBOL = re.compile(r"^\s*\d+:\s+\S+\s+(\S+)\s+(\w+)\s+(\w+)\s+\w+\s+(\S+)\s+(.*)$")


def readelf(*args: str) -> str:
    return subprocess.run(["readelf", "-W", *args], check=True, capture_output=True,
                          text=True).stdout


def is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def needed(path: Path) -> list[str]:
    return re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", readelf("-d", str(path)))


def version_files(path: Path) -> dict[str, str]:
    """version name -> the file it is required from (the .gnu.version_r section)."""
    out, current = {}, None
    for line in readelf("-V", str(path)).splitlines():
        m = re.search(r"Version: \d+\s+File: (\S+)", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"Name: (\S+)\s+Flags", line)
        if m and current:
            out[m.group(1)] = current
    return out


def symbols(path: Path):
    """(name, version or None, type, bind, defined) of each dynamic symbol."""
    for line in readelf("--dyn-syms", str(path)).splitlines():
        m = SYMBOL.match(line)
        if not m:
            continue
        _size, typ, bind, ndx, rest = m.groups()
        rest = rest.split(" (")[0].strip()
        name, _, version = rest.partition("@")
        version = version.lstrip("@") or None
        if name:
            yield name, version, typ, bind, ndx != "UND"


def main(torch_dir: str, root: str, cc: str = "aarch64-linux-gnu-gcc") -> None:
    torch = Path(torch_dir)
    lib = torch / "lib"
    root_path = Path(root)
    ours = sorted(p for p in [*lib.iterdir(), *torch.glob("_C*.so")] if p.is_file() and is_elf(p))
    system_dirs = [root_path / d for d in ("lib/aarch64-linux-gnu", "usr/lib/aarch64-linux-gnu")]
    system = {p.name: p for d in system_dirs if d.is_dir() for p in d.iterdir()}
    present = {p.name for p in ours} | set(system)
    missing = sorted({n for p in ours for n in needed(p) if n not in present})
    if not missing:
        print("arm_cuda_stubs: torch needs no library the root lacks")
        return
    # the symbols every present library (and the interpreter) defines
    providers = ours + [root_path / "usr/bin/python3.11"] + [
        system[n] for n in ("libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1",
                            "libpthread.so.0", "libdl.so.2", "librt.so.1") if n in system]
    defined = {name for p in providers if p.exists() for name, _v, _t, _b, d in symbols(p) if d}

    wanted: dict[str, dict[str, tuple[str | None, str]]] = {m: {} for m in missing}
    for p in ours:
        files = version_files(p)
        first_missing = next((n for n in needed(p) if n in wanted), None)
        for name, version, typ, bind, is_defined in symbols(p):
            if is_defined:
                continue
            target = files.get(version) if version else None
            if target in wanted:
                wanted[target][name] = (version, typ)
            elif version is None and name not in defined and bind != "WEAK" and first_missing:
                wanted[first_missing].setdefault(name, (None, typ))

    for soname, syms in wanted.items():
        src = lib / f"{soname}.stub.c"
        lines = [f"/* stand-in {soname}, written by .ci/arm_cuda_stubs.py */",
                 f'static const char message[] = "{MESSAGE}";']
        for name, (_version, typ) in sorted(syms.items()):
            if typ == "OBJECT":
                lines.append(f"char {name}[256] __attribute__((aligned(16)));")
            elif STRING_FUNCTION.search(name):
                lines.append(f"const char *{name}(void) {{ return message; }}")
            else:
                lines.append(f"int {name}(void) {{ return {STATUS}; }}")
        src.write_text("\n".join(lines) + "\n")
        versions = sorted({v for v, _t in syms.values() if v})
        script = lib / f"{soname}.stub.map"
        if versions:
            body = "".join(f"{v} {{ global: *; }};\n" for v in versions)
        else:
            body = "{ global: *; };\n"
        script.write_text(body)
        subprocess.run([cc, "-shared", "-fPIC", "-O1", "-w", f"-Wl,-soname,{soname}",
                        f"-Wl,--version-script={script}", str(src), "-o", str(lib / soname)],
                       check=True)
        src.unlink()
        script.unlink()
        print(f"arm_cuda_stubs: {soname}: {len(syms)} symbols"
              + (f" (versions {', '.join(versions)})" if versions else ""))


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    main(*sys.argv[1:])
