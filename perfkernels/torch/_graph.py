"""The modules under PyTorch's graph tools and function transforms.

Our kernels read a tensor's memory from outside torch, which torch's tools cannot see:

* ``torch.jit.trace`` records torch's ops, so a lookup computed outside them would enter the
  graph as a constant; the modules call the registered ops (``torch.ops.perfkernels.*``) while a
  trace is recorded, choosing the op from the tensors alone, so that the trace check (which runs
  again under ``no_grad``) records the same op;
* ``torch.func``'s transforms (``grad``, ``vmap``, ``jacfwd``, ``jacrev``) wrap tensors in
  tensors without memory, and forward-mode AD (``torch.autograd.forward_ad``) carries tangents a
  kernel does not compute: while either is active (:func:`transforming`) the modules run torch's
  own functions, which work or raise as they do on torch's modules;
* ``torch.fx.symbolic_trace`` hands the modules a ``Proxy``: they record one call of a function
  (:func:`fx_call`; for ``EmbeddingBag``, ``_embedding_bag.fx_embedding_bag``), which runs on
  perfkernels' kernels when the traced graph is called;
* ``torch.jit.script`` compiles Python it can read: it compiles a second forward in place of the
  module's (:func:`script_as`), written with torch's functions and the registered ops.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.autograd.forward_ad as _fwad
from torch import Tensor

_functorch_level = torch._C._functorch.maybe_current_level
_tracing_state = torch._C._get_tracing_state


def transforming() -> bool:
    """Whether a ``torch.func`` transform or forward-mode AD is active: lookups then run torch's
    functions (tensors may have no memory, or carry tangents)."""
    return _fwad._current_level >= 0 or _functorch_level() is not None


def records_grad_traced(*tensors: Optional[Tensor]) -> bool:
    """Under ``torch.jit.trace``: whether the graph calls the op with autograd (a tensor that
    requires a gradient), decided without the grad mode, which the trace check changes."""
    return any(t is not None and t.requires_grad for t in tensors)


# --------------------------------------------------------------------------- torch.fx

def is_proxy(x: Any) -> bool:
    """Whether ``x`` is a ``torch.fx.Proxy`` (symbolic tracing)."""
    return isinstance(x, torch.fx.Proxy)


def fx_call(module: torch.nn.Module, fn: Callable, args: tuple, proxy: torch.fx.Proxy
            ) -> torch.fx.Proxy:
    """Record ``fn(*args)`` in ``proxy``'s graph (the module's tables enter it as attributes);
    a module whose backward updates its table (a fused optimizer) cannot be recorded so."""
    if getattr(module, "weight_backward", None) is not None or getattr(
            module, "fused_optimizer", None) is not None:
        raise torch.fx.proxy.TraceError(
            f"{type(module).__name__} with a fused optimizer cannot be traced symbolically: "
            "its backward updates the table in place, which a traced function call does not "
            "record (set_fused_optimizer(None) first)")
    return proxy.tracer.create_proxy("call_function", fn, args, {})


# --------------------------------------------------------------------------- torch.jit.script

def script_as(script_forward: Callable) -> Callable[[Callable], Callable]:
    """Decorate a module's ``forward`` so that ``torch.jit.script`` compiles ``script_forward``
    (same signature, TorchScript-compatible: torch's functions or the registered ops) in its
    place, while Python calls run the decorated function unchanged (no wrapper, no cost).

    TorchScript reads a method's source through :func:`inspect.getsourcelines`, which follows
    ``__wrapped__``; the two functions must keep the same parameters and annotations, which
    :func:`inspect.signature` then reports for both."""
    def decorate(forward: Callable) -> Callable:
        forward.__wrapped__ = script_forward
        return forward
    return decorate


def refuse_collection_script(module: torch.nn.Module) -> torch.nn.Module:
    """``__prepare_scriptable__`` of perfkernels' collections: a clear refusal instead of
    TorchScript's error on a type deep inside (their forward takes either KeyedJaggedTensor
    class, and the key bookkeeping is Python)."""
    name = type(module).__name__
    raise RuntimeError(
        f"perfkernels.torch.{name} cannot be compiled by torch.jit.script: its forward runs "
        f"Python over a KeyedJaggedTensor. Script TorchRec's {name} instead (convert() it: its "
        "tables become perfkernels' and the converted collection scripts), or capture this one "
        "with torch.export, torch.compile or torch.jit.trace")


def refuse_fused_script(module: torch.nn.Module) -> torch.nn.Module:
    """``__prepare_scriptable__`` of the modules: the module itself (scripted as it is), unless
    a fused optimizer updates its table during backward, which the scripted forward (torch's
    function or the registered op) would silently drop."""
    if getattr(module, "fused_optimizer", None) is not None:
        raise RuntimeError(
            f"{type(module).__name__} with a fused optimizer cannot be scripted: its backward "
            "updates the table in place, which TorchScript does not run "
            "(set_fused_optimizer(None) first)")
    return module
