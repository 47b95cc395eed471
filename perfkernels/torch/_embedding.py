"""perfkernels.torch.Embedding: torch.nn.Embedding (unpooled lookups) on perfkernels' kernels, and
the functional ``embedding`` that :func:`~perfkernels.torch.route_functional` puts in place of
``torch.nn.functional.embedding``."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.autograd.forward_ad as _fwad
import torch.nn.functional as F
from torch import Tensor

import perfkernels as pk

from . import _bags, _fused, _graph, _placement, _tensor_bags
from ._bridge import TableViewCache, as_numpy
from ._fallback import warn_once

_module_lookup = _tensor_bags.embedding_module_lookup
_is_compiling = torch.compiler.is_compiling
_tracing_state = torch._C._get_tracing_state
_functorch_level = torch._C._functorch.maybe_current_level

#: torch's own function, kept so that routing (and our fallbacks) never call ourselves
_TORCH_EMBEDDING = F.embedding
_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INDEX_DTYPES = (torch.int64, torch.int32)
#: torch's message for an index out of [0, rows) (an IndexError, as torch raises it)
TORCH_INDEX_MESSAGE = "index out of range in self"


def _reason(max_norm: Optional[float], scale_grad_by_freq: bool, dtype: torch.dtype
            ) -> Optional[str]:
    """Why an Embedding with these options runs torch's implementation (None: ours)."""
    if max_norm is not None:
        return "max_norm renormalises rows in place during lookup, which perfkernels does not do"
    if scale_grad_by_freq:
        return "scale_grad_by_freq is not implemented by perfkernels"
    if dtype not in _KERNEL_DTYPES:
        return f"weight dtype {dtype} is not float32, float16 or bfloat16"
    return None


def _as_tensor(result: np.ndarray, dtype: torch.dtype) -> Tensor:
    if dtype is torch.bfloat16:
        return torch.from_numpy(result.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(result)


def _plain(input, weight) -> bool:
    """Whether a lookup is one our kernel answers exactly as torch: plain CPU tensors (no
    subclass, no torch function mode, no forward-mode AD level, no ``torch.func`` transform),
    int32/int64 indices, a 2-D float table with unit-stride rows of our dtypes.  Anything else
    goes to torch's function (its result or its exception)."""
    return (type(input) is Tensor and input.dtype in _INDEX_DTYPES and input.device.type == "cpu"
            and (type(weight) is torch.nn.Parameter or type(weight) is Tensor)
            and weight.device.type == "cpu" and weight.dtype in _KERNEL_DTYPES
            and weight.dim() == 2 and (weight.stride(1) == 1 or weight.shape[1] <= 1)
            and weight.stride(0) >= 0 and not weight.is_neg()
            and not torch._C._is_torch_function_mode_enabled()
            and _fwad._current_level < 0    # forward-mode AD (dual tensors): torch's function
            and _functorch_level() is None)  # torch.func (tensors without memory): torch's


def _numpy_lookup(table: np.ndarray, input: Tensor, dtype: torch.dtype) -> Tensor:
    """Our kernel on a NumPy view of the table; torch's IndexError for a bad index."""
    try:
        out = pk.embedding(table, input.numpy())
    except IndexError:
        raise IndexError(TORCH_INDEX_MESSAGE) from None
    return _as_tensor(out, dtype)


def lookup(weight: Tensor, input: Tensor) -> Tensor:
    """``weight[input]`` by our kernel (a plain CPU lookup, see :func:`_plain`), no autograd."""
    return _numpy_lookup(as_numpy(weight), input, weight.dtype)


class EmbeddingFunction(torch.autograd.Function):
    """Our lookup with torch's gradient: the weight gradient is torch's own
    ``aten::embedding_backward`` (dense, or sparse COO with ``sparse=True``; ``padding_idx`` rows
    get none), or a fused optimizer's in-place update (no gradient returned)."""

    @staticmethod
    def forward(ctx, weight: Tensor, input: Tensor, padding_idx: int, sparse: bool,
                module: Optional["Embedding"], table: Optional[np.ndarray]) -> Tensor:
        out = (_numpy_lookup(table, input, weight.dtype) if table is not None
               else lookup(weight, input))
        ctx.save_for_backward(input)
        ctx.options = (weight.shape[0], padding_idx, sparse, module, weight.dtype)
        return out

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        (input,) = ctx.saved_tensors
        rows, padding_idx, sparse, module, dtype = ctx.options
        grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_weight = weight_gradient(module, grad_output, input, rows, padding_idx, sparse,
                                          dtype, ctx.next_functions[0][0])
        return grad_weight, None, None, None, None, None


def weight_gradient(module: Optional["Embedding"], grad_output: Tensor, input: Tensor, rows: int,
                    padding_idx: int, sparse: bool, dtype: torch.dtype,
                    node: Optional[object] = None) -> Optional[Tensor]:
    """The table's gradient of the lookup ``weight[input]`` by the module's rule: its fused
    optimizer's in-place step (each index a bag of one; None returned), else torch's own
    ``aten::embedding_backward`` (dense, or sparse COO; ``padding_idx`` rows get none).
    ``node``: the autograd node that takes the table's gradient, if known."""
    if module is not None and getattr(module, "fused_optimizer", None) is not None:
        n = input.numel()
        b = _bags.BagBackward(grad_output.reshape(n, -1), input.reshape(n, 1), None, None,
                              "sum", False, None if padding_idx < 0 else padding_idx,
                              rows, dtype, node)
        module.fused_optimizer.update(module.weight, module._buffers, b)
        return None
    return torch.ops.aten.embedding_backward(grad_output, input, rows, padding_idx, False, sparse)


# --------------------------------------------------------------------------- the registered op

# Defined, with its CPU kernel, by perfkernels' native library (native/ops.cpp, loaded by _bags):
# compiled and exported graphs call it without Python.  Registered here: its fake, its autograd
# and its CUDA kernel (torch's own lookup).
#: weight[indices] (float32 / float16 / bfloat16 rows), shape indices.shape + (D,)
embedding_op = torch.ops.perfkernels.embedding.default
#: the same without autograd, for graphs that record no gradient
embedding_inference_op = torch.ops.perfkernels.embedding_inference.default


@torch.library.register_kernel("perfkernels::embedding_inference", "cuda")
@torch.library.register_kernel("perfkernels::embedding", "cuda")
def _embedding_cuda(weight: Tensor, indices: Tensor, padding_idx: int) -> Tensor:
    return torch.embedding(weight, indices, padding_idx)


@torch.library.register_fake("perfkernels::embedding_inference")
@torch.library.register_fake("perfkernels::embedding")
def _embedding_fake(weight, indices, padding_idx):
    return weight.new_empty((*indices.shape, weight.shape[1]))


def _embedding_setup(ctx, inputs, output):
    weight, indices, padding_idx = inputs
    ctx.save_for_backward(indices)
    ctx.options = (weight.shape[0], padding_idx)


def _embedding_backward(ctx, grad_output):
    (indices,) = ctx.saved_tensors
    rows, padding_idx = ctx.options
    grad_weight = None
    if ctx.needs_input_grad[0]:
        grad_weight = torch.ops.aten.embedding_dense_backward(grad_output, indices, rows,
                                                              padding_idx, False)
    return grad_weight, None, None


torch.library.register_autograd("perfkernels::embedding", _embedding_backward,
                                setup_context=_embedding_setup)


# --------------------------------------------------------------------------- the functional

def _normalised_padding(padding_idx: Optional[int], rows: int) -> int:
    """F.embedding's handling of padding_idx: its assertions, then -1 for none."""
    if padding_idx is None:
        return -1
    if padding_idx > 0:
        assert padding_idx < rows, "Padding_idx must be within num_embeddings"
    elif padding_idx < 0:
        assert padding_idx >= -rows, "Padding_idx must be within num_embeddings"
        padding_idx = rows + padding_idx
    return padding_idx


def embedding(input: Tensor, weight: Tensor, padding_idx: Optional[int] = None,
              max_norm: Optional[float] = None, norm_type: float = 2.0,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
    """``torch.nn.functional.embedding`` on perfkernels' kernel: the same signature, and torch's
    result or exception for every input.  Plain CPU lookups (int32/int64 indices of any shape, a
    float32/float16/bfloat16 table) run our kernel, with torch's gradient (dense, or sparse COO
    with ``sparse=True``); ``max_norm`` and ``scale_grad_by_freq`` run torch's function, with a
    one-time warning; anything else (other dtypes and devices, tensor subclasses, a torch
    function mode, compiling) is torch's function, which answers or raises as it does.

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> weight = torch.arange(6.0).view(3, 2)
    >>> pkt.embedding(torch.tensor([2, 0]), weight)
    tensor([[4., 5.],
            [0., 1.]])
    """
    if (max_norm is not None or scale_grad_by_freq) and isinstance(weight, Tensor):
        warn_once(_reason(max_norm, scale_grad_by_freq, weight.dtype))
    elif (not torch.compiler.is_compiling() and _tracing_state() is None
          and (padding_idx is None or type(padding_idx) is int) and _plain(input, weight)):
        pad = _normalised_padding(padding_idx, weight.shape[0])
        if torch.is_grad_enabled() and weight.requires_grad:
            return EmbeddingFunction.apply(weight, input, pad, sparse, None, None)
        return lookup(weight, input)
    return _TORCH_EMBEDDING(input, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq,
                            sparse)


# --------------------------------------------------------------------------- the module

class Embedding(TableViewCache, torch.nn.Embedding):
    """Drop-in replacement for :class:`torch.nn.Embedding` (a subclass of it).

    The constructor, :meth:`forward`, ``from_pretrained``, ``state_dict`` and attributes are
    torch's, so checkpoints load unchanged and ``isinstance(m, torch.nn.Embedding)`` holds.
    Lookups of float32 / float16 / bfloat16 CPU tables with int32 / int64 indices of any shape
    run perfkernels' kernel (:func:`perfkernels.embedding`); the weight gradient is torch's own
    (``aten::embedding_backward``: dense, or with ``sparse=True`` the same uncoalesced COO
    gradient; ``padding_idx`` rows get none), so torch optimizers work unchanged.  Under
    ``torch.compile`` / ``torch.export`` the lookup is the registered op ``perfkernels::embedding``
    and the gradient dense.

    ``max_norm`` and ``scale_grad_by_freq`` (and other weight dtypes) run torch's implementation,
    with a one-time warning.  Every other input torch's function would refuse (indices of another
    dtype, a bad ``padding_idx``, tensors on other devices, subclasses) goes to torch's function,
    which raises its own exception; an out-of-range index raises torch's
    ``IndexError: index out of range in self``.

    ``fused_optimizer=("rowwise_adagrad", {"lr": 0.01})`` (or ``"adagrad"``, ``"sgd"``; also
    :meth:`set_fused_optimizer`) makes backward update the table in place, each index treated
    as a bag of one (:func:`perfkernels.embedding_bag_backward_update`), instead of returning a
    gradient: ``weight.grad`` stays None, the state is the buffer ``momentum1``.

    ``placement=`` (``"auto"`` by default, ``"hugepage"``, ``"keep"``) moves the weight's storage
    into memory placed for gathers, as :class:`~perfkernels.torch.EmbeddingBag` does.

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> emb = pkt.Embedding(10, 3)
    >>> rows = emb(torch.tensor([[1, 2], [3, 4]]))
    >>> rows.shape, torch.equal(rows[1, 0], emb.weight[3])
    (torch.Size([2, 2, 3]), True)
    """

    #: the optimizer that updates the table during backward, if any
    fused_optimizer: Optional[_fused.FusedOptimizer] = None
    #: replacement for the weight gradient used by the fused optimizer (None: torch's gradient)
    weight_backward = None

    def __init__(self, *args, fused_optimizer: Optional[_fused.FusedOptimizerSpec] = None,
                 placement: str = "auto", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # (a `_weight` in shared memory or in memory torch did not allocate stays: torch's module
        # shares it)
        _placement.place_tensor_attr(self, "weight", placement, keep_shared=False)
        if fused_optimizer is not None:
            self.set_fused_optimizer(fused_optimizer)

    @classmethod
    def from_torch(cls, module: torch.nn.Embedding) -> "Embedding":
        """Ours in place of ``module``: its attributes, hooks and weight Parameter (no copy)."""
        new = cls.__new__(cls)
        for key, value in module.__dict__.items():
            if key == "_np_view":
                continue
            # the hook dicts themselves, so that the handles torch gave out keep working
            new.__dict__[key] = (value.copy() if isinstance(value, dict) and "hook" not in key
                                 else value)
        return new

    def set_fused_optimizer(self, spec: Optional[_fused.FusedOptimizerSpec]) -> None:
        """Update the table during backward with ``spec`` = ``(name, {"lr": ..., ...})`` (see
        :class:`~perfkernels.torch.FusedOptimizer`); None returns to ordinary gradients."""
        _fused.enable(self, spec)

    def _fused_weight_backward(self, b) -> None:
        self.fused_optimizer.update(self.weight, self._buffers, b)
        return None

    def _script_forward(self, input: Tensor) -> Tensor:
        # What torch.jit.script compiles for forward (see _graph.script_as): torch's function.
        return F.embedding(input, self.weight, self.padding_idx, self.max_norm, self.norm_type,
                           self.scale_grad_by_freq, self.sparse)

    def __prepare_scriptable__(self):
        return _graph.refuse_fused_script(self)

    @_graph.script_as(_script_forward)
    def forward(self, input: Tensor) -> Tensor:
        """Rows of the table, shape ``input.shape + (embedding_dim,)``, as
        :meth:`torch.nn.Embedding.forward` (torch's result or exception for every input)."""
        # a plain lookup without a gradient in C (None for everything else: the full path below)
        if not _is_compiling() and _tracing_state() is None and _fwad._current_level < 0:
            out = _module_lookup(self, input)
            if out is not None:
                return out
        w = self._parameters.get("weight")
        if w is None:
            w = self.weight
        if self.max_norm is not None or self.scale_grad_by_freq:
            warn_once(_reason(self.max_norm, self.scale_grad_by_freq, w.dtype))
        elif torch.compiler.is_compiling() or _tracing_state() is not None:
            # a graph: the registered op (chosen under torch.jit.trace without the grad mode,
            # which its check changes), or torch's function for a sparse gradient
            grad = (_bags.records_grad(w) if _tracing_state() is None
                    else _graph.records_grad_traced(w))
            if (w.dtype in _KERNEL_DTYPES and input.dtype in _INDEX_DTYPES
                    and not (grad and self.sparse)):
                pad = -1 if self.padding_idx is None else self.padding_idx
                return (embedding_op if grad else embedding_inference_op)(w, input, pad)
        elif not isinstance(input, Tensor) and _graph.is_proxy(input):     # torch.fx
            return _graph.fx_call(self, embedding, (
                input, w, self.padding_idx, self.max_norm, self.norm_type,
                self.scale_grad_by_freq, self.sparse), input)
        elif (self.padding_idx is None or type(self.padding_idx) is int) and _plain(input, w):
            view = self._np_view
            if (view is None or view[0] is not w or view[1] != w.data_ptr()
                    or view[2] != w.stride() or view[3] is not w.dtype or view[4] != w.shape):
                self._table_array(w)
                view = self._np_view
            pad = -1 if self.padding_idx is None else self.padding_idx
            if torch.is_grad_enabled() and w.requires_grad:
                return EmbeddingFunction.apply(w, input, pad, self.sparse,
                                               self if self.fused_optimizer is not None else None,
                                               view[5])
            return _numpy_lookup(view[5], input, w.dtype)
        elif w.dtype not in _KERNEL_DTYPES and isinstance(w, Tensor):
            warn_once(_reason(None, False, w.dtype))
        return _TORCH_EMBEDDING(input, w, self.padding_idx, self.max_norm, self.norm_type,
                                self.scale_grad_by_freq, self.sparse)
