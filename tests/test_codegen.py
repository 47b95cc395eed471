"""The build's generator (perfkernels/_codegen.py): its header parser reads every construct a public
header is written in, the declarations it writes are the header's, and the type stubs are the
wrappers' annotated signatures."""
import ast
import re
import subprocess
import shutil
from pathlib import Path

import pytest

from perfkernels import _codegen, _registry

ROOT = Path(__file__).resolve().parents[1]
in_checkout = pytest.mark.skipif(not (ROOT / "include" / "perfkernels").is_dir(),
                                 reason="needs a source checkout")

# every construct the parser reads, in a header of a made-up family "foo"
FOO_H = r"""/* foo: a made-up family. */
#ifndef PERFKERNELS_FOO_H
#define PERFKERNELS_FOO_H

#include "perfkernels/bags.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PK_FOO_LIMIT (4 * 16)   /* an object-like macro */
#define PK_FOO_TWICE(x) ((x) * 2)

typedef enum pk_foo_mode { PK_FOO_A = 0, PK_FOO_B = 1 } pk_foo_mode;

typedef struct pk_foo_params {
    int64_t n, d;        /* two members on one line */
    const float *scale;
} pk_foo_params;

// a line comment
typedef pk_status (*pk_foo_bag_fn)(const pk_bags *bags, const pk_foo_params *p,
                                   int64_t *bad_pos);
typedef void (*pk_foo_fill_fn)(float *dst, size_t n);

typedef struct pk_foo_kernels {
    pk_foo_bag_fn foo_bag;
    pk_foo_fill_fn foo_fill;
} pk_foo_kernels;

const pk_foo_kernels *pk_foo_table(int isa);

static inline int64_t pk_foo_bytes(int64_t n)
{
    if (n > 0) { return n * 4; }
    return 0;
}

#ifdef __cplusplus
}
#endif
#endif
"""


def test_the_parser_reads_every_construct():
    header = _codegen.parse_header(FOO_H)
    kinds = [(type(item).__name__, getattr(item, "name", None) or item.fn.name)
             for item in header.items]
    assert kinds == [("Constant", "PK_FOO_LIMIT"), ("Enum", "pk_foo_mode"), ("Struct", "pk_foo_params"),
                     ("FnType", "pk_foo_bag_fn"), ("FnType", "pk_foo_fill_fn"),
                     ("Struct", "pk_foo_kernels"), ("Function", "pk_foo_table"),
                     ("Function", "pk_foo_bytes")]
    assert header.of(_codegen.Enum)[0].constants == ("PK_FOO_A", "PK_FOO_B")
    assert header.of(_codegen.Struct)[0].members == ("int64_t n, d", "const float *scale")
    bag = header.of(_codegen.FnType)[0].fn
    assert bag == _codegen.Function("pk_status", "pk_foo_bag_fn",
                                    ("const pk_bags *bags", "const pk_foo_params *p",
                                     "int64_t *bad_pos"))
    assert header.of(_codegen.Function)[0].head() == "const pk_foo_kernels *pk_foo_table"
    assert [(m, fn.name) for m, fn in _codegen.kernels(header, "foo")] == [
        ("foo_bag", "pk_foo_bag_fn"), ("foo_fill", "pk_foo_fill_fn")]


def test_the_parser_refuses_what_it_does_not_read():
    with pytest.raises(ValueError, match="typedef"):
        _codegen.parse_header("typedef union u { int a; float b; } u;")
    with pytest.raises(ValueError, match="no table struct"):
        _codegen.kernels(_codegen.parse_header(FOO_H), "bar")
    bad_member = FOO_H.replace("pk_foo_fill_fn foo_fill;", "int foo_fill;")
    with pytest.raises(ValueError, match="not a function type"):
        _codegen.kernels(_codegen.parse_header(bad_member), "foo")


def test_the_generated_c_declares_every_level_of_every_kernel():
    levels = _codegen.levels_source("foo", FOO_H, ["scalar", "avx2"])
    protos = [_squash(p) for p in re.findall(r"^\w[^;#]*\);", levels, re.M)]
    assert protos == [
        "pk_status pk_foo_bag_scalar(const pk_bags *bags, const pk_foo_params *p, int64_t *bad_pos);",
        "void pk_foo_fill_scalar(float *dst, size_t n);",
        "pk_status pk_foo_bag_avx2(const pk_bags *bags, const pk_foo_params *p, int64_t *bad_pos);",
        "void pk_foo_fill_avx2(float *dst, size_t n);"]
    table = _codegen.dispatch_source("foo", FOO_H)
    assert ".foo_bag = pk_foo_bag_##isa," in table and ".foo_fill = pk_foo_fill_##isa," in table
    assert "PK_DEFINE_KERNEL_TABLE(pk_foo_kernels, pk_foo_table, ROW)" in table


def _squash(text):
    return " ".join(text.split())


def test_the_generated_pxd_declares_the_header():
    shared = {"pk_status": "perfkernels._c_common", "pk_bags": "perfkernels._c_bags"}
    pxd = _codegen.pxd_source("foo", [("perfkernels/foo.h", FOO_H)], shared)
    flat = _squash(pxd)
    for line in ("from libc.stdint cimport int64_t", "from perfkernels._c_bags cimport pk_bags",
                 "from perfkernels._c_common cimport pk_status",
                 'cdef extern from "perfkernels/foo.h":', "enum: PK_FOO_LIMIT ctypedef enum",
                 "ctypedef enum pk_foo_mode: PK_FOO_A PK_FOO_B",
                 "ctypedef struct pk_foo_params: int64_t n, d const float *scale",
                 "ctypedef pk_status (*pk_foo_bag_fn)(const pk_bags *bags, const pk_foo_params *p, "
                 "int64_t *bad_pos) noexcept nogil",
                 "const pk_foo_kernels *pk_foo_table(int isa) noexcept nogil",
                 "int64_t pk_foo_bytes(int64_t n) noexcept nogil"):
        assert line in flat, line
    assert "PK_FOO_TWICE" not in pxd and "PERFKERNELS_FOO_H" not in pxd
    assert all(len(line) <= 100 for line in pxd.splitlines()[1:])


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
@in_checkout
@pytest.mark.parametrize("family", [f for f in _registry.FAMILIES if f.header],
                         ids=[f.name for f in _registry.FAMILIES if f.header])
def test_each_familys_declarations_compile_against_its_header(tmp_path, family):
    """levels.h repeats the header's signatures for every level: a C compiler accepts it next to
    the header and to a definition with the header's type (a mismatch is a conflicting type)."""
    text = _codegen.header_path(ROOT, family.name).read_text()
    (tmp_path / "levels.h").write_text(_codegen.levels_source(family.name, text, _registry.NAMES))
    members = _codegen.kernels(_codegen.parse_header(text), family.name)
    field, fn = members[0]
    src = tmp_path / "check.c"
    src.write_text('#include "levels.h"\n'
                   f"static {fn.name} check = pk_{field}_{_registry.NAMES[0]};\n")
    proc = subprocess.run(["gcc", "-std=c11", "-Wall", "-Werror", "-Wno-unused-variable",
                           "-I", str(ROOT / "include"), "-fsyntax-only", str(src)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_a_stub_is_the_annotated_signature_with_its_imports():
    pyx = '''
cdef int _helper(int x) except -1:
    return x

def lookup(table: TableArray, indices: IndexArray, *, mode: Mode = "sum",
           weights: npt.ArrayLike | None = None,
           kinds: Sequence[int] = ()) -> Float32Array:
    """Doc: with a colon: here."""
    return None
'''
    aliases = {"TableArray", "IndexArray", "Mode", "Float32Array", "GateOrder"}
    stub = _codegen.stub_source("foo", pyx, ["lookup"], aliases)
    tree = ast.parse(stub)
    imports = [ast.unparse(node) for node in tree.body if not isinstance(node, ast.FunctionDef)]
    assert imports == ["from typing import Sequence", "import numpy.typing as npt",
                       "from perfkernels._typing import Float32Array, IndexArray, Mode, TableArray"]
    (fn,) = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    assert ast.unparse(fn.returns) == "Float32Array"
    assert [a.arg for a in fn.args.args + fn.args.kwonlyargs] == [
        "table", "indices", "mode", "weights", "kinds"]
    with pytest.raises(ValueError, match="Unknown"):
        _codegen.stub_source("foo", pyx.replace("Mode", "Unknown"), ["lookup"], aliases)
    with pytest.raises(ValueError, match="no top-level def"):
        _codegen.stub_source("foo", pyx, ["missing"], aliases)


@in_checkout
def test_the_families_stubs_and_pxds_are_the_generators_output():
    """What the last build wrote is what the generator writes now (else: rebuild)."""
    aliases = _codegen.typing_aliases(ROOT / "perfkernels")
    shared = _codegen.shared_cython_names(ROOT / "perfkernels")
    for family in _registry.FAMILIES:
        folder = ROOT / _registry.FAMILIES_DIR / family.name
        stub = folder / f"_{family.name}.pyi"
        assert stub.read_text() == _codegen.stub_source(
            family.name, (folder / f"_{family.name}.pyx").read_text(), family.functions, aliases)
        if family.header:
            assert (folder / f"_c_{family.name}.pxd").read_text() == _codegen.pxd_source(
                family.name, _codegen.pxd_headers(ROOT, family.name), shared)
