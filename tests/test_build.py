"""Build hygiene: baseline flags outside the ISA files, no -march=native, scalar C portable to aarch64.

These compile the C sources directly (not through setup.py) with the flags setup.py uses, so they
check the sources themselves: an AVX instruction leaking into a baseline file, or x86-only code
outside `#if PK_X86_64`, fails here.
"""
import ast
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "perfkernels" / "csrc"
INCLUDES = ["-I", str(ROOT / "include"), "-I", str(CSRC)]
SOURCES = sorted(CSRC.glob("*.c"))
ISA_SUFFIXES = ("_avx2.c", "_avx512.c")

# the flag lists setup.py really uses, read from its source (importing it would run setup())
_text = (ROOT / "setup.py").read_text() if (ROOT / "setup.py").exists() else ""
def _flags(name):
    m = re.search(rf"^{name} = (?:AVX2_FLAGS \+ )?(\[.*\])", _text, re.M)
    return ast.literal_eval(m.group(1)) if m else []
BASE_FLAGS = _flags("BASE_FLAGS")
AVX2_FLAGS = _flags("AVX2_FLAGS")
AVX512_FLAGS = AVX2_FLAGS + _flags("AVX512_FLAGS")

pytestmark = pytest.mark.skipif(not SOURCES, reason="C sources not found (tests run from a checkout)")


def compile_c(cc, src, out, flags):
    return subprocess.run([cc, *flags, *INCLUDES, "-c", str(src), "-o", str(out)],
                          capture_output=True, text=True)


def test_no_march_native_anywhere():
    for path in [ROOT / "setup.py", ROOT / "pyproject.toml", *SOURCES, *CSRC.glob("*.h")]:
        assert not re.search(r"[\"']-march=native", path.read_text()), path


@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("objdump") is None,
                    reason="needs gcc and objdump")
@pytest.mark.skipif(not __import__("platform").machine().lower() in ("x86_64", "amd64"),
                    reason="x86-64 only")
def test_only_isa_files_contain_wide_vector_instructions(tmp_path):
    for src in SOURCES:
        isa_flags = (AVX512_FLAGS if src.name.endswith("_avx512.c")
                     else AVX2_FLAGS if src.name.endswith("_avx2.c") else [])
        obj = tmp_path / (src.stem + ".o")
        proc = compile_c("gcc", src, obj, BASE_FLAGS + isa_flags + ["-fPIC"])
        assert proc.returncode == 0, f"{src.name}:\n{proc.stderr}"
        asm = subprocess.run(["objdump", "-d", str(obj)], capture_output=True, text=True).stdout
        wide = re.findall(r"%[yz]mm\d+", asm)
        if isa_flags:
            continue  # allowed (and expected) to use YMM/ZMM
        assert not wide, f"{src.name} is built with baseline flags but uses {sorted(set(wide))[:5]}"


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_isa_files_refuse_to_build_without_their_flags(tmp_path):
    for src in SOURCES:
        if not src.name.endswith(ISA_SUFFIXES):
            continue
        proc = compile_c("gcc", src, tmp_path / "x.o", BASE_FLAGS)
        if __import__("platform").machine().lower() in ("x86_64", "amd64"):
            assert proc.returncode != 0 and "must be compiled with" in proc.stderr, src.name


CROSS = shutil.which("aarch64-linux-gnu-gcc")


@pytest.mark.skipif(CROSS is None and not os.environ.get("PERFKERNELS_REQUIRE_CROSS"),
                    reason="aarch64-linux-gnu-gcc not installed (Debian: gcc-aarch64-linux-gnu)")
def test_every_source_compiles_for_aarch64(tmp_path):
    assert CROSS, "PERFKERNELS_REQUIRE_CROSS is set but aarch64-linux-gnu-gcc is missing"
    for src in SOURCES:
        proc = compile_c(CROSS, src, tmp_path / (src.stem + ".o"), BASE_FLAGS + ["-Werror", "-fPIC"])
        assert proc.returncode == 0, f"{src.name} does not build for aarch64:\n{proc.stderr}"
