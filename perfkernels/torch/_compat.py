"""torch's answer on every input the NumPy API would answer differently.

perfkernels' NumPy API checks its arguments more strictly than ``torch.nn.functional.embedding_bag``
and says so in its own words (``ValueError`` for malformed offsets, ``TypeError`` for a dtype).
The torch layer promises torch's behaviour instead: the same accepted inputs, the same exception
classes, torch's wording.  It gets there without re-checking anything on the fast path:

* the few things the NumPy API accepts and torch refuses are checked before the kernel runs
  (:func:`weights_refused`: ``per_sample_weights`` with ``mode="mean"``, or of another dtype than
  the table, or of another shape than the input);
* whatever the NumPy API refuses goes to torch's own function (:func:`torch_verdict`) on the same
  arguments: where torch refuses too, its exception is raised as torch raised it; where torch
  accepts (``include_last_offset=True`` with a last offset short of the input's end, tensors on
  the ``meta`` device ...), torch's result is the answer, gradient included.

An index out of range is the one refusal the two share; it becomes
:class:`~perfkernels.torch.IndexOutOfRangeError` (an ``IndexError`` and a ``RuntimeError``) with
torch's message.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ._bridge import index_error_at

#: torch's own function, kept so that routing (and our fallbacks) never call ourselves
TORCH_EMBEDDING_BAG = F.embedding_bag


def weights_refused(input: Tensor, per_sample_weights: Tensor, mode: str, dtype: torch.dtype,
                    weighted_mean: bool) -> bool:
    """Whether torch refuses these ``per_sample_weights`` where the NumPy API would take them:
    another shape than ``input``, a mode other than "sum" (unless ``weighted_mean``, our
    opt-in), or a dtype other than ``dtype`` (the table's dtype as the model sees it)."""
    return (per_sample_weights.dtype is not dtype
            or (mode != "sum" and not weighted_mean)
            or per_sample_weights.shape != input.shape)


def input_refused(input: Tensor) -> bool:
    """Whether torch refuses this input where the NumPy API takes it: 2-D input with no columns
    (torch's ``arange(0, numel, 0)`` raises "step must be nonzero").  Not asked while
    ``torch.jit.trace`` records (the answer would be frozen into the trace, with a TracerWarning):
    the registered op the trace calls refuses such input itself."""
    if torch._C._get_tracing_state() is not None:
        return False
    return input.dim() == 2 and input.shape[1] == 0


def _first_bad_index(input: Tensor, rows: int) -> Optional[tuple[int, int]]:
    """(flattened position, value) of the first index outside [0, rows), or None."""
    if input.dtype not in (torch.int32, torch.int64) or input.device.type == "meta":
        return None
    flat = input.reshape(-1)
    bad = ((flat < 0) | (flat >= rows)).nonzero()
    return None if bad.numel() == 0 else (int(bad[0]), int(flat[bad[0]]))


def _first_decrease(offsets: Optional[Tensor]) -> Optional[int]:
    """Position of the first offset smaller than the one before it, where every offset is
    non-negative; None otherwise (read through NumPy: it is on the path of calls torch answers)."""
    if (offsets is None or offsets.dim() != 1 or offsets.numel() < 2
            or offsets.dtype not in (torch.int32, torch.int64) or offsets.device.type != "cpu"):
        return None
    off = offsets.detach().numpy()
    drops = off[1:] < off[:-1]
    if not drops.any() or off.min() < 0:     # torch's own checks answer negative offsets
        return None
    return int(drops.argmax()) + 1


#: torch's message for decreasing offsets (its multi-threaded kernel's check)
DECREASING_OFFSETS = ("Expected i < index_size to be true, but got false.  (Could this error message "
                      "be improved?  If so, please report an enhancement request to PyTorch.)")


def torch_verdict(input: Tensor, weight: Tensor, offsets: Optional[Tensor],
                  per_sample_weights: Optional[Tensor], mode: str, sparse: bool,
                  include_last_offset: bool, padding_idx: Optional[int],
                  dtype: torch.dtype, weighted_mean: bool = False,
                  check_offsets: bool = True) -> Tensor:
    """What ``torch.nn.functional.embedding_bag`` does with these arguments: raises its
    exception, or returns its result (with autograd when grad mode and the inputs ask for it).

    ``weight`` may be stored in a narrower dtype than the model's (``dtype``, what
    ``convert(model, dtype=...)`` keeps as the output dtype): ``per_sample_weights`` of the
    model's dtype are then given in the table's, and the result comes back in ``dtype``.
    With ``weighted_mean`` (our opt-in), weights in mode "mean" are not refused: torch cannot
    run them, so the question is put to it in mode "sum" (the same checks otherwise).

    ``check_offsets=False`` is for the route where torch's kernel is the fast path of a lookup
    with a gradient (the NumPy API was not asked): the answer is then exactly stock torch's,
    including its one-thread kernel's acceptance of decreasing offsets; the check (about 3 us)
    would make that route slower than stock.
    """
    psw = per_sample_weights
    if psw is not None and dtype is not weight.dtype:
        if psw.dtype is dtype:
            psw = psw.to(weight.dtype)
        elif weight.dim() == 2:
            # weights of another dtype than the model's: the model's table would refuse them
            # (torch's error, from its function on a stand-in table of the model's dtype)
            TORCH_EMBEDDING_BAG(input, torch.zeros((), dtype=dtype, device=weight.device).expand(
                weight.shape), offsets, None, 2.0, False, mode, False, psw, include_last_offset,
                padding_idx)
    weighted_mean = weighted_mean and psw is not None and mode == "mean"
    try:
        out = TORCH_EMBEDDING_BAG(input, weight, offsets, None, 2.0, False,
                                  "sum" if weighted_mean else mode, sparse, psw,
                                  include_last_offset, padding_idx)
    except NotImplementedError as exc:    # (a RuntimeError): torch's refusal comes first
        raise exc.with_traceback(None) from None
    except RuntimeError as exc:
        bad = _first_bad_index(input, weight.shape[0]) if weight.dim() == 2 else None
        if bad is not None:   # torch's wording of a bad index varies; ours is always the same
            raise index_error_at(bad[0], bad[1], weight.shape[0]) from None
        raise exc.with_traceback(None) from None
    except Exception as exc:
        raise exc.with_traceback(None) from None
    # torch refuses decreasing offsets on two threads and more, whatever the size (checked on
    # 2.13); only its one-thread kernel takes them, so only then is there anything to check
    drop = (_first_decrease(offsets) if check_offsets and torch.get_num_threads() == 1
            else None)
    if drop is not None:
        # torch refuses these when it runs on several threads; on one thread its kernel takes them
        # and returns uninitialised memory for the bags after the drop (undefined behaviour), so
        # the only answer that does not depend on torch's thread count is the refusal
        raise RuntimeError(f"{DECREASING_OFFSETS} offsets[{drop}] = {int(offsets[drop])} is "
                           f"smaller than offsets[{drop - 1}] = {int(offsets[drop - 1])}: "
                           "offsets must be non-decreasing")
    if weighted_mean:
        raise NotImplementedError("per_sample_weights with mode='mean' (weighted_mean=True) "
                                  "need offsets where every bag ends at the next offset, the "
                                  "last at the end of the input")
    return out if out.dtype is dtype else out.to(dtype)
