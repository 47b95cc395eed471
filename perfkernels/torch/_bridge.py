"""Tensors in, tensors out: the thin layer between PyTorch tensors and the NumPy / CuPy kernels.

CPU tensors are handed to the C kernels as NumPy views of the same memory (``Tensor.numpy()``
shares the buffer; bfloat16, which NumPy lacks, is viewed as int16 bits and re-labelled
``ml_dtypes.bfloat16``).  Results come back through ``torch.from_numpy`` (no copy).  CUDA tensors
go to :mod:`perfkernels.cuda` (read through DLPack without a copy) on PyTorch's current stream,
and its CuPy results come back through DLPack.
"""
from __future__ import annotations

import contextlib
import re
from typing import Any

import ml_dtypes
import numpy as np
import torch

_BF16 = np.dtype(ml_dtypes.bfloat16)


#: The NumPy API's wording of a bad index, and torch's wording of the same mistake.
_NUMPY_INDEX_MESSAGE = re.compile(
    r"indices\[(\d+)\] = (-?\d+) is out of range for a table of (\d+) rows")
_TORCH_INDEX_MESSAGE = r"Index \1 of input takes value \2 which is not in the valid range [0, \3)"


class IndexOutOfRangeError(IndexError, RuntimeError):
    """An index outside ``[0, rows)`` reached an embedding lookup.

    It is both an :class:`IndexError` (what perfkernels' NumPy API raises) and a
    :class:`RuntimeError` (what PyTorch raises for the same mistake), so code written for either
    catches it.  The message is torch's, with the flattened position and the value, e.g.
    ``Index 17 of input takes value 1000000 which is not in the valid range [0, 1000)`` (a
    NumPy-API message given to the constructor is reworded so); nothing was written.

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> bag = pkt.EmbeddingBag(10, 4)
    >>> try:
    ...     bag(torch.tensor([10]), torch.tensor([0]))
    ... except pkt.IndexOutOfRangeError as e:
    ...     print(isinstance(e, IndexError), isinstance(e, RuntimeError))
    True True
    """

    def __init__(self, message: str = "") -> None:
        super().__init__(_NUMPY_INDEX_MESSAGE.sub(_TORCH_INDEX_MESSAGE, str(message)))


def index_error(exc: BaseException, *, quantized: bool = False) -> IndexOutOfRangeError:
    """The torch-layer exception for the NumPy API's ``IndexError`` ``exc``: the one place where
    the torch layer builds its index errors.  ``quantized``: in the wording of torch's quantized
    embedding-bag ops (``Index 3 is out of bounds: 1000, range 0 to 1000``) rather than that of
    ``F.embedding_bag``.  Callers write ``raise index_error(exc) from None``."""
    if isinstance(exc, IndexOutOfRangeError) and not quantized:
        return exc
    message = _NUMPY_INDEX_MESSAGE.sub(_TORCH_INDEX_MESSAGE, str(exc))
    if quantized:
        message = re.sub(
            r"Index (\d+) of input takes value (-?\d+) which is not in the valid range \[0, (\d+)\)",
            r"Index \1 is out of bounds: \2, range 0 to \3", message)
    return IndexOutOfRangeError(message)


#: A native op's wording of a bad index (torch's own).
_NATIVE_INDEX_MESSAGE = re.compile(r"Index (\d+) of input takes value (-?\d+) which is not in the "
                                   r"valid range \[0, (\d+)\)")


def native_index_error(exc: BaseException) -> "IndexOutOfRangeError | None":
    """The torch-layer exception for a native op's error ``exc`` when it reports a bad index (a
    ``RuntimeError`` in torch's wording), else None."""
    m = _NATIVE_INDEX_MESSAGE.search(str(exc))
    if m is None:
        return None
    return index_error_at(int(m.group(1)), int(m.group(2)), int(m.group(3)))


def index_error_at(position: int, value: int, rows: int) -> IndexOutOfRangeError:
    """The torch-layer exception for index ``value`` at flattened ``position`` of a lookup into a
    table of ``rows`` rows."""
    return index_error(IndexError(f"indices[{position}] = {value} is out of range for a table of "
                                  f"{rows} rows"))


def feature_index_error(exc: IndexOutOfRangeError, feature: str) -> IndexOutOfRangeError:
    """``exc`` (a collection's lookup, its position within one feature's values) with that
    feature named first."""
    return IndexOutOfRangeError(f"feature {feature!r}: {exc} (the entry's position within that "
                                "feature's values)")


def padded_index_error(exc: IndexOutOfRangeError) -> IndexOutOfRangeError:
    """``exc`` in the wording torch's ``embedding_bag`` uses for a bad index when the lookup has
    a ``padding_idx`` (``embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx
    to be 10``), with the position and the valid range after it."""
    m = _NATIVE_INDEX_MESSAGE.search(str(exc))
    if m is None:
        return exc
    return IndexOutOfRangeError(
        f"embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to be "
        f"{m.group(2)} (index {m.group(1)} of input; valid range [0, {m.group(3)}))")


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor's memory (no copy), bfloat16 as ``ml_dtypes.bfloat16``; a
    negative view (``x.conj().imag``, whose memory holds the negated values) is resolved into a
    copy first."""
    if t.requires_grad:
        t = t.detach()
    if t.is_neg():
        t = t.resolve_neg()
    if t.dtype is torch.bfloat16:
        return t.view(torch.int16).numpy().view(_BF16)
    return t.numpy()


@contextlib.contextmanager
def _torch_stream():
    """Run CuPy work on PyTorch's current CUDA stream, so the two stay ordered."""
    import cupy
    with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
        yield


def cuda_call(fn_name: str, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Call ``perfkernels.cuda.<fn_name>`` on CUDA tensors; the CuPy result as a tensor (no copy)."""
    from .. import cuda as pk_cuda
    if not pk_cuda.is_available():
        raise RuntimeError(f"CUDA tensors need perfkernels.cuda, which cannot run here: "
                           f"{pk_cuda.unavailable_reason()}")
    with _torch_stream():
        try:
            result = getattr(pk_cuda, fn_name)(*args, **kwargs)
        except IndexError as exc:
            raise index_error(exc) from None
    if isinstance(result, tuple):
        return tuple(torch.from_dlpack(r) for r in result)
    return torch.from_dlpack(result)


class TableViewCache:
    """Mixin for modules holding one table: a NumPy view of it (None for a table off the CPU, or
    a negative view, which has no view of its values), re-made only when the tensor
    object, its memory, its shape, its strides or its dtype change (``tensor.numpy()`` costs about
    a microsecond a call, as much as a tiny lookup).  In-place changes of the layout keep the
    tensor object and its memory (``weight.data = weight.data.t()``, ``weight.t_()``, a float16
    table re-viewed as bfloat16), hence the strides and the dtype in the key.  The view is never
    pickled or deep-copied."""

    _np_view: tuple | None = None
    #: not compiled by torch.jit.script (the view holds a NumPy array)
    __jit_ignored_attributes__ = ["_np_view"]

    def _table_array(self, t: torch.Tensor) -> np.ndarray | None:
        """The view of ``t`` (None when ``t`` is not on the CPU)."""
        view = self._np_view
        if (view is None or view[0] is not t or view[1] != t.data_ptr() or view[2] != t.stride()
                or view[3] is not t.dtype or view[4] != t.shape):
            view = self._np_view = (t, t.data_ptr(), t.stride(), t.dtype, t.shape,
                                    as_numpy(t) if t.device.type == "cpu" and not t.is_neg()
                                    else None)
        return view[5]

    def __getstate__(self):
        state = dict(super().__getstate__())
        state.pop("_np_view", None)
        return state
