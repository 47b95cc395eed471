"""The float64 NumPy reference of the training family (embedding-bag backward fused with a
sparse optimizer step), and the check of an updated table against it.  See
perfkernels/reference.py."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from perfkernels._reference_base import BFLOAT16, Expected
from perfkernels.families.embedding.reference import bag_bounds, check_indices

__all__ = ["TableUpdate", "embedding_bag_table_gradient", "embedding_bag_backward_update",
           "assert_update_close", "AdamUpdate", "embedding_bag_backward_adam"]


def embedding_bag_table_gradient(rows: int, dim: int, indices, offsets=None, *, grad_output,
                                 lengths=None, per_sample_weights=None, mode: str = "sum",
                                 include_last_offset: bool = False, padding_idx=None,
                                 positional_weights: bool = False) -> tuple[Expected, np.ndarray]:
    """``(Expected([rows, dim], ...), touched)``: the gradient of an embedding bag's table and the
    boolean mask of the rows some non-padding entry names.

    ``g[r] = sum over entries j with indices[j] == r of scale_b * w_j * grad_output[b]``, ``b`` the
    bag of entry j, ``scale_b`` 1 (``"sum"``) or ``1 / count_b`` (``"mean"``, count_b the bag's
    non-padding entries), ``w_j`` as in :func:`embedding_bag`; padding entries contribute nothing.
    """
    idx = np.asarray(indices)
    shape2d = idx.shape if idx.ndim == 2 and offsets is None and lengths is None else None
    flat = idx.reshape(-1).astype(np.int64)
    check_indices(flat, rows)
    pad = None if padding_idx is None else int(padding_idx) + (rows if padding_idx < 0 else 0)
    psw = (None if per_sample_weights is None
           else np.asarray(per_sample_weights, dtype=np.float64).reshape(-1))
    G = np.asarray(grad_output, dtype=np.float64)
    value = np.zeros((rows, dim))
    magnitude = np.zeros((rows, dim))
    touched = np.zeros(rows, dtype=bool)
    for b, (begin, end) in enumerate(bag_bounds(flat.size, offsets, lengths, include_last_offset,
                                                shape2d)):
        entries = np.arange(begin, end)
        entries = entries[flat[entries] != pad] if pad is not None else entries
        if entries.size == 0:
            continue
        scale = 1.0 / entries.size if mode == "mean" else 1.0
        for j in entries:
            wj = 1.0 if psw is None else (psw[j - begin] if positional_weights else psw[j])
            term = scale * wj * G[b]
            value[flat[j]] += term
            magnitude[flat[j]] += np.abs(term)
            touched[flat[j]] = True
    return Expected(value, magnitude), touched


class TableUpdate(NamedTuple):
    """The result of :func:`embedding_bag_backward_update`: the new table and state (float64),
    the mask of updated rows, and the table gradient (:class:`Expected`, before weight decay)."""
    weight: np.ndarray
    state: np.ndarray | None
    touched: np.ndarray
    grad: Expected


def embedding_bag_backward_update(weight, indices, offsets=None, *, grad_output,
                                  optimizer: str = "sgd", state=None, lr: float,
                                  eps: float = 1e-8, weight_decay: float = 0.0,
                                  **bags) -> TableUpdate:
    """One fused backward + sparse optimizer step, in float64 (the inputs are not modified).

    With ``g`` from :func:`embedding_bag_table_gradient` (duplicates summed first), every touched
    row r is updated once; other rows and their state are unchanged:

    - ``"sgd"``: ``w -= lr * (g + weight_decay * w)``
    - ``"adagrad"``: ``g += weight_decay * w; h += g * g; w -= lr * g / (sqrt(h) + eps)``
    - ``"rowwise_adagrad"``: ``g += weight_decay * w; h += mean(g * g); w -= lr * g / (sqrt(h) + eps)``
      (``h`` one value per row)
    """
    w = np.asarray(weight).astype(np.float64)
    rows, dim = w.shape
    grad, touched = embedding_bag_table_gradient(rows, dim, indices, offsets,
                                                 grad_output=grad_output, **bags)
    h = None if state is None else np.asarray(state).astype(np.float64)
    r = np.flatnonzero(touched)
    g = grad.value[r] + weight_decay * w[r]
    if optimizer == "sgd":
        w[r] -= lr * g
    elif optimizer == "adagrad":
        h[r] += g * g
        w[r] -= lr * g / (np.sqrt(h[r]) + eps)
    elif optimizer == "rowwise_adagrad":
        if dim:
            h[r] += np.mean(g * g, axis=1)
        w[r] -= lr * g / (np.sqrt(h[r]) + eps)[:, None]
    else:
        raise ValueError(f"unknown optimizer {optimizer!r}")
    return TableUpdate(w, h, touched, grad)


#: Half a unit in the last place, relative, of a value stored in a table of each dtype.
_TABLE_EPS = {np.dtype(np.float32): 0.0, np.dtype(np.float16): 2.0 ** -11, BFLOAT16: 2.0 ** -8}
#: Half the spacing of each dtype's subnormals (the absolute rounding near zero).
_TABLE_TINY = {np.dtype(np.float32): 2.0 ** -150, np.dtype(np.float16): 2.0 ** -25,
               BFLOAT16: 2.0 ** -134}


def assert_update_close(weight, state, weight0, state0, expected: TableUpdate, *, optimizer: str,
                        lr: float, eps: float, weight_decay: float, rtol: float = 2e-5,
                        stochastic: bool = False) -> None:
    """Check a table and state updated in place (``weight``, ``state``; ``weight0``, ``state0``
    before the step) against :func:`embedding_bag_backward_update`'s ``expected``.

    The tolerance follows the float32 arithmetic: ``rtol`` of the terms (the old value plus the
    step computed from the gradient's magnitude), plus the rounding to the table's dtype (half an
    ulp, or a whole one with stochastic rounding).  Untouched rows must be unchanged, bit for bit.
    """
    exp_w, exp_h, touched, (_, gabs) = expected
    weight0 = np.asarray(weight0)
    rows, dim = weight0.shape
    w0 = np.abs(weight0.astype(np.float64))
    gabs = gabs + weight_decay * w0
    if optimizer == "sgd":
        step = lr * gabs
    elif optimizer == "adagrad":
        step = lr * gabs / (np.sqrt(exp_h) + eps)
        h_tol = rtol * (state0.astype(np.float64) + 4 * gabs ** 2)
        assert np.all(np.abs(state - exp_h) <= h_tol + 1e-30), "adagrad state"
    else:
        step = lr * gabs / (np.sqrt(exp_h) + eps)[:, None]
        h_tol = rtol * (state0.astype(np.float64) + (4 * np.mean(gabs ** 2, axis=1) if dim else 0))
        assert np.all(np.abs(state - exp_h) <= h_tol + 1e-30), "rowwise state"
    ulps = 2 if stochastic else 1
    dtype = weight0.dtype
    tol = (rtol * (w0 + step) + ulps * (_TABLE_EPS[dtype] * np.abs(exp_w) * 1.001 + _TABLE_TINY[dtype])
           + 1e-30)
    err = np.abs(np.asarray(weight).astype(np.float64) - exp_w)
    assert np.all(err <= tol), (f"max error {err.max()} at "
                                f"{np.unravel_index(np.argmax(err - tol), err.shape)}")
    assert np.array_equal(np.asarray(weight)[~touched].view(np.uint8),
                          weight0[~touched].view(np.uint8)), "a row not in the batch changed"
    if state is not None:
        assert np.array_equal(np.asarray(state)[~touched], np.asarray(state0)[~touched]), \
            "the state of a row not in the batch changed"


class AdamUpdate(NamedTuple):
    """The result of :func:`embedding_bag_backward_adam`: the new table and state (float64), the
    mask of updated rows."""
    weight: np.ndarray
    state: tuple
    touched: np.ndarray


def embedding_bag_backward_adam(weight, indices, offsets=None, *, grad_output, optimizer: str,
                                state, lr: float, eps: float = 1e-8, weight_decay: float = 0.0,
                                step: int | None = None, betas=(0.9, 0.999),
                                momentum: float = 0.0, nesterov: bool = False,
                                **bags) -> AdamUpdate:
    """One fused backward + lazy Adam-family or momentum step, in float64 (inputs unmodified).

    ``state``: ``(m, v)`` for the Adam family, the momentum buffer for ``"sgd"`` with momentum.
    With ``g`` the table gradient (duplicates summed first), ``t = step``, ``b1, b2 = betas``,
    every touched row r is updated once; other rows and their state are unchanged:

    - ``"adam"``: ``g += wd w; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
      w -= lr sqrt(1-b2^t) / (1-b1^t) * m / (sqrt(v) + eps)``
    - ``"adamw"``: ``w *= 1 - lr wd``, then ``"adam"`` without the L2 term
    - ``"rowwise_adam"``: ``m`` as adam, ``v = b2 v + (1-b2) mean(g^2)`` (one per row),
      ``w -= lr (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + wd w)``
    - ``"sgd"`` with momentum: ``g += wd w; b = mu b + g; w -= lr b`` (nesterov:
      ``w -= lr (g + mu b)``)
    """
    w = np.asarray(weight).astype(np.float64)
    rows, dim = w.shape
    grad, touched = embedding_bag_table_gradient(rows, dim, indices, offsets,
                                                 grad_output=grad_output, **bags)
    r = np.flatnonzero(touched)
    g = grad.value[r]
    if optimizer == "sgd":
        buf = np.asarray(state).astype(np.float64)
        g = g + weight_decay * w[r]
        buf[r] = momentum * buf[r] + g
        w[r] -= lr * (g + momentum * buf[r] if nesterov else buf[r])
        return AdamUpdate(w, (buf,), touched)
    m = np.asarray(state[0]).astype(np.float64)
    v = np.asarray(state[1]).astype(np.float64)
    b1, b2 = betas
    bias1, bias2 = 1 - b1 ** step, 1 - b2 ** step
    if optimizer in ("adam", "adamw"):
        if optimizer == "adamw":
            w[r] *= 1 - lr * weight_decay
        else:
            g = g + weight_decay * w[r]
        m[r] = b1 * m[r] + (1 - b1) * g
        v[r] = b2 * v[r] + (1 - b2) * g * g
        w[r] -= lr * np.sqrt(bias2) / bias1 * m[r] / (np.sqrt(v[r]) + eps)
    elif optimizer == "rowwise_adam":
        m[r] = b1 * m[r] + (1 - b1) * g
        if dim:
            v[r] = b2 * v[r] + (1 - b2) * np.mean(g * g, axis=1)
        w[r] -= lr * (m[r] / bias1 / (np.sqrt(v[r] / bias2) + eps)[:, None]
                      + weight_decay * w[r])
    else:
        raise ValueError(f"unknown optimizer {optimizer!r}")
    return AdamUpdate(w, (m, v), touched)
