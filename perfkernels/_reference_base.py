"""What every family's reference (``perfkernels/families/<family>/reference.py``) builds on: the
float64 result with its magnitude (:class:`Expected`), and the comparisons of a kernel's result
with a reference (:func:`assert_close`, :func:`assert_same_bits`).  perfkernels/reference.py
re-exports all of it."""
from __future__ import annotations

from typing import NamedTuple

import ml_dtypes
import numpy as np

__all__ = ["BFLOAT16", "Expected", "tolerance", "max_excess", "assert_close", "assert_same_bits"]

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


class Expected(NamedTuple):
    """A float64 result and, element by element, the sum of the absolute values of its terms.

    Unpacks as ``value, magnitude = reference.embedding_bag(...)``; :func:`assert_close` takes it
    whole and scales its tolerance by ``magnitude``.
    """
    value: np.ndarray
    magnitude: np.ndarray


def tolerance(expected, magnitude=None, *, rtol: float = 1e-5, atol: float = 0.0) -> np.ndarray:
    """The allowed absolute error per element: ``atol + rtol * magnitude``.

    ``expected`` may be an :class:`Expected` (its magnitude is used) or an array (then
    ``magnitude`` defaults to ``|expected|``: an ordinary relative tolerance).
    """
    if isinstance(expected, Expected):
        expected, magnitude = expected
    if magnitude is None:
        magnitude = np.abs(np.asarray(expected, dtype=np.float64))
    return atol + rtol * np.asarray(magnitude, dtype=np.float64)


def max_excess(got, expected, magnitude=None, *, rtol: float = 1e-5, atol: float = 0.0) -> float:
    """max over elements of ``|got - expected| / tolerance`` (<= 1 passes; NaN in ``got`` where
    the reference has none counts as infinitely wrong).  Shapes must match."""
    bound = tolerance(expected, magnitude, rtol=rtol, atol=atol)
    want = np.asarray(expected.value if isinstance(expected, Expected) else expected, np.float64)
    got = np.asarray(got, dtype=np.float64)
    if got.shape != want.shape:
        raise AssertionError(f"shape {got.shape} != expected {want.shape}")
    if got.size == 0:
        return 0.0
    both_nan = np.isnan(got) & np.isnan(want)
    err = np.where(both_nan, 0.0, np.abs(got - want))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err == 0, 0.0, err / bound)
    ratio = np.where(np.isnan(ratio), np.inf, ratio)
    return float(ratio.max())


def assert_close(got, expected, magnitude=None, *, rtol: float = 1e-5, atol: float = 0.0,
                 err_msg: str = "") -> None:
    """Assert ``|got - expected| <= atol + rtol * magnitude`` everywhere (see :func:`tolerance`)."""
    bound = tolerance(expected, magnitude, rtol=rtol, atol=atol)
    want = np.asarray(expected.value if isinstance(expected, Expected) else expected, np.float64)
    got64 = np.asarray(got, dtype=np.float64)
    assert got64.shape == want.shape, f"shape {got64.shape} != expected {want.shape} {err_msg}"
    err = np.abs(got64 - want)
    bad = ~(err <= bound) & ~(np.isnan(got64) & np.isnan(want))
    if bad.any():
        k = np.unravel_index(int(np.argmax(np.where(bad, err - bound, -np.inf))), bad.shape)
        raise AssertionError(
            f"{int(bad.sum())} of {bad.size} elements off; worst at {tuple(map(int, k))}: "
            f"got {got64[k]!r}, expected {want[k]!r}, allowed error {bound[k]:.3g} {err_msg}")


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])


def assert_same_bits(got, want, err_msg: str = "") -> None:
    """Assert equal dtype, shape and bit patterns (NaN payloads and signed zeros included)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (
        f"got {got.dtype}{got.shape}, want {want.dtype}{want.shape} {err_msg}")
    gb, wb = _bits(got).ravel(), _bits(want).ravel()
    bad = np.flatnonzero(gb != wb)
    assert bad.size == 0, (f"{bad.size} mismatches; first at {bad[0]}: got {gb[bad[0]]:#x}, "
                           f"want {wb[bad[0]]:#x} {err_msg}")
