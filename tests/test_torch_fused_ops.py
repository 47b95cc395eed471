"""The fused whole-model ops (perfkernels.torch._fused_ops): the tensor fast path and the
registered op against the NumPy API (bit for bit) and against torch's unfused ops (values and
gradients), on every ISA level, for table dtypes, index widths, modes, padding and offsets."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import perfkernels as pk  # noqa: E402
from perfkernels import reference  # noqa: E402
from perfkernels.torch import _fused_ops  # noqa: E402

OP = torch.ops.perfkernels.embedding_bags_interaction


def inputs(seed, F=4, B=9, D=8, dtype=torch.float32, index_dtype=torch.int64, last=False):
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(20 + f, D, generator=g).to(dtype) for f in range(F)]
    indices, offsets = [], []
    for f in range(F):
        lens = torch.randint(0, 4, (B,), generator=g)
        o = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
        indices.append(torch.randint(0, 20 + f, (int(o[-1]),), generator=g).to(index_dtype))
        offsets.append((o if last else o[:-1]).to(index_dtype))
    dense = torch.randn(B, D, generator=g)
    return dense, weights, indices, offsets


def unfused(dense, weights, indices, offsets, last, interaction, pairs, itself, mean, pads):
    ly = [torch.nn.functional.embedding_bag(i, w.float(), o, mode="mean" if m else "sum",
                                            include_last_offset=last,
                                            padding_idx=None if p < 0 else p)
          for w, i, o, m, p in zip(weights, indices, offsets, mean, pads)]
    if interaction == "cat":
        return torch.cat([dense] + ly, 1)
    T = torch.cat([dense] + ly, 1).view(dense.shape[0], -1, dense.shape[1])
    Z = torch.bmm(T, T.transpose(1, 2))
    n = Z.shape[1]
    if pairs == "dlrm":
        li, lj = torch.tril_indices(n, n, offset=0 if itself else -1)
    else:
        li, lj = torch.triu_indices(n, n, offset=0 if itself else 1)
    return torch.cat([dense, Z[:, li, lj]], 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("form", [("dot", "dlrm", False), ("dot", "dlrm", True),
                                  ("dot", "torchrec", False), ("cat", "dlrm", False)])
def test_fast_path_and_op_equal_the_numpy_api_and_torch(isa, dtype, index_dtype, form):
    interaction, pairs, itself = form
    for last in (False, True):
        dense, weights, indices, offsets = inputs(3, dtype=dtype, index_dtype=index_dtype,
                                                  last=last)
        mean, pads = [0, 1, 0, 1], [-1, 2, 0, -1]
        args = (dense, weights, indices, offsets, last, interaction, pairs, itself, mean, pads,
                [0] * 4, [8] * 4, 0)
        with torch.no_grad():
            fast = _fused_ops.embedding_bags_interaction(*args)
            op = OP(*args)
        numpy = pk.embedding_bags_interaction(
            dense.numpy(), [w.view(torch.int16).numpy().view(reference.BFLOAT16)
                            if w.dtype is torch.bfloat16 else w.numpy() for w in weights],
            [i.numpy() for i in indices], [o.numpy() for o in offsets], interaction=interaction,
            pairs=pairs, self_interaction=itself, include_last_offset=last,
            modes=["mean" if m else "sum" for m in mean],
            padding_idx=[None if p < 0 else p for p in pads])
        assert fast.numpy().tobytes() == numpy.tobytes()
        assert op.numpy().tobytes() == numpy.tobytes()
        want = unfused(dense, weights, indices, offsets, last, interaction, pairs, itself, mean,
                       pads)
        torch.testing.assert_close(fast, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", [("dot", "dlrm", False), ("dot", "torchrec", True),
                                  ("cat", "dlrm", False)])
def test_gradients_equal_the_unfused_ops(form):
    interaction, pairs, itself = form
    dense, weights, indices, offsets = inputs(5, F=3, B=12, D=5)
    mean, pads = [0, 1, 0], [-1, -1, 3]
    grads = []
    for fused in (True, False):
        x = dense.clone().requires_grad_()
        ws = [w.clone().requires_grad_() for w in weights]
        args = (x, ws, indices, offsets, False, interaction, pairs, itself, mean, pads)
        out = (_fused_ops.embedding_bags_interaction(*args, [0] * 3, [5] * 3, 0) if fused
               else unfused(*args))
        (out * torch.linspace(-1, 2, out.numel()).view_as(out)).sum().backward()
        grads.append([x.grad] + [w.grad for w in ws])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_bad_index_and_bad_offsets():
    dense, weights, indices, offsets = inputs(7)
    indices[2][1] = 100
    with pytest.raises(RuntimeError, match=r"Index 1 of input takes value 100 which is not in "
                                           r"the valid range \[0, 22\)"):
        with torch.no_grad():
            OP(dense, weights, indices, offsets, False, "dot", "dlrm", False, [0] * 4, [-1] * 4,
               [0] * 4, [8] * 4, 0)
    dense, weights, indices, offsets = inputs(7)
    offsets[1][0] = 1
    with pytest.raises(_fused_ops.FusedInputError, match="feature 1: offsets\\[0\\] = 1"):
        with torch.no_grad():
            _fused_ops.embedding_bags_interaction(dense, weights, indices, offsets, False, "dot",
                                                  "dlrm", False, [0] * 4, [-1] * 4, [0] * 4,
                                                  [8] * 4, 0)


def test_threads_do_not_change_the_bits():
    dense, weights, indices, offsets = inputs(9, F=6, B=3000, D=16)
    outs = []
    for nt in (1, 2, 3):
        old = pk.get_num_threads()
        pk.set_num_threads(nt)
        try:
            with torch.no_grad():
                outs.append(_fused_ops.embedding_bags_interaction(
                    dense, weights, indices, offsets, False, "dot", "dlrm", False, [0] * 6,
                    [-1] * 6, [0] * 6, [16] * 6, 0).numpy().tobytes())
        finally:
            pk.set_num_threads(old)
    assert outs[0] == outs[1] == outs[2]
