"""Production-size tables: built block by block (never whole in float32) and stored as files that
load by ``mmap``.

**Build.**  A *row source* yields float rows a block at a time: a seeded initialiser
(:class:`SeededInit`), a 2-D array or a float32/float16 ``.npy`` file read by ``mmap``
(:class:`ArraySource`, :func:`npy_source`), a torch tensor, e.g. a checkpoint's tensor loaded with
``torch.load(mmap=True)`` (:class:`TensorSource`, :func:`checkpoint_source`), or a callback
``fn(start, stop) -> rows`` (:class:`CallbackSource`).  :func:`build_table` quantizes (or
converts) each block into its place in the output table, so the memory the build needs is the
output plus ``threads`` blocks of ``block_rows`` rows; the bytes are those of quantizing (or
converting) the whole table at once.  :func:`build_tables` builds a collection of them under one
progress bar; :func:`build_table_file` builds straight into a table file.

**Store.**  :func:`save_table` writes a table file: a fixed header (below), then the table's rows
back to back at an offset aligned to 4 KiB (tables under 2 MiB) or 2 MiB (so the kernel can map
the rows with huge pages from the page cache).  The save is atomic: a temporary file in the same
directory, ``fsync``, ``rename``, ``fsync`` of the directory; a crash leaves either the old file
or the new one under the name.  :func:`load_table` maps the rows (no read, no parse, no copy):
``mode="r"`` is a read-only shared mapping (``MAP_SHARED``, ``PROT_READ``; the array is not
writeable), ``mode="c"`` a copy-on-write private mapping (writes go to private copies of the
pages touched, never to the file).  Either way every process mapping one file reads the same
pages of the page cache.

The header (little-endian, :data:`HEADER_BYTES` bytes at offset 0):

======  =====  ====================================================================
offset  type   field
======  =====  ====================================================================
0       8s     magic ``b"PKTABLE\\0"``
8       u32    format version (:data:`FORMAT_VERSION`)
12      u32    format code: 32 float32, 16 float16, 17 bfloat16, 8/4/2 row-wise quantized
16      u64    rows
24      u64    D (columns; of a quantized table, the float columns its rows encode)
32      u64    row bytes
40      u64    data offset (a multiple of 4096)
48      u64    data bytes (rows x row bytes)
56      u32    CRC-32 of bytes 0-55
======  =====  ====================================================================

A quantized row is what :func:`perfkernels.quantize_rowwise` makes of it (codes, then scale and
bias); a float row is D values.
"""
from __future__ import annotations

import concurrent.futures
import mmap
import os
import struct
import sys
import tempfile
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional, Union

import numpy as np

from . import _placement
from .families.convert._convert import BFLOAT16, float_to_bfloat16, float_to_half
from .families.quantized._quantized import quantize_rowwise
from .families.quantized.layout import packed_row_bytes

__all__ = [
    "ArraySource", "CallbackSource", "SeededInit", "TensorSource", "TableFileError", "TableInfo",
    "build_table", "build_table_file", "build_tables", "checkpoint_source", "load_table",
    "npy_source", "read_table_header", "save_table", "table_format", "RowSource", "FORMATS",
    "FORMAT_VERSION", "HEADER_BYTES", "INIT_CHUNK_ROWS",
]

#: table formats: row-wise quantized bit widths, and float dtypes by name
FORMATS = (8, 4, 2, "float32", "float16", "bfloat16")
_CODES = {"float32": 32, "float16": 16, "bfloat16": 17, 8: 8, 4: 4, 2: 2}
_FORMAT_OF_CODE = {v: k for k, v in _CODES.items()}
MAGIC = b"PKTABLE\0"
#: the version of the table file format this module writes and reads
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sIIQQQQQ")            # everything the CRC covers (56 bytes)
#: bytes of a table file's header (the fields and the CRC-32 that follows them)
HEADER_BYTES = _HEADER.size + 4
#: rows of a :class:`SeededInit` drawn from one random stream
INIT_CHUNK_ROWS = 4096
#: default rows of one build block (a multiple of :data:`INIT_CHUNK_ROWS`)
DEFAULT_BLOCK_ROWS = 16 * INIT_CHUNK_ROWS
_SMALL_DATA = 2 << 20                           # tables under this get a 4 KiB data offset


class TableFileError(ValueError):
    """A table file that cannot be loaded as asked: truncated, foreign, another format version,
    a damaged header, or not the shape/format the caller expects.  The message names the file."""


def table_format(fmt: Any) -> Union[int, str]:
    """``fmt`` as one of :data:`FORMATS` (8/4/2, or a float dtype: ``"float32"``, ``np.float16``,
    ``torch.bfloat16``, ...); ValueError naming it otherwise."""
    if isinstance(fmt, (int, np.integer)) and not isinstance(fmt, bool) and int(fmt) in (8, 4, 2):
        return int(fmt)
    name = str(fmt).replace("torch.", "")
    if name in ("float32", "float16", "bfloat16"):
        return name
    try:
        name = np.dtype(fmt).name
    except TypeError:
        name = None
    if name in ("float32", "float16", "bfloat16"):
        return name
    raise ValueError(f"table format must be 8, 4, 2 (row-wise quantized bits) or float32, float16, "
                     f"bfloat16; got {fmt!r}")


def _row_bytes(fmt: Union[int, str], dim: int) -> int:
    if isinstance(fmt, int):
        return packed_row_bytes(dim, fmt)
    return dim * (4 if fmt == "float32" else 2)


def _out_dtype(fmt: Union[int, str]) -> np.dtype:
    if isinstance(fmt, int):
        return np.dtype(np.uint8)
    return BFLOAT16 if fmt == "bfloat16" else np.dtype(fmt)


# ----------------------------------------------------------------------------- row sources

class RowSource:
    """What :func:`build_table` reads: ``rows``, ``dim`` and ``block(start, stop)``, the float32
    or float16 rows ``[start, stop)`` as a ``[stop - start, dim]`` array (it may be a view, valid
    until the next call from the same thread)."""
    rows: int
    dim: int

    def block(self, start: int, stop: int) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError


class SeededInit(RowSource):
    """Rows drawn at random, reproducibly and independently of the block size.

    ``dist="normal"`` (default): ``normal(mean, std)``, as ``torch.nn.EmbeddingBag`` initialises
    its weight (``normal(0, 1)``); ``dist="uniform"``: ``uniform(low, high)``, as TorchRec's
    collections do (``+-sqrt(1 / rows)``).  The values follow these distributions but are not
    torch's random stream.  The rule: rows are drawn in chunks of :data:`INIT_CHUNK_ROWS`; chunk
    ``c`` (rows ``c * 4096`` on) is ``numpy.random.Generator(numpy.random.PCG64(
    numpy.random.SeedSequence(seed, spawn_key=(c,))))``'s ``standard_normal((n, dim),
    dtype=numpy.float32)`` (``random((n, dim), dtype=float32)`` for uniform), scaled and shifted in
    float32 (``x * std + mean``; ``x * (high - low) + low``), row-major, so row ``i`` is the same
    whatever block holds it.
    """

    def __init__(self, rows: int, dim: int, seed: int = 0, *, dist: str = "normal",
                 mean: float = 0.0, std: float = 1.0, low: Optional[float] = None,
                 high: Optional[float] = None) -> None:
        self.rows, self.dim = _check_shape(rows, dim)
        if dist not in ("normal", "uniform"):
            raise ValueError(f"dist must be 'normal' or 'uniform'; got {dist!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be an int >= 0; got {seed!r}")
        self.seed, self.dist = int(seed), dist
        if dist == "uniform":
            bound = (1.0 / max(rows, 1)) ** 0.5
            low = -bound if low is None else low
            high = bound if high is None else high
            self._scale, self._shift = np.float32(high - low), np.float32(low)
        else:
            self._scale, self._shift = np.float32(std), np.float32(mean)

    def _chunk(self, c: int, n: int, out: np.ndarray) -> None:
        g = np.random.Generator(np.random.PCG64(np.random.SeedSequence(self.seed,
                                                                       spawn_key=(c,))))
        if self.dist == "normal":
            g.standard_normal(out=out[:n], dtype=np.float32)
        else:
            g.random(out=out[:n], dtype=np.float32)
        if self._scale != 1:
            np.multiply(out[:n], self._scale, out=out[:n])
        if self._shift != 0:
            np.add(out[:n], self._shift, out=out[:n])

    def block(self, start: int, stop: int) -> np.ndarray:
        start, stop = _check_range(self, start, stop)
        out = np.empty((stop - start, self.dim), np.float32)
        C = INIT_CHUNK_ROWS
        r = start
        while r < stop:
            c = r // C
            chunk_stop = min((c + 1) * C, self.rows)
            if r == c * C and chunk_stop <= stop:          # a whole chunk: straight into out
                self._chunk(c, chunk_stop - r, out[r - start:chunk_stop - start])
            else:                                           # part of a chunk: draw it, copy
                tmp = np.empty((chunk_stop - c * C, self.dim), np.float32)
                n = min(stop, chunk_stop) - c * C
                self._chunk(c, n, tmp)                      # only the rows up to what we need
                out[r - start:min(stop, chunk_stop) - start] = tmp[r - c * C:n]
            r = min(stop, chunk_stop)
        return out


class ArraySource(RowSource):
    """Rows of a 2-D float32 or float16 array (a ``numpy.memmap`` or ``np.load(mmap_mode="r")``
    result reads only the blocks asked for)."""

    def __init__(self, array: Any) -> None:
        a = np.asanyarray(array)
        if a.ndim != 2:
            raise ValueError(f"a row source array must be 2-D [rows, D]; got shape {a.shape}")
        if a.dtype not in (np.float32, np.float16):
            raise ValueError(f"a row source array must be float32 or float16; got {a.dtype}")
        self.array = a
        self.rows, self.dim = _check_shape(a.shape[0], a.shape[1])

    def block(self, start: int, stop: int) -> np.ndarray:
        start, stop = _check_range(self, start, stop)
        return np.ascontiguousarray(self.array[start:stop])


def npy_source(path: Union[str, os.PathLike]) -> ArraySource:
    """The rows of a float32/float16 ``.npy`` file, read through ``mmap`` a block at a time."""
    return ArraySource(np.load(os.fspath(path), mmap_mode="r"))


class TensorSource(RowSource):
    """Rows of a 2-D CPU torch tensor (float32 and float16 as they are, other float dtypes as
    float32), e.g. one that ``torch.load(path, mmap=True)`` maps from a checkpoint."""

    def __init__(self, tensor: Any) -> None:
        if tensor.dim() != 2:
            raise ValueError(f"a row source tensor must be 2-D [rows, D]; got shape "
                             f"{tuple(tensor.shape)}")
        if not tensor.dtype.is_floating_point:
            raise ValueError(f"a row source tensor must be floating point; got {tensor.dtype}")
        self.tensor = tensor.detach()
        self.rows, self.dim = _check_shape(tensor.shape[0], tensor.shape[1])

    def block(self, start: int, stop: int) -> np.ndarray:
        import torch
        start, stop = _check_range(self, start, stop)
        t = self.tensor[start:stop]
        if t.dtype not in (torch.float32, torch.float16):
            t = t.float()
        return np.ascontiguousarray(t.cpu().numpy())


def checkpoint_source(path: Union[str, os.PathLike], key: str) -> TensorSource:
    """The tensor ``key`` of a checkpoint saved by ``torch.save`` (a state_dict), mapped with
    ``torch.load(path, mmap=True, weights_only=True)``: only the blocks read are paged in."""
    import torch
    state = torch.load(os.fspath(path), mmap=True, weights_only=True, map_location="cpu")
    if key not in state:
        raise KeyError(f"{os.fspath(path)!r} holds no tensor {key!r}; it holds "
                       f"{sorted(state)[:20]}")
    return TensorSource(state[key])


class CallbackSource(RowSource):
    """Rows from ``fn(start, stop)``, which returns ``[stop - start, dim]`` float32/float16 rows
    (called from several threads at once when the build uses threads)."""

    def __init__(self, rows: int, dim: int, fn: Callable[[int, int], Any]) -> None:
        self.rows, self.dim = _check_shape(rows, dim)
        self.fn = fn

    def block(self, start: int, stop: int) -> np.ndarray:
        start, stop = _check_range(self, start, stop)
        a = np.asarray(self.fn(start, stop))
        if a.shape != (stop - start, self.dim) or a.dtype not in (np.float32, np.float16):
            raise ValueError(f"the row callback returned {a.dtype} {a.shape} for rows "
                             f"[{start}, {stop}); want float32 or float16 "
                             f"{(stop - start, self.dim)}")
        return a


def _check_shape(rows: Any, dim: Any) -> tuple[int, int]:
    if int(rows) != rows or rows < 0 or int(dim) != dim or dim < 1:
        raise ValueError(f"a table needs rows >= 0 and D >= 1; got rows={rows!r}, D={dim!r}")
    return int(rows), int(dim)


def _check_range(src: RowSource, start: int, stop: int) -> tuple[int, int]:
    if not 0 <= start <= stop <= src.rows:
        raise ValueError(f"rows [{start}, {stop}) are outside the source's {src.rows} rows")
    return int(start), int(stop)


def _as_source(source: Any) -> RowSource:
    if isinstance(source, RowSource):
        return source
    if hasattr(source, "data_ptr") and hasattr(source, "dim"):
        return TensorSource(source)
    if isinstance(source, (str, os.PathLike)):
        return npy_source(source)
    return ArraySource(source)


# ----------------------------------------------------------------------------- building

class _Progress:
    """A tqdm bar over rows when asked (``True``) or, with ``None``, when tqdm is importable,
    stderr is a terminal and the build writes at least 256 MiB; otherwise nothing."""

    def __init__(self, progress: Optional[bool], total_rows: int, nbytes: int, desc: str) -> None:
        self.bar = None
        if progress is False or (progress is None and (nbytes < (256 << 20)
                                                       or not sys.stderr.isatty())):
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self.bar = tqdm(total=total_rows, unit="row", unit_scale=True, desc=desc)

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _fill_block(src: RowSource, fmt: Union[int, str], out: np.ndarray, start: int,
                stop: int) -> None:
    rows = src.block(start, stop)
    dst = out[start:stop]
    if isinstance(fmt, int):
        dst[...] = quantize_rowwise(rows, fmt, num_threads=1)
    elif fmt == "float32":
        dst[...] = rows
    elif fmt == "float16":
        if rows.dtype == np.float16:
            dst[...] = rows
        elif dst.flags.c_contiguous:
            float_to_half(rows, out=dst, num_threads=1)
        else:
            dst[...] = float_to_half(rows, num_threads=1)
    else:
        rows32 = rows if rows.dtype == np.float32 else rows.astype(np.float32)
        if dst.flags.c_contiguous:
            float_to_bfloat16(rows32, out=dst, num_threads=1)
        else:
            dst[...] = float_to_bfloat16(rows32, num_threads=1)


def _check_out(out: np.ndarray, rows: int, row_width: int, dtype: np.dtype, what: str) -> None:
    if out.shape != (rows, row_width) or out.dtype != dtype:
        raise ValueError(f"out must be {dtype} of shape {(rows, row_width)} for {what}; got "
                         f"{out.dtype} {out.shape}")
    if not out.flags.writeable:
        raise ValueError("out must be writeable")


def build_table(source: Any, fmt: Any, *, block_rows: int = DEFAULT_BLOCK_ROWS,
                threads: Optional[int] = None, placement: str = "auto",
                out: Optional[np.ndarray] = None, progress: Optional[bool] = None,
                _bar: Optional[_Progress] = None) -> np.ndarray:
    """A table of ``fmt`` built from ``source`` block by block, never whole in float32.

    Parameters
    ----------
    source : row source
        A :class:`SeededInit`, :class:`ArraySource`, :class:`TensorSource`,
        :class:`CallbackSource`, or what :class:`ArraySource` / :class:`TensorSource` take (an
        array, a tensor) or a ``.npy`` path.
    fmt : 8, 4, 2, "float32", "float16" or "bfloat16"
        Row-wise quantized bits (rows as :func:`perfkernels.quantize_rowwise` packs them, uint8
        ``[rows, row_bytes]``) or a float dtype (``[rows, D]``).
    block_rows : int
        Rows per block; each thread holds one block of float rows (plus its packed rows) at a time.
        From a :class:`SeededInit`, a multiple of :data:`INIT_CHUNK_ROWS` draws each row once.
    threads : int, optional
        Blocks built at once (default :func:`perfkernels.get_num_threads`); each block is
        quantized by one thread, so the bytes do not depend on it.
    placement : {"auto", "hugepage", "keep"}
        Where a new output table lives (see :func:`perfkernels.empty_table`).
    out : ndarray, optional
        Write here instead (e.g. a writable mapping of a file).
    progress : bool, optional
        A tqdm progress bar (None: for builds of 256 MiB and more on a terminal).

    Returns
    -------
    ndarray
        uint8 ``[rows, row_bytes]`` for 8/4/2 bits, else ``[rows, D]`` of the float dtype.
    """
    src = _as_source(source)
    fmt = table_format(fmt)
    if int(block_rows) != block_rows or block_rows < 1:
        raise ValueError(f"block_rows must be an int >= 1; got {block_rows!r}")
    from ._parallel import get_num_threads
    nt = get_num_threads() if threads is None else int(threads)
    if nt < 1:
        raise ValueError(f"threads must be >= 1; got {threads!r}")
    dtype = _out_dtype(fmt)
    width = _row_bytes(fmt, src.dim) if isinstance(fmt, int) else src.dim
    if out is None:
        out = _placement.empty_table(src.rows, width, dtype, placement)
    else:
        _check_out(out, src.rows, width, dtype, f"{src.rows} x {src.dim} rows in format {fmt}")
    bar = _bar or _Progress(progress, src.rows, out.nbytes, f"table {fmt}")
    starts = range(0, src.rows, int(block_rows))

    def one(start: int) -> int:
        stop = min(start + int(block_rows), src.rows)
        _fill_block(src, fmt, out, start, stop)
        return stop - start

    try:
        if nt == 1 or len(starts) < 2:
            for s in starts:
                bar.update(one(s))
        else:
            with concurrent.futures.ThreadPoolExecutor(nt) as pool:
                # at most 2 * nt blocks in flight: the buffer stays bounded
                pending: set = set()
                for s in starts:
                    if len(pending) >= 2 * nt:
                        done, pending = concurrent.futures.wait(
                            pending, return_when=concurrent.futures.FIRST_COMPLETED)
                        for f in done:
                            bar.update(f.result())
                    pending.add(pool.submit(one, s))
                for f in concurrent.futures.as_completed(pending):
                    bar.update(f.result())
    finally:
        if _bar is None:
            bar.close()
    return out


def build_tables(sources: Mapping[str, Any], fmt: Any, *, progress: Optional[bool] = None,
                 **kwargs: Any) -> dict[str, np.ndarray]:
    """:func:`build_table` for each ``name: source`` under one progress bar; ``fmt`` is one
    format for all or a ``{name: format}`` mapping.  Other keywords go to :func:`build_table`."""
    srcs = {name: _as_source(s) for name, s in sources.items()}
    fmts = {name: table_format(fmt[name] if isinstance(fmt, Mapping) else fmt) for name in srcs}
    total_rows = sum(s.rows for s in srcs.values())
    nbytes = sum(s.rows * _row_bytes(fmts[n], s.dim) for n, s in srcs.items())
    bar = _Progress(progress, total_rows, nbytes, f"{len(srcs)} tables")
    try:
        return {name: build_table(s, fmts[name], _bar=bar, **kwargs) for name, s in srcs.items()}
    finally:
        bar.close()


# ----------------------------------------------------------------------------- the file format

@dataclass(frozen=True)
class TableInfo:
    """A table file's header: ``fmt`` (8/4/2 or a float dtype name), ``rows``, ``dim``,
    ``row_bytes``, ``data_offset`` and ``data_bytes``."""
    fmt: Union[int, str]
    rows: int
    dim: int
    row_bytes: int
    data_offset: int
    data_bytes: int

    @property
    def bits(self) -> int:
        """Bits per value: 8/4/2 for quantized tables, 32 or 16 for float ones."""
        return self.fmt if isinstance(self.fmt, int) else (32 if self.fmt == "float32" else 16)

    def pack(self) -> bytes:
        head = _HEADER.pack(MAGIC, FORMAT_VERSION, _CODES[self.fmt], self.rows, self.dim,
                            self.row_bytes, self.data_offset, self.data_bytes)
        return head + struct.pack("<I", zlib.crc32(head))


def _info_for(fmt: Union[int, str], rows: int, dim: int) -> TableInfo:
    row_bytes = _row_bytes(fmt, dim)
    data_bytes = rows * row_bytes
    offset = 4096 if data_bytes < _SMALL_DATA else _placement.HUGE_PAGE
    return TableInfo(fmt, rows, dim, row_bytes, offset, data_bytes)


def read_table_header(path: Union[str, os.PathLike]) -> TableInfo:
    """The header of the table file at ``path``, checked (magic, version, CRC, consistent sizes,
    file long enough); :class:`TableFileError` naming the file and the value otherwise."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
        size = os.fstat(f.fileno()).st_size
    return _parse_header(path, head, size)


def _parse_header(path: str, head: bytes, size: int) -> TableInfo:
    if len(head) < len(MAGIC) or head[:len(MAGIC)] != MAGIC:
        raise TableFileError(f"{path!r} is not a perfkernels table file (its first bytes are "
                             f"{head[:8]!r}, not {MAGIC!r})")
    if len(head) < HEADER_BYTES:
        raise TableFileError(f"{path!r} is truncated: {size} bytes, shorter than the "
                             f"{HEADER_BYTES}-byte header")
    magic, version, code, rows, dim, row_bytes, offset, data_bytes = _HEADER.unpack(
        head[:_HEADER.size])
    if version != FORMAT_VERSION:
        raise TableFileError(f"{path!r} has table format version {version}; this perfkernels "
                             f"reads version {FORMAT_VERSION}")
    (crc,) = struct.unpack("<I", head[_HEADER.size:HEADER_BYTES])
    if crc != zlib.crc32(head[:_HEADER.size]):
        raise TableFileError(f"{path!r} has a damaged header (CRC-32 {crc:#010x}, the header's "
                             f"bytes give {zlib.crc32(head[:_HEADER.size]):#010x})")
    if code not in _FORMAT_OF_CODE:
        raise TableFileError(f"{path!r} has an unknown table format code {code}")
    fmt = _FORMAT_OF_CODE[code]
    if dim < 1 or row_bytes != _row_bytes(fmt, dim) or data_bytes != rows * row_bytes:
        raise TableFileError(f"{path!r} has an inconsistent header: format {fmt}, D {dim}, "
                             f"row bytes {row_bytes}, rows {rows}, data bytes {data_bytes}")
    if offset % 4096 or offset < HEADER_BYTES:
        raise TableFileError(f"{path!r} has a bad data offset {offset} (a multiple of 4096 "
                             f"is required)")
    if size < offset + data_bytes:
        raise TableFileError(f"{path!r} is truncated: {size} bytes, but its header says "
                             f"{offset + data_bytes} ({rows} rows of {row_bytes} bytes at "
                             f"offset {offset})")
    return TableInfo(fmt, rows, dim, row_bytes, offset, data_bytes)


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask, read without changing it where Linux tells it (setting and
    restoring it would race with another thread creating a file)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class _AtomicFile:
    """A temporary file next to ``path`` that becomes ``path`` on :meth:`commit` (fsync,
    rename, fsync of the directory) and is removed otherwise."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.directory = os.path.dirname(os.path.abspath(path))
        fd, self.tmp = tempfile.mkstemp(dir=self.directory,
                                        prefix="." + os.path.basename(path) + ".",
                                        suffix=".tmp")
        self.file = os.fdopen(fd, "w+b")
        self.done = False

    def commit(self) -> None:
        self.file.flush()
        # mkstemp's file is 0600; a table file gets what open() would give it (0666 less the
        # umask), so that a server running as another user can map it.
        os.fchmod(self.file.fileno(), 0o666 & ~_umask())
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.path)
        self.done = True
        _fsync_dir(self.directory)

    def __enter__(self) -> "_AtomicFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.done:
            self.file.close()
            try:
                os.unlink(self.tmp)
            except OSError:
                pass


def _infer_format(table: np.ndarray, bits: Optional[int]) -> Union[int, str]:
    if table.dtype == np.uint8:
        if bits is None:
            raise ValueError("a uint8 (packed) table needs bits=8, 4 or 2 and dim= to save")
        return table_format(bits)
    if bits is not None:
        raise ValueError(f"bits={bits!r} is only for packed uint8 tables; this one is "
                         f"{table.dtype}")
    return table_format(table.dtype)


def save_table(path: Union[str, os.PathLike], table: Any, *, bits: Optional[int] = None,
               dim: Optional[int] = None, block_bytes: int = 64 << 20) -> TableInfo:
    """Write ``table`` (float32/float16/bfloat16 ``[rows, D]``, or packed uint8 rows with
    ``bits=`` and ``dim=``, the float columns they encode; a torch tensor is accepted) as a table
    file at ``path``, atomically, ``block_bytes`` at a time.  Returns the header written."""
    path = os.fspath(path)
    if hasattr(table, "data_ptr"):
        import torch
        t = table.detach().cpu()
        table = (t.view(torch.int16).numpy().view(BFLOAT16) if t.dtype == torch.bfloat16
                 else t.numpy())
    a = np.asarray(table)
    if a.ndim != 2:
        raise ValueError(f"a table must be 2-D [rows, D]; got shape {a.shape}")
    fmt = _infer_format(a, bits)
    if isinstance(fmt, int):
        if dim is None:
            raise ValueError("a packed table needs dim= (the float columns of its rows) to save")
        if packed_row_bytes(int(dim), fmt) != a.shape[1]:
            raise ValueError(f"dim={dim} at {fmt} bits gives {packed_row_bytes(int(dim), fmt)}-"
                             f"byte rows; the table's rows are {a.shape[1]} bytes")
        info = _info_for(fmt, a.shape[0], int(dim))
    else:
        if dim is not None and dim != a.shape[1]:
            raise ValueError(f"dim={dim} does not match the table's {a.shape[1]} columns")
        info = _info_for(fmt, a.shape[0], a.shape[1])
    step = max(1, block_bytes // max(info.row_bytes, 1))
    with _AtomicFile(path) as af:
        af.file.write(info.pack())
        af.file.truncate(info.data_offset)
        af.file.seek(info.data_offset)
        for start in range(0, info.rows, step):
            block = np.ascontiguousarray(a[start:start + step])
            af.file.write(memoryview(block.view(np.uint8)).cast("B"))
        af.commit()
    return info


def build_table_file(path: Union[str, os.PathLike], source: Any, fmt: Any,
                     **kwargs: Any) -> TableInfo:
    """:func:`build_table` straight into a table file at ``path`` (a writable shared mapping of
    the new file: the table is never in anonymous memory; written back by the kernel as it
    goes), saved atomically.  Keywords as :func:`build_table` (not ``out``/``placement``)."""
    path = os.fspath(path)
    src = _as_source(source)
    fmt = table_format(fmt)
    info = _info_for(fmt, src.rows, src.dim)
    with _AtomicFile(path) as af:
        af.file.write(info.pack())
        af.file.truncate(info.data_offset + info.data_bytes)
        af.file.flush()
        if info.data_bytes:
            m = mmap.mmap(af.file.fileno(), info.data_offset + info.data_bytes,
                          access=mmap.ACCESS_WRITE)
            out = np.frombuffer(m, _out_dtype(fmt), offset=info.data_offset,
                                count=info.data_bytes // _out_dtype(fmt).itemsize)
            build_table(src, fmt, out=out.reshape(info.rows, -1), **kwargs)
            del out
            m.flush()
            m.close()        # (on an error the mapping goes with the exception's frames)
        af.commit()
    return info


#: Linux's madvise advice that maps the pages of a range (5.14 and later); Python has no name
#: for it yet
_MADV_POPULATE_READ = 22


def _populate(m: mmap.mmap, start: int, length: int) -> None:
    """Fault in every page of ``m[start:start + length]`` now (offsets in the file)."""
    start_page = start - start % mmap.PAGESIZE
    try:
        m.madvise(_MADV_POPULATE_READ, start_page, length + start - start_page)
        return
    except (OSError, ValueError):          # an older kernel: EINVAL
        pass
    if hasattr(mmap, "MADV_WILLNEED"):
        m.madvise(mmap.MADV_WILLNEED, start_page, length + start - start_page)


def load_table(path: Union[str, os.PathLike], *, fmt: Any = None, rows: Optional[int] = None,
               dim: Optional[int] = None, mode: str = "r", willneed: bool = False,
               populate: bool = False) -> np.ndarray:
    """Map the table file at ``path``: no read, no parse, no copy.

    ``mode="r"``: a read-only shared mapping (``MAP_SHARED``, ``PROT_READ``); the array is not
    writeable.  ``mode="c"``: copy-on-write (``MAP_PRIVATE``): a write copies the page it
    touches into this process, the file never changes.  Either way processes mapping one file
    share its pages in the page cache.  ``fmt``, ``rows``, ``dim``: what the caller expects
    (TableFileError naming the file and the value when the file differs).  ``willneed``: ask the
    kernel to read the file in now (``MADV_WILLNEED``), in the background.  ``populate``: map
    every page now (``MADV_POPULATE_READ``, Linux 5.14 and later; elsewhere ``MADV_WILLNEED``),
    reading from disk what the page cache lacks, so that no lookup pays a page fault later: a
    server's first answers then run as fast as its later ones (the full-size DLRM-v2 tables,
    13 GiB in the page cache: about 0.4 s).

    Returns uint8 ``[rows, row_bytes]`` (quantized) or ``[rows, D]`` (float) over the mapping;
    :func:`read_table_header` says what it holds.
    """
    path = os.fspath(path)
    if mode not in ("r", "c"):
        raise ValueError(f"mode must be 'r' (read-only, shared) or 'c' (copy-on-write); "
                         f"got {mode!r}")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        info = _parse_header(path, f.read(HEADER_BYTES), size)
        for name, want, got in (("format", None if fmt is None else table_format(fmt), info.fmt),
                                ("rows", rows, info.rows), ("D", dim, info.dim)):
            if want is not None and want != got:
                raise TableFileError(f"{path!r} holds a table of {name} {got}; expected {want} "
                                     f"(it is {info.rows} x {info.dim}, format {info.fmt})")
        dtype = _out_dtype(info.fmt)
        width = info.row_bytes if isinstance(info.fmt, int) else info.dim
        if info.data_bytes == 0:
            return np.empty((info.rows, width), dtype)
        access = mmap.ACCESS_READ if mode == "r" else mmap.ACCESS_COPY
        m = mmap.mmap(f.fileno(), info.data_offset + info.data_bytes, access=access)
    if populate:
        _populate(m, info.data_offset, info.data_bytes)
    elif willneed and hasattr(mmap, "MADV_WILLNEED"):
        m.madvise(mmap.MADV_WILLNEED, info.data_offset, info.data_bytes)
    a = np.frombuffer(m, dtype, count=info.data_bytes // dtype.itemsize, offset=info.data_offset)
    return a.reshape(info.rows, width)


def table_files(directory: Union[str, os.PathLike], names: Iterable[str],
                suffix: str = ".pkt") -> dict[str, str]:
    """``{name: directory/name + suffix}`` for each name (a collection's files)."""
    return {n: os.path.join(os.fspath(directory), n + suffix) for n in names}
