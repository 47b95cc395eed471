"""Benchmark cases for fp16/bf16 conversion: 16 Mi elements from DRAM, 64 Ki in L2."""
from __future__ import annotations

import numpy as np

import perfkernels as pk

from ..._variants import BFLOAT16 as BF16
from ..._variants import CONVERSIONS, CONVERT_SIZES, QUICK_CONVERT_SIZES
from ...benchsuite import Case, torch_or_none


def make_input(dtype, n: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(n, dtype=np.float32) * 100
    return x.astype(dtype)


def _to_torch(torch, x: np.ndarray):
    if x.dtype == BF16:
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(x)


def cases(quick: bool) -> list[Case]:
    torch = torch_or_none()
    out = []
    for label, n in (QUICK_CONVERT_SIZES if quick else CONVERT_SIZES).items():
        for name, src_dtype, dst_dtype, torch_method in CONVERSIONS:
            x = make_input(src_dtype, n)
            fn = getattr(pk, name)
            nbytes = n * (np.dtype(src_dtype).itemsize + np.dtype(dst_dtype).itemsize)
            baselines = {"numpy": (lambda x=x, d=dst_dtype: x.astype(d))}
            if torch is not None:
                t = _to_torch(torch, x)
                baselines["torch"] = lambda t=t, m=torch_method: getattr(t, m)()
            out.append(Case("convert", f"{name} {label}", nbytes, lambda fn=fn, x=x: fn(x), baselines))
            if label in ("16Mi", "2Mi"):
                # the same work into a preallocated output, for everyone (no page faults)
                dst = np.empty(n, dtype=dst_dtype)
                pre = {"numpy": lambda x=x, dst=dst: np.copyto(dst, x, casting="unsafe")}
                if torch is not None:
                    t, dst_t = _to_torch(torch, x), _to_torch(torch, np.empty(n, dtype=dst_dtype))
                    pre["torch"] = lambda t=t, dst_t=dst_t: dst_t.copy_(t)
                out.append(Case("convert", f"{name} {label} out=", nbytes,
                                lambda fn=fn, x=x, dst=dst: fn(x, out=dst), pre,
                                scaling=name in ("float_to_half", "half_to_float")))
    return out
