"""What the training tests share: random bags, and stock PyTorch's sparse training of
``nn.EmbeddingBag`` to compare the fused updates with."""
from __future__ import annotations

import numpy as np


def bags_of(rng, rows, num_bags, max_len, *, empty=True):
    """``num_bags`` bags of up to ``max_len`` random indices in [0, rows) (empty bags too unless
    ``empty=False``): (indices, offsets)."""
    lengths = rng.integers(0 if empty else 1, max_len + 1, num_bags)
    indices = rng.integers(0, rows, int(lengths.sum()))
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return indices, offsets


def torch_bags_of(gen, rows, num_bags, max_len):
    """``num_bags`` bags of up to ``max_len`` random indices in [0, rows) drawn from the torch
    Generator ``gen`` (empty bags too): int64 (indices, offsets) tensors."""
    import torch
    lengths = torch.randint(0, max_len + 1, (num_bags,), generator=gen)
    ix = torch.randint(0, rows, (int(lengths.sum()),), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)[:-1]])
    return ix, offsets


def torch_sparse_bag(weight, mode, padding_idx):
    """``nn.EmbeddingBag(sparse=True)`` holding a copy of the float32 table ``weight``."""
    import torch
    rows, D = weight.shape
    bag = torch.nn.EmbeddingBag(rows, D, mode=mode, sparse=True, padding_idx=padding_idx)
    with torch.no_grad():
        bag.weight.copy_(torch.from_numpy(weight))
    return bag


def torch_sparse_step(rng, bag, optimizer, B, padding_idx, weighted):
    """One step of ``optimizer`` on ``bag`` for B random bags of a 12-row hot set (duplicates
    within and across steps; every 4th index ``padding_idx`` when given; random per-sample
    weights when ``weighted``) and a random output gradient.  Returns what the step used:
    (indices, offsets, per_sample_weights or None, grad_output)."""
    import torch
    indices, offsets = bags_of(rng, 12, B, 6)
    if padding_idx is not None:
        indices[::4] = padding_idx
    psw = rng.standard_normal(indices.size).astype(np.float32) if weighted else None
    grad = rng.standard_normal((B, bag.embedding_dim)).astype(np.float32)
    optimizer.zero_grad()
    out = bag(torch.from_numpy(indices), torch.from_numpy(offsets),
              per_sample_weights=None if psw is None else torch.from_numpy(psw))
    (out * torch.from_numpy(grad)).sum().backward()
    optimizer.step()
    return indices, offsets, psw, grad
