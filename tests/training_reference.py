"""float64 NumPy reference of the fused embedding-bag backward + sparse optimizer step, written from
the formulas (independent of the kernels): g[r] = sum over entries j with indices[j] == r of
scale_b * w_j * grad_output[b]; duplicates summed first; each touched row updated once."""
import numpy as np


def bag_bounds(n, offsets=None, lengths=None, include_last_offset=False, shape2d=None):
    """[(begin, end)] of each bag."""
    if shape2d is not None:
        B, L = shape2d
        return [(b * L, (b + 1) * L) for b in range(B)]
    if lengths is not None:
        ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
        return [(int(e - l), int(e)) for e, l in zip(ends, lengths)]
    offsets = [int(o) for o in offsets]
    if include_last_offset:
        return list(zip(offsets[:-1], offsets[1:]))
    return list(zip(offsets, offsets[1:] + [n]))


def row_gradients(rows, D, indices, offsets=None, *, grad_output, lengths=None,
                  per_sample_weights=None, mode="sum", include_last_offset=False, padding_idx=None,
                  positional_weights=False):
    """(g, touched): float64 [rows, D] gradient of the table and the boolean mask of touched rows."""
    idx = np.asarray(indices)
    shape2d = idx.shape if idx.ndim == 2 else None
    flat = idx.reshape(-1).astype(np.int64)
    psw = (None if per_sample_weights is None
           else np.asarray(per_sample_weights, np.float64).reshape(-1))
    pad = None if padding_idx is None else (padding_idx + rows if padding_idx < 0 else padding_idx)
    G = np.asarray(grad_output, np.float64)
    g = np.zeros((rows, D))
    touched = np.zeros(rows, dtype=bool)
    for b, (lo, hi) in enumerate(bag_bounds(flat.size, offsets, lengths, include_last_offset,
                                            shape2d)):
        live = [j for j in range(lo, hi) if flat[j] != pad]
        scale = 1.0 / len(live) if (mode == "mean" and live) else 1.0
        for j in live:
            wj = 1.0 if psw is None else (psw[j - lo] if positional_weights else psw[j])
            g[flat[j]] += scale * wj * G[b]
            touched[flat[j]] = True
    return g, touched


def backward_update(weight, indices, offsets=None, *, grad_output, optimizer="sgd", state=None,
                    lr, eps=1e-8, weight_decay=0.0, **bags):
    """(new_weight, new_state) in float64 (the inputs are not modified)."""
    w = np.asarray(weight).astype(np.float64)
    rows, D = w.shape
    g, touched = row_gradients(rows, D, indices, offsets, grad_output=grad_output, **bags)
    h = None if state is None else np.asarray(state).astype(np.float64)
    r = np.flatnonzero(touched)
    if optimizer == "sgd":
        w[r] -= lr * (g[r] + weight_decay * w[r])
    elif optimizer == "adagrad":
        gr = g[r] + weight_decay * w[r]
        h[r] += gr * gr
        w[r] -= lr * gr / (np.sqrt(h[r]) + eps)
    elif optimizer == "rowwise_adagrad":
        gr = g[r] + weight_decay * w[r]
        if D:
            h[r] += np.mean(gr * gr, axis=1)
        w[r] -= lr * gr / (np.sqrt(h[r]) + eps)[:, None]
    else:
        raise ValueError(optimizer)
    return w, h
