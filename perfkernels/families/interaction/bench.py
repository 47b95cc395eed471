"""Benchmark of dot_interaction: DLRM's dot interaction at the Criteo Kaggle shape (dense row and
26 pooled rows of D 16, 351 pairs), against PyTorch's bmm + tril gather + cat."""
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


def cases(quick: bool) -> list[Case]:
    return [interaction_case(11, 128 if quick else 2048)]
