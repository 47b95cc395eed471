"""Build hygiene: baseline flags outside the ISA files, no -march=native, scalar C portable to aarch64.

These compile the C sources directly (not through setup.py) with the flags setup.py uses, so they
check the sources themselves: an AVX instruction leaking into a baseline file, or x86-only code
outside `#if PK_BUILT_<level>` (`PK_X86_64` and the level not omitted), fails here.
"""
import json
import os
import re
import runpy
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "perfkernels" / "csrc"

# the registry and the generator setup.py reads, loaded the way setup.py loads them (by path,
# without the package)
REGISTRY = runpy.run_path(str(ROOT / "perfkernels" / "_registry.py"))
CODEGEN = runpy.run_path(str(ROOT / "perfkernels" / "_codegen.py"))
LEVELS = REGISTRY["LEVELS"]
BASE_FLAGS = list(REGISTRY["BASE_FLAGS"])
FAMILY_DIR = ROOT / REGISTRY["FAMILIES_DIR"]
FAMILIES = [f.name for f in REGISTRY["FAMILIES"] if f.body]
INCLUDES = ["-I", str(ROOT / "include"), "-I", str(CSRC), "-I", str(FAMILY_DIR)]
HEADERS = (sorted(CSRC.glob("**/*.h")) + sorted(FAMILY_DIR.glob("*/*.h"))
           + sorted((ROOT / "include").glob("**/*.h")))


def build_sources(generated):
    """Every C source setup.py compiles: each folder's own files (the shared csrc/<module>/ and the
    families') plus the generated per-level files and dispatch tables of the kernel families
    (written under ``generated``)."""
    folders = [p for p in sorted(CSRC.iterdir()) if p.is_dir()]
    folders += [FAMILY_DIR / f.name for f in REGISTRY["FAMILIES"]]
    return [src for folder in folders
            for src in CODEGEN["family_sources"](folder, folder.name, generated, REGISTRY["NAMES"])]


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    return tmp_path_factory.mktemp("generated")


@pytest.fixture(scope="module")
def sources(generated):
    return build_sources(generated)


SOURCES = sorted(CSRC.glob("**/*.c")) + sorted(FAMILY_DIR.glob("*/[!_]*.c"))


def level_of(src):
    """The registry row of an ISA source file (the generated <family>/<level>.c), or None."""
    return next((lv for lv in LEVELS if src.stem == lv.name and lv.flags), None)


pytestmark = pytest.mark.skipif(not SOURCES, reason="C sources not found (tests run from a checkout)")


def compile_c(cc, src, out, flags, generated):
    """Compile as setup.py does; ``generated``: where build_sources wrote the families'
    generated files (a hand-written scalar.c includes its family's generated levels.h)."""
    return subprocess.run([cc, *flags, *INCLUDES, "-I", str(generated), "-c", str(src), "-o", str(out)],
                          capture_output=True, text=True)


def test_no_march_native_anywhere():
    for path in [ROOT / "setup.py", ROOT / "pyproject.toml", ROOT / "perfkernels" / "_registry.py",
                 *SOURCES, *HEADERS]:
        assert not re.search(r"[\"']-march=native", path.read_text()), path


@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("objdump") is None,
                    reason="needs gcc and objdump")
@pytest.mark.skipif(not __import__("platform").machine().lower() in ("x86_64", "amd64"),
                    reason="x86-64 only")
def test_only_isa_files_contain_wide_vector_instructions(tmp_path, sources, generated):
    baseline = [src for src in sources if level_of(src) is None]
    assert baseline
    # the ISA files may (and do) use YMM/ZMM: they are not compiled here (the bag kernels' level
    # files take minutes each, and the build compiles them anyway)
    for src in baseline:
        obj = tmp_path / (src.parent.name + "_" + src.stem + ".o")
        proc = compile_c("gcc", src, obj, BASE_FLAGS + ["-fPIC"], generated)
        assert proc.returncode == 0, f"{src}:\n{proc.stderr}"
        asm = subprocess.run(["objdump", "-d", str(obj)], capture_output=True, text=True).stdout
        wide = re.findall(r"%[yz]mm\d+", asm)
        assert not wide, f"{src} is built with baseline flags but uses {sorted(set(wide))[:5]}"


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_isa_files_refuse_to_build_without_their_flags(tmp_path, sources, generated):
    host = REGISTRY["host_arch"]()
    # another architecture's level files compile to nothing here (PK_BUILT_<level> is 0)
    isa_sources = [src for src in sources if level_of(src) and level_of(src).arch == host]
    assert isa_sources or host not in ("x86_64", "aarch64")
    for src in isa_sources:
        proc = compile_c("gcc", src, tmp_path / "x.o", BASE_FLAGS, generated)
        if host == "x86_64" or level_of(src).name != "neon":   # aarch64's baseline is NEON
            assert proc.returncode != 0 and "must be compiled with" in proc.stderr, src


CROSS = shutil.which("aarch64-linux-gnu-gcc")


@pytest.mark.skipif(CROSS is None and not os.environ.get("PERFKERNELS_REQUIRE_CROSS"),
                    reason="aarch64-linux-gnu-gcc not installed (Debian: gcc-aarch64-linux-gnu)")
def test_every_source_compiles_for_aarch64(tmp_path, sources, generated):
    """The scalar path and the baseline files build for aarch64 (the Arm levels' own files are
    compiled, with their flags, and run by tests/test_emulated_arm.py)."""
    assert CROSS, "PERFKERNELS_REQUIRE_CROSS is set but aarch64-linux-gnu-gcc is missing"
    omit = [f"-DPK_OMIT_{lv.name}" for lv in LEVELS if lv.arch == "aarch64"]
    for src in sources:
        proc = compile_c(CROSS, src, tmp_path / "x.o", BASE_FLAGS + ["-Werror", "-fPIC"] + omit, generated)
        assert proc.returncode == 0, f"{src} does not build for aarch64:\n{proc.stderr}"


def test_every_family_has_a_source_for_every_level(sources):
    """Adding an ISA level is a registry row, an isa_list.h row and simd/<level>.h: the build
    generates each kernel family's file for the level (and its dispatch table) unless the family
    writes that level by hand."""
    assert FAMILIES
    by_family = {}
    for src in sources:
        by_family.setdefault(src.parent.name, set()).add(src.name)
    for family in FAMILIES:
        assert {f"{lv.name}.c" for lv in LEVELS} | {"dispatch.c"} <= by_family[family], family
    for level in LEVELS:
        assert (CSRC / "simd" / f"{level.name}.h").exists(), level.name


def test_generated_sources_are_rewritten_only_when_changed(tmp_path):
    """Rebuilds stay incremental: a second run leaves the generated files' times alone, and a
    stale generated file is corrected."""
    first = build_sources(tmp_path)
    generated = [p for p in first if tmp_path in p.parents]
    assert generated
    stamps = {p: p.stat().st_mtime_ns for p in generated}
    generated[0].write_text("stale")
    second = build_sources(tmp_path)
    assert second == first
    assert generated[0].read_text().startswith("/* Generated by the build")
    assert all(p.stat().st_mtime_ns == stamps[p] for p in generated[1:])


def test_c_isa_list_matches_the_registry():
    """The build writes PK_ISA_LIST's rows from the registry; the committed header holds them."""
    text = (ROOT / "include" / "perfkernels" / "isa_list.h").read_text()
    assert CODEGEN["isa_list_source"](text, LEVELS) == text
    rows = re.findall(r"^\s*X\(A, (\w+), (\w+)\)", text, re.M)
    assert [name for name, _ in rows] == [lv.name for lv in LEVELS]
    assert [built for _, built in rows] == ["1" if lv.arch == "any" else f"PK_BUILT_{lv.name}"
                                            for lv in LEVELS]
    for lv in LEVELS:
        if lv.arch != "any":    # built on the level's architecture unless the build omits it
            assert (f"#if PK_{lv.arch.upper()} && !defined(PK_OMIT_{lv.name})\n"
                    f"#define PK_BUILT_{lv.name} 1\n") in text, lv.name


def test_levels_option_names_the_levels_left_out():
    """PERFKERNELS_LEVELS lists the levels a development build keeps: the rest are omitted; unset,
    none is; a typo or a list without scalar is refused (never a build that silently lacks one)."""
    omitted = REGISTRY["omitted_levels"]
    assert omitted("") == () and omitted(" , ") == ()
    assert omitted(",".join(lv.name for lv in LEVELS)) == ()
    assert omitted("scalar") == tuple(lv.name for lv in LEVELS[1:])
    assert omitted(" Scalar, " + LEVELS[-1].name) == tuple(lv.name for lv in LEVELS[1:-1])
    with pytest.raises(ValueError, match=r"unknown level\(s\) avx3; valid: scalar"):
        omitted("scalar,avx3")
    with pytest.raises(ValueError, match="scalar must be one of the levels"):
        omitted(LEVELS[-1].name)


@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("nm") is None,
                    reason="needs gcc and nm")
@pytest.mark.skipif(not __import__("platform").machine().lower() in ("x86_64", "amd64"),
                    reason="x86-64 only (elsewhere the x86 levels are never built)")
def test_an_omitted_level_compiles_to_nothing_and_leaves_its_table_rows_empty(tmp_path, generated):
    """With PK_OMIT_<level> (what PERFKERNELS_LEVELS gives setup.py) a level file, even with its
    flags, defines no symbol, and the dispatch table refers to no symbol of that level; without it
    the file defines the level's kernels and the table refers to them (so the check can fail)."""
    family = "interaction"      # a family with a small body: compiled at every level in seconds
    folder = FAMILY_DIR / family
    srcs = {p.name: p for p in CODEGEN["family_sources"](folder, family, generated, REGISTRY["NAMES"])}
    for level in [lv for lv in LEVELS[1:] if lv.arch == "x86_64"]:
        for omit in (False, True):
            flags = BASE_FLAGS + ["-fPIC"] + (["-DPK_OMIT_" + level.name] if omit else [])
            symbols = {}
            for name, extra in ((f"{level.name}.c", list(level.flags)), ("dispatch.c", [])):
                obj = tmp_path / f"{level.name}_{omit}_{name}.o"
                proc = compile_c("gcc", srcs[name], obj, flags + extra, generated)
                assert proc.returncode == 0, proc.stderr
                symbols[name] = subprocess.run(["nm", str(obj)], capture_output=True,
                                               text=True).stdout
            defined = re.findall(rf" T (pk_\w+_{level.name})$", symbols[f"{level.name}.c"], re.M)
            wanted = re.findall(rf" U (pk_\w+_{level.name})$", symbols["dispatch.c"], re.M)
            if omit:
                assert not defined and not wanted, (level.name, defined, wanted)
            else:
                assert defined and set(wanted) <= set(defined), (level.name, defined, wanted)


def test_asv_matrix_matches_the_registry():
    """asv cannot read Python: its PERFKERNELS_ISA axis is a copy of the registry's names."""
    text = (ROOT / "asv.conf.json").read_text()
    conf = json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.M))
    assert conf["matrix"]["env_nobuild"]["PERFKERNELS_ISA"] == [lv.name for lv in LEVELS]
