"""The type stubs (.pyi) of the compiled modules name the same parameters, in the same order and
kind, with the same defaults, as the compiled functions themselves (Cython embeds their real
signatures in the docstrings)."""
import ast
from pathlib import Path

import pytest

import perfkernels as pk

PKG = Path(pk.__file__).resolve().parent


def stub_functions():
    for pyi in sorted(PKG.glob("_*.pyi")) + sorted(PKG.glob("families/*/_*.pyi")):
        for node in ast.parse(pyi.read_text()).body:
            if isinstance(node, ast.FunctionDef) and hasattr(pk, node.name):
                yield pytest.param(pyi.name, node, id=node.name)


REQUIRED = "<required>"


def stub_signature(node: ast.FunctionDef):
    a = node.args
    pos_defaults = [None] * (len(a.args) - len(a.defaults)) + list(a.defaults)
    default = (lambda d: REQUIRED if d is None else ast.literal_eval(d))
    params = [(p.arg, "pos", default(d)) for p, d in zip(a.args, pos_defaults)]
    params += [(p.arg, "kw", default(d)) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    return params


def runtime_signature(fn):
    """The compiled function's parameters, read from the signature Cython embeds (annotations
    included) on its docstring's first line."""
    first = fn.__doc__.splitlines()[0]
    node = ast.parse(f"def {first}: ...").body[0]
    return stub_signature(node)


@pytest.mark.parametrize("pyi,node", list(stub_functions()))
def test_stub_matches_compiled_signature(pyi, node):
    assert stub_signature(node) == runtime_signature(getattr(pk, node.name)), pyi


def test_every_public_kernel_has_a_stub():
    stubbed = {p.values[1].name for p in stub_functions()}
    compiled = {n for n in pk.__all__ if not hasattr(getattr(pk, n), "__code__")}
    assert compiled <= stubbed, compiled - stubbed
