"""convert(model): swap torch's embedding bags for ours; route F.embedding_bag to us."""
from __future__ import annotations

import copy
import gc
import logging
import os
import platform
import warnings
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.autograd.forward_ad as _fwad
import torch.nn.functional as F
from torch import Tensor

from . import _bags, _graph, _placement, _route, _tensor_bags
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
    (name, type, reason), ``kept_in_place`` as (name of a table, why placement left it where it
    was: its storage is shared).

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> _ = pkt.convert(torch.nn.Sequential(torch.nn.EmbeddingBag(10, 4), torch.nn.Linear(4, 1)))
    >>> report = pkt.last_report()
    >>> [name for name, *_ in report.swapped], report.skipped
    (['0'], [])
    """
    swapped: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    kept_in_place: list = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"perfkernels.torch.convert: swapped {len(self.swapped)}, "
                 f"skipped {len(self.skipped)}"]
        lines += [f"  swapped {n or '<model>'}: {a} -> {b}{f' ({note})' if note else ''}"
                  for n, a, b, note in self.swapped]
        lines += [f"  skipped {n or '<model>'}: {t}: {why}" for n, t, why in self.skipped]
        lines += [f"  not placed {n}: {why}" for n, why in self.kept_in_place]
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


def _holders(model: torch.nn.Module) -> dict[int, list]:
    """id(tensor) -> [(module name, module, attribute)] for every parameter and buffer of every
    module of ``model`` (a tensor held by several modules, or under several names, has several)."""
    out: dict[int, list] = {}
    for name, m in model.named_modules(remove_duplicate=False):
        for store in (m._parameters, m._buffers):
            for key, t in store.items():
                if t is not None:
                    out.setdefault(id(t), []).append((name, m, key))
    return out


def _converts_alike(module: torch.nn.Module, bits: Optional[int]) -> bool:
    """Whether convert(dtype=...) (``bits`` None) or convert(bits=...) gives ``module`` a table of
    the same new kind: exact torch modules with options our modules take (dtype= applies to
    EmbeddingBag tables only)."""
    from ._embedding import _reason
    if type(module) is torch.nn.EmbeddingBag:
        return unsupported_reason(mode=module.mode, max_norm=module.max_norm,
                                  scale_grad_by_freq=module.scale_grad_by_freq,
                                  dtype=module.weight.dtype) is None
    if type(module) is torch.nn.Embedding and bits is not None:
        return _reason(module.max_norm, module.scale_grad_by_freq, module.weight.dtype) is None
    return False


#: the hook dicts a quantized replacement takes over from the float module (its state_dict
#: hooks stay behind: they read the float module's keys)
_CALL_HOOKS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
               "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
               "_backward_pre_hooks", "_is_full_backward_hook")


class _Swapper:
    """Swaps modules for ours, once each: a module reachable under several names (one table used
    in two places) gets one replacement, and tables that share one weight Parameter keep sharing
    one converted Parameter (``dtype=``) or one packed table (``bits=``), so tied tables stay
    tied (one parameter, trained once).  A table tied to a module that would not be converted
    alike (a Linear, an Embedding under ``dtype=``) keeps its dtype, and the report says so.
    Float tables are placed unless their storage is shared (the report says why)."""

    def __init__(self, model: torch.nn.Module, dtype: Optional[torch.dtype], bits: Optional[int],
                 report: ConversionReport, placement: str = "auto", inplace: bool = True) -> None:
        self.dtype, self.bits, self.report, self.placement = dtype, bits, report, placement
        self.inplace = inplace
        self.modules: dict[int, Optional[torch.nn.Module]] = {}   # id(old) -> new (None: kept)
        self.weights: dict[int, tuple] = {}    # id(old weight) -> (new weight, output dtype)
        self.packed: dict[int, Tensor] = {}                      # id(old weight) -> packed rows
        self.holders = _holders(model)
        self.replaced: dict[int, tuple[str, Tensor]] = {}   # old Parameters the model dropped
        self.placed: set[int] = set()
        self.keep: list = []   # the old objects, so that their ids stay theirs during convert

    def _tie(self, module: torch.nn.Module) -> Optional[str]:
        """Why ``module``'s table must keep its dtype: its weight is shared with a module that
        the conversion would not convert alike (None: every holder converts alike)."""
        w = module._parameters.get("weight") if isinstance(module, torch.nn.Module) else None
        if w is None:
            return None
        for name, m, key in self.holders.get(id(w), ()):
            if m is not module and (key != "weight" or not _converts_alike(m, self.bits)):
                what = f"bits={self.bits}" if self.bits is not None else f"dtype={self.dtype}"
                return (f"weight shared with {name or '<model>'}.{key} ({type(m).__name__}), "
                        f"which {what} would untie: kept as {w.dtype}")
        return None

    def __call__(self, name: str, module: torch.nn.Module) -> Optional[torch.nn.Module]:
        from ._quantized import QuantizedEmbeddingBag
        from ._quantized_embedding import QuantizedEmbedding
        if id(module) in self.modules:
            return self.modules[id(module)]
        dtype, bits = self.dtype, self.bits
        old = module._parameters.get("weight") if type(module) in (
            torch.nn.EmbeddingBag, torch.nn.Embedding) else None
        tie = None
        if old is not None and (bits is not None or dtype not in (None, old.dtype)):
            from ._torchao import is_torchao_weight
            tie = None if is_torchao_weight(old) else self._tie(module)
            if tie is not None:
                dtype = bits = None
        # a table converted to a copy (dtype=, bits=) no longer reads the storage it shared
        copied = (_placement.sharing_reason(old) if old is not None and (
            bits is not None or dtype not in (None, old.dtype)) else None)
        new = _swap_one(name, module, dtype, bits, self.report, self.placement)
        if new is not None and type(new).__module__ == "perfkernels.torch._torchrec_convert":
            for inner in module.modules():    # a whole collection: not its tables one by one
                self.modules.setdefault(id(inner), None)
        if new is not None and (tie is not None or copied is not None):
            n, a, b, note = self.report.swapped[-1]
            extra = tie if tie is not None else (
                f"a converted copy of a shared table: {copied.replace('the moved', 'the')}")
            self.report.swapped[-1] = (n, a, b, extra if note == "same weight Parameter"
                                       else f"{note}; {extra}")
        if isinstance(new, EmbeddingBag) and old is not None and (
                id(old) in self.weights or dtype not in (None, old.dtype)):
            self._set_dtype(name, new, old, dtype)
        elif (isinstance(new, (QuantizedEmbeddingBag, QuantizedEmbedding)) and old is not None
              and bits is not None):
            shared = self.packed.get(id(old))
            if shared is None:
                self.packed[id(old)] = new.packed_weight
            else:          # a table tied to one quantized before: the same packed rows
                new._buffers["packed_weight"] = shared
            self.replaced[id(old)] = (name, old)
        if isinstance(new, (QuantizedEmbeddingBag, QuantizedEmbedding)):
            for key in _CALL_HOOKS:       # the replaced module's hooks, and their handles
                if key in module.__dict__:
                    new.__dict__[key] = module.__dict__[key]
        if isinstance(new, (EmbeddingBag, Embedding)):
            self._place(name, new)
        if old is not None:
            self.keep.append(old)
        self.modules[id(module)] = new
        self.keep.append(module)
        return new

    def _set_dtype(self, name: str, new: EmbeddingBag, old: torch.nn.Parameter,
                   dtype: torch.dtype) -> None:
        """Store ``new``'s table in ``dtype``, once for all the modules tied to it: in the same
        Parameter object with ``inplace=True`` (an optimizer built before keeps updating it, as
        after ``module.half()``), else in a new Parameter (the original model keeps its own)."""
        if id(old) in self.weights:           # a table tied to one converted before
            new.weight, new.output_dtype = self.weights[id(old)]
            return
        new.output_dtype = old.dtype
        if self.inplace:
            grad = old.grad
            old.data = old.detach().to(dtype)
            if grad is not None:
                old.grad = grad.to(dtype)
            weight = old
        else:
            weight = torch.nn.Parameter(old.detach().to(dtype), requires_grad=old.requires_grad)
            self.replaced[id(old)] = (name, old)
        new.weight = weight
        self.weights[id(old)] = (weight, new.output_dtype)

    def _place(self, name: str, new: torch.nn.Module) -> None:
        """Place ``new``'s float table unless its storage is shared (the report says why)."""
        w = new._parameters.get("weight")
        if w is None or id(w) in self.placed:
            return
        self.placed.add(id(w))
        reason = _placement.place_tensor_attr(new, "weight", self.placement, keep_shared=True)
        if reason is not None:
            self.report.kept_in_place.append((f"{name}.weight" if name else "weight", reason))

    def warn_replaced(self, model: torch.nn.Module, original: torch.nn.Module,
                      *ours: object) -> None:
        """A warning naming the Parameters the converted model no longer holds (``dtype=`` with
        ``inplace=False``, ``bits=``) that something outside both models still references: an
        optimizer built before :func:`convert` would go on updating those, not the tables."""
        if not self.replaced:
            return
        olds = [p for _, p in self.replaced.values()]
        known = {id(m._parameters) for root in (model, original)
                 for m in root.modules()}
        known.update(id(m._parameters) for m in self.keep if isinstance(m, torch.nn.Module))
        known.update((id(self.keep), id(olds), id(self.replaced), *map(id, ours)))
        known.update(map(id, self.replaced.values()))
        # what an optimizer holds them in: lists (its param_groups' "params") and dicts keyed by
        # them (its state); a module's _parameters dict (another model sharing the Parameter)
        # holds them as values
        held = set()
        for ref in gc.get_referrers(*olds):
            if id(ref) in known or not isinstance(ref, (list, tuple, dict)):
                continue
            for p in olds:
                if any(x is p for x in ref):     # a list's items, a dict's keys
                    held.add(id(p))
        names = [n or "<model>" for key, (n, _) in self.replaced.items() if key in held]
        if not names:
            return
        what = (f"bits={self.bits} stored packed rows (an inference table)" if self.bits is not None
                else f"dtype={self.dtype} stored the tables in new Parameters")
        warnings.warn(
            f"perfkernels.torch.convert: {what} for {', '.join(names)}, and something outside the "
            "model still holds their old weight Parameters (an optimizer built before convert()?): "
            "it would go on updating the old Parameters, not the converted model's tables.  Build "
            "the optimizer after convert() from the converted model's parameters()"
            + ("" if self.bits is not None else ", or convert with inplace=True, which keeps the "
               "Parameter objects") + ".", UserWarning, stacklevel=3)


def _quantized_bag_class() -> type:
    """QuantizedEmbeddingBag as it replaces an ``nn.EmbeddingBag`` (made once)."""
    global _QuantizedTorchEmbeddingBag
    if _QuantizedTorchEmbeddingBag is None:
        from ._quantized import QuantizedEmbeddingBag

        class _QuantizedTorchEmbeddingBag(QuantizedEmbeddingBag):
            """A :class:`QuantizedEmbeddingBag` in place of an ``nn.EmbeddingBag``: called as
            that module is, its first argument ``input`` (TorchRec's collections call each
            table with ``input=``, ``offsets=``, ``per_sample_weights=``)."""

            def _script_input_forward(self, input: Tensor, offsets: Optional[Tensor] = None,
                                      per_sample_weights: Optional[Tensor] = None) -> Tensor:
                # what torch.jit.script compiles for forward (see _graph.script_as)
                return self._script_forward(input, offsets, per_sample_weights, None)

            @_graph.script_as(_script_input_forward)
            def forward(self, input: Tensor, offsets: Optional[Tensor] = None,
                        per_sample_weights: Optional[Tensor] = None) -> Tensor:
                return QuantizedEmbeddingBag.forward(self, input, offsets, per_sample_weights)

            def _get_name(self) -> str:
                return "QuantizedEmbeddingBag"

        _QuantizedTorchEmbeddingBag.__module__ = __name__
        _QuantizedTorchEmbeddingBag.__qualname__ = "_QuantizedTorchEmbeddingBag"
        globals()["_QuantizedTorchEmbeddingBag"] = _QuantizedTorchEmbeddingBag
    return _QuantizedTorchEmbeddingBag


_QuantizedTorchEmbeddingBag = None


#: Why convert() leaves the embedding modules to torch on an Arm CPU (see arm_unmeasured)
ARM_REASON = ("on an Arm CPU no route of ours has been timed against PyTorch's own kernels yet, "
              "so torch's stays (PERFKERNELS_ARM_CONVERT=1 swaps anyway; dtype= and bits= "
              "convert as asked)")

#: TorchRec's collections that convert() swaps whole
_TORCHREC_COLLECTIONS = ("EmbeddingBagCollection", "EmbeddingCollection")


def arm_unmeasured() -> bool:
    """Whether this is an Arm CPU (aarch64), where convert() keeps torch's kernels for a plain
    conversion: perfkernels' Arm levels are tested under emulation but no route has been timed
    against PyTorch's own Arm kernels (its SVE embedding bag among them), and a conversion must
    not make a model slower.  ``PERFKERNELS_ARM_CONVERT=1`` swaps as on x86; ``dtype=`` and
    ``bits=`` (storage only our modules provide) always convert."""
    return (platform.machine().lower() in ("aarch64", "arm64")
            and os.environ.get("PERFKERNELS_ARM_CONVERT", "") != "1")


def _swaps_a_kernel(module: torch.nn.Module) -> bool:
    """Whether convert() would swap ``module`` for a module of ours running our kernels."""
    cls = type(module)
    if cls.__module__.startswith("torchrec."):
        return cls.__name__ in _TORCHREC_COLLECTIONS
    return cls in (torch.nn.EmbeddingBag, torch.nn.Embedding, _torch_ao_embedding_bag(),
                   _torch_ao_embedding())


def _swap_one(name: str, module: torch.nn.Module, dtype: Optional[torch.dtype],
              bits: Optional[int], report: ConversionReport, placement: str = "auto"
              ) -> Optional[torch.nn.Module]:
    """Our replacement for one module, or None (with the reason in the report) to leave it."""
    from ._quantized import QuantizedEmbeddingBag
    kind = type(module).__name__
    if (bits is None and dtype in (None, torch.float32) and _swaps_a_kernel(module)
            and arm_unmeasured()):
        report.skipped.append((name, kind, ARM_REASON))
        return None
    if type(module).__module__.startswith("torchrec."):   # TorchRec's collections, whole
        from ._torchrec_convert import swap as swap_torchrec
        return swap_torchrec(name, module, bits, report)
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
            new = _quantized_bag_class().from_float(module, bits=bits, placement=placement)
            report.swapped.append((name, kind, "QuantizedEmbeddingBag", f"{bits}-bit rows"))
            return new
        new = EmbeddingBag.from_torch(module)     # (dtype= and placement: _Swapper)
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
    if isinstance(module, (EmbeddingBag, Embedding)) and (bits is not None
                                                          or dtype not in (None, torch.float32)):
        return _swap_ours(name, module, dtype, bits, report, placement)
    if isinstance(module, torch.nn.Embedding) and not isinstance(module, Embedding):
        report.skipped.append((name, kind, "a subclass of torch.nn.Embedding may override "
                               "forward; only the exact class is swapped"))
    if isinstance(module, torch.nn.EmbeddingBag) and not isinstance(module, EmbeddingBag):
        report.skipped.append((name, kind, "a subclass of torch.nn.EmbeddingBag may override "
                               "forward; only the exact class is swapped"))
    return None


def _swap_ours(name: str, module: torch.nn.Module, dtype: Optional[torch.dtype],
               bits: Optional[int], report: ConversionReport, placement: str
               ) -> Optional[torch.nn.Module]:
    """With ``bits=``, perfkernels' own float EmbeddingBag / Embedding (a collection's tables
    too) quantized row-wise as torch's would be; with ``dtype=``, left (the report says how)."""
    from ._quantized import QuantizedEmbeddingBag
    from ._quantized_embedding import QuantizedEmbedding
    kind = type(module).__name__
    weight = module._parameters.get("weight")
    if weight is None or not weight.dtype.is_floating_point:
        return None
    if bits is None:
        if weight.dtype is not dtype:
            report.skipped.append((name, kind, f"already perfkernels' module: dtype= converts "
                                   f"torch's tables; store this one in {dtype} with "
                                   f"module.weight.data = module.weight.data.to({dtype})"))
        return None
    bag = isinstance(module, EmbeddingBag)
    reason = (unsupported_reason(mode=module.mode, max_norm=module.max_norm,
                                 scale_grad_by_freq=module.scale_grad_by_freq,
                                 dtype=weight.dtype) if bag else
              (None if module.max_norm is None and not module.scale_grad_by_freq else
               "max_norm / scale_grad_by_freq change the table at lookup"))
    if reason is not None:
        report.skipped.append((name, kind, reason))
        return None
    target = QuantizedEmbeddingBag if bag else QuantizedEmbedding
    new = target.from_float(module, bits=bits, placement=placement)
    out = getattr(module, "output_dtype", None) or weight.dtype
    new.output_dtype = None if out is torch.float32 else out
    note = f"{bits}-bit rows"
    if getattr(module, "fused_optimizer", None) is not None:
        note += "; its fused optimizer dropped (quantized rows are not trained)"
    report.swapped.append((name, kind, target.__name__, note))
    new.train(module.training)
    return new


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
    new = Embedding.from_torch(module)        # (placement: _Swapper)
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
        accumulate in float32 and return the model's original dtype (after ``model.half()``,
        ``.double()``, ``.to(dtype)``: the new one, as a stock table's would).  With
        ``inplace=True`` the table stays the same Parameter object (as after ``module.half()``:
        an optimizer built before keeps updating it); with ``inplace=False`` it is a new
        Parameter, and a warning names the tables whose old Parameter something outside the
        models still holds (an optimizer built before convert() would update those).
    bits : 8, 4 or 2, optional
        Quantize float tables row-wise to this many bits (torch's ``embedding_bag_*_prepack``
        layout, like ``torch.ao.quantization`` with a float_qparams weight-only config); the
        result is an inference table (no gradient) that answers as the float module did (its
        output dtype, torch's exceptions).  Works on ``meta`` models.  Tables tied to one
        Parameter stay tied under ``dtype=`` and ``bits=`` (one converted Parameter, one packed
        table); a table tied to a module that would not be converted alike (a ``Linear``, or an
        ``Embedding`` under ``dtype=``) keeps its dtype, and the report says so.
    inplace : bool
        False (default): return a new module tree and leave ``model`` as it was; parameters and
        buffers are shared, never copied (the new EmbeddingBags hold the same weight Parameter,
        keep ``sparse`` and train/eval mode).  True: swap inside ``model``.  Hooks move with the
        swapped modules, and their handles keep working.
    verbose : bool
        Print the report.
    placement : "auto", "hugepage" or "keep"
        Where the swapped modules' tables live: ``"auto"`` (default) moves tables of 2 MiB and
        more into memory perfkernels places for gathers (2 MiB-aligned, huge pages requested
        before the first touch; :func:`perfkernels.torch.place`), ``"hugepage"`` moves every
        table, ``"keep"`` none.  A float table keeps its Parameter object (its storage moves), so
        with ``inplace=False`` the original model, which shares the Parameter, reads the moved
        storage too.  A table whose storage something else uses stays where it is: shared
        memory (``share_memory()``), memory torch did not allocate (``torch.from_numpy``, a
        NumPy memmap, ``torch.load(mmap=True)``), or a storage another tensor also uses (a view,
        a detached alias, another Parameter); ``last_report().kept_in_place`` says which and
        why, and :func:`perfkernels.torch.place` moves them when asked explicitly.

    Returns
    -------
    The converted model.  ``perfkernels.torch.last_report()`` (and the log at INFO level on the
    ``perfkernels.torch`` logger) says what was swapped, and what was skipped and why.

    Modules that call ``torch.nn.functional.embedding_bag`` themselves are not swapped: wrap
    their calls in :func:`route_functional`.

    Raises
    ------
    ValueError
        ``dtype`` not None, float32, float16 or bfloat16; ``bits`` not None, 8, 4 or 2.

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> model = torch.nn.ModuleDict({"user": torch.nn.EmbeddingBag(1000, 16, mode="sum")})
    >>> fast = pkt.convert(model)
    >>> type(fast["user"]).__module__, fast["user"].weight is model["user"].weight
    ('perfkernels.torch._embedding_bag', True)
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
    original, memo = model, None
    if not inplace:
        # Share every parameter and buffer: only the module objects are new.
        memo = {id(t): t for t in (*model.parameters(), *model.buffers())}
        model = copy.deepcopy(model, memo)
    report = ConversionReport()
    swap = _Swapper(model, dtype, bits, report, placement, inplace)
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
    if (any(type(m).__module__.startswith("torchrec.") for m in model.modules())
            and not (bits is None and dtype in (None, torch.float32) and arm_unmeasured())):
        from ._torchrec_convert import convert_float_collections
        model = convert_float_collections(model, report)
    swap.warn_replaced(model, original, memo)
    for entry in report.swapped:
        log.info("swapped %s: %s -> %s (%s)", *entry)
    for entry in report.skipped:
        log.info("skipped %s: %s: %s", *entry)
    for entry in report.kept_in_place:
        log.info("not placed %s: %s", *entry)
    _last_report = report
    if verbose:
        print(report)
    return model


_last_report: Optional[ConversionReport] = None


def last_report() -> Optional[ConversionReport]:
    """The report of the latest :func:`convert` call in this process (None before the first).

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> _ = pkt.convert(torch.nn.Sequential(torch.nn.EmbeddingBag(10, 4), torch.nn.Linear(4, 1)))
    >>> report = pkt.last_report()
    >>> [name for name, *_ in report.swapped], report.skipped
    (['0'], [])
    """
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
    exceptions (see :class:`~perfkernels.torch.EmbeddingBag`).

    Raises
    ------
    IndexOutOfRangeError
        An index outside the table (an ``IndexError`` and a ``RuntimeError``), with torch's message.
    RuntimeError, ValueError, TypeError
        Whatever ``torch.nn.functional.embedding_bag`` raises for the same bad input, with torch's
        message.

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> weight = torch.arange(6.0).view(3, 2)
    >>> pkt.embedding_bag(torch.tensor([0, 2, 1]), weight, torch.tensor([0, 2]), mode="sum")
    tensor([[4., 6.],
            [2., 3.]])
    """
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

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> weight = torch.arange(6.0).view(3, 2)
    >>> with pkt.route_functional():       # calls in the block go to perfkernels' kernels
    ...     torch.nn.functional.embedding_bag(torch.tensor([0, 2]), weight, torch.tensor([0]))
    tensor([[2., 3.]])
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
