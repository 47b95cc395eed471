"""convert(model): swap torch's embedding bags for ours; route F.embedding_bag to us."""
from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.autograd.forward_ad as _fwad
import torch.nn.functional as F
from torch import Tensor

from . import _bags, _placement, _route, _tensor_bags
from ._embedding import Embedding, embedding as _embedding_functional
from ._route import Route
from ._embedding_bag import EmbeddingBag
from ._fallback import unsupported_reason, warn_once

log = logging.getLogger("perfkernels.torch")

#: torch's own function, kept so that routing (and our fallbacks) never call ourselves
_TORCH_EMBEDDING_BAG = F.embedding_bag


@dataclass
class ConversionReport:
    """What :func:`convert` did: ``swapped`` as (name, old type, new type, note), ``skipped`` as
    (name, type, reason)."""
    swapped: list = field(default_factory=list)
    skipped: list = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"perfkernels.torch.convert: swapped {len(self.swapped)}, "
                 f"skipped {len(self.skipped)}"]
        lines += [f"  swapped {n or '<model>'}: {a} -> {b}{f' ({note})' if note else ''}"
                  for n, a, b, note in self.swapped]
        lines += [f"  skipped {n or '<model>'}: {t}: {why}" for n, t, why in self.skipped]
        return "\n".join(lines)


def _torch_ao_embedding_bag():
    try:
        from torch.ao.nn.quantized import EmbeddingBag as QEmbeddingBag
    except ImportError:   # pragma: no cover - torch builds without quantization
        return None
    return QEmbeddingBag


def _torch_ao_embedding():
    try:
        from torch.ao.nn.quantized import Embedding as QEmbedding
    except ImportError:   # pragma: no cover - torch builds without quantization
        return None
    return QEmbedding


class _Swapper:
    """Swaps modules for ours, once each: a module reachable under several names (one table used
    in two places) gets one replacement, and tables that share one weight Parameter keep sharing
    one converted Parameter, so tied tables stay tied (one parameter, trained once)."""

    def __init__(self, dtype: Optional[torch.dtype], bits: Optional[int],
                 report: ConversionReport, placement: str = "auto") -> None:
        self.dtype, self.bits, self.report, self.placement = dtype, bits, report, placement
        self.modules: dict[int, Optional[torch.nn.Module]] = {}   # id(old) -> new (None: kept)
        self.weights: dict[int, torch.nn.Parameter] = {}          # id(old weight) -> new weight
        self.keep: list = []   # the old objects, so that their ids stay theirs during convert

    def __call__(self, name: str, module: torch.nn.Module) -> Optional[torch.nn.Module]:
        if id(module) in self.modules:
            return self.modules[id(module)]
        new = _swap_one(name, module, self.dtype, self.bits, self.report, self.placement)
        if isinstance(new, EmbeddingBag) and new.weight is not module.weight:
            old = module.weight
            if id(old) in self.weights:     # a table tied to one converted before
                new.weight = self.weights[id(old)]
            else:
                self.weights[id(old)] = new.weight
            self.keep.append(old)
        self.modules[id(module)] = new
        self.keep.append(module)
        return new


def _swap_one(name: str, module: torch.nn.Module, dtype: Optional[torch.dtype],
              bits: Optional[int], report: ConversionReport, placement: str = "auto"
              ) -> Optional[torch.nn.Module]:
    """Our replacement for one module, or None (with the reason in the report) to leave it."""
    from ._quantized import QuantizedEmbeddingBag
    kind = type(module).__name__
    qtype = _torch_ao_embedding_bag()
    if type(module) in (torch.nn.EmbeddingBag, torch.nn.Embedding):
        from ._torchao import is_torchao_weight
        if is_torchao_weight(getattr(module, "weight", None)):
            return _swap_torchao(name, module, bits, report, placement)
    if type(module) is torch.nn.EmbeddingBag:
        reason = unsupported_reason(mode=module.mode, max_norm=module.max_norm,
                                    scale_grad_by_freq=module.scale_grad_by_freq,
                                    dtype=module.weight.dtype)
        if reason is not None:
            report.skipped.append((name, kind, reason))
            return None
        if bits is not None:
            new = QuantizedEmbeddingBag.from_float(module, bits=bits, placement=placement)
            report.swapped.append((name, kind, "QuantizedEmbeddingBag", f"{bits}-bit rows"))
            return new
        new = EmbeddingBag.from_torch(module, dtype=dtype)
        _placement.place_tensor_attr(new, "weight", placement)
        note = "" if dtype in (None, module.weight.dtype) else f"weight stored as {dtype}"
        report.swapped.append((name, kind, "EmbeddingBag",
                               note or "same weight Parameter"))
        return new
    if qtype is not None and type(module) is qtype:
        new = QuantizedEmbeddingBag.from_torch_ao(module, placement=placement)
        report.swapped.append((name, kind, "QuantizedEmbeddingBag", f"{new.bits}-bit rows"))
        return new
    if type(module) is torch.nn.Embedding:
        return _swap_embedding(name, module, dtype, bits, report, placement)
    qemb = _torch_ao_embedding()
    if qemb is not None and type(module) is qemb:
        from ._quantized_embedding import QuantizedEmbedding
        new = QuantizedEmbedding.from_torch_ao(module, placement=placement)
        report.swapped.append((name, kind, "QuantizedEmbedding", f"{new.bits}-bit rows"))
        return new
    if isinstance(module, torch.nn.Embedding) and not isinstance(module, Embedding):
        report.skipped.append((name, kind, "a subclass of torch.nn.Embedding may override "
                               "forward; only the exact class is swapped"))
    if isinstance(module, torch.nn.EmbeddingBag) and not isinstance(module, EmbeddingBag):
        report.skipped.append((name, kind, "a subclass of torch.nn.EmbeddingBag may override "
                               "forward; only the exact class is swapped"))
    return None


def _swap_torchao(name: str, module: torch.nn.Module, bits: Optional[int],
                  report: ConversionReport, placement: str) -> Optional[torch.nn.Module]:
    """Our quantized module in place of an Embedding / EmbeddingBag whose weight torchao
    quantized (its rows read as ``from_torchao`` reads them), or None with the reason."""
    from ._quantized import QuantizedEmbeddingBag
    from ._quantized_embedding import QuantizedEmbedding
    kind = type(module).__name__
    target = QuantizedEmbedding if type(module) is torch.nn.Embedding else QuantizedEmbeddingBag
    try:
        new = target.from_torchao(module, bits=bits, placement=placement)
    except ValueError as exc:
        report.skipped.append((name, kind, f"torchao {type(module.weight).__name__}: {exc}"))
        return None
    report.swapped.append((name, kind, target.__name__,
                           f"{new.bits}-bit rows from torchao {type(module.weight).__name__}"))
    return new


def _swap_embedding(name: str, module: torch.nn.Embedding, dtype: Optional[torch.dtype],
                    bits: Optional[int], report: ConversionReport, placement: str
                    ) -> Optional[torch.nn.Module]:
    """Our Embedding (unpooled lookups) in place of torch's, sharing its weight Parameter."""
    from ._embedding import _reason
    kind = type(module).__name__
    reason = _reason(module.max_norm, module.scale_grad_by_freq, module.weight.dtype)
    if reason is not None:
        report.skipped.append((name, kind, reason))
        return None
    if bits is not None:
        from ._quantized_embedding import QuantizedEmbedding
        new = QuantizedEmbedding.from_float(module, bits=bits, placement=placement)
        report.swapped.append((name, kind, "QuantizedEmbedding", f"{bits}-bit rows"))
        return new
    new = Embedding.from_torch(module)
    _placement.place_tensor_attr(new, "weight", placement)
    note = "same weight Parameter"
    if dtype not in (None, module.weight.dtype):
        note += "; dtype= applies to EmbeddingBag tables only, this table is unchanged"
    report.swapped.append((name, kind, "Embedding", note))
    return new


def convert(model: torch.nn.Module, *, dtype: Optional[torch.dtype] = None,
            bits: Optional[int] = None, inplace: bool = False,
            verbose: bool = False, placement: str = "auto") -> torch.nn.Module:
    """Swap every ``torch.nn.EmbeddingBag``, ``torch.ao.nn.quantized.EmbeddingBag`` and
    ``torch.nn.Embedding`` in ``model`` for perfkernels' modules; the one-line way to speed up an
    existing model.  (``dtype`` applies to the bag tables; ``bits`` turns an ``Embedding`` into a
    :class:`~perfkernels.torch.QuantizedEmbedding`, ``torch.ao.nn.quantized.Embedding`` becomes
    one too; an ``Embedding`` with ``max_norm`` or ``scale_grad_by_freq`` is left to torch.
    An ``Embedding`` / ``EmbeddingBag`` whose weight torchao quantized becomes a quantized module
    read by ``from_torchao``, 8-bit rows unless ``bits`` says otherwise.)

    Parameters
    ----------
    model : torch.nn.Module
        Any model; a bare EmbeddingBag is converted too.
    dtype : torch.float16 or torch.bfloat16, optional
        Store float tables in this dtype (half the memory and bandwidth); lookups still
        accumulate in float32 and return the model's original dtype.
    bits : 8, 4 or 2, optional
        Quantize float tables row-wise to this many bits (torch's ``embedding_bag_*_prepack``
        layout, like ``torch.ao.quantization`` with a float_qparams weight-only config); the
        result is an inference table (no gradient).
    inplace : bool
        False (default): return a new module tree and leave ``model`` as it was; parameters and
        buffers are shared, never copied (the new EmbeddingBags hold the same weight Parameter,
        keep ``sparse`` and train/eval mode).  True: swap inside ``model``.
    verbose : bool
        Print the report.
    placement : "auto", "hugepage" or "keep"
        Where the swapped modules' tables live: ``"auto"`` (default) moves tables of 2 MiB and
        more into memory perfkernels places for gathers (2 MiB-aligned, huge pages requested
        before the first touch; :func:`perfkernels.torch.place`), ``"hugepage"`` moves every
        table, ``"keep"`` none.  A float table keeps its Parameter object (its storage moves), so
        with ``inplace=False`` the original model, which shares the Parameter, reads the moved
        storage too.

    Returns
    -------
    The converted model.  ``perfkernels.torch.last_report()`` (and the log at INFO level on the
    ``perfkernels.torch`` logger) says what was swapped, and what was skipped and why.

    Modules that call ``torch.nn.functional.embedding_bag`` themselves are not swapped: wrap
    their calls in :func:`route_functional`.
    """
    global _last_report
    if dtype is not None and dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"dtype must be None, torch.float32, torch.float16 or torch.bfloat16; "
                         f"got {dtype}")
    _placement.check_placement(placement)
    if bits is not None and bits not in (8, 4, 2):
        raise ValueError(f"bits must be None, 8, 4 or 2; got {bits!r}")
    if dtype is not None and bits is not None:
        raise ValueError("give dtype (float16/bfloat16 storage) or bits (quantized rows), "
                         "not both")
    if not inplace:
        # Share every parameter and buffer: only the module objects are new.
        memo = {id(t): t for t in (*model.parameters(), *model.buffers())}
        model = copy.deepcopy(model, memo)
    report = ConversionReport()
    swap = _Swapper(dtype, bits, report, placement)
    top = swap("", model)
    if top is not None:
        model = top
    else:
        # every name of every module (named_children() would list a module held twice by one
        # parent once, leaving its second name on torch's module)
        for name, parent in list(model.named_modules()):
            for child_name, child in list(parent._modules.items()):
                if child is None:
                    continue
                full = f"{name}.{child_name}" if name else child_name
                new = swap(full, child)
                if new is not None:
                    setattr(parent, child_name, new)
    for entry in report.swapped:
        log.info("swapped %s: %s -> %s (%s)", *entry)
    for entry in report.skipped:
        log.info("skipped %s: %s: %s", *entry)
    _last_report = report
    if verbose:
        print(report)
    return model


_last_report: Optional[ConversionReport] = None


def last_report() -> Optional[ConversionReport]:
    """The report of the latest :func:`convert` call in this process (None before the first)."""
    return _last_report


def embedding_bag(input: Tensor, weight: Tensor, offsets: Optional[Tensor] = None,
                  max_norm: Optional[float] = None, norm_type: float = 2.0,
                  scale_grad_by_freq: bool = False, mode: str = "mean", sparse: bool = False,
                  per_sample_weights: Optional[Tensor] = None, include_last_offset: bool = False,
                  padding_idx: Optional[int] = None, *, weighted_mean: bool = False,
                  strict_offsets: bool = False) -> Tensor:
    """``torch.nn.functional.embedding_bag`` on perfkernels' kernels: the same signature, and
    torch's result or exception for every input (what the kernels don't do runs torch's
    function, with a one-time warning for options such as ``mode="max"``).

    Our opt-ins, keyword-only: ``weighted_mean=True`` accepts ``per_sample_weights`` with
    ``mode="mean"``; ``strict_offsets=True`` applies the NumPy API's stricter bag checks and
    exceptions (see :class:`~perfkernels.torch.EmbeddingBag`)."""
    if (max_norm is None and not scale_grad_by_freq and not _route.capturing()
            and _fwad._current_level < 0):
        # the plain cases in C, as in the module; None for everything else
        out = _tensor_bags.lookup(weight, input, offsets, per_sample_weights, mode,
                                  include_last_offset, padding_idx, None, weighted_mean, sparse,
                                  True)
        if out is not None:
            return out
    spec = _bags.BagSpec(mode, include_last_offset, padding_idx, sparse, None, weighted_mean,
                         strict_offsets)
    route = _route.route(weight, input, per_sample_weights, mode=mode, sparse=sparse,
                         max_norm=max_norm, scale_grad_by_freq=scale_grad_by_freq,
                         needs_ours=_bags.needs_ours(None, weighted_mean, mode, per_sample_weights),
                         weighted_mean=weighted_mean)
    if route is Route.TORCH:
        if mode in ("sum", "mean", "max"):
            warn_once(unsupported_reason(mode=mode, max_norm=max_norm,
                                         scale_grad_by_freq=scale_grad_by_freq, dtype=weight.dtype))
        return _TORCH_EMBEDDING_BAG(input, weight, offsets, max_norm, norm_type,
                                    scale_grad_by_freq, mode, sparse, per_sample_weights,
                                    include_last_offset, padding_idx)
    if route is Route.TORCH_AUTOGRAD:
        return _bags.torch_answer(input, weight, offsets, per_sample_weights, spec, weight.dtype,
                                  check_offsets=False)
    return _bags.bag_forward(weight, input, offsets, per_sample_weights, spec, route=route)


class route_functional:
    """Route the functions code calls itself to perfkernels: ``torch.nn.functional.embedding_bag``
    (DLRM's ``QREmbeddingBag`` ...), ``torch.nn.functional.embedding`` (to
    :func:`perfkernels.torch.embedding`) and ``torch.ops.quantized.embedding_bag_{byte,4bit,2bit}
    _rowwise_offsets`` (DLRM's ``--quantize-emb-with-bit`` path, which prepacks its tables with
    ``torch.ops.quantized.embedding_bag_*_prepack``: their layout is already ours, so the packed
    tables are read in place and the prepack ops need no routing).

    As a context manager (``with route_functional(): ...``) it restores torch's functions on
    exit; called plainly (``route_functional()``) it routes for the rest of the process.  Not
    thread-safe: it patches module attributes for the whole process while active.  What it
    cannot reach: calls bound before routing (``from torch.nn.functional import embedding_bag``,
    ``op = torch.ops.quantized.embedding_bag_byte_rowwise_offsets`` kept in a variable), calls
    from C++ or TorchScript, and ``torch.embedding_bag`` / ``torch.ops.aten`` used directly.
    """

    def __init__(self) -> None:
        from ._quantized import OP_ALIASES
        self._saved = (F.embedding_bag,
                       {name: getattr(torch.ops.quantized, name) for name in OP_ALIASES},
                       F.embedding)
        F.embedding_bag = embedding_bag
        F.embedding = _embedding_functional
        for name, fn in OP_ALIASES.items():
            setattr(torch.ops.quantized, name, fn)

    def __enter__(self) -> "route_functional":
        return self

    def __exit__(self, *exc_info) -> None:
        function, ops, unpooled = self._saved
        F.embedding_bag = function
        F.embedding = unpooled
        for name, op in ops.items():
            setattr(torch.ops.quantized, name, op)
