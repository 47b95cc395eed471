"""perfkernels.torch.EmbeddingBag: torch.nn.EmbeddingBag on perfkernels' kernels."""
from __future__ import annotations

from typing import Optional

import torch
import torch.autograd.forward_ad as _fwad
import torch.nn.functional as F
from torch import Tensor

import perfkernels as pk

from . import _bags, _compat, _fused, _graph, _placement, _route, _tensor_bags
from ._route import Route
from ._bridge import IndexOutOfRangeError, TableViewCache, index_error, padded_index_error
from ._fallback import unsupported_reason, warn_once

_module_lookup = _tensor_bags.module_lookup
_is_compiling = torch.compiler.is_compiling
_tracing_state = torch._C._get_tracing_state


class EmbeddingBag(TableViewCache, torch.nn.EmbeddingBag):
    """Drop-in replacement for :class:`torch.nn.EmbeddingBag` (a subclass of it).

    The constructor, :meth:`forward`, :meth:`from_pretrained`, ``state_dict`` and attributes are
    torch's, so checkpoints load unchanged and ``isinstance(m, torch.nn.EmbeddingBag)`` holds.
    Lookups run on perfkernels' kernels for float32 / float16 / bfloat16 weights in modes
    ``"sum"`` and ``"mean"``, with ``per_sample_weights``, ``padding_idx``,
    ``include_last_offset`` and 2-D input; CPU tensors are read in place, CUDA tensors go to
    ``perfkernels.cuda``.  Gradients equal torch's: dense, or with ``sparse=True`` the same
    uncoalesced sparse COO gradient (``torch.optim.SGD`` / ``SparseAdam`` / ``Adagrad`` work
    unchanged).  Under ``torch.compile`` / ``torch.export`` the lookup is the registered op
    ``perfkernels::embedding_bag`` and the weight gradient is dense.

    ``mode="max"``, ``max_norm`` and ``scale_grad_by_freq`` (and other weight dtypes) run torch's
    implementation instead, with a one-time warning saying why.

    Every input gets torch's answer: the same result, or the same exception class with torch's
    message (whatever perfkernels' NumPy API refuses is put to torch's own function, which
    raises, or computes what it accepts, e.g. ``include_last_offset=True`` with a last offset
    short of the input's end; tensors on the ``meta`` device also run torch's function).  An
    out-of-range index raises :class:`IndexOutOfRangeError` (both ``IndexError`` and
    ``RuntimeError``) with torch's message.  What perfkernels does beyond torch is opt-in:

    * ``weighted_mean=True``: ``per_sample_weights`` with ``mode="mean"`` (the weighted sum
      divided by the count of non-padding entries; torch refuses weights in mode "mean");
    * ``strict_offsets=True``: the NumPy API's checks and exceptions for the bag arguments
      (``ValueError`` for offsets that do not start at 0, decrease, or with
      ``include_last_offset`` do not end at the input's end);
    * :attr:`output_dtype`: the output's dtype (``convert(model, dtype=...)`` stores
      float16/bfloat16 tables but keeps the model's float32 activations, and its
      ``per_sample_weights``); by default the weight's dtype, as in torch.

    ``placement=`` (``"auto"``, ``"hugepage"`` or ``"keep"``; :meth:`from_pretrained` uses
    ``"auto"``) moves the weight's storage into memory perfkernels places for gathers: 2 MiB-aligned,
    huge pages requested before the first touch (``"auto"``: tables of 2 MiB and more).  The
    weight stays a ``torch.nn.Parameter``; see :func:`perfkernels.torch.place`.

    :attr:`weight_backward` replaces the weight-gradient computation when set: a callable taking
    a :class:`~perfkernels.torch._bags.BagBackward` and returning the gradient, or None when it
    consumed it (e.g. a fused optimizer updating the table during backward).

    ``fused_optimizer=("rowwise_adagrad", {"lr": 0.01, "eps": 1e-8})`` (or ``"adagrad"``,
    ``"sgd"`` (with ``momentum``), ``"adam"``, ``"rowwise_adam"``, ``"adamw"``; also
    :meth:`set_fused_optimizer`) makes backward update the table in place with
    :func:`perfkernels.embedding_bag_backward_update` instead of returning a gradient for it
    (FBGEMM's fused table-batched embeddings work this way): ``weight.grad`` stays None, and the
    optimizer state is the buffer ``momentum1`` (the Adam family also ``momentum2`` and
    ``step``), saved in ``state_dict``.  Eager mode, CPU
    tables; under ``torch.compile`` the registered op gives the usual dense gradient instead.

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> bag = pkt.EmbeddingBag(10, 3, mode="sum")
    >>> indices, offsets = torch.tensor([1, 2, 4]), torch.tensor([0, 2])
    >>> out = bag(indices, offsets)                          # bags [1, 2] and [4]
    >>> torch.testing.assert_close(out[0], bag.weight[1] + bag.weight[2])
    >>> torch.testing.assert_close(out[1], bag.weight[4])
    >>> out.shape, isinstance(bag, torch.nn.EmbeddingBag)
    (torch.Size([2, 3]), True)
    """

    #: dtype of the lookup's result; None: the weight's dtype (torch's behaviour)
    output_dtype: Optional[torch.dtype] = None
    #: replacement for the weight gradient (see the class docstring); None: torch's gradient
    weight_backward: Optional[_bags.WeightBackward] = None
    #: the optimizer that updates the table during backward, if any (see the class docstring)
    fused_optimizer: Optional[_fused.FusedOptimizer] = None
    #: our opt-in: accept ``per_sample_weights`` with ``mode="mean"`` (torch refuses them)
    weighted_mean: bool = False
    #: our opt-in: the NumPy API's stricter bag checks and exceptions instead of torch's
    strict_offsets: bool = False
    #: read by torch.jit.script as constants (the output's dtype selects the scripted call)
    __constants__ = torch.nn.EmbeddingBag.__constants__ + ["output_dtype"]

    def __init__(self, *args, fused_optimizer: Optional[_fused.FusedOptimizerSpec] = None,
                 weighted_mean: bool = False, strict_offsets: bool = False,
                 placement: str = "auto", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # (a `_weight` in shared memory or in memory torch did not allocate stays: torch's module
        # shares it)
        _placement.place_tensor_attr(self, "weight", placement, keep_shared=False)
        if weighted_mean:
            self.weighted_mean = True
        if strict_offsets:
            self.strict_offsets = True
        if fused_optimizer is not None:
            self.set_fused_optimizer(fused_optimizer)

    @classmethod
    def from_pretrained(cls, embeddings: Tensor, *args, weighted_mean: bool = False,
                        strict_offsets: bool = False, **kwargs) -> "EmbeddingBag":
        """:meth:`torch.nn.EmbeddingBag.from_pretrained`, with our opt-ins."""
        new = super().from_pretrained(embeddings, *args, **kwargs)
        new.weighted_mean, new.strict_offsets = weighted_mean, strict_offsets
        return new

    @classmethod
    def from_file(cls, path, *, dtype=None, dim: Optional[int] = None,
                  rows: Optional[int] = None, mode: str = "mean",
                  include_last_offset: bool = False, padding_idx: Optional[int] = None,
                  **kwargs) -> "EmbeddingBag":
        """Over a float table file of :mod:`perfkernels.tables` (``save_table``,
        ``build_table_file``), mapped copy-on-write and shared with every process that maps it:
        nothing is read or copied now, and the weight does not require grad (a write copies the
        pages it touches into this process, never into the file).  ``dtype``/``dim``/``rows``:
        what the file must hold (:class:`~perfkernels.tables.TableFileError` naming the file
        otherwise); other keywords go to the constructor.  ``table_file`` names the file."""
        from ._table_files import float_bag_from_file
        return float_bag_from_file(cls, path, dtype=dtype, dim=dim, rows=rows, mode=mode,
                                   include_last_offset=include_last_offset,
                                   padding_idx=padding_idx, **kwargs)

    def _apply(self, fn, recurse: bool = True):
        # ``.half()`` / ``.double()`` / ``.to(dtype)`` of a model whose table is stored narrower
        # (convert(model, dtype=...)): the output follows the model's dtype, as a stock table's
        # would (what ``fn`` makes of a tensor of the current output dtype)
        out = super()._apply(fn, recurse)
        if self.output_dtype is not None:
            try:
                dtype = fn(torch.empty(0, dtype=self.output_dtype)).dtype
            except Exception:     # a function for other tensors than float ones: no dtype change
                return out
            w = self._parameters.get("weight")
            if dtype.is_floating_point:
                self.output_dtype = None if w is not None and dtype is w.dtype else dtype
        return out

    def set_fused_optimizer(self, spec: Optional[_fused.FusedOptimizerSpec]) -> None:
        """Update the table during backward with ``spec`` = ``(name, {"lr": ..., ...})`` (see
        :class:`~perfkernels.torch.FusedOptimizer`); None returns to ordinary gradients.  The
        state starts at ``initial_accumulator_value`` (0)."""
        _fused.enable(self, spec)

    def _fused_weight_backward(self, b: _bags.BagBackward) -> None:
        self.fused_optimizer.update(self.weight, self._buffers, b)
        return None

    def _script_forward(self, input: Tensor, offsets: Optional[Tensor] = None,
                        per_sample_weights: Optional[Tensor] = None) -> Tensor:
        # What torch.jit.script compiles for forward (see _graph.script_as): torch's function,
        # or the registered op for a table stored in another dtype than the output's.
        dtype = self.output_dtype
        weight = self.weight
        if dtype is not None:
            if dtype != weight.dtype:
                return torch.ops.perfkernels.embedding_bag(
                    weight, input, offsets, per_sample_weights, self.mode,
                    self.include_last_offset, self.padding_idx).to(dtype)
        return F.embedding_bag(input, weight, offsets, self.max_norm, self.norm_type,
                               self.scale_grad_by_freq, self.mode, self.sparse,
                               per_sample_weights, self.include_last_offset, self.padding_idx)

    def __prepare_scriptable__(self):
        return _graph.refuse_fused_script(self)

    @_graph.script_as(_script_forward)
    def forward(self, input: Tensor, offsets: Optional[Tensor] = None,
                per_sample_weights: Optional[Tensor] = None) -> Tensor:
        """Pooled rows per bag, as :meth:`torch.nn.EmbeddingBag.forward` (torch's result or
        exception for every input)."""
        # The plain cases in C (our kernel without a gradient, torch's own with one), whose
        # answer is None for everything else: that goes to _forward.  (_bags.capturing(),
        # inlined; forward-mode AD: torch's function, which computes or refuses the tangent.)
        try:
            if not _is_compiling() and _tracing_state() is None and _fwad._current_level < 0:
                out = _module_lookup(self, input, offsets, per_sample_weights)
                if out is not None:
                    return out
                if self.weight_backward is not None and per_sample_weights is None:
                    # a training step with a fused optimizer: the lean autograd function
                    out = _bags.weight_backward_lookup(self, input, offsets)
                    if out is not None:
                        return out
            return self._forward(input, offsets, per_sample_weights)
        except IndexOutOfRangeError as exc:
            if self.padding_idx is None:
                raise
            raise padded_index_error(exc) from None     # (torch's wording there)

    def _forward(self, input: Tensor, offsets: Optional[Tensor] = None,
                 per_sample_weights: Optional[Tensor] = None) -> Tensor:
        """Every route, for every input (see docs/pytorch.md)."""
        w = self._parameters.get("weight")
        if w is None:                       # a plain tensor assigned in place of the Parameter
            w = self.weight
        if not isinstance(input, Tensor) and _graph.is_proxy(input):      # torch.fx
            return _graph.fx_call(self, fx_embedding_bag, (
                input, w, offsets, per_sample_weights, self.mode, self.sparse, self.max_norm,
                self.norm_type, self.scale_grad_by_freq, self.include_last_offset,
                self.padding_idx, self.output_dtype, self.weighted_mean, self.strict_offsets),
                input)
        route = _route.route(w, input, per_sample_weights, mode=self.mode, sparse=self.sparse,
                             max_norm=self.max_norm, scale_grad_by_freq=self.scale_grad_by_freq,
                             needs_ours=_bags.needs_ours(self.weight_backward, self.weighted_mean,
                                                         self.mode, per_sample_weights),
                             weighted_mean=self.weighted_mean, output_dtype=self.output_dtype)
        if route is Route.TORCH:
            return self._torch_forward(input, offsets, per_sample_weights)
        if route is Route.TORCH_AUTOGRAD:
            return _compat.torch_verdict(input, w, offsets, per_sample_weights, self.mode,
                                         self.sparse, self.include_last_offset,
                                         self.padding_idx, self.output_dtype or w.dtype,
                                         check_offsets=False)
        if (route is Route.KERNEL or route is Route.OUR_AUTOGRAD) and _graph.transforming():
            # torch.func / forward-mode AD: torch's function works or raises as on torch's module
            return _bags.torch_answer(input, w, offsets, per_sample_weights, self._spec(),
                                      self.output_dtype or w.dtype, check_offsets=False)
        if route is not Route.KERNEL or _bags._profiler_enabled():
            # (while a profiler runs, the registered op, which it records by name)
            return _bags.bag_forward(w, input, offsets, per_sample_weights, self._spec(),
                                     self.output_dtype, route)
        # Inference, the cheapest path (a tiny lookup costs about as much as the Python around
        # it): straight to the kernel on the cached NumPy view of a CPU weight (the check of
        # TableViewCache._table_array, inlined).
        view = self._np_view
        if (view is None or view[0] is not w or view[1] != w.data_ptr()
                or view[2] != w.stride() or view[3] is not w.dtype or view[4] != w.shape):
            self._table_array(w)
            view = self._np_view
        table = view[5]
        if table is not None:
            dtype = self.output_dtype or w.dtype
            psw = per_sample_weights
            try:
                out = torch.from_numpy(pk.embedding_bag(
                    table, input.numpy(), None if offsets is None else offsets.numpy(),
                    per_sample_weights=None if psw is None else psw.detach().float().numpy(),
                    mode=self.mode, include_last_offset=self.include_last_offset,
                    padding_idx=self.padding_idx))
            except IndexError as exc:
                if psw is not None and self.mode != "sum" and not self.weighted_mean:
                    # torch refuses these weights before it reads an index
                    return self._torch_answer(input, w, offsets, per_sample_weights, dtype)
                raise index_error(exc) from None
            except (ValueError, TypeError):
                if self.strict_offsets:
                    raise
                return self._torch_answer(input, w, offsets, per_sample_weights, dtype)
            except RuntimeError:    # Tensor.numpy() refuses a negative view (x.conj().imag)
                return self._torch_answer(input, w, offsets, per_sample_weights, dtype)
            return out if dtype is torch.float32 else out.to(dtype)
        return _bags.bag_forward(w, input, offsets, per_sample_weights, self._spec(),
                                 self.output_dtype, route)

    def _torch_answer(self, input, w, offsets, per_sample_weights, dtype):
        return _bags.torch_answer(input, w, offsets, per_sample_weights, self._spec(), dtype)

    def _spec(self) -> _bags.BagSpec:
        return _bags.BagSpec(self.mode, self.include_last_offset, self.padding_idx, self.sparse,
                             self.weight_backward, self.weighted_mean, self.strict_offsets)

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
            # the hook dicts themselves, so that the handles torch gave out keep working
            new.__dict__[key] = (value.copy() if isinstance(value, dict) and "hook" not in key
                                 else value)
        if dtype is not None and dtype != module.weight.dtype:
            new.output_dtype = module.weight.dtype
            new.weight = torch.nn.Parameter(module.weight.detach().to(dtype),
                                            requires_grad=module.weight.requires_grad)
        return new


def fx_embedding_bag(input: Tensor, weight: Tensor, offsets: Optional[Tensor],
                     per_sample_weights: Optional[Tensor], mode: str, sparse: bool,
                     max_norm: Optional[float], norm_type: float, scale_grad_by_freq: bool,
                     include_last_offset: bool, padding_idx: Optional[int],
                     output_dtype: Optional[torch.dtype], weighted_mean: bool,
                     strict_offsets: bool) -> Tensor:
    """What a symbolically traced ``perfkernels.torch.EmbeddingBag`` calls: its forward with
    these options, on our kernels."""
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
        warn_once(unsupported_reason(mode=mode, max_norm=max_norm,
                                     scale_grad_by_freq=scale_grad_by_freq, dtype=weight.dtype))
        return _compat.TORCH_EMBEDDING_BAG(input, weight, offsets, max_norm, norm_type,
                                           scale_grad_by_freq, mode, sparse, per_sample_weights,
                                           include_last_offset, padding_idx)
    spec = _bags.BagSpec(mode, include_last_offset, padding_idx, sparse, None, weighted_mean,
                         strict_offsets)
    if route is Route.TORCH_AUTOGRAD:
        return _bags.torch_answer(input, weight, offsets, per_sample_weights, spec, dtype,
                                  check_offsets=False)
    return _bags.bag_forward(weight, input, offsets, per_sample_weights, spec, output_dtype,
                             route)
