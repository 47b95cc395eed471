"""The registry (perfkernels/_registry.py) is the one list of ISA levels and kernel families: every
other list is derived from it, the files a row implies exist, and docs/architecture.md's "add a
family" / "add an ISA level" steps are the registry's own lists."""
import importlib
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import perfkernels as pk
from perfkernels import _codegen, _registry, _selfcheck, benchsuite, reference
from perfkernels.families.quantized import layout

ROOT = Path(__file__).resolve().parents[1]
FAMILY_DIR = ROOT / _registry.FAMILIES_DIR
in_checkout = pytest.mark.skipif(not FAMILY_DIR.is_dir() or not (ROOT / "docs").is_dir(),
                                 reason="needs a source checkout")


@in_checkout
def test_the_family_folders_are_the_registry_rows():
    folders = sorted(p.parent.name for p in FAMILY_DIR.glob("*/_*.pyx"))
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


HEADER_FAMILIES = [f for f in _registry.FAMILIES if f.header]


@in_checkout
@pytest.mark.parametrize("family", HEADER_FAMILIES, ids=[f.name for f in HEADER_FAMILIES])
def test_each_kernel_signature_is_written_once(family):
    """A kernel's signature is its function type in the family header, named by a member of the
    table struct; the header names no level (the per-level declarations and the table rows are
    generated, tests/test_codegen.py)."""
    header = (ROOT / f"include/perfkernels/{family.header}.h").read_text()
    members = _codegen.kernels(_codegen.parse_header(header), family.name)
    assert members
    assert "##" not in header and "PK_DECLARE" not in header
    for level in _registry.NAMES:
        assert not re.search(rf"\w_{level}\b", header), f"{family.header}.h names the level {level}"


@pytest.mark.skipif(not (ROOT / "build" / "csrc").is_dir(), reason="needs an in-place build")
@pytest.mark.parametrize("family", _registry.FAMILIES, ids=_registry.FAMILY_NAMES)
def test_the_build_wrote_the_files_a_row_generates(family):
    """What the build generates for a row (generated_files) exists, says it is generated, and is
    not kept in git (a contributor never writes it)."""
    for name in _registry.generated_files(family):
        path = ROOT / name
        assert path.exists(), name
        assert _codegen.GENERATED_MARK in path.read_text().splitlines()[0], name
    tracked = subprocess.run(["git", "ls-files", *_registry.generated_files(family)], cwd=ROOT,
                             capture_output=True, text=True)
    assert tracked.returncode != 0 or not tracked.stdout.strip(), tracked.stdout


@pytest.mark.parametrize("family", _registry.FAMILIES, ids=_registry.FAMILY_NAMES)
def test_perfkernels_reference_gathers_each_familys_reference(family):
    module = importlib.import_module(f"perfkernels.families.{family.name}.reference")
    assert set(family.functions) <= set(module.__all__), family.name
    for name in module.__all__:
        assert getattr(reference, name) is getattr(module, name), name


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


def _calls_of_every_function(text: str) -> set[str]:
    """The registry's public functions that ``text`` names as ``pk.<function>``."""
    return {fn for family in _registry.FAMILIES for fn in family.functions
            if re.search(rf"\bpk\.{fn}\b", text)}


@pytest.mark.parametrize("where", ["tests/test_threads.py", "tests/emulated/smoke.py",
                                   "tests/test_leaks.py"])
def test_every_kernel_lists_cover_the_registry(where):
    """The tests that run "every kernel" (thread-count independence and fork, the emulated CPUs,
    leaks) call every public function of every family in the registry: a new family fails here
    until it is added to them."""
    text = (ROOT / where).read_text()
    every = {fn for family in _registry.FAMILIES for fn in family.functions}
    assert every - _calls_of_every_function(text) == set(), where
