"""Importing perfkernels from a source checkout whose compiled modules were never built there.

``pip install .`` compiles the extension modules into site-packages, not into the checkout.  Run
from the checkout's root, ``python -m perfkernels ...`` and ``python -c "import perfkernels"``
put the current directory first on ``sys.path``, so Python finds the source folder
``perfkernels/`` (pure Python, no compiled modules) before the installed package.  Rather than
fail half-way through the import, the package then continues from the installed copy (found on
``sys.path``, compiled, not this folder), or, when there is none, raises an ``ImportError`` that
says what to do.  docs/installing.md explains the choice.
"""
from __future__ import annotations

import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES


def has_compiled_modules(directory: str) -> bool:
    """Whether `directory` holds at least one built extension module (``*.so`` / ``*.pyd``)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return False
    return any(name.endswith(tuple(EXTENSION_SUFFIXES)) for name in names)


def installed_copy(source_dir: str) -> str | None:
    """The first other ``perfkernels`` package on ``sys.path`` that is compiled, or None."""
    here = os.path.realpath(source_dir)
    for entry in sys.path:
        candidate = os.path.join(entry or os.getcwd(), "perfkernels")
        if os.path.realpath(candidate) == here:
            continue
        if os.path.isfile(os.path.join(candidate, "__init__.py")) and has_compiled_modules(candidate):
            return candidate
    return None


def package_dir(source_dir: str) -> str:
    """Where the package's modules should be imported from: `source_dir` when it is compiled,
    else the installed copy; ImportError when neither can work."""
    if has_compiled_modules(source_dir):
        return source_dir
    found = installed_copy(source_dir)
    if found is None:
        raise ImportError(
            f"perfkernels is being imported from its source folder {source_dir}, whose compiled "
            "modules have not been built, and no installed perfkernels was found on sys.path. "
            "Install it with `pip install .` (then any directory works, the checkout's root "
            "included), or build the modules in place for development with `pip install -e .` "
            "or `python setup.py build_ext --inplace`.")
    return found
