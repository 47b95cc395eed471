"""Table placement for the torch modules: a table's Parameter (or buffer) keeps its identity while
its storage moves to memory placed by :mod:`perfkernels._placement` (2 MiB-aligned, huge pages
requested before the first touch, rows on 64-byte lines).

The tensor object is the same before and after (``tensor.data`` is replaced), so an optimizer
already holding the Parameter keeps working, ``state_dict`` saves and loads the values as before
(loading copies into the placed storage), and ``torch.from_numpy`` keeps the placed memory alive
as long as the tensor uses it.  Rows are not padded here: a padded stride would make the weight a
non-contiguous tensor, which torch's own ops would copy; tables whose rows are a whole number of
lines (float32 D a multiple of 16, float16 D a multiple of 32) have every row on its own lines.
A deep copy of a module (``copy.deepcopy``) is a copy in torch's ordinary memory.

Placement never cuts a table off memory that something else reads or writes: a storage in shared
memory, memory torch did not allocate (a NumPy array, a memmap) and, where :func:`convert` asks,
a storage another tensor also uses stay where they are (:func:`sharing_reason` says why), unless
placement is asked for explicitly with :func:`place`.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import _placement
from .._placement import check_placement, placement_of  # noqa: F401  (re-exported)

#: module attributes holding tables (parameters or buffers) that placement moves
TABLE_ATTRIBUTES = ("weight", "packed_weight", "momentum1", "momentum2")


#: torch's count of the references to a storage (each tensor on it holds one), if it has one
_storage_use_count = getattr(torch._C, "_storage_Use_Count", None)


def sharing_reason(t: Tensor, aliases: bool = True) -> Optional[str]:
    """Why moving ``t``'s storage would cut it off memory that something else reads or writes
    (None: nothing else does, as far as can be told).

    Shared memory (``share_memory_()``: other processes hold it), memory torch did not allocate
    (``torch.from_numpy``, ``np.memmap``, ``torch.frombuffer``, DLPack, ``torch.load(mmap=True)``:
    its owner reads it) and, with ``aliases``, a storage that another tensor also uses (a view, a
    detached alias, another Parameter, a kept ``state_dict``: each holds a reference to the
    storage, which torch counts).  A table perfkernels placed is its own memory."""
    if t.device.type != "cpu" or t.layout is not torch.strided or t.is_quantized:
        return None
    if t.is_shared():
        return ("its storage is in shared memory (share_memory_()): the processes sharing it "
                "would not see the moved table")
    storage = t.untyped_storage()
    if not storage.resizable() and placement_of(t) is None:
        return ("its storage is memory torch did not allocate (torch.from_numpy, a NumPy memmap, "
                "torch.frombuffer, torch.load(mmap=True)): its owner would not see the moved table")
    # the references: this tensor's, and `storage`'s (the Python object just made)
    if aliases and _storage_use_count is not None and _storage_use_count(storage._cdata) > 2:
        return ("another tensor uses its storage (a view, a detached alias, another Parameter, a "
                "kept state_dict): it would not see the moved table")
    return None


def placed_tensor(t: Tensor, placement: str = "auto") -> Optional[Tensor]:
    """A CPU tensor with ``t``'s values, dtype and shape in placed memory, or None when ``t``
    already satisfies ``placement`` (or is not a dense CPU tensor, or ``placement="keep"``)."""
    check_placement(placement)
    if (placement == "keep" or t.device.type != "cpu" or t.layout is not torch.strided
            or t.dim() == 0 or not t.is_contiguous() or t.is_quantized):
        return None
    if _placement.is_placed(t, placement):
        return None
    rows = t.shape[0]
    row_bytes = t[0].numel() * t.element_size() if rows else 0
    raw, record = _placement._allocate(rows, row_bytes, row_bytes, placement, None)
    out = torch.from_numpy(raw.reshape(-1)).view(t.dtype).view(t.shape)
    with torch.no_grad():
        out.copy_(t.detach())                 # the first touch
    _placement._confirm_huge_pages(record)
    return out


def place_tensor_attr(module: torch.nn.Module, name: str, placement: str = "auto",
                      keep_shared: Optional[bool] = None) -> Optional[str]:
    """Move ``module.<name>`` (a parameter or buffer, if present) into placed memory in place:
    the same tensor object, new storage.

    ``keep_shared``: None (explicit placement, :func:`place`) moves any storage; False keeps
    shared memory and memory torch did not allocate where it is (the constructors: stock torch
    shares a ``_weight`` / ``from_pretrained`` tensor's memory); True keeps also a storage
    another tensor uses (:func:`convert`).  Returns why a table was kept (None: placed, or
    nothing to do)."""
    t = module._parameters.get(name)
    if t is None:
        t = module._buffers.get(name)
    if t is None or placement == "keep":
        return None
    if keep_shared is not None and not _placement.is_placed(t, placement):
        reason = sharing_reason(t, aliases=keep_shared)
        if reason is not None:
            return reason
    new = placed_tensor(t, placement)
    if new is not None:
        t.data = new
    return None


def place_state_like_weight(module: torch.nn.Module) -> None:
    """Place a fused optimizer's state ``momentum1`` when the module's weight is placed (the
    state is read and written at the same rows as the table)."""
    if placement_of(module.weight) is not None:
        place_tensor_attr(module, "momentum1", "auto")
        place_tensor_attr(module, "momentum2", "auto")


#: The module classes whose tables :func:`place` places: torch's own embedding modules, and
#: those of perfkernels that are not their subclasses (each registers itself with
#: :func:`register_table_module` where it is defined, so this module imports none of them).
TABLE_MODULES: list[type] = [torch.nn.EmbeddingBag, torch.nn.Embedding]


def register_table_module(cls: type) -> type:
    """Let :func:`place` place the tables of ``cls``'s instances; returns ``cls`` (a decorator)."""
    if cls not in TABLE_MODULES:
        TABLE_MODULES.append(cls)
    return cls


def place(module: torch.nn.Module, placement: str = "auto") -> torch.nn.Module:
    """Place the tables of every embedding module in ``module`` (perfkernels' modules and torch's
    own ``nn.EmbeddingBag`` / ``nn.Embedding``): their ``weight``, ``packed_weight`` and fused
    optimizer state ``momentum1``.  Returns ``module``.  ``placement="hugepage"`` on a stock
    torch model gives its tables what ``THP_MEM_ALLOC_ENABLE=1`` gives torch's allocations
    (2 MiB alignment and ``MADV_HUGEPAGE``), for comparisons on the same placement.

    Raises
    ------
    ValueError
        ``placement`` not ``"auto"``, ``"hugepage"`` or ``"keep"``.

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> model = pkt.place(torch.nn.Sequential(torch.nn.EmbeddingBag(1000, 16)), "hugepage")
    >>> [name for name, _ in pkt.placement_report(model)]
    ['0.weight']
    """
    check_placement(placement)
    kinds = tuple(TABLE_MODULES)
    for m in module.modules():
        if isinstance(m, kinds):
            for name in TABLE_ATTRIBUTES:
                place_tensor_attr(m, name, placement)
    return module


def placement_report(module: torch.nn.Module) -> list[tuple[str, str]]:
    """``(name, description)`` of every table in ``module``: its size, the bytes on huge pages
    now (``AnonHugePages`` in ``/proc/self/smaps``) and whether perfkernels placed it.

    Raises
    ------
    AttributeError
        ``module`` not a ``torch.nn.Module`` (it has no ``named_parameters``).

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> model = pkt.place(torch.nn.Sequential(torch.nn.EmbeddingBag(1000, 16)), "hugepage")
    >>> [name for name, _ in pkt.placement_report(model)]
    ['0.weight']
    """
    ranges = _placement.smaps_huge_ranges()
    out = []
    for name, t in (*module.named_parameters(), *module.named_buffers()):
        if name.rsplit(".", 1)[-1] in TABLE_ATTRIBUTES and t.device.type == "cpu" and t.dim() == 2:
            out.append((name, _placement.describe(t, ranges)))
    return out


def huge_page_share(tables: list[Tensor]) -> tuple[int, int]:
    """``(bytes on huge pages, bytes)`` summed over ``tables`` (one smaps read for all)."""
    ranges = _placement.smaps_huge_ranges()
    total = sum(t.numel() * t.element_size() for t in tables)
    huge = sum(_placement.anon_huge_bytes(t.data_ptr(), t.numel() * t.element_size(), ranges)
               for t in tables)
    return huge, total
