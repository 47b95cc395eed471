"""The one decision of a lookup's route in the torch layer.

Every frontend of a float-table embedding bag (the module ``EmbeddingBag``, the functional
``perfkernels.torch.embedding_bag``, the collections, the sharded collection) asks :func:`route`
which way a call goes, from its tensors and the module's options, and then only carries the
decision out.  The function is pure (it reads tensor metadata, never data, and changes nothing),
so the documentation's route table is generated from it (:func:`route_table`) and the tests check
both against each other.

The eager fast path in C (``_tensor_bags``) answers the plainest calls before any Python runs;
what it answers is a subset of the ``KERNEL`` and ``TORCH_AUTOGRAD`` routes below (checked by
``tests/test_torch_route.py``), and it leaves every other call to the frontend's full path, which
asks :func:`route`.
"""
from __future__ import annotations

import enum
import itertools
from typing import Optional

import torch
from torch import Tensor

from . import _compat

#: Table dtypes our float kernels read.
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: below this many gathered values (indices x D), torch's dense-gradient embedding bag (forward
#: and backward) takes less time than ours, whose backward is a chain of torch ops run from
#: Python (measured on one thread; benchmarks/torch_small.py)
DENSE_GRAD_MIN_VALUES = 1 << 17


class Route(str, enum.Enum):
    """Where a lookup goes.  The value is the name the docs and reports use."""

    #: options our kernels do not implement (mode "max", ``max_norm``, ``scale_grad_by_freq``, a
    #: table dtype other than float32/float16/bfloat16): torch's function, with a one-time warning
    TORCH = "torch (unsupported option)"
    #: tensors on a device other than the CPU or CUDA (``meta``): torch's function
    DEVICE = "torch (other device)"
    #: input torch refuses, or answers otherwise than the NumPy API would: torch's answer
    REFUSED = "torch's answer"
    #: compiling, exporting or tracing (``torch.jit.trace``): the registered op
    #: ``torch.ops.perfkernels.*`` (a sparse gradient: torch's function)
    OP = "custom op"
    #: a gradient torch's own kernel and autograd serve faster (float32 CPU table, a sparse or a
    #: small dense gradient, no custom weight backward)
    TORCH_AUTOGRAD = "torch's kernel + autograd"
    #: any other gradient: our kernel under ``BagFunction``
    OUR_AUTOGRAD = "our kernel + BagFunction"
    #: no gradient, CUDA tensors: ``perfkernels.cuda``
    CUDA = "perfkernels.cuda"
    #: no gradient, CPU tensors: our kernel
    KERNEL = "our kernel"


_tracing_state = torch._C._get_tracing_state


def capturing() -> bool:
    """Whether a graph is being captured, so that lookups must call the registered ops rather
    than the kernels: ``torch.compile`` / ``torch.export``, or ``torch.jit.trace``."""
    return torch.compiler.is_compiling() or _tracing_state() is not None


def unsupported(mode: str, max_norm: Optional[float], scale_grad_by_freq: bool,
                dtype: torch.dtype) -> bool:
    """Whether the options ask for what our float kernels do not do (torch's function runs)."""
    return (max_norm is not None or scale_grad_by_freq or (mode != "sum" and mode != "mean")
            or dtype not in KERNEL_DTYPES)


def torch_autograd_is_faster(weight: Tensor, input: Tensor, sparse: bool,
                             needs_ours: bool) -> bool:
    """Whether a lookup with a gradient is better left to torch's own kernel and autograd:
    a sparse gradient (torch builds it in one C++ pass, ours in several torch ops: slower at every
    size measured), or a small one (the Python of our backward costs more than the work), unless
    the lookup ``needs_ours`` (a custom weight backward such as a fused optimizer, or weights in
    mode "mean", which torch refuses), the table is on CUDA, or it is float16 / bfloat16 (torch's
    kernel rounds partial results to the table's dtype, and may overflow where ours, accumulating
    in float32, does not). A table of zero columns keeps ours too (torch's kernel raises
    "Expected i < index_size" on any non-empty input there)."""
    dim = weight.shape[1]
    if needs_ours or weight.device.type != "cpu" or weight.dtype is not torch.float32 or not dim:
        return False
    return sparse or input.numel() * dim < DENSE_GRAD_MIN_VALUES


def route(weight: Tensor, input: Tensor, per_sample_weights: Optional[Tensor], *,
          mode: str, sparse: bool = False, max_norm: Optional[float] = None,
          scale_grad_by_freq: bool = False, needs_ours: bool = False,
          weighted_mean: bool = False, output_dtype: Optional[torch.dtype] = None,
          compiling: Optional[bool] = None, grad_enabled: Optional[bool] = None) -> Route:
    """The route of a float-table lookup (see :class:`Route` and docs/pytorch.md).

    ``needs_ours``: the lookup needs our autograd (a custom weight backward such as a fused
    optimizer, or ``weighted_mean`` weights in mode "mean"), never torch's.  ``compiling`` (a
    graph being captured: :func:`capturing`) and ``grad_enabled`` default to torch's current
    state."""
    if unsupported(mode, max_norm, scale_grad_by_freq, weight.dtype):
        return Route.TORCH
    if compiling is None:
        compiling = capturing()
    if grad_enabled is None:
        # (torch.jit.trace: as with grad on, so that the trace check, run under no_grad, takes
        # the route the trace took)
        grad_enabled = torch.is_grad_enabled() or _tracing_state() is not None
    needs_grad = (not compiling and grad_enabled and (weight.requires_grad or (
        per_sample_weights is not None and per_sample_weights.requires_grad)))
    if needs_grad and torch_autograd_is_faster(weight, input, sparse, needs_ours):
        return Route.TORCH_AUTOGRAD
    if (compiling and sparse and grad_enabled and weight.requires_grad and not needs_ours
            and weight.device.type != "meta"):
        # a sparse gradient in a captured graph: only torch's function gives one (the op's is
        # dense, its size being data-dependent)
        return Route.TORCH_AUTOGRAD
    if weight.device.type not in ("cpu", "cuda"):
        return Route.DEVICE
    dtype = output_dtype or weight.dtype
    if ((per_sample_weights is not None and _compat.weights_refused(
            input, per_sample_weights, mode, dtype, weighted_mean)) or _compat.input_refused(input)):
        return Route.REFUSED
    if compiling:
        return Route.OP
    if needs_grad:
        return Route.OUR_AUTOGRAD
    return Route.CUDA if weight.device.type == "cuda" else Route.KERNEL


# --- the route table of docs/pytorch.md ------------------------------------------------------------

#: The cases of the table: (column, values) in the order the table lists them.
_TABLE_AXES = (
    ("options", ("sum/mean", "max, max_norm or scale_grad_by_freq")),
    ("table", ("float32", "float16/bfloat16")),
    ("device", ("cpu", "cuda", "meta")),
    ("capturing", ("no", "yes")),
    ("gradient", ("none", "sparse", "small dense", "large dense", "fused optimizer")),
)


def _case(options: str, table: str, device: str, capturing: str, gradient: str) -> Route:
    """The route of one row of the table, asked of :func:`route` on meta tensors of that shape
    (the device is passed as a stand-in: the function reads only metadata)."""
    dtype = torch.float32 if table == "float32" else torch.float16
    weight = torch.empty(1000, 64, dtype=dtype, device="meta")
    weight.requires_grad_(gradient != "none")
    n = 8 if gradient != "large dense" else DENSE_GRAD_MIN_VALUES // 64
    input = torch.empty(n, dtype=torch.int64, device="meta")

    class _Device:                     # the device type the route reads, without allocating
        type = device
    weight = _MetaView(weight, _Device)
    return route(weight, input, None, mode="sum" if options == "sum/mean" else "max",
                 sparse=gradient == "sparse", needs_ours=gradient == "fused optimizer",
                 compiling=capturing == "yes", grad_enabled=True)


class _MetaView:
    """A meta tensor that reports another device type (for the table only)."""

    def __init__(self, tensor: Tensor, device) -> None:
        self._t, self.device = tensor, device

    def __getattr__(self, name):
        return getattr(self._t, name)


def route_table() -> list[tuple[str, ...]]:
    """The rows (options, table, device, compiling, gradient, route) of the route table:
    :func:`route` asked for every combination of the axes, then merged where the route does not
    depend on an axis (its value then reads "any")."""
    rows = [combo + (_case(*combo).value,)
            for combo in itertools.product(*(values for _, values in _TABLE_AXES))]
    for axis in reversed(range(len(_TABLE_AXES))):
        merged: dict[tuple, list] = {}
        for row in rows:
            key = row[:axis] + row[axis + 1:]
            merged.setdefault(key, []).append(row)
        width = len(_TABLE_AXES[axis][1])
        rows = []
        for key, group in merged.items():
            if len(group) == width and all(r[axis] != "any" for r in group):
                rows.append(key[:axis] + ("any",) + key[axis:])
            else:
                rows.extend(group)
    order = [dict((v, i) for i, v in enumerate(("any",) + values)) for _, values in _TABLE_AXES]
    return sorted(rows, key=lambda r: tuple(order[i][r[i]] for i in range(len(_TABLE_AXES))))


def route_table_markdown() -> str:
    """:func:`route_table` as the Markdown table docs/pytorch.md holds (a test keeps them equal)."""
    header = [axis for axis, _ in _TABLE_AXES] + ["route"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in route_table()]
    return "\n".join(lines)
