"""The modules under PyTorch's graph tools and function transforms.

Our kernels read a tensor's memory from outside torch, which torch's tools cannot see:

* ``torch.jit.trace`` records torch's ops, so a lookup computed outside them would enter the
  graph as a constant; the modules call the registered ops (``torch.ops.perfkernels.*``) while a
  trace is recorded, choosing the op from the tensors alone, so that the
  trace check (which runs again under ``no_grad``) records the same op;
* ``torch.func``'s transforms (``grad``, ``vmap``, ``jacfwd``, ``jacrev``) wrap tensors in
  tensors without memory, and forward-mode AD (``torch.autograd.forward_ad``) carries tangents a
  kernel does not compute: while either is active (:func:`transforming`) the modules run torch's
  own functions, which work or raise as they do on torch's modules;
* ``torch.fx.symbolic_trace`` hands the modules a ``Proxy``: they record one call of a function
  (:func:`fx_call`), which runs on perfkernels' kernels when the traced graph is called;
* ``torch.jit.script`` compiles Python it can read: it compiles a second forward in place of the
  module's (:func:`script_as`), written with torch's functions and the registered ops.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.autograd.forward_ad as _fwad
import torch.nn.functional as F
from torch import Tensor

_functorch_level = torch._C._functorch.maybe_current_level
_tracing_state = torch._C._get_tracing_state
#: torch's own function, kept so that routing (``route_functional``) never reaches ours
_TORCH_EMBEDDING_BAG = F.embedding_bag


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


def fx_embedding_bag(input: Tensor, weight: Tensor, offsets: Optional[Tensor],
                     per_sample_weights: Optional[Tensor], mode: str, sparse: bool,
                     max_norm: Optional[float], norm_type: float, scale_grad_by_freq: bool,
                     include_last_offset: bool, padding_idx: Optional[int],
                     output_dtype: Optional[torch.dtype], weighted_mean: bool,
                     strict_offsets: bool) -> Tensor:
    """What a symbolically traced ``perfkernels.torch.EmbeddingBag`` calls: its forward with
    these options, on our kernels."""
    from . import _bags, _route, _tensor_bags
    from ._route import Route
    if (max_norm is None and not scale_grad_by_freq and not _route.capturing()
            and _fwad._current_level < 0):
        # the plain cases in C, as in the module; None for everything else
        out = _tensor_bags.lookup(weight, input, offsets, per_sample_weights, mode,
                                  include_last_offset, padding_idx, output_dtype, weighted_mean,
                                  sparse, True)
        if out is not None:
            return out
    dtype = output_dtype or weight.dtype
    route = _route.route(weight, input, per_sample_weights, mode=mode, sparse=sparse,
                         max_norm=max_norm, scale_grad_by_freq=scale_grad_by_freq,
                         needs_ours=_bags.needs_ours(None, weighted_mean, mode,
                                                     per_sample_weights),
                         weighted_mean=weighted_mean, output_dtype=output_dtype)
    if route is Route.TORCH:
        return _TORCH_EMBEDDING_BAG(input, weight, offsets, max_norm, norm_type,
                                    scale_grad_by_freq, mode, sparse, per_sample_weights,
                                    include_last_offset, padding_idx)
    spec = _bags.BagSpec(mode, include_last_offset, padding_idx, sparse, None, weighted_mean,
                         strict_offsets)
    if route is Route.TORCH_AUTOGRAD:
        return _bags.torch_answer(input, weight, offsets, per_sample_weights, spec, dtype,
                                  check_offsets=False)
    return _bags.bag_forward(weight, input, offsets, per_sample_weights, spec, output_dtype,
                             route)


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
