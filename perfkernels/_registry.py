"""The one registry of perfkernels: the ISA levels it is built for and dispatches between, and its
kernel families.  Every list of levels or families elsewhere (the build, the dispatcher, the CLI,
the tests, ``.ci/``, the benchmark suite, the CUDA runtime) is derived from these tables, and
``asv.conf.json``'s copy of the level names is checked against them by a test.

ISA levels: one row per level, lowest first.  A row's position is its level number (the index into every family's C dispatch table).  Its name
is the value of ``PERFKERNELS_ISA`` and of ``use_isa()``, the stem of its source file in each
family (the generated ``build/csrc/<family>/<name>.c``), the suffix of the C symbols compiled there
(``pk_embedding_bag_f32_<name>``) and the name of its SIMD primitive header
(``perfkernels/csrc/simd/<name>.h``).

This module imports nothing from the package, so ``setup.py`` loads it by file path (the package
is not built yet then).  The C side lists the same levels in ``include/perfkernels/isa_list.h``
(its rows written from this table by the build) and asv in the ``PERFKERNELS_ISA`` axis of
``asv.conf.json``; tests check both against this table.

Kernel families: one row per family (:class:`Family`); all a family owns lives in its folder
``perfkernels/families/<name>/`` (docs/architecture.md lists the files a row implies).
"""
from __future__ import annotations

from typing import NamedTuple


class IsaLevel(NamedTuple):
    name: str
    #: "any", or the target family that compiles it (setup.py builds other targets without it)
    arch: str
    #: compiler flags for the level's own source files, and for no other file
    flags: tuple[str, ...]
    #: CPU features (names as perfkernels.cpu_features() reports them) the level needs at run time;
    #: os_ymm / os_zmm: the operating system saves the wider registers
    requires: tuple[str, ...]


#: flags of every C file (the Cython output drops -std=c11 and -Wall); a level adds its own
BASE_FLAGS: tuple[str, ...] = ("-O3", "-std=c11", "-fno-strict-aliasing", "-Wall", "-Wno-unused-function")

_AVX2_FLAGS = ("-mavx2", "-mfma", "-mf16c")
_AVX2_NEEDS = ("avx", "avx2", "fma", "f16c", "os_ymm")

LEVELS: tuple[IsaLevel, ...] = (
    IsaLevel("scalar", "any", (), ()),
    IsaLevel("avx2", "x86_64", _AVX2_FLAGS, _AVX2_NEEDS),
    IsaLevel("avx512", "x86_64",
             _AVX2_FLAGS + ("-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl"),
             _AVX2_NEEDS + ("avx512f", "avx512bw", "avx512dq", "avx512vl", "os_zmm")),
    # aarch64 (Linux: features from getauxval(AT_HWCAP)).  neon: Advanced SIMD, which every
    # Armv8-A CPU has (4 float32 lanes, 32 registers).  sve: float32 bags in length-agnostic SVE
    # (common/bags_sve.h; the vector length read at run time, used where wider than NEON's);
    # every other kernel is the NEON body (the bodies' accumulator arrays need a width known when
    # compiling, which SVE's sizeless types are not), compiled with SVE enabled, so the loops GCC
    # vectorises itself use SVE too; chosen over neon only on CPUs that have SVE.
    IsaLevel("neon", "aarch64", ("-march=armv8-a",), ("asimd",)),
    IsaLevel("sve", "aarch64", ("-march=armv8.2-a+sve",), ("asimd", "sve")),
)

NAMES: tuple[str, ...] = tuple(level.name for level in LEVELS)


def host_arch() -> str:
    """The ``arch`` of levels built for this machine ("x86_64", "aarch64", ...), as setup.py
    names the target."""
    import platform
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
BY_NAME: dict[str, IsaLevel] = {level.name: level for level in LEVELS}


def omitted_levels(value: str) -> tuple[str, ...]:
    """The levels a build leaves out for ``PERFKERNELS_LEVELS=value`` (e.g. ``scalar,avx2``: the
    levels a development build contains; unset or empty, every level, as a wheel always has).

    setup.py defines ``PK_OMIT_<level>`` for each: the level's files compile to nothing and its
    dispatch rows are NULL, so ``available_isas()`` and ``use_isa()`` treat it as not built.  The
    sanitizer run leaves out the levels its CPU cannot run (their tests would skip there), which
    saves the slowest compiles of its build.  Raises ValueError for an unknown name or a list
    without scalar (every kernel's fallback)."""
    names = [n.strip().lower() for n in value.split(",") if n.strip()]
    if not names:
        return ()
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise ValueError(f"PERFKERNELS_LEVELS={value!r}: unknown level(s) {', '.join(unknown)}; "
                         f"valid: {', '.join(NAMES)}")
    if "scalar" not in names:
        raise ValueError(f"PERFKERNELS_LEVELS={value!r}: scalar must be one of the levels (it is "
                         "every kernel's fallback)")
    return tuple(name for name in NAMES if name not in names)


# --- the kernel families ---------------------------------------------------------------------------


class Family(NamedTuple):
    """A kernel family: everything it owns lives in ``perfkernels/families/<name>/``."""
    name: str
    #: public functions, ``perfkernels.<function>`` (the NumPy frontend, ``_<name>.pyx``)
    functions: tuple[str, ...]
    #: its public C header ``include/perfkernels/<header>.h``, or None (a family written over others')
    header: str | None
    #: the kernels are ``body.h`` over the SIMD layer: the build writes one file per level and the
    #: dispatch table (``_codegen.family_sources``); False: no C of its own (it calls other
    #: families' tables)
    body: bool
    #: the scalar level is the plain C ``scalar.c`` rather than the body over ``simd/scalar.h``
    scalar_c: bool
    #: its CUDA kernels (``.cu`` files in the folder, launched by its ``_cuda.py``); () when none
    cuda: tuple[str, ...]
    #: the ``perfkernels.cuda`` functions of its CUDA frontend
    cuda_functions: tuple[str, ...]


#: Every kernel family, in the order ``check`` and ``bench`` run them.
FAMILIES: tuple[Family, ...] = (
    Family("convert", ("float_to_half", "half_to_float", "float_to_bfloat16", "bfloat16_to_float"),
           "convert", True, True, ("convert.cu",),
           ("float_to_half", "half_to_float", "float_to_bfloat16", "bfloat16_to_float")),
    Family("embedding", ("embedding_bag",), "embedding", True, True, ("embedding_bag.cu",),
           ("embedding_bag",)),
    Family("quantized", ("quantize_rowwise", "dequantize_rowwise", "embedding_bag_quantized"),
           "quantized", True, True, ("quantize.cu",),
           ("quantize_rowwise", "dequantize_rowwise", "embedding_bag_quantized")),
    Family("lstm", ("lstm_unit", "lstm_unit_backward"), "lstm", True, False, ("lstm.cu",),
           ("lstm_unit", "lstm_unit_backward")),
    Family("interaction", ("dot_interaction", "dot_interaction_backward"), "interaction", True, False, (), ()),
    Family("multi", ("embedding_bags_multi", "embedding_bags_interaction"), None, False, False,
           (), ()),
    Family("training", ("embedding_bag_backward_update",), "training", True, True, (), ()),
    Family("sequence", ("embedding", "embedding_quantized"), "sequence", True, False, (), ()),
)

FAMILY_NAMES: tuple[str, ...] = tuple(f.name for f in FAMILIES)
FAMILY_BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}
#: where a family's files live, relative to the repository root
FAMILIES_DIR = "perfkernels/families"
#: every .cu file: its path relative to the package folder
CUDA_SOURCES: dict[str, str] = {cu: f"families/{f.name}/{cu}" for f in FAMILIES for cu in f.cuda}


def family_files(family: Family) -> list[str]:
    """The files (repository paths) a family row implies, the ones its author writes, in the order
    docs/architecture.md lists them; tests/test_registry.py checks that every family has exactly
    these and that the doc's "add a family" list is this list.  The rest is generated by the build
    (:func:`generated_files`)."""
    folder = f"{FAMILIES_DIR}/{family.name}"
    files = [f"include/perfkernels/{family.header}.h"] if family.header else []
    if family.body:
        files.append(f"{folder}/body.h")
    if family.scalar_c:
        files.append(f"{folder}/scalar.c")
    files += [f"{folder}/_{family.name}.pyx", f"{folder}/reference.py"]
    if family.cuda:
        files += [f"{folder}/{cu}" for cu in family.cuda] + [f"{folder}/_cuda.py"]
    files += [f"{folder}/bench.py", f"tests/test_{family.name}.py"]
    return files


def generated_files(family: Family) -> list[str]:
    """The files the build writes for a family row (perfkernels/_codegen.py), never edited by
    hand nor kept in git: the type stub, and with a C header the Cython declarations, the
    per-level declarations and the dispatch table, and a file per level the body is compiled for
    (besides a hand-written scalar.c)."""
    folder = f"{FAMILIES_DIR}/{family.name}"
    files = [f"{folder}/_{family.name}.pyi"]
    if family.header:
        files.append(f"{folder}/_c_{family.name}.pxd")
    if family.body:
        built = f"build/csrc/{family.name}"
        files += [f"{built}/levels.h", f"{built}/dispatch.c"]
        files += [f"{built}/{level.name}.c" for level in LEVELS
                  if not (family.scalar_c and level.name == "scalar")]
    return files


#: Files every new family edits (one row or line each), beside those :func:`family_files` lists.
FAMILY_EDITS: tuple[str, ...] = ("perfkernels/_registry.py", "perfkernels/__init__.py",
                                 "perfkernels/reference.py", "perfkernels/_selfcheck.py",
                                 "docs/semantics.md")


def level_files(level: IsaLevel) -> list[str]:
    """The files a level row implies: its SIMD header (the per-level C of every family, the
    dispatch tables and the build flags all follow from the registry)."""
    return [f"perfkernels/csrc/simd/{level.name}.h"]


#: Files every new level edits, beside :func:`level_files`: asv's matrix axis (asv cannot read
#: Python; checked against the registry by a test).  The C copy of the level list, the rows of
#: include/perfkernels/isa_list.h, is written by the build (``_codegen.isa_list_source``).
LEVEL_EDITS: tuple[str, ...] = ("perfkernels/_registry.py", "asv.conf.json")
