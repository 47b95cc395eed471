"""Benchmark of dot_interaction and its gradient: DLRM's dot interaction at the Criteo Kaggle shape
(dense row and 26 pooled rows of D 16, 351 pairs), against PyTorch's bmm + tril gather + cat, and
the gradient against what autograd runs for it (a scatter into [B, n, n], bmm)."""
from __future__ import annotations

import numpy as np

from ...benchsuite import Case, torch_or_none


def interaction_case(seed: int, batch: int, features: int = 26, dim: int = 16) -> Case:
    import perfkernels as pk
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((batch, dim)).astype(np.float32)
    sparse = rng.standard_normal((batch, features, dim)).astype(np.float32)
    pairs = features * (features + 1) // 2
    out = np.empty((batch, dim + pairs), np.float32)
    nbytes = dense.nbytes + sparse.nbytes + out.nbytes

    def ours():
        return pk.dot_interaction(dense, sparse, out=out)

    baselines = {}
    torch = torch_or_none()
    if torch is not None:
        x, ly = torch.from_numpy(dense), torch.from_numpy(sparse)
        li, lj = torch.tril_indices(features + 1, features + 1, offset=-1)

        def torch_dot():
            t = torch.cat([x.unsqueeze(1), ly], dim=1)
            z = torch.bmm(t, t.transpose(1, 2))
            return torch.cat([x, z[:, li, lj]], dim=1)

        baselines["torch bmm"] = torch_dot
    return Case("interaction", f"dot F={features} D={dim} B={batch}", nbytes, ours, baselines,
                scaling=True)


def interaction_backward_case(seed: int, batch: int, features: int = 26, dim: int = 64) -> Case:
    import perfkernels as pk
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((batch, dim)).astype(np.float32)
    pooled = [rng.standard_normal((batch, dim)).astype(np.float32) for _ in range(features)]
    pairs = features * (features + 1) // 2
    grad = rng.standard_normal((batch, dim + pairs)).astype(np.float32)
    outs = (np.empty((batch, dim), np.float32), np.empty((batch, features, dim), np.float32))
    nbytes = dense.nbytes * (2 * features + 3) + grad.nbytes

    def ours():
        return pk.dot_interaction_backward(grad, dense, pooled, out=outs)

    baselines = {}
    torch = torch_or_none()
    if torch is not None:
        x, ly, g = torch.from_numpy(dense), [torch.from_numpy(p) for p in pooled], \
            torch.from_numpy(grad)
        li, lj = torch.tril_indices(features + 1, features + 1, offset=-1)

        def torch_grad():     # the ops of the model's own backward
            t = torch.stack([x] + ly, dim=1)
            m = torch.zeros(batch, features + 1, features + 1)
            m[:, li, lj] = g[:, dim:]
            dz = torch.bmm(m + m.transpose(1, 2), t)
            return g[:, :dim] + dz[:, 0], dz[:, 1:]

        baselines["torch bmm"] = torch_grad
    return Case("interaction", f"dot backward F={features} D={dim} B={batch}", nbytes, ours,
                baselines, scaling=True)


def cases(quick: bool) -> list[Case]:
    return [interaction_case(11, 128 if quick else 2048),
            interaction_backward_case(12, 128 if quick else 2048)]
