"""Benchmarks of one training step's embedding part: the backward of an embedding bag fused with the
sparse optimizer step (``embedding_bag_backward_update``), beside what a user would otherwise run.

Shape: the DLRM table (1M x 64 float32, B 2048, L 100, Zipf indices; docs/benchmarking.md); --quick uses
a 100k-row table, B 256, L 40.  Baselines, on the same table, indices and upstream gradient:

- ``torch``: ``nn.EmbeddingBag(sparse=True)`` backward (``out.backward(grad, retain_graph=True)``:
  the forward is not timed) + ``torch.optim.Adagrad.step()``, the element-wise optimizer ours
  computes with ``optimizer="adagrad"``;
- ``fbgemm``: FBGEMM's CPU ``SplitTableBatchedEmbeddingBagsCodegen`` with
  ``EmbOptimType.EXACT_ROWWISE_ADAGRAD`` (its backward applies the update), against ours with
  ``optimizer="rowwise_adagrad"``.  Timed only where ``fbgemm_gpu`` imports (``pip install
  fbgemm-gpu-cpu==1.8.0``); it is a comparator, never a dependency;
- ``torch:sparse_adam``: ``nn.EmbeddingBag(sparse=True)`` backward + ``torch.optim.SparseAdam``,
  the lazy update ours computes with ``optimizer="adam"``;
- ``ours:rowwise_adagrad`` beside ``optimizer="rowwise_adam"``: the row-wise Adam step against
  the fused row-wise Adagrad step it replaces (one more ``[rows, D]`` state read and written).

Each timed call updates its own copy of the table in place, with a small learning rate, so
repeated calls keep doing the same work.
"""
from __future__ import annotations

import numpy as np

from ...benchsuite import Case, torch_or_none, zipf_indices

DLRM = ("dlrm 1M x 64", 1_000_000, 64, 2048, 100)
QUICK = ("small 100k x 64", 100_000, 64, 256, 40)
LR, EPS = 0.01, 1e-8


def make_indices(seed: int, rows: int, n: int) -> np.ndarray:
    return zipf_indices(np.random.default_rng(seed), rows, n)


def make_inputs(seed: int, rows: int, dim: int, num_bags: int, bag_len: int) -> dict:
    rng = np.random.default_rng(seed + 1)
    weight = np.empty((rows, dim), np.float32)
    for start in range(0, rows, 250_000):
        stop = min(rows, start + 250_000)
        weight[start:stop] = rng.standard_normal((stop - start, dim), dtype=np.float32)
    return {"weight": weight, "indices": make_indices(seed, rows, num_bags * bag_len),
            "offsets": np.arange(num_bags, dtype=np.int64) * bag_len,
            "grad": rng.standard_normal((num_bags, dim), dtype=np.float32) * np.float32(0.01)}


def step_bytes(indices: np.ndarray, num_bags: int, dim: int, state_floats: int) -> int:
    """Bytes a step must touch: the indices, the upstream gradient, and each distinct row's
    weight and state read and written once."""
    unique = np.unique(indices).size
    return indices.size * 8 + num_bags * dim * 4 + unique * 2 * (dim + state_floats) * 4


def fbgemm_or_none():
    """FBGEMM's training TBE module and optimizer enum, or None where fbgemm_gpu does not import."""
    try:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice, EmbeddingLocation, SplitTableBatchedEmbeddingBagsCodegen)
    except Exception:   # not installed, or built for another torch
        return None
    return SplitTableBatchedEmbeddingBagsCodegen, EmbOptimType, EmbeddingLocation, ComputeDevice


def step_functions(x: dict, *, torch_threads: int | None = None, num_threads: int | None = None,
                   which: tuple[str, ...] = ("ours", "torch", "fbgemm")) -> dict:
    """The timed calls on inputs `x`: {"ours:adagrad", "ours:rowwise_adagrad", "torch",
    "fbgemm"}, those of `which` (the baselines only where installed).  Each owns a copy of the
    table."""
    weight, indices, offsets, grad = x["weight"], x["indices"], x["offsets"], x["grad"]
    fns = {}
    if "ours" in which:
        fns.update(_ours(weight, indices, offsets, grad, num_threads))
    torch = torch_or_none()
    if torch is None or not ("torch" in which or "fbgemm" in which):
        return fns
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    ti, to, tg = torch.from_numpy(indices), torch.from_numpy(offsets), torch.from_numpy(grad)
    if "torch" in which:
        fns["torch"] = _torch_step(torch, weight, ti, to, tg)
        fns["torch:sparse_adam"] = _torch_step(torch, weight, ti, to, tg, adam=True)
    fb = fbgemm_or_none() if "fbgemm" in which else None
    if fb is not None:
        fns["fbgemm"] = _fbgemm_step(torch, fb, weight, ti, to, tg)
    return fns


def _ours(weight, indices, offsets, grad, num_threads):
    import perfkernels as pk
    rows, dim = weight.shape
    w_ada, h_ada = weight.copy(), np.zeros((rows, dim), np.float32)
    w_row, h_row = weight.copy(), np.zeros(rows, np.float32)

    def ours_adagrad():
        pk.embedding_bag_backward_update(w_ada, indices, offsets, grad_output=grad,
                                         optimizer="adagrad", state=h_ada, lr=LR, eps=EPS,
                                         num_threads=num_threads)

    def ours_rowwise():
        pk.embedding_bag_backward_update(w_row, indices, offsets, grad_output=grad,
                                         optimizer="rowwise_adagrad", state=h_row, lr=LR,
                                         eps=EPS, num_threads=num_threads)

    w_adam, m_adam, v_adam = weight.copy(), np.zeros((rows, dim), np.float32), \
        np.zeros((rows, dim), np.float32)
    w_radam, m_radam, v_radam = weight.copy(), np.zeros((rows, dim), np.float32), \
        np.zeros(rows, np.float32)
    steps = {"adam": 0, "rowwise_adam": 0}

    def ours_adam():
        steps["adam"] += 1
        pk.embedding_bag_backward_update(w_adam, indices, offsets, grad_output=grad,
                                         optimizer="adam", state=(m_adam, v_adam), lr=LR,
                                         eps=EPS, step=steps["adam"], num_threads=num_threads)

    def ours_rowwise_adam():
        steps["rowwise_adam"] += 1
        pk.embedding_bag_backward_update(w_radam, indices, offsets, grad_output=grad,
                                         optimizer="rowwise_adam", state=(m_radam, v_radam),
                                         lr=LR, eps=EPS, step=steps["rowwise_adam"],
                                         num_threads=num_threads)

    return {"ours:adagrad": ours_adagrad, "ours:rowwise_adagrad": ours_rowwise,
            "ours:adam": ours_adam, "ours:rowwise_adam": ours_rowwise_adam}


def _torch_step(torch, weight, ti, to, tg, adam=False):
    rows, dim = weight.shape
    bag = torch.nn.EmbeddingBag(rows, dim, mode="sum", sparse=True)
    with torch.no_grad():
        bag.weight.copy_(torch.from_numpy(weight))
    opt = (torch.optim.SparseAdam(bag.parameters(), lr=LR, eps=EPS) if adam
           else torch.optim.Adagrad(bag.parameters(), lr=LR, eps=EPS))
    out = bag(ti, to)

    def torch_step():
        out.backward(tg, retain_graph=True)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return torch_step


def _fbgemm_step(torch, fb, weight, ti, to, tg):
    TBE, EmbOptimType, EmbeddingLocation, ComputeDevice = fb
    rows, dim = weight.shape
    tbe = TBE([(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)],
              optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=LR, eps=EPS)
    with torch.no_grad():
        tbe.weights_host.copy_(torch.from_numpy(weight).reshape(-1))
    # TBE takes offsets with the end of the last bag (B + 1 entries)
    tb_off = torch.cat([to, torch.tensor([ti.numel()], dtype=to.dtype)])
    tb_out = tbe(ti, tb_off)

    def fbgemm_step():
        tb_out.backward(tg, retain_graph=True)

    fbgemm_step.module = tbe   # for checking its table against ours
    return fbgemm_step


def cases(quick: bool) -> list[Case]:
    name, rows, dim, num_bags, bag_len = QUICK if quick else DLRM
    n = num_bags * bag_len
    holder: dict = {}

    def fns():
        if "fns" not in holder:
            # ours and the baselines at the thread counts the runner sets (one, in the main
            # table; 1, 2, ... in the scaling view)
            holder["fns"] = step_functions(make_inputs(7, rows, dim, num_bags, bag_len))
        return holder["fns"]

    indices = make_indices(7, rows, n)
    out = []
    state_floats = {"adagrad": dim, "rowwise_adagrad": 1, "adam": 2 * dim,
                    "rowwise_adam": dim + 1}
    for optimizer, base in (("adagrad", "torch"), ("rowwise_adagrad", "fbgemm"),
                            ("adam", "torch:sparse_adam"), ("rowwise_adam", "ours:rowwise_adagrad")):
        baselines = {}
        if base == "torch" and torch_or_none() is not None:
            baselines["torch"] = lambda: fns()["torch"]()
        if base == "fbgemm" and torch_or_none() is not None and fbgemm_or_none() is not None:
            baselines["fbgemm"] = lambda: fns()["fbgemm"]()
        if base == "torch:sparse_adam" and torch_or_none() is not None:
            baselines["torch:sparse_adam"] = lambda: fns()["torch:sparse_adam"]()
        if base == "ours:rowwise_adagrad":
            baselines["ours:rowwise_adagrad"] = lambda: fns()["ours:rowwise_adagrad"]()
        nbytes = step_bytes(indices, num_bags, dim, state_floats[optimizer])
        out.append(Case("training", f"backward+{optimizer} {name} B={num_bags} L={bag_len} zipf",
                        nbytes, (lambda o=optimizer: fns()["ours:" + o]()), baselines,
                        scaling=True))
    return out
