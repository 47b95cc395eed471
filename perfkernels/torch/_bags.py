"""Embedding-bag lookups on tensors: the kernel call, its autograd and its ``torch.library`` ops.

Two routes reach the same kernels:

* eager mode calls :func:`lookup` directly (no grad needed) or through :class:`BagFunction`
  (an ``autograd.Function``, which can return torch's sparse COO gradient); a registered custom
  op costs ~10 us a call by itself, more than a small lookup;
* under ``torch.compile`` / ``torch.export`` the modules call the registered ops
  ``perfkernels::embedding_bag`` and ``perfkernels::embedding_bag_quantized``, whose fake
  implementations give the output shape and whose autograd gives a dense gradient (a sparse
  gradient has a data-dependent size and does not trace).

The gradient is written with torch ops (:func:`weight_grad`, :func:`per_sample_weights_grad`), so
both routes share it and it traces.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

import torch
from torch import Tensor

import perfkernels as pk

from . import _compat, _graph, _native_ops, _route, _tensor_bags  # noqa: F401 (_native_ops)
from ._bridge import as_numpy, cuda_call, index_error
from ._double_backward import refuse_double_backward
from ._route import DENSE_GRAD_MIN_VALUES, Route, capturing, torch_autograd_is_faster  # noqa: F401

MODES = ("sum", "mean")
_tracing_state = torch._C._get_tracing_state


def lookup(table: Tensor, indices: Tensor, offsets: Optional[Tensor],
           per_sample_weights: Optional[Tensor], mode: str, include_last_offset: bool,
           padding_idx: Optional[int], bits: int = 0, dim: Optional[int] = None) -> Tensor:
    """One kernel call: float32 ``[num_bags, D]`` bags of ``table`` (float, or packed rows of
    ``bits`` bits when ``bits`` is 8/4/2).  CPU tensors are read in place, CUDA tensors go to
    perfkernels.cuda."""
    if per_sample_weights is not None and per_sample_weights.dtype is not torch.float32:
        per_sample_weights = per_sample_weights.float()
    if _profiler_enabled() and table.device.type == "cpu":
        out = _profiled_lookup(table, indices, offsets, per_sample_weights, mode,
                               include_last_offset, padding_idx, bits, dim)
        if out is not None:
            return out
    kwargs = dict(per_sample_weights=per_sample_weights, mode=mode,
                  include_last_offset=include_last_offset, padding_idx=padding_idx)
    if table.device.type != "cpu":
        if bits:
            return cuda_call("embedding_bag_quantized", table.detach(), indices, offsets,
                             bits=bits, dim=dim, **kwargs)
        return cuda_call("embedding_bag", table.detach(), indices, offsets, **kwargs)
    if per_sample_weights is not None:
        kwargs["per_sample_weights"] = as_numpy(per_sample_weights)
    ix = as_numpy(indices)
    off = None if offsets is None else as_numpy(offsets)
    try:
        if bits:
            out = pk.embedding_bag_quantized(as_numpy(table), ix, off, bits=bits, dim=dim, **kwargs)
        else:
            out = pk.embedding_bag(as_numpy(table), ix, off, **kwargs)
    except IndexError as exc:
        raise index_error(exc) from None
    return torch.from_numpy(out)


_profiler_enabled = torch._C._autograd._profiler_enabled


def _profiled_lookup(table: Tensor, indices: Tensor, offsets: Optional[Tensor],
                     per_sample_weights: Optional[Tensor], mode: str, include_last_offset: bool,
                     padding_idx: Optional[int], bits: int, dim: Optional[int]
                     ) -> Optional[Tensor]:
    """:func:`lookup` while a profiler runs: through the registered op, which the profiler
    records by name (``perfkernels::embedding_bag``, with input shapes under
    ``record_shapes=True``); None where the op refuses the arguments (the caller's route then
    answers, with its own exception)."""
    try:
        if bits:
            if dim is None:
                return None
            return torch.ops.perfkernels.embedding_bag_quantized(
                table.detach(), indices, offsets, per_sample_weights, mode, include_last_offset,
                padding_idx, bits, dim)
        return torch.ops.perfkernels.embedding_bag(table.detach(), indices, offsets,
                                                   per_sample_weights, mode,
                                                   include_last_offset, padding_idx)
    except RuntimeError:
        return None


# --------------------------------------------------------------------------- gradient formulas

def bag_of_entries(indices: Tensor, offsets: Optional[Tensor], include_last_offset: bool
                   ) -> tuple[Tensor, int]:
    """The bag number of every (flattened) index entry, and the number of bags."""
    n = indices.numel()
    if indices.dim() == 2:
        num_bags, length = indices.shape
        return torch.arange(num_bags, device=indices.device).repeat_interleave(length), num_bags
    num_bags = offsets.numel() - 1 if include_last_offset else offsets.numel()
    # A 1 where each bag (after the first) starts, then a running sum: O(n), unlike
    # repeat_interleave on CPU; empty bags add several marks at one place, trailing ones land on
    # the extra last slot.
    marks = torch.zeros(n + 1, dtype=torch.int64, device=indices.device)
    starts = offsets[1:num_bags].long()
    marks.index_add_(0, starts, torch.ones_like(starts))
    bag = marks[:n].cumsum(0)
    return bag, num_bags


def entry_scales(indices: Tensor, bag: Tensor, num_bags: int, mode: str,
                 padding_idx: Optional[int], rows: int) -> Optional[Tensor]:
    """Per entry: 0 for padding entries, 1 / count for mode "mean" (count = the bag's non-padding
    entries), else 1; None when every factor is 1."""
    scale = None
    if padding_idx is not None:
        scale = (indices.reshape(-1) != padding_idx % rows).float()
    if mode == "mean":
        counted = (scale if scale is not None
                   else torch.ones(bag.shape[0], dtype=torch.float32, device=bag.device))
        count = torch.zeros(num_bags, dtype=torch.float32, device=bag.device).index_add_(
            0, bag, counted)
        inv = (1.0 / count.clamp(min=1.0)).index_select(0, bag)
        scale = inv if scale is None else scale * inv
    return scale


@dataclass
class BagBackward:
    """What the weight gradient of one lookup depends on (handed to a custom weight backward):
    the bags' upstream gradient and the lookup's arguments.  :attr:`entry_grads` (one gradient
    row per entry) is computed on first use only, so a weight backward that works from the bags
    themselves (a fused optimizer) never materialises it.

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> b = pkt.BagBackward(torch.ones(1, 2), torch.tensor([0, 3]), torch.tensor([0]), None,
    ...                     "mean", False, None, 4, torch.float32)
    >>> b.entry_grads          # mean of 2 entries: each entry's row gets half the bag's gradient
    tensor([[0.5000, 0.5000],
            [0.5000, 0.5000]])
    """
    grad_output: Tensor            # [num_bags, D], the gradient of the bags
    indices: Tensor                # the lookup's indices (1-D, or 2-D [B, L]), int32 or int64
    offsets: Optional[Tensor]
    per_sample_weights: Optional[Tensor]
    mode: str
    include_last_offset: bool
    padding_idx: Optional[int]
    rows: int
    dtype: torch.dtype             # the table's dtype
    weight_node: Any = None        # the autograd node taking the table's gradient (if known)

    @functools.cached_property
    def entry_grads(self) -> Tensor:
        """[n, D] float32: the gradient of each entry's row."""
        return entry_gradients(self.grad_output, self.indices, self.offsets,
                               self.per_sample_weights, self.mode, self.include_last_offset,
                               self.padding_idx, self.rows)


def entry_gradients(grad_output: Tensor, indices: Tensor, offsets: Optional[Tensor],
                    per_sample_weights: Optional[Tensor], mode: str, include_last_offset: bool,
                    padding_idx: Optional[int], rows: int) -> Tensor:
    """d loss / d weight[indices[j]] for every entry j: ``scale_j * w_j * grad_output[bag(j)]``
    in float32 (padding entries give zero rows)."""
    bag, num_bags = bag_of_entries(indices, offsets, include_last_offset)
    g = grad_output.float().index_select(0, bag)
    scale = entry_scales(indices, bag, num_bags, mode, padding_idx, rows)
    if per_sample_weights is not None:
        psw = per_sample_weights.reshape(-1).float()
        scale = psw if scale is None else scale * psw
    return g if scale is None else g * scale.unsqueeze(1)


def dense_weight_grad(b: BagBackward) -> Tensor:
    """torch's dense EmbeddingBag gradient: entry rows summed into a zero table (float32, then
    the table's dtype)."""
    d = b.entry_grads.shape[1]
    g = torch.zeros(b.rows, d, dtype=torch.float32, device=b.entry_grads.device)
    g.index_add_(0, b.indices.reshape(-1), b.entry_grads)
    return g.to(b.dtype)


def sparse_weight_grad(b: BagBackward, padding_idx: Optional[int]) -> Tensor:
    """torch's ``sparse=True`` gradient: an uncoalesced COO tensor, one row per non-padding entry
    in entry order."""
    ix = b.indices.reshape(-1).long()
    values = b.entry_grads
    if padding_idx is not None:
        keep = ix != padding_idx % b.rows
        ix, values = ix[keep], values[keep]
    return torch.sparse_coo_tensor(ix.unsqueeze(0), values.to(b.dtype),
                                   (b.rows, values.shape[1]), is_coalesced=False,
                                   check_invariants=False)


def per_sample_weights_grad(grad_output: Tensor, weight: Tensor, indices: Tensor,
                            offsets: Optional[Tensor], mode: str, include_last_offset: bool,
                            padding_idx: Optional[int], dtype: torch.dtype) -> Tensor:
    """d loss / d w_j = scale_j * <grad_output[bag(j)], weight[indices[j]]>."""
    bag, num_bags = bag_of_entries(indices, offsets, include_last_offset)
    rows = weight.shape[0]
    flat = indices.reshape(-1)
    dots = (grad_output.float().index_select(0, bag)
            * weight.detach().index_select(0, flat.long()).float()).sum(1)
    scale = entry_scales(indices, bag, num_bags, mode, padding_idx, rows)
    if scale is not None:
        dots = dots * scale
    return refuse_double_backward(dots.reshape(indices.shape).to(dtype), weight)


# --------------------------------------------------------------------------- eager autograd

#: A replacement for the weight gradient: receives the :class:`BagBackward` of a lookup and
#: returns the weight's gradient, or None when it has consumed it (a fused optimizer that updates
#: the table during backward).
WeightBackward = Callable[[BagBackward], Optional[Tensor]]


class BagSpec(NamedTuple):
    """The options of one lookup that are not tensors."""
    mode: str
    include_last_offset: bool
    padding_idx: Optional[int]
    sparse: bool = False
    weight_backward: Optional[WeightBackward] = None
    #: our opt-in: per_sample_weights with mode "mean" (torch refuses them)
    weighted_mean: bool = False
    #: our opt-in: the NumPy API's stricter bag checks and its exceptions, not torch's
    strict_offsets: bool = False


class BagFunction(torch.autograd.Function):
    """Eager lookup with autograd: torch's dense or sparse COO weight gradient, the gradient of
    ``per_sample_weights``, or a custom :data:`WeightBackward`."""

    @staticmethod
    def forward(ctx, weight: Tensor, per_sample_weights: Optional[Tensor], indices: Tensor,
                offsets: Optional[Tensor], spec: BagSpec) -> Tensor:
        out = lookup(weight, indices, offsets, per_sample_weights, spec.mode,
                     spec.include_last_offset, spec.padding_idx)
        psw_grad = per_sample_weights is not None and ctx.needs_input_grad[1]
        ctx.save_for_backward(weight if psw_grad else None, per_sample_weights, indices, offsets)
        ctx.spec = spec
        ctx.rows, ctx.dtype = weight.shape[0], weight.dtype
        return out

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        weight, psw, indices, offsets = ctx.saved_tensors
        spec: BagSpec = ctx.spec
        grad_weight = grad_psw = None
        if ctx.needs_input_grad[1]:
            # first: a weight backward may update the table in place (fused optimizer)
            grad_psw = per_sample_weights_grad(grad_output, weight, indices, offsets, spec.mode,
                                               spec.include_last_offset, spec.padding_idx,
                                               psw.dtype)
        if ctx.needs_input_grad[0]:
            b = BagBackward(grad_output, indices, offsets, psw, spec.mode,
                            spec.include_last_offset, spec.padding_idx, ctx.rows, ctx.dtype,
                            ctx.next_functions[0][0])
            if spec.weight_backward is not None:
                grad_weight = spec.weight_backward(b)
            elif spec.sparse:
                grad_weight = sparse_weight_grad(b, spec.padding_idx)
            else:
                grad_weight = dense_weight_grad(b)
        return grad_weight, grad_psw, None, None, None


class WeightBackwardBag(torch.autograd.Function):
    """:class:`BagFunction` for the one case a training loop repeats: a float32 CPU table whose
    weight gradient a custom weight backward (a fused optimizer) consumes, no
    ``per_sample_weights``.  The module's cached view of the table, nothing saved but the
    indices and offsets, and no per-call options object: a small-batch step pays several such
    lookups per model (:func:`weight_backward_lookup`)."""

    @staticmethod
    def forward(ctx, weight: Tensor, indices: Tensor, offsets: Optional[Tensor], module: Any,
                table: Any) -> Tensor:
        try:
            # (integer tensors: Tensor.numpy() refuses a negative view with a RuntimeError, and
            # the caller then takes the full route)
            out = pk.embedding_bag(table, indices.numpy(),
                                   None if offsets is None else offsets.numpy(),
                                   mode=module.mode, include_last_offset=module.include_last_offset,
                                   padding_idx=module.padding_idx)
        except IndexError as exc:
            raise index_error(exc) from None
        ctx.save_for_backward(indices, offsets)
        ctx.module = module
        ctx.rows = weight.shape[0]
        return torch.from_numpy(out)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        indices, offsets = ctx.saved_tensors
        m = ctx.module
        b = BagBackward(grad_output, indices, offsets, None, m.mode, m.include_last_offset,
                        m.padding_idx, ctx.rows, torch.float32, ctx.next_functions[0][0])
        grad = m.weight_backward(b)
        return grad, None, None, None, None


def weight_backward_lookup(module: Any, input: Tensor, offsets: Optional[Tensor]
                           ) -> Optional[Tensor]:
    """An EmbeddingBag module's lookup through :class:`WeightBackwardBag` where it gives what the
    full route gives (float32 CPU table requiring grad under grad mode, a custom weight
    backward, no ``per_sample_weights``, sum or mean, none of torch's other options, no graph
    capture, transform or profiler: the caller has checked capture and forward-mode AD); None
    for everything else, and wherever the NumPy API refuses the arguments (the full route then
    answers, torch's answer or its exception)."""
    w = module._parameters.get("weight")
    if (w is None or not w.requires_grad or not torch.is_grad_enabled()
            or type(input) is not Tensor or w.dtype is not torch.float32
            or (offsets is not None and type(offsets) is not Tensor)
            or w.device.type != "cpu" or module.mode not in MODES or module.max_norm is not None
            or module.scale_grad_by_freq or module.output_dtype not in (None, torch.float32)
            or module.weighted_mean or _compat.input_refused(input) or _profiler_enabled()
            or _graph.transforming()):
        return None
    table = module._table_array(w)
    if table is None:
        return None
    try:
        # torch.autograd.Function.apply's C half: its Python half only binds default arguments
        # (none here) and unwraps functorch tensors, and no functorch transform is active
        return _apply_weight_backward_bag(w, input, offsets, module, table)
    except (ValueError, TypeError, RuntimeError):
        return None


_apply_weight_backward_bag = torch._C._FunctionBase.__dict__["apply"].__get__(None,
                                                                            WeightBackwardBag)


# --------------------------------------------------------------------------- registered ops
# ``perfkernels::embedding_bag`` and ``perfkernels::embedding_bag_quantized`` are defined, with
# their CPU kernels, by the native library (``_native_ops``); here: their fake kernels (tracing),
# the float op's autograd (a dense gradient, written with torch ops so that it traces), and CUDA
# kernels (perfkernels.cuda, from Python).

def _embedding_bag_cuda(weight: Tensor, indices: Tensor, offsets: Optional[Tensor],
                        per_sample_weights: Optional[Tensor], mode: str,
                        include_last_offset: bool, padding_idx: Optional[int]) -> Tensor:
    return lookup(weight, indices, offsets, per_sample_weights, mode, include_last_offset,
                  padding_idx)


def _num_bags(indices: Tensor, offsets: Optional[Tensor], include_last_offset: bool):
    if indices.dim() == 2:
        return indices.shape[0]
    torch._check(offsets is not None, lambda: "1-D indices need offsets")
    return offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]


def _embedding_bag_fake(weight, indices, offsets, per_sample_weights, mode, include_last_offset,
                        padding_idx):
    return weight.new_empty((_num_bags(indices, offsets, include_last_offset), weight.shape[1]),
                            dtype=torch.float32)


def _embedding_bag_setup(ctx, inputs, output):
    weight, indices, offsets, psw, mode, include_last_offset, padding_idx = inputs
    ctx.save_for_backward(weight, indices, offsets, psw)
    ctx.options = (mode, include_last_offset, padding_idx)


def _embedding_bag_backward(ctx, grad_output):
    weight, indices, offsets, psw = ctx.saved_tensors
    mode, include_last_offset, padding_idx = ctx.options
    grad_weight = grad_psw = None
    if ctx.needs_input_grad[0]:
        grad_weight = dense_weight_grad(BagBackward(
            grad_output, indices, offsets, psw, mode, include_last_offset, padding_idx,
            weight.shape[0], weight.dtype))
    if ctx.needs_input_grad[3]:
        grad_psw = per_sample_weights_grad(grad_output, weight, indices, offsets, mode,
                                           include_last_offset, padding_idx, psw.dtype)
    return grad_weight, None, None, grad_psw, None, None, None


def _embedding_bag_quantized_cuda(packed: Tensor, indices: Tensor, offsets: Optional[Tensor],
                                  per_sample_weights: Optional[Tensor], mode: str,
                                  include_last_offset: bool, padding_idx: Optional[int],
                                  bits: int, dim: int) -> Tensor:
    return lookup(packed, indices, offsets, per_sample_weights, mode, include_last_offset,
                  padding_idx, bits, dim)


def _embedding_bag_quantized_fake(packed, indices, offsets, per_sample_weights, mode,
                                  include_last_offset, padding_idx, bits, dim):
    return packed.new_empty((_num_bags(indices, offsets, include_last_offset), dim),
                            dtype=torch.float32)


torch.library.register_fake("perfkernels::embedding_bag")(_embedding_bag_fake)
torch.library.register_fake("perfkernels::embedding_bag_inference")(_embedding_bag_fake)
torch.library.register_kernel("perfkernels::embedding_bag_inference", "cuda")(_embedding_bag_cuda)
torch.library.register_autograd("perfkernels::embedding_bag", _embedding_bag_backward,
                                setup_context=_embedding_bag_setup)
torch.library.register_kernel("perfkernels::embedding_bag", "cuda")(_embedding_bag_cuda)
torch.library.register_fake("perfkernels::embedding_bag_quantized")(
    _embedding_bag_quantized_fake)
torch.library.register_kernel("perfkernels::embedding_bag_quantized", "cuda")(
    _embedding_bag_quantized_cuda)


# --------------------------------------------------------------------------- one entry point

def records_grad(*tensors: Optional[Tensor]) -> bool:
    """Whether a call on these tensors records a gradient: graphs that record none call the
    ``*_inference`` twin of an op (the same native kernel without an autograd kernel, which in
    Python costs several microseconds a call even under ``no_grad``)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def bag_forward(weight: Tensor, input: Tensor, offsets: Optional[Tensor],
                per_sample_weights: Optional[Tensor], spec: BagSpec,
                output_dtype: Optional[torch.dtype] = None,
                route: Optional[Route] = None) -> Tensor:
    """A float-table lookup by our kernel on ``route`` (:func:`_route.route`'s decision; asked
    here, with our autograd for any gradient, when None), with torch's answer wherever the NumPy
    API would answer differently (see ``_compat``)."""
    dtype = output_dtype or weight.dtype
    if route is None:
        route = _route.route(weight, input, per_sample_weights, mode=spec.mode, sparse=spec.sparse,
                             needs_ours=True, weighted_mean=spec.weighted_mean,
                             output_dtype=output_dtype)
    if route is Route.DEVICE or route is Route.REFUSED or route is Route.TORCH:
        return torch_answer(input, weight, offsets, per_sample_weights, spec, dtype)
    if route is Route.OP:
        # (torch.jit.trace: chosen without the grad mode, which its check changes)
        grad = (records_grad(weight, per_sample_weights) if _tracing_state() is None
                else _graph.records_grad_traced(weight, per_sample_weights))
        op = (torch.ops.perfkernels.embedding_bag if grad
              else torch.ops.perfkernels.embedding_bag_inference)
        out = op(weight, input, offsets, per_sample_weights, spec.mode, spec.include_last_offset,
                 spec.padding_idx)
        return out if dtype is torch.float32 else out.to(dtype)
    if route is not Route.OUR_AUTOGRAD and route is not Route.KERNEL and route is not Route.CUDA:
        raise AssertionError(f"bag_forward cannot take the route {route.value!r}")
    if _graph.transforming():
        # torch.func / forward-mode AD: torch's function works or raises as on torch's module
        return torch_answer(input, weight, offsets, per_sample_weights, spec, dtype,
                            check_offsets=False)
    try:
        if route is Route.OUR_AUTOGRAD:
            out = BagFunction.apply(weight, per_sample_weights, input, offsets, spec)
        else:
            out = lookup(weight, input, offsets, per_sample_weights, spec.mode,
                         spec.include_last_offset, spec.padding_idx)
    except IndexError:
        raise
    except (ValueError, TypeError):
        if spec.strict_offsets:
            raise
        out = torch_answer(input, weight, offsets, per_sample_weights, spec, dtype)
        if spec.weight_backward is not None and out.requires_grad:
            raise ValueError("a custom weight backward (a fused optimizer) needs offsets where "
                             "every bag ends at the next offset, the last at the end of the "
                             "input") from None
        return out
    return out if dtype is torch.float32 else out.to(dtype)


_tensor_bags.set_dense_grad_min_values(DENSE_GRAD_MIN_VALUES)


def needs_ours(weight_backward: Optional[WeightBackward], weighted_mean: bool, mode: str,
               per_sample_weights: Optional[Tensor]) -> bool:
    """Whether a lookup with a gradient needs our autograd: a custom weight backward (a fused
    optimizer), or weights in mode "mean" (our opt-in; torch refuses them)."""
    return weight_backward is not None or (
        weighted_mean and mode == "mean" and per_sample_weights is not None)


def torch_answer(input: Tensor, weight: Tensor, offsets: Optional[Tensor],
                 per_sample_weights: Optional[Tensor], spec: BagSpec,
                 dtype: torch.dtype, check_offsets: bool = True) -> Tensor:
    """torch's result or exception for a lookup (see :func:`_compat.torch_verdict`)."""
    return _compat.torch_verdict(input, weight, offsets, per_sample_weights, spec.mode,
                                 spec.sparse, spec.include_last_offset, spec.padding_idx, dtype,
                                 spec.weighted_mean, check_offsets)
