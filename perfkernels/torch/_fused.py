"""Fused optimizers for the embedding modules: the table is updated during backward by
:func:`perfkernels.embedding_bag_backward_update` (FBGEMM's fused table-batched-embedding style),
and no gradient is returned for it.

    bag = perfkernels.torch.EmbeddingBag(1000, 64, mode="sum",
                                         fused_optimizer=("rowwise_adagrad", {"lr": 0.01}))

The optimizer state lives in the module as buffers, so it is part of ``state_dict`` and is saved
and loaded with the table: ``momentum1`` (float32 ``[rows]`` for ``"rowwise_adagrad"``,
``[rows, D]`` for ``"adagrad"``, the first moment ``m`` of the Adam family, the momentum buffer of
``"sgd"`` with ``momentum``; none for plain ``"sgd"``), ``momentum2`` (the Adam family's second
moment ``v``: ``[rows, D]``, ``[rows]`` for ``"rowwise_adam"``) and ``step`` (the Adam family's
step count of this table, an int64 scalar, as ``torch.optim.SparseAdam``'s ``state["step"]``).  The other parameters of the model are
untouched: give them a torch optimizer as usual (the table's ``.grad`` stays None, so a torch
optimizer that also holds the table skips it).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Tuple, Union

import torch
from torch import Tensor

from . import _native_ops, _placement  # noqa: F401 (_native_ops: the ops)
from ._bridge import native_index_error

OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad", "adam", "rowwise_adam", "adamw")
#: the optimizers with two moments and a step count
ADAM_FAMILY = ("adam", "rowwise_adam", "adamw")
_OPTIONS = {"lr", "eps", "weight_decay", "stochastic_rounding", "initial_accumulator_value",
            "betas", "momentum", "nesterov"}
#: the state buffers a fused optimizer may keep in its module
STATE_BUFFERS = ("momentum1", "momentum2", "step")

#: What ``fused_optimizer=`` accepts: ``(name, {"lr": ..., ...})``, a name alone is not enough
#: (lr has no default), or a :class:`FusedOptimizer`.
FusedOptimizerSpec = Union[Tuple[str, Mapping[str, Any]], "FusedOptimizer"]


_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _real_option(value: Any, name: str) -> float:
    """The option ``name``'s ``value`` as a float (inf where it overflows one); TypeError for a
    bool, a string or anything that is not a real number."""
    if isinstance(value, (bool, str, bytes)) or not hasattr(type(value), "__float__"):
        raise TypeError(f"fused optimizer option {name} must be a real number; got "
                        f"{type(value).__name__}")
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _float32_option(options: Mapping[str, Any], key: str, default: Optional[float]) -> float:
    """``options[key]`` (or ``default``) checked as the kernels need it: a real number (TypeError
    for a bool or a string), finite, >= 0 and finite in float32, the precision the update runs
    in (ValueError), so a bad value fails here and not inside a later backward."""
    value = options.get(key, default)
    v = _real_option(value, key)
    if not (math.isfinite(v) and 0 <= v <= _FLOAT32_MAX):
        raise ValueError(f"fused optimizer option {key} = {value} must be finite, >= 0 and at "
                         f"most {_FLOAT32_MAX:.7g} (float32)")
    return v


def _betas_option(options: Mapping[str, Any]) -> Tuple[float, float]:
    """``options["betas"]`` (default (0.9, 0.999)): a pair of real numbers in [0, 1)."""
    betas = options.get("betas", (0.9, 0.999))
    try:
        b1, b2 = betas
    except (TypeError, ValueError):
        raise TypeError(f"fused optimizer option betas must be a pair (beta1, beta2); got "
                        f"{betas!r}") from None
    out = []
    for i, b in enumerate((b1, b2)):
        value = _real_option(b, f"betas[{i}]")
        if not 0.0 <= value < 1.0:
            raise ValueError(f"fused optimizer option betas[{i}] = {b} must be in [0, 1)")
        out.append(value)
    return out[0], out[1]


class FusedOptimizer:
    """A sparse optimizer applied to an embedding table during backward.

    ``name``: ``"sgd"``, ``"adagrad"`` (element-wise state, ``torch.optim.Adagrad``'s update),
    ``"rowwise_adagrad"`` (one state value per row, FBGEMM's ``EXACT_ROWWISE_ADAGRAD``),
    ``"adam"`` (``torch.optim.SparseAdam``'s lazy update), ``"rowwise_adam"`` (FBGEMM's
    PARTIAL_ROWWISE_ADAM: one second moment per row) or ``"adamw"`` (decoupled weight decay).
    Options: ``lr`` (required), ``eps`` (default 1e-8; > 0 for the Adam family),
    ``weight_decay`` (0), ``stochastic_rounding`` (False; float16 / bfloat16 tables),
    ``initial_accumulator_value`` (0; the starting state of the adagrad variants), ``betas``
    ((0.9, 0.999); the Adam family), ``momentum`` (0) and ``nesterov`` (False) (``"sgd"`` only).  The formulas are those of
    :func:`perfkernels.embedding_bag_backward_update`.

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> opt = pkt.FusedOptimizer("rowwise_adagrad", {"lr": 0.1})
    >>> bag = pkt.EmbeddingBag(10, 3, fused_optimizer=opt)
    >>> before = bag.weight.detach().clone()
    >>> bag(torch.tensor([1, 2]), torch.tensor([0])).sum().backward()   # rows 1 and 2 step here
    >>> torch.equal(bag.weight[0], before[0]), torch.equal(bag.weight[1], before[1])
    (True, False)
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
        self.betas = _betas_option(options)
        self.momentum = _float32_option(options, "momentum", 0.0)
        nesterov = options.get("nesterov", False)
        if not isinstance(nesterov, bool):
            raise TypeError(f"fused optimizer option nesterov must be a bool; got "
                            f"{type(nesterov).__name__}")
        self.nesterov = nesterov
        if name != "sgd" and (self.momentum != 0 or nesterov):
            raise ValueError(f"fused optimizer options momentum and nesterov belong to 'sgd'; "
                             f"got them with {name!r}")
        if nesterov and self.momentum == 0:
            raise ValueError("fused optimizer option nesterov=True needs momentum > 0")
        if name in ADAM_FAMILY:
            if self.eps <= 0:
                raise ValueError(f"fused optimizer option eps = {self.eps} must be > 0 for "
                                 f"{name!r}")
            if not set(options) <= {"lr", "eps", "weight_decay", "stochastic_rounding", "betas"}:
                raise ValueError(f"fused optimizer {name!r} takes lr, eps, weight_decay, betas "
                                 f"and stochastic_rounding; got {sorted(options)}")
        elif "betas" in options:
            raise ValueError(f"fused optimizer option betas belongs to the Adam family; got it "
                             f"with {name!r}")
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
        out = {"lr": self.lr, "eps": self.eps, "weight_decay": self.weight_decay,
               "stochastic_rounding": self.stochastic_rounding}
        if self.name in ADAM_FAMILY:
            out["betas"] = self.betas
        else:
            out["initial_accumulator_value"] = self.initial_accumulator_value
        if self.name == "sgd":
            out.update(momentum=self.momentum, nesterov=self.nesterov)
        return out

    def __repr__(self) -> str:
        return f"FusedOptimizer({self.name!r}, {self.options()})"

    def initial_state(self, weight: Tensor) -> Optional[Tensor]:
        """The first state buffer (``momentum1``) for a table like ``weight`` (None for plain
        sgd); :meth:`initial_buffers` gives every buffer."""
        return self.initial_buffers(weight).get("momentum1")

    def initial_buffers(self, weight: Tensor) -> dict:
        """The state buffers for a table like ``weight``: ``{"momentum1": ..., "momentum2":
        ..., "step": ...}``, those this optimizer keeps (none for plain sgd)."""
        rows, dim = weight.shape
        dev = weight.device
        if self.name == "sgd":
            if self.momentum == 0:
                return {}
            return {"momentum1": torch.zeros((rows, dim), dtype=torch.float32, device=dev)}
        if self.name in ADAM_FAMILY:
            v_shape = (rows,) if self.name == "rowwise_adam" else (rows, dim)
            return {"momentum1": torch.zeros((rows, dim), dtype=torch.float32, device=dev),
                    "momentum2": torch.zeros(v_shape, dtype=torch.float32, device=dev),
                    "step": torch.zeros((), dtype=torch.int64, device=dev)}
        shape = (rows, dim) if self.name == "adagrad" else (rows,)
        return {"momentum1": torch.full(shape, self.initial_accumulator_value,
                                        dtype=torch.float32, device=dev)}

    def skip(self, buffers: Mapping[str, Tensor]) -> None:
        """Count a step in which this table had no rows to update (a rank of a sharded
        collection that holds none of its rows), so every holder of the table keeps the same
        step count."""
        step = buffers.get("step")
        if step is not None:
            with torch.no_grad():
                step.add_(1)

    def update(self, weight: Tensor, state: Any, b) -> None:
        """Step ``weight`` (and the state) in place for the lookup ``b`` (a
        :class:`~perfkernels.torch._bags.BagBackward`), called from the lookup's backward.
        ``state``: the module's buffers (a mapping holding ``momentum1``, ``momentum2``,
        ``step`` as this optimizer needs), or ``momentum1`` alone (a tensor or None) for the
        optimizers without a second moment.

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
            key = None
            if b.per_sample_weights is None and b.offsets is not None and b.indices.dim() == 1:
                key = self._batch_key(b.include_last_offset)
            _pending_rows().append((key, self, weight, state, b.grad_output, b.indices,
                                    b.offsets, b.mode == "mean", b.padding_idx, b))

    def queue(self, weight: Tensor, state: Any, grad: Tensor, indices: Tensor, offsets: Tensor,
              mean: bool, include_last_offset: bool, padding_idx: Optional[int]) -> None:
        """:meth:`update` for the bags of 1-D ``indices`` with ``offsets`` and no
        ``per_sample_weights`` whose backward the caller runs (a fused lookup's): the step of
        ``grad`` (their ``[num_bags, D]`` gradient), at the end of the running backward pass."""
        if torch._C._current_graph_task_id() < 0:
            from ._bags import BagBackward
            self._step_now(weight, state, BagBackward(
                grad, indices, offsets, None, "mean" if mean else "sum", include_last_offset,
                padding_idx, weight.shape[0], weight.dtype))
            return
        _pending_rows().append((self._batch_key(include_last_offset), self, weight, state, grad,
                                indices, offsets, mean, padding_idx, None))

    def _batch_key(self, include_last_offset: bool) -> tuple:
        """What the steps batched into one call with this one must share."""
        return (self.name, self.lr, self.eps, self.weight_decay, self.betas, self.momentum,
                self.nesterov, self.stochastic_rounding, include_last_offset)

    def _step_now(self, weight: Tensor, state: Any, b) -> None:
        buffers = state if isinstance(state, Mapping) else {"momentum1": state}
        m1 = buffers.get("momentum1")
        m2 = step = t = None
        if self.name in ADAM_FAMILY:
            m2, step = buffers.get("momentum2"), buffers.get("step")
            if m1 is None or m2 is None or step is None:
                raise RuntimeError(f"fused optimizer {self.name!r} needs the buffers momentum1, "
                                   "momentum2 and step")
            t = int(step) + 1
            seed = t    # the table's own count: a state_dict round trip keeps the rounding bits
        else:
            self._step += 1
            seed = self._step
        grad = b.grad_output
        if grad.dtype is not torch.float32:
            grad = grad.float()
        psw = b.per_sample_weights
        if psw is not None and psw.dtype is not torch.float32:
            psw = psw.float()
        _in_place(fused_step_op, weight, b.indices, b.offsets, psw, b.mode,
                  b.include_last_offset, b.padding_idx, grad, self.name, m1, m2, self.lr,
                  self.eps, self.weight_decay, t, self.betas[0], self.betas[1], self.momentum,
                  self.nesterov, self.stochastic_rounding,
                  seed)   # reproducible runs; a new seed every step
        if step is not None:
            with torch.no_grad():
                step.fill_(t)     # counted once the update is done


def _in_place(op, *args) -> None:
    """Call a step op with grad mode off (the in-place update of a leaf that requires grad); a
    bad index raises torch's IndexError.  A backward pass (where steps run, but with
    create_graph=True) already has grad mode off, and then no torch.no_grad() is entered (it
    cost more than the op call itself, per table and step)."""
    grad_mode = torch.is_grad_enabled()
    if grad_mode:
        torch._C._set_grad_enabled(False)
    try:
        op(*args)
    except RuntimeError as exc:
        bad_index = native_index_error(exc)
        if bad_index is not None:
            raise bad_index from None
        raise
    finally:
        if grad_mode:
            torch._C._set_grad_enabled(True)


#: The steps queued by each running backward pass (by graph task id), taken by the pass's one
#: engine callback; a pass that fails before its end leaves its entry, dropped once
#: _PENDING_LIMIT passes are pending.
_PENDING: dict = {}
_PENDING_LIMIT = 64


def _pending_rows() -> list:
    """The steps the running backward pass has queued (a new list, with the callback that takes
    it, on a pass's first step)."""
    task = torch._C._current_graph_task_id()
    rows = _PENDING.get(task)
    if rows is None:
        if len(_PENDING) >= _PENDING_LIMIT:     # passes that failed before their end
            _PENDING.pop(min(_PENDING), None)
        rows = _PENDING[task] = []
        torch.autograd.Variable._execution_engine.queue_callback(lambda: _run_pending(task))
    return rows


def _run_pending(task: int) -> None:
    """The table steps a backward pass queued, in their order: each run of consecutive steps
    with the same optimizer options in one native call (a small-batch training step of a model
    with tens of tables would otherwise pay a dispatch and a callback per table).  A row:
    ``(key, optimizer, weight, state, grad, indices, offsets, mean, padding_idx, b)``, key None
    where the step runs alone (``b``, its :class:`~perfkernels.torch._bags.BagBackward`:
    per_sample_weights, 2-D indices)."""
    rows = _PENDING.pop(task, ())
    i, n = 0, len(rows)
    while i < n:
        key = rows[i][0]
        j = i + 1
        if key is not None:
            while j < n and rows[j][0] == key:
                j += 1
        if j - i == 1 and rows[i][9] is not None:
            _, opt, weight, state, *_rest, b = rows[i]
            opt._step_now(weight, state, b)
        else:
            _step_batch(rows[i:j])
        i = j


def _step_batch(rows: list) -> None:
    """The steps ``rows`` (see :func:`_run_pending`: one set of optimizer options, 1-D indices
    with offsets, no per_sample_weights) in one call of the many-table op."""
    opt0 = rows[0][1]
    adam = opt0.name in ADAM_FAMILY
    weights, indices, offsets, mean, padding, grads = [], [], [], [], [], []
    states, states2, steps, seeds, counted = [], [], [], [], {}
    for _, opt, weight, state, grad, ix, off, is_mean, pad, _b in rows:
        if type(state) is dict or isinstance(state, Mapping):
            m1 = state.get("momentum1")
        else:
            m1, state = state, None
        if adam:
            m2, step = state.get("momentum2"), state.get("step")
            if m1 is None or m2 is None or step is None:
                raise RuntimeError(f"fused optimizer {opt.name!r} needs the buffers momentum1, "
                                   "momentum2 and step")
            prev = counted.get(id(step))
            t = (int(step) if prev is None else prev[1]) + 1
            counted[id(step)] = (step, t)
            steps.append(t)
            seeds.append(t)
            states2.append(m2)
        else:
            opt._step += 1
            seeds.append(opt._step)
        if m1 is not None:
            states.append(m1)
        weights.append(weight)
        indices.append(ix)
        offsets.append(off)
        mean.append(is_mean)
        padding.append(-1 if pad is None else (pad + weight.shape[0] if pad < 0 else pad))
        grads.append(grad if grad.dtype is torch.float32 else grad.float())
    if states and len(states) != len(rows):
        raise RuntimeError(f"fused optimizer {opt0.name!r}: some tables lack their momentum1 "
                           "buffer")
    _in_place(fused_steps_op, weights, indices, offsets, mean, rows[0][0][-1], padding, grads,
              opt0.name, states, states2, opt0.lr, opt0.eps, opt0.weight_decay, steps,
              opt0.betas[0], opt0.betas[1], opt0.momentum, opt0.nesterov,
              opt0.stochastic_rounding, seeds)
    if counted:
        with torch.no_grad():
            for step, t in counted.values():
                step.fill_(t)     # counted once the update is done


#: The step as the native op (its CPU kernel in the native library, what the NumPy API's
#: perfkernels.embedding_bag_backward_update runs): ``(weight, indices, offsets,
#: per_sample_weights, bag_mode, include_last_offset, padding_idx, grad_output, optimizer, state,
#: state2, lr, eps, weight_decay, step, beta1, beta2, momentum, nesterov, stochastic_rounding,
#: seed)``, weight / state / state2 updated in place.
fused_step_op = torch.ops.perfkernels.embedding_bag_backward_update.default


#: Several tables' steps with one optimizer in one call: ``(weights, indices, offsets, mean,
#: include_last_offset, padding_idx, grad_outputs, optimizer, states, states2, lr, eps,
#: weight_decay, steps, beta1, beta2, momentum, nesterov, stochastic_rounding, seeds)``, lists
#: with an entry per table (states, states2 and steps empty where the optimizer keeps none).
fused_steps_op = torch.ops.perfkernels.embedding_bags_backward_update.default


@torch.library.register_fake("perfkernels::embedding_bags_backward_update")
def _fused_steps_fake(weights, indices, offsets, mean, include_last_offset, padding_idx,
                      grad_outputs, optimizer, states, states2, lr, eps, weight_decay, steps,
                      beta1, beta2, momentum, nesterov, stochastic_rounding, seeds) -> None:
    return None


@torch.library.register_fake("perfkernels::embedding_bag_backward_update")
def _fused_step_fake(weight, indices, offsets, per_sample_weights, bag_mode, include_last_offset,
                     padding_idx, grad_output, optimizer, state, state2, lr, eps, weight_decay,
                     step, beta1, beta2, momentum, nesterov, stochastic_rounding, seed) -> None:
    return None


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
    for name in STATE_BUFFERS:
        if name in module._buffers:
            del module._buffers[name]
    if spec is None:
        module.fused_optimizer = None
        module.weight_backward = None
        return
    opt = FusedOptimizer.from_spec(spec)
    dtype = module.weight.dtype
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        # such a table runs torch's lookup, whose backward returns a gradient: the step would
        # never be taken
        raise TypeError(f"fused optimizers update float32, float16 or bfloat16 tables; this "
                        f"table is {dtype}")
    module.fused_optimizer = opt
    for name, buf in opt.initial_buffers(module.weight).items():
        module.register_buffer(name, buf)
    _placement.place_state_like_weight(module)
    module.weight_backward = module._fused_weight_backward
