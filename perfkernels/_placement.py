"""Table placement: where a table's rows live in memory, chosen and checked by perfkernels.

A gather of random rows from a large table pays for every cache line and every page it touches.
Two properties of the table's memory decide that cost, and neither is under the caller's control
with an ordinary allocation:

* **Rows start on a 64-byte line.**  NumPy's large arrays start 16 bytes past a line, so a
  256-byte row spans 5 lines instead of 4.  Tables placed here start on a 2 MiB boundary, and a
  float table's row stride is padded to a whole number of lines when some rows would otherwise
  span one line more than their size needs (and the padding costs at most a quarter more memory).
  The array keeps its logical ``[rows, D]`` shape; only its row stride changes.  Byte tables
  (row-wise quantized rows) are never padded: the quantized kernels read them contiguous.
* **Huge pages.**  With 4 KiB pages every row of a large table is a TLB miss and a page walk;
  with 2 MiB transparent huge pages the walks mostly hit the paging-structure caches.  The memory
  is mapped privately, 2 MiB-aligned, and ``madvise(MADV_HUGEPAGE)`` is applied before the first
  touch, so the first-touch faults allocate huge pages.  When that gave fewer huge pages than
  asked (fragmented memory), ``MADV_COLLAPSE`` (Linux 6.1+) is tried; what was obtained and why
  not more is recorded in the table's :class:`Placement`.  A machine whose transparent huge pages
  are ``never`` gets plain pages and a one-time :class:`PlacementWarning`, never an error.

``placement=``:

``"auto"`` (default)
    Tables of at least :data:`AUTO_MIN_BYTES` (one huge page) on huge pages; smaller ones in
    ordinary memory whose rows start on a 64-byte line.
``"hugepage"``
    Huge pages whatever the size (a small table then occupies a whole 2 MiB page).
``"keep"``
    No placement: :func:`as_table` returns the array unchanged, :func:`empty_table` is
    ``numpy.empty``.

``placement_of(array)`` returns the record of a placed table (or of a view of it, or of a torch
tensor on it); ``Placement.anon_huge_bytes()`` reads ``/proc/self/smaps`` now, to confirm that the
kernel really backs the table with huge pages.
"""
from __future__ import annotations

import bisect
import math
import mmap
import os
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

PLACEMENTS = ("auto", "hugepage", "keep")
HUGE_PAGE = 2 << 20
LINE = 64
#: "auto" puts tables of at least this many bytes on huge pages
AUTO_MIN_BYTES = HUGE_PAGE
#: a padded row stride may add at most this fraction of the table's size
MAX_PADDING = 0.25
THP_DIR = "/sys/kernel/mm/transparent_hugepage"
_MADV_COLLAPSE = getattr(mmap, "MADV_COLLAPSE", 25)   # Linux 6.1; Python's mmap lacks it


class PlacementWarning(RuntimeWarning):
    """Huge pages were asked for but this machine cannot give them (THP ``never``)."""


@dataclass
class Placement:
    """Where one placed table lives and what it got.

    ``address``/``nbytes``: the table's first byte and its size in bytes (rows x row stride);
    ``row_bytes``/``row_stride``: bytes of one row's data and from one row to the next;
    ``huge_pages``: how huge pages were requested (``"MADV_HUGEPAGE"``,
    ``"MADV_HUGEPAGE+MADV_COLLAPSE"`` or ``"none"``); ``huge_bytes``: the bytes on huge pages
    right after the first touch (None: not checked); ``reason``: why not (all) huge pages, or why
    rows are not padded to whole lines, or None.
    """
    address: int
    nbytes: int
    row_bytes: int
    row_stride: int
    huge_pages: str
    huge_bytes: Optional[int] = None
    reason: Optional[str] = None

    def anon_huge_bytes(self) -> int:
        """Bytes of this table on transparent huge pages now (``AnonHugePages`` of the mapping
        in ``/proc/self/smaps``, capped at the table's size)."""
        return anon_huge_bytes(self.address, self.nbytes)


# ----------------------------------------------------------------------------- the THP mode

def thp_mode() -> dict[str, Optional[str]]:
    """The transparent-huge-page settings: ``{"enabled": "madvise", "defrag": "madvise"}`` (the
    bracketed choice of each file under ``/sys/kernel/mm/transparent_hugepage``; None where the
    file is missing, e.g. a kernel without THP or a non-Linux system)."""
    out: dict[str, Optional[str]] = {}
    for name in ("enabled", "defrag"):
        try:
            with open(os.path.join(THP_DIR, name)) as f:
                text = f.read()
        except OSError:
            out[name] = None
            continue
        chosen = [w[1:-1] for w in text.split() if w.startswith("[") and w.endswith("]")]
        out[name] = chosen[0] if chosen else text.strip()
    return out


def _no_huge_pages_reason() -> Optional[str]:
    """Why this machine gives no huge pages on request, or None when it may."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return "this system has no MADV_HUGEPAGE"
    enabled = thp_mode()["enabled"]
    if enabled is None:
        return f"no transparent huge pages ({THP_DIR}/enabled is missing)"
    if enabled == "never":
        return f"transparent huge pages are 'never' ({THP_DIR}/enabled)"
    return None


_warned = False


def _warn_once(reason: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"perfkernels: tables get plain 4 KiB pages: {reason}", PlacementWarning,
                      stacklevel=4)


# ----------------------------------------------------------------------------- smaps

def smaps_huge_ranges() -> list[tuple[int, int, int]]:
    """``(start, end, AnonHugePages bytes)`` of every mapping of this process (``/proc/self/smaps``;
    empty where it does not exist)."""
    ranges = []
    try:
        with open("/proc/self/smaps") as f:
            lo = hi = None
            for line in f:
                first = line.split(None, 1)[0]
                if "-" in first and not first.endswith(":"):
                    a, b = first.split("-")
                    lo, hi = int(a, 16), int(b, 16)
                elif first == "AnonHugePages:" and lo is not None:
                    ranges.append((lo, hi, int(line.split()[1]) * 1024))
    except OSError:
        return []
    return ranges


def anon_huge_bytes(address: int, nbytes: int,
                    ranges: Optional[list[tuple[int, int, int]]] = None) -> int:
    """Bytes on huge pages of the mappings overlapping ``[address, address + nbytes)``, capped at
    ``nbytes`` (a mapping's count is per mapping, so memory of a neighbour sharing it may count;
    placed tables have mappings of their own).  ``ranges``: a :func:`smaps_huge_ranges` result to
    reuse for many tables."""
    if ranges is None:
        ranges = smaps_huge_ranges()
    end = address + nbytes
    total = sum(huge for lo, hi, huge in ranges if lo < end and address < hi)
    return min(total, nbytes)


# ----------------------------------------------------------------------------- the registry

_lock = threading.Lock()
_starts: list[int] = []                       # sorted start addresses of live placed regions
_regions: dict[int, Placement] = {}


def _register(owner: Any, placement: Placement) -> None:
    start = placement.address
    with _lock:
        bisect.insort(_starts, start)
        _regions[start] = placement
    weakref.finalize(owner, _unregister, start)


def _unregister(start: int) -> None:
    with _lock:
        i = bisect.bisect_left(_starts, start)
        if i < len(_starts) and _starts[i] == start:
            del _starts[i]
            _regions.pop(start, None)


def placement_of(table: Any) -> Optional[Placement]:
    """The :class:`Placement` of the placed table that ``table`` (an ndarray, a view of one, a
    torch tensor, or an address) lies in; None for memory perfkernels did not place.

    It raises nothing: memory it does not know gives None.

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> p = perfkernels.placement_of(perfkernels.empty_table(100_000, 64, np.float32))
    >>> type(p).__name__
    'Placement'
    """
    if isinstance(table, int):
        address = table
    elif hasattr(table, "data_ptr"):
        address = table.data_ptr()
    else:
        address = np.asarray(table).__array_interface__["data"][0]
    with _lock:
        i = bisect.bisect_right(_starts, address) - 1
        if i < 0:
            return None
        p = _regions[_starts[i]]
    return p if address < p.address + max(p.nbytes, 1) else None


# ----------------------------------------------------------------------------- allocation

def check_placement(placement: str) -> str:
    """``placement`` if it is one of :data:`PLACEMENTS`, else the ValueError naming it."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(map(repr, PLACEMENTS))}; "
                         f"got {placement!r}")
    return placement


def padded_row_stride(row_bytes: int, align: int) -> tuple[int, Optional[str]]:
    """The row stride for rows of ``row_bytes`` on a line-aligned table whose rows must start on
    multiples of ``align`` bytes, and why it is not padded (None when every row already spans the
    fewest lines, or when it is padded).

    A row starting ``r`` bytes into a line spans ``ceil((r + row_bytes) / 64)`` lines; unpadded,
    row i starts at ``i * row_bytes mod 64``.  The stride is rounded up to a multiple of 64 only
    when some row would span more lines than ``ceil(row_bytes / 64)`` and the padding adds at most
    :data:`MAX_PADDING` to the table."""
    fewest = -(-row_bytes // LINE)
    step = math.gcd(row_bytes, LINE)
    worst = max(-(-(r + row_bytes) // LINE) for r in range(0, LINE, step))
    if worst == fewest or row_bytes == 0:
        return row_bytes, None
    padded = fewest * LINE
    if padded % align or (padded - row_bytes) > MAX_PADDING * row_bytes:
        return row_bytes, (f"rows of {row_bytes} bytes are not padded to {padded} (more than "
                           f"{MAX_PADDING:.0%} more memory): some span {worst} lines, not {fewest}")
    return padded, None


def _map(nbytes: int) -> tuple[mmap.mmap, np.ndarray]:
    """A private anonymous mapping of at least ``nbytes`` rounded to huge pages, and a uint8
    view of it that starts on a 2 MiB boundary (the slack before it is never touched)."""
    size = max(-(-nbytes // HUGE_PAGE), 1) * HUGE_PAGE
    m = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE)
    whole = np.frombuffer(m, np.uint8)
    offset = (-whole.__array_interface__["data"][0]) % HUGE_PAGE
    return m, whole[offset:offset + size]


def _allocate(rows: int, row_bytes: int, row_stride: int, placement: str,
              pad_reason: Optional[str]) -> tuple[np.ndarray, Optional[Placement]]:
    """``[rows, row_stride]`` uint8 memory placed as ``placement`` asks, untouched, and its
    record (None for ordinary memory)."""
    nbytes = rows * row_stride
    if placement == "hugepage" or nbytes >= AUTO_MIN_BYTES:
        m, region = _map(nbytes)
        why = _no_huge_pages_reason()
        how = "none"
        if why is None:
            offset = region.__array_interface__["data"][0] - np.frombuffer(
                m, np.uint8).__array_interface__["data"][0]
            try:
                m.madvise(mmap.MADV_HUGEPAGE, offset, region.size)
                how = "MADV_HUGEPAGE"
            except OSError as exc:
                why = f"madvise(MADV_HUGEPAGE) failed: {exc}"
        if why is not None:
            _warn_once(why)
        record = Placement(region.__array_interface__["data"][0], nbytes, row_bytes, row_stride,
                           how, reason=why if why else pad_reason)
        record._mmap = weakref.ref(m)       # for MADV_COLLAPSE after the first touch
        _register(m, record)
        return region[:nbytes].reshape(rows, row_stride), record
    # small: ordinary memory, rows on lines
    raw = np.empty(nbytes + LINE, np.uint8)
    offset = (-raw.__array_interface__["data"][0]) % LINE
    return raw[offset:offset + nbytes].reshape(rows, row_stride), None


def _confirm_huge_pages(record: Optional[Placement]) -> None:
    """After the first touch: record the bytes on huge pages, trying MADV_COLLAPSE when the
    faults gave fewer than asked."""
    if record is None or record.huge_pages == "none":
        return
    want = (record.nbytes // HUGE_PAGE) * HUGE_PAGE      # whole huge pages inside the table
    got = record.anon_huge_bytes()
    if got < want:
        m = record._mmap()
        base = np.frombuffer(m, np.uint8).__array_interface__["data"][0]
        try:
            m.madvise(_MADV_COLLAPSE, record.address - base, -(-record.nbytes // HUGE_PAGE)
                      * HUGE_PAGE)
            record.huge_pages = "MADV_HUGEPAGE+MADV_COLLAPSE"
            got = record.anon_huge_bytes()
        except OSError as exc:
            record.reason = (f"the first touch got {got} of {want} bytes on huge pages; "
                             f"MADV_COLLAPSE failed: {exc}")
        if got < want and record.reason is None:
            record.reason = f"{got} of {want} bytes on huge pages after MADV_COLLAPSE"
    record.huge_bytes = got


def _table_layout(rows: int, dim: int, dtype: np.dtype, pad: bool
                  ) -> tuple[int, int, Optional[str]]:
    if rows < 0 or dim < 0:
        raise ValueError(f"a table needs rows >= 0 and dim >= 0; got rows={rows}, dim={dim}")
    row_bytes = dim * dtype.itemsize
    if not pad:
        return row_bytes, row_bytes, None
    stride, why = padded_row_stride(row_bytes, dtype.itemsize)
    return row_bytes, stride, why


def _pads(dtype: np.dtype) -> bool:
    """Float tables may get a padded row stride (the float bag kernels take any row stride);
    byte tables (packed quantized rows) stay contiguous."""
    return dtype.kind == "f" or dtype.name == "bfloat16"


def empty_table(rows: int, dim: int, dtype: Any = np.float32, placement: str = "auto"
                ) -> np.ndarray:
    """A ``[rows, dim]`` table placed for gathers (see the module docstring), zero-filled.

    Memory is touched here (the zeros), so huge pages are allocated and checked now; the record
    is :func:`placement_of` the result.  A float table's row stride may be padded to whole lines
    (``result.strides[0]``); its shape is ``[rows, dim]`` all the same.  With
    ``placement="keep"`` it is ``numpy.zeros``.

    Raises
    ------
    ValueError
        ``rows`` or ``dim`` negative, or ``placement`` not ``"auto"``, ``"hugepage"`` or ``"keep"``.

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> table = perfkernels.empty_table(100_000, 64, np.float32)
    >>> table.shape, table.dtype, float(table.max())
    ((100000, 64), dtype('float32'), 0.0)
    """
    dtype = np.dtype(dtype)
    check_placement(placement)
    if placement == "keep":
        return np.zeros((rows, dim), dtype)
    row_bytes, stride, why = _table_layout(int(rows), int(dim), dtype, _pads(dtype))
    raw, record = _allocate(int(rows), row_bytes, stride, placement, why)
    raw.fill(0)      # the first touch (a mapping reads as zeros, but is not yet backed)
    _confirm_huge_pages(record)
    return raw[:, :row_bytes].view(dtype)


def as_table(array: Any, placement: str = "auto") -> np.ndarray:
    """``array`` (2-D) in placed memory: a placed copy, or ``array`` itself when it is already
    placed as asked (or ``placement="keep"``).  Values and dtype are unchanged.

    Raises
    ------
    ValueError
        ``array`` not 2-D, or ``placement`` not ``"auto"``, ``"hugepage"`` or ``"keep"``.

    Examples
    --------
    >>> import numpy as np, perfkernels
    >>> table = perfkernels.as_table(np.ones((100_000, 64), np.float32))    # a placed copy
    >>> table.shape, bool((table == 1).all())
    ((100000, 64), True)
    """
    check_placement(placement)
    a = np.asarray(array)
    if placement == "keep":
        return a
    if a.ndim != 2:
        raise ValueError(f"a table must be 2-D [rows, D]; got shape {a.shape}")
    if is_placed(a, placement):
        return a
    row_bytes, stride, why = _table_layout(a.shape[0], a.shape[1], a.dtype, _pads(a.dtype))
    raw, record = _allocate(a.shape[0], row_bytes, stride, placement, why)
    out = raw[:, :row_bytes].view(a.dtype)
    np.copyto(out, a)          # the first touch
    _confirm_huge_pages(record)
    return out


def is_placed(a: Any, placement: str = "auto") -> bool:
    """Whether ``a`` (an ndarray or tensor) already satisfies ``placement``: a placed table's
    memory for ``"hugepage"`` (and for ``"auto"`` above :data:`AUTO_MIN_BYTES`), rows on 64-byte
    lines otherwise; always for ``"keep"``."""
    if placement == "keep":
        return True
    if hasattr(a, "data_ptr"):
        address, nbytes = a.data_ptr(), a.numel() * a.element_size()
    else:
        address, nbytes = a.__array_interface__["data"][0], a.nbytes
    if placement == "hugepage" or nbytes >= AUTO_MIN_BYTES:
        return placement_of(address) is not None
    return address % LINE == 0


def describe(table: Any, ranges: Optional[list[tuple[int, int, int]]] = None) -> str:
    """One line on where ``table`` lives: placed or not, huge-page bytes now, row stride."""
    if hasattr(table, "data_ptr"):
        address, nbytes = table.data_ptr(), table.numel() * table.element_size()
    else:
        address, nbytes = table.__array_interface__["data"][0], table.nbytes
    huge = anon_huge_bytes(address, nbytes, ranges)
    p = placement_of(address)
    where = (f"placed ({p.huge_pages}, row stride {p.row_stride} B)" if p is not None else
             f"not placed (address mod 64 = {address % LINE})")
    line = f"{nbytes / 2**20:.1f} MiB, AnonHugePages {huge / 2**20:.1f} MiB, {where}"
    if p is not None and p.reason:
        line += f"; {p.reason}"
    return line


def info_lines() -> list[str]:
    """What ``python -m perfkernels info`` says about placement: the THP mode, and whether a
    4 MiB test table placed now really got huge pages."""
    mode = thp_mode()
    lines = [f"  THP           enabled={mode['enabled']}, defrag={mode['defrag']} ({THP_DIR})"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlacementWarning)
        t = empty_table(2 * HUGE_PAGE // 256, 64, np.float32, "hugepage")
    p = placement_of(t)
    got = p.anon_huge_bytes()
    verdict = "huge pages" if got >= t.nbytes else ("partly huge pages" if got else "4 KiB pages")
    lines.append(f"  placement     a 4 MiB test table got {got >> 20} MiB AnonHugePages: "
                 f"{verdict} [{p.huge_pages}]" + (f"; {p.reason}" if p.reason else ""))
    return lines
