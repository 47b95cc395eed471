"""Fused optimizers for the embedding modules: the table is updated during backward by
:func:`perfkernels.embedding_bag_backward_update` (FBGEMM's fused table-batched-embedding style),
and no gradient is returned for it.

    bag = perfkernels.torch.EmbeddingBag(1000, 64, mode="sum",
                                         fused_optimizer=("rowwise_adagrad", {"lr": 0.01}))

The optimizer state lives in the module as the buffer ``momentum1`` (float32 ``[rows]`` for
``"rowwise_adagrad"``, ``[rows, D]`` for ``"adagrad"``, none for ``"sgd"``), so it is part of
``state_dict`` and is saved and loaded with the table.  The other parameters of the model are
untouched: give them a torch optimizer as usual (the table's ``.grad`` stays None, so a torch
optimizer that also holds the table skips it).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Tuple, Union

import torch
from torch import Tensor

import perfkernels as pk

from . import _placement
from ._bridge import as_numpy, index_error

OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad")
_OPTIONS = {"lr", "eps", "weight_decay", "stochastic_rounding", "initial_accumulator_value"}

#: What ``fused_optimizer=`` accepts: ``(name, {"lr": ..., ...})``, a name alone is not enough
#: (lr has no default), or a :class:`FusedOptimizer`.
FusedOptimizerSpec = Union[Tuple[str, Mapping[str, Any]], "FusedOptimizer"]


_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _float32_option(options: Mapping[str, Any], key: str, default: Optional[float]) -> float:
    """``options[key]`` (or ``default``) checked as the kernels need it: a real number (TypeError
    for a bool or a string), finite, >= 0 and finite in float32, the precision the update runs
    in (ValueError), so a bad value fails here and not inside a later backward."""
    value = options.get(key, default)
    if isinstance(value, (bool, str, bytes)) or not hasattr(type(value), "__float__"):
        raise TypeError(f"fused optimizer option {key} must be a real number; got "
                        f"{type(value).__name__}")
    try:
        v = float(value)
    except OverflowError:
        v = math.inf
    if not (math.isfinite(v) and 0 <= v <= _FLOAT32_MAX):
        raise ValueError(f"fused optimizer option {key} = {value} must be finite, >= 0 and at "
                         f"most {_FLOAT32_MAX:.7g} (float32)")
    return v


class FusedOptimizer:
    """A sparse optimizer applied to an embedding table during backward.

    ``name``: ``"sgd"``, ``"adagrad"`` (element-wise state, ``torch.optim.Adagrad``'s update) or
    ``"rowwise_adagrad"`` (one state value per row, FBGEMM's ``EXACT_ROWWISE_ADAGRAD``).
    Options: ``lr`` (required), ``eps`` (default 1e-8), ``weight_decay`` (0),
    ``stochastic_rounding`` (False; float16 / bfloat16 tables), ``initial_accumulator_value``
    (0; the starting state of the adagrad variants).  The formulas are those of
    :func:`perfkernels.embedding_bag_backward_update`.
    """

    def __init__(self, name: str, options: Optional[Mapping[str, Any]] = None) -> None:
        if name not in OPTIMIZERS:
            raise ValueError(f"fused optimizer must be one of {', '.join(OPTIMIZERS)}; got {name!r}")
        options = dict(options or {})
        unknown = set(options) - _OPTIONS
        if unknown:
            raise ValueError(f"unknown fused optimizer option(s) {sorted(unknown)}; valid: "
                             f"{sorted(_OPTIONS)}")
        if "lr" not in options:
            raise ValueError(f"fused optimizer {name!r} needs a learning rate: "
                             f"({name!r}, {{'lr': ...}})")
        self.name = name
        self.lr = _float32_option(options, "lr", None)
        self.eps = _float32_option(options, "eps", 1e-8)
        self.weight_decay = _float32_option(options, "weight_decay", 0.0)
        self.stochastic_rounding = bool(options.get("stochastic_rounding", False))
        self.initial_accumulator_value = _float32_option(options, "initial_accumulator_value", 0.0)
        self._step = 0

    @classmethod
    def from_spec(cls, spec: FusedOptimizerSpec) -> "FusedOptimizer":
        if isinstance(spec, FusedOptimizer):
            return spec
        if isinstance(spec, str):
            return cls(spec, None)
        try:
            name, options = spec
        except (TypeError, ValueError):
            raise TypeError("fused_optimizer must be (name, options), e.g. "
                            "('rowwise_adagrad', {'lr': 0.01}); got "
                            f"{type(spec).__name__}") from None
        return cls(name, options)

    def options(self) -> dict:
        return {"lr": self.lr, "eps": self.eps, "weight_decay": self.weight_decay,
                "stochastic_rounding": self.stochastic_rounding,
                "initial_accumulator_value": self.initial_accumulator_value}

    def __repr__(self) -> str:
        return f"FusedOptimizer({self.name!r}, {self.options()})"

    def initial_state(self, weight: Tensor) -> Optional[Tensor]:
        """The state for a table like ``weight`` (None for sgd)."""
        rows, dim = weight.shape
        if self.name == "sgd":
            return None
        shape = (rows, dim) if self.name == "adagrad" else (rows,)
        return torch.full(shape, self.initial_accumulator_value, dtype=torch.float32,
                          device=weight.device)

    def update(self, weight: Tensor, state: Optional[Tensor], b) -> None:
        """Step ``weight`` (and ``state``) in place for the lookup ``b`` (a
        :class:`~perfkernels.torch._bags.BagBackward`), called from the lookup's backward.

        The step is deferred to the end of the backward pass (an autograd engine callback), so
        every gradient of the pass, that of ``per_sample_weights`` of each use of a module used
        several times included, is computed from the table the forward read.  A pass that does
        not deliver the table's gradient (``torch.autograd.grad(loss, [per_sample_weights])``,
        ``loss.backward(inputs=[...])`` without the table) leaves table and state untouched."""
        if weight.device.type != "cpu":
            raise NotImplementedError("fused optimizers run on CPU tables only")
        if torch._C._current_graph_task_id() < 0:     # called outside a backward pass
            self._step_now(weight, state, b)
        elif _delivers_gradient(getattr(b, "weight_node", None)):
            torch.autograd.Variable._execution_engine.queue_callback(
                lambda: self._step_now(weight, state, b))

    def _step_now(self, weight: Tensor, state: Optional[Tensor], b) -> None:
        self._step += 1
        grad = b.grad_output
        if grad.dtype is not torch.float32:
            grad = grad.float()
        psw = b.per_sample_weights
        if psw is not None and psw.dtype is not torch.float32:
            psw = psw.float()
        try:
            pk.embedding_bag_backward_update(
                as_numpy(weight), as_numpy(b.indices),
                None if b.offsets is None else as_numpy(b.offsets),
                grad_output=as_numpy(grad), optimizer=self.name,
                state=None if state is None else as_numpy(state), lr=self.lr, eps=self.eps,
                weight_decay=self.weight_decay,
                per_sample_weights=None if psw is None else as_numpy(psw), mode=b.mode,
                include_last_offset=b.include_last_offset, padding_idx=b.padding_idx,
                stochastic_rounding=self.stochastic_rounding,
                seed=self._step)   # reproducible runs; a new seed every step
        except IndexError as exc:
            raise index_error(exc) from None


def _delivers_gradient(node: Any) -> bool:
    """Whether the running backward pass delivers a gradient through ``node`` (the autograd node
    taking the table's gradient; None: unknown, assumed yes)."""
    if node is None:
        return True
    try:
        return bool(torch._C._will_engine_execute_node(node))
    except RuntimeError:
        # torch.autograd.grad(): it returns the gradients of its inputs and never accumulates
        # into a leaf such as the table, so it asks for no table step
        return False


def enable(module: torch.nn.Module, spec: Optional[FusedOptimizerSpec]) -> None:
    """Give an embedding module (our EmbeddingBag) a fused optimizer, or remove it (None)."""
    if spec is None:
        module.fused_optimizer = None
        module.weight_backward = None
        if "momentum1" in module._buffers:
            del module._buffers["momentum1"]
        return
    opt = FusedOptimizer.from_spec(spec)
    module.fused_optimizer = opt
    state = opt.initial_state(module.weight)
    if state is not None:
        module.register_buffer("momentum1", state)
        _placement.place_state_like_weight(module)
    elif "momentum1" in module._buffers:
        del module._buffers["momentum1"]
    module.weight_backward = module._fused_weight_backward
