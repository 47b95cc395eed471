"""What our kernels do not do goes to torch's own implementation, with one warning per reason."""
from __future__ import annotations

import warnings
from typing import Optional

import torch

_warned: set[str] = set()


def warn_once(reason: str) -> None:
    """Warn the first time a reason comes up in this process (a model would warn every batch)."""
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"perfkernels.torch: {reason}; using torch's implementation instead",
                      RuntimeWarning, stacklevel=3)


def unsupported_reason(*, mode: str, max_norm: Optional[float], scale_grad_by_freq: bool,
                       dtype: torch.dtype) -> Optional[str]:
    """Why an EmbeddingBag with these options cannot use our kernels (None when it can)."""
    if mode not in ("sum", "mean"):
        return f"mode={mode!r} is not implemented by perfkernels (only 'sum' and 'mean')"
    if max_norm is not None:
        return "max_norm renormalises rows in place during lookup, which perfkernels does not do"
    if scale_grad_by_freq:
        return "scale_grad_by_freq is not implemented by perfkernels"
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return f"weight dtype {dtype} is not float32, float16 or bfloat16"
    return None
