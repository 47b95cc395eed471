"""The ISA levels perfkernels is built for and dispatches between: one row per level, lowest first.

A row's position is its level number (the index into every family's C dispatch table).  Its name
is the value of ``PERFKERNELS_ISA`` and of ``use_isa()``, the stem of its source file in each
family folder (``perfkernels/csrc/<family>/<name>.c``), the suffix of the C symbols compiled there
(``pk_embedding_bag_f32_<name>``) and the name of its SIMD primitive header
(``perfkernels/csrc/simd/<name>.h``).

This module imports nothing from the package, so ``setup.py`` loads it by file path (the package
is not built yet then).  The C side lists the same levels in ``include/perfkernels/isa_list.h``
and asv in the ``PERFKERNELS_ISA`` axis of ``asv.conf.json``; tests check both against this table.
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
)

NAMES: tuple[str, ...] = tuple(level.name for level in LEVELS)
BY_NAME: dict[str, IsaLevel] = {level.name: level for level in LEVELS}
