"""The registry (perfkernels/_registry.py) is the one list of ISA levels and kernel families: every
other list is derived from it, the files a row implies exist, and docs/architecture.md's "add a
family" / "add an ISA level" steps are the registry's own lists."""
import re
from pathlib import Path

import numpy as np
import pytest

import perfkernels as pk
from perfkernels import _registry, _selfcheck, benchsuite
from perfkernels.families.quantized import layout

ROOT = Path(__file__).resolve().parents[1]
FAMILY_DIR = ROOT / _registry.FAMILIES_DIR
in_checkout = pytest.mark.skipif(not FAMILY_DIR.is_dir() or not (ROOT / "docs").is_dir(),
                                 reason="needs a source checkout")


@in_checkout
def test_the_family_folders_are_the_registry_rows():
    folders = sorted(p.parent.name for p in FAMILY_DIR.glob("*/__init__.py"))
    assert folders == sorted(_registry.FAMILY_NAMES)


@in_checkout
@pytest.mark.parametrize("family", _registry.FAMILIES, ids=_registry.FAMILY_NAMES)
def test_every_family_has_the_files_its_row_implies(family):
    missing = [f for f in _registry.family_files(family) if not (ROOT / f).exists()]
    assert not missing, missing


@in_checkout
@pytest.mark.parametrize("level", _registry.LEVELS, ids=_registry.NAMES)
def test_every_level_has_the_files_its_row_implies(level):
    missing = [f for f in _registry.level_files(level) if not (ROOT / f).exists()]
    assert not missing, missing


def test_the_public_functions_are_the_families_functions():
    modules = {n: getattr(pk, n).__module__ for n in pk.__all__}
    from_families = {n for n, m in modules.items() if m.startswith("perfkernels.families.")}
    assert from_families == {fn for f in _registry.FAMILIES for fn in f.functions}
    for family in _registry.FAMILIES:
        for fn in family.functions:
            assert modules[fn] == f"perfkernels.families.{family.name}._{family.name}", fn


def test_the_cuda_frontend_has_each_familys_functions():
    from perfkernels import cuda
    for family in _registry.FAMILIES:
        assert set(family.cuda_functions) <= set(family.functions)
        assert set(family.cuda_functions) <= set(cuda.__all__), family.name
        assert bool(family.cuda) == bool(family.cuda_functions), family.name


def test_check_and_bench_cover_every_family_in_registry_order():
    assert tuple(dict.fromkeys(c.family for c in _selfcheck.checks())) == _registry.FAMILY_NAMES
    assert tuple(benchsuite.families()[:len(_registry.FAMILIES)]) == _registry.FAMILY_NAMES


@pytest.mark.parametrize("bits", layout.BITS)
def test_the_packed_row_size_is_the_same_in_python_and_c(bits):
    """quantize_rowwise sizes its output with the C pk_quantized_row_bytes; the frontends and the
    reference use layout.packed_row_bytes."""
    for dim in range(1, 70):
        packed = pk.quantize_rowwise(np.zeros((1, dim), np.float32), bits=bits)
        assert packed.shape[1] == layout.packed_row_bytes(dim, bits), dim
        assert layout.packed_dim(packed.shape[1], bits, dim) == dim
        assert layout.packed_dim(packed.shape[1], bits) >= dim


@in_checkout
def test_no_other_file_lists_the_levels_or_families():
    """The registry is the one list: no tuple or list of level or family names elsewhere."""
    level_list = re.compile(r"""["']{}["'],\s*["']{}["']""".format(*_registry.NAMES[:2]))
    family_list = re.compile(r"""["']{}["'],\s*["']{}["']""".format(*_registry.FAMILY_NAMES[:2]))
    files = [p for pattern in ("perfkernels/**/*.py", "perfkernels/**/*.pyx", "benchmarks/*.py",
                               ".ci/*", "setup.py")
             for p in ROOT.glob(pattern) if p.name != "_registry.py"]
    assert files
    for path in files:
        text = path.read_text()
        assert not level_list.search(text), f"{path} lists the ISA levels by hand"
        assert not family_list.search(text), f"{path} lists the families by hand"


@in_checkout
@pytest.mark.parametrize("family", [f for f in _registry.FAMILIES if f.header],
                         ids=[f.name for f in _registry.FAMILIES if f.header])
def test_each_c_table_is_declared_once_per_side(family):
    """The C header defines the family's table row and its per-level declarations; its .pxd
    declares the same table struct and getter from that header (the signatures are written in the
    header, the .pxd repeats only the names Cython calls)."""
    header = (ROOT / f"include/perfkernels/{family.header}.h").read_text()
    pxd = (FAMILY_DIR / family.name / f"_c_{family.name}.pxd").read_text()
    name = family.name
    assert f"pk_{name}_kernels" in header and f"PK_{name.upper()}_KERNELS" in header
    assert "PK_DECLARE_FOR_EACH_ISA" in header
    assert f'cdef extern from "perfkernels/{family.header}.h"' in pxd
    for symbol in (f"pk_{name}_kernels", f"pk_{name}_table"):
        assert symbol in pxd, symbol


def _doc_table(heading: str) -> list[str]:
    """The file paths in the first column of the table under ``heading`` in architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)`", section, re.M)


FOO = _registry.Family("foo", ("foo",), "foo", True, True, ("foo.cu",), ("foo",))
NEW_LEVEL = _registry.IsaLevel("<isa>", "x86_64", (), ())


@in_checkout
def test_the_add_a_family_steps_are_the_registrys():
    listed = _doc_table("Adding a kernel family")
    assert listed == list(_registry.FAMILY_EDITS) + _registry.family_files(FOO)


@in_checkout
def test_the_add_a_level_steps_are_the_registrys():
    listed = _doc_table("Adding an ISA level")
    assert listed == list(_registry.LEVEL_EDITS) + _registry.level_files(NEW_LEVEL)
