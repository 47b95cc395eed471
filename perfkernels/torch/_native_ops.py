"""The native torch ops: loading ``perfkernels/torch/_native*.so`` into this process.

The library (built from ``perfkernels/torch/native/``) defines the ops of namespace
``perfkernels`` and registers their CPU kernels on PyTorch's stable C ABI when it is loaded, so
the ops run without Python: from ``torch.compile``'s and ``torch.export``'s graphs, from an
AOTInductor package or a TorchScript model loaded by a C++ program (docs/deployment.md).  It links
no torch library and not libpython: one build serves every torch from 2.10 on.

Python adds what only tracing and training need (fake kernels and autograd formulas, in the
modules that use each op) and keeps the library's kernels on the ISA level of the rest of the
package (:func:`perfkernels.use_isa`).
"""
from __future__ import annotations

import ctypes
import importlib.machinery
import os

import torch

from perfkernels import _dispatch

_HERE = os.path.dirname(os.path.abspath(__file__))


def native_library_path() -> str:
    """The path of perfkernels' native torch library (``perfkernels/torch/_native*.so``): what a
    C++ program loads (``dlopen``) to run a model that calls ``torch.ops.perfkernels.*``
    (docs/deployment.md).

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> import os
    >>> os.path.isfile(pkt.native_library_path())
    True
    """
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(_HERE, "_native" + suffix)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"perfkernels' native torch library (_native*.so) is not in {_HERE}: "
                            "reinstall perfkernels (pip install .) or build it in place "
                            "(python setup.py build_ext --inplace)")


def _load() -> ctypes.CDLL:
    path = native_library_path()
    torch.ops.load_library(path)      # runs the library's registration
    lib = ctypes.CDLL(path)           # the same loaded library: its C entry points
    lib.pk_native_status.restype = ctypes.c_char_p
    status = lib.pk_native_status().decode()
    if status:
        raise ImportError(f"perfkernels' native torch ops could not be registered: {status}")
    lib.pk_native_set_isa.argtypes = [ctypes.c_int]
    return lib


_lib = _load()


def _set_isa(level: int) -> None:
    _lib.pk_native_set_isa(level)


_dispatch.register(_set_isa)


def active_level() -> int:
    """The ISA level (index into ``perfkernels._registry.LEVELS``) the native ops run at."""
    return _lib.pk_native_isa()
