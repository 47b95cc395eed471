"""perfkernels.torch.EmbeddingBag: torch.nn.EmbeddingBag on perfkernels' kernels."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

import perfkernels as pk

from . import _bags
from ._bridge import IndexOutOfRangeError, TableViewCache
from ._fallback import unsupported_reason, warn_once

_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class EmbeddingBag(TableViewCache, torch.nn.EmbeddingBag):
    """Drop-in replacement for :class:`torch.nn.EmbeddingBag` (a subclass of it).

    The constructor, :meth:`forward`, :meth:`from_pretrained`, ``state_dict`` and attributes are
    torch's, so checkpoints load unchanged and ``isinstance(m, torch.nn.EmbeddingBag)`` holds.
    Lookups run on perfkernels' kernels for float32 / float16 / bfloat16 weights in modes
    ``"sum"`` and ``"mean"``, with ``per_sample_weights``, ``padding_idx``,
    ``include_last_offset`` and 2-D input; CPU tensors are read in place, CUDA tensors go to
    :mod:`perfkernels.cuda`.  Gradients equal torch's: dense, or with ``sparse=True`` the same
    uncoalesced sparse COO gradient (``torch.optim.SGD`` / ``SparseAdam`` / ``Adagrad`` work
    unchanged).  Under ``torch.compile`` / ``torch.export`` the lookup is the registered op
    ``perfkernels::embedding_bag`` and the weight gradient is dense.

    ``mode="max"``, ``max_norm`` and ``scale_grad_by_freq`` (and other weight dtypes) run torch's
    implementation instead, with a one-time warning saying why.

    Differences from torch, both on purpose:

    * the output is float32 when :attr:`output_dtype` says so (``convert(model, dtype=...)``
      stores float16/bfloat16 tables but keeps the model's float32 activations); by default it
      has the weight's dtype, as in torch;
    * ``per_sample_weights`` is accepted with ``mode="mean"`` too (torch refuses it).

    An out-of-range index raises :class:`IndexOutOfRangeError` (both ``IndexError`` and
    ``RuntimeError``) naming the position and value.

    :attr:`weight_backward` replaces the weight-gradient computation when set: a callable taking
    a :class:`~perfkernels.torch._bags.BagBackward` and returning the gradient, or None when it
    consumed it (e.g. a fused optimizer updating the table during backward).
    """

    #: dtype of the lookup's result; None: the weight's dtype (torch's behaviour)
    output_dtype: Optional[torch.dtype] = None
    #: replacement for the weight gradient (see the class docstring); None: torch's gradient
    weight_backward: Optional[_bags.WeightBackward] = None

    def forward(self, input: Tensor, offsets: Optional[Tensor] = None,
                per_sample_weights: Optional[Tensor] = None) -> Tensor:
        """Pooled rows per bag, as :meth:`torch.nn.EmbeddingBag.forward`."""
        w = self.weight
        if (self.max_norm is not None or self.scale_grad_by_freq
                or (self.mode != "sum" and self.mode != "mean") or w.dtype not in _KERNEL_DTYPES):
            return self._torch_forward(input, offsets, per_sample_weights)
        return _bags.bag_forward(w, input, offsets, per_sample_weights, self._spec(),
                                 self.output_dtype, self._lookup_no_grad)

    def _lookup_no_grad(self, input: Tensor, offsets: Optional[Tensor],
                        per_sample_weights: Optional[Tensor]) -> Tensor:
        """The cheapest eager path: straight to the NumPy kernel on a cached view of the weight."""
        if per_sample_weights is not None:
            if per_sample_weights.dtype is not torch.float32:
                per_sample_weights = per_sample_weights.float()
            per_sample_weights = per_sample_weights.numpy()
        try:
            out = pk.embedding_bag(self._table_array(self.weight), input.numpy(),
                                   None if offsets is None else offsets.numpy(),
                                   per_sample_weights=per_sample_weights, mode=self.mode,
                                   include_last_offset=self.include_last_offset,
                                   padding_idx=self.padding_idx)
        except IndexError as exc:
            raise IndexOutOfRangeError(str(exc)) from None
        return torch.from_numpy(out)

    def _spec(self) -> _bags.BagSpec:
        return _bags.BagSpec(self.mode, self.include_last_offset, self.padding_idx, self.sparse,
                             self.weight_backward)

    def _torch_forward(self, input, offsets, per_sample_weights):
        warn_once(unsupported_reason(mode=self.mode, max_norm=self.max_norm,
                                     scale_grad_by_freq=self.scale_grad_by_freq,
                                     dtype=self.weight.dtype))
        return F.embedding_bag(input, self.weight, offsets, self.max_norm, self.norm_type,
                               self.scale_grad_by_freq, self.mode, self.sparse,
                               per_sample_weights, self.include_last_offset, self.padding_idx)

    @classmethod
    def from_torch(cls, module: torch.nn.EmbeddingBag, *, dtype: Optional[torch.dtype] = None
                   ) -> "EmbeddingBag":
        """Ours in place of ``module``: the same attributes and hooks, the same weight Parameter
        (no copy) unless ``dtype`` asks for float16/bfloat16 storage, in which case the output
        stays in the module's original dtype."""
        new = cls.__new__(cls)
        for key, value in module.__dict__.items():
            if key == "_np_view":
                continue
            new.__dict__[key] = value.copy() if isinstance(value, dict) else value
        if dtype is not None and dtype != module.weight.dtype:
            new.output_dtype = module.weight.dtype
            new.weight = torch.nn.Parameter(module.weight.detach().to(dtype),
                                            requires_grad=module.weight.requires_grad)
        return new
