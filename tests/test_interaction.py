"""dot_interaction: DLRM's pairwise dot products, against the float64 reference (written from the
formula), against PyTorch's bmm + gather of facebookresearch DLRM and TorchRec, every ISA level."""
import numpy as np
import pytest

import perfkernels as pk
from perfkernels import reference
from perfkernels.families.interaction._interaction import pair_lists

from conftest import AWKWARD_DIMS, readonly, unaligned


PAIR_FORMS = [("dlrm", False), ("dlrm", True), ("torchrec", False), ("torchrec", True)]


def check_close(got, expected):
    reference.assert_close(got, expected.value, expected.magnitude + 1.0, rtol=1e-5)


def dense_sparse(rng, B, F, D):
    return (rng.standard_normal((B, D)).astype(np.float32),
            rng.standard_normal((B, F, D)).astype(np.float32))


@pytest.mark.parametrize("D", AWKWARD_DIMS)
@pytest.mark.parametrize("pairs,itself", PAIR_FORMS)
def test_matches_reference(isa, rng, D, pairs, itself):
    B, F = 9, 6
    dense, sparse = dense_sparse(rng, B, F, D)
    got = pk.dot_interaction(dense, sparse, pairs=pairs, self_interaction=itself)
    P = (F + 1) * F // 2 + (F + 1 if itself else 0)
    assert got.shape == (B, D + P) and got.dtype == np.float32
    assert got[:, :D].tobytes() == dense.tobytes()
    check_close(got, reference.dot_interaction(dense, sparse, pairs=pairs,
                                               self_interaction=itself))


def test_pair_order_is_the_models_own():
    torch = pytest.importorskip("torch")
    for n in (1, 2, 5, 27):
        for itself in (False, True):
            # facebookresearch DLRM's pairs: (i, j) for j < i (j <= i with the self-interaction),
            # i the outer loop; and the tril_indices of the same triangle
            pairs = [(i, j) for i in range(n) for j in range(i + 1 if itself else i)]
            li, lj = [i for i, _ in pairs], [j for _, j in pairs]
            got = pair_lists(n, "dlrm", itself)
            assert got[0].tolist() == li and got[1].tolist() == lj
            tril = torch.tril_indices(n, n, offset=0 if itself else -1)
            assert tril[0].tolist() == li and tril[1].tolist() == lj
        triu = torch.triu_indices(n, n, offset=1)           # TorchRec's InteractionArch
        got = pair_lists(n, "torchrec")
        assert got[0].tolist() == triu[0].tolist() and got[1].tolist() == triu[1].tolist()


def test_matches_torch_bmm_and_any_thread_count(isa, rng):
    torch = pytest.importorskip("torch")
    B, F, D = 700, 26, 16
    dense = rng.standard_normal((B, D)).astype(np.float32)
    sparse = rng.standard_normal((B, F, D)).astype(np.float32)
    results = [pk.dot_interaction(dense, sparse, num_threads=nt) for nt in (1, 2, 3, 8)]
    assert all(r.tobytes() == results[0].tobytes() for r in results)
    x, s = torch.from_numpy(dense), torch.from_numpy(sparse)
    T = torch.cat([x.unsqueeze(1), s], 1)
    Z = torch.bmm(T, T.transpose(1, 2))
    li, lj = torch.tril_indices(F + 1, F + 1, offset=-1)
    np.testing.assert_allclose(results[0], torch.cat([x, Z[:, li, lj]], 1).numpy(),
                               rtol=1e-5, atol=1e-4)


def test_explicit_pairs_out_and_unusual_inputs(isa, rng):
    dense = rng.standard_normal((4, 9)).astype(np.float32)
    sparse = rng.standard_normal((4, 3, 9)).astype(np.float32)
    pairs = (np.array([3, 0, 2]), np.array([3, 1, 0]))
    expected = pk.dot_interaction(dense, sparse, pairs=pairs)
    check_close(expected, reference.dot_interaction(dense, sparse, pairs=pairs))
    out = np.full((4, 12), 7.0, np.float32)
    assert pk.dot_interaction(dense, sparse, pairs=pairs, out=out) is out
    np.testing.assert_array_equal(out, expected)
    got = pk.dot_interaction(unaligned(dense), readonly(sparse), pairs=pairs)
    np.testing.assert_array_equal(got, expected)
    strided = np.ascontiguousarray(np.repeat(sparse, 2, axis=2))[:, :, ::2]
    np.testing.assert_array_equal(pk.dot_interaction(dense, strided, pairs=pairs), expected)
    empty = pk.dot_interaction(np.zeros((0, 9), np.float32), np.zeros((0, 3, 9), np.float32))
    assert empty.shape == (0, 9 + 6)
    no_features = pk.dot_interaction(dense, np.zeros((4, 0, 9), np.float32))
    np.testing.assert_array_equal(no_features, dense)


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(sparse=np.ones((4, 2, 3), np.float32)), ValueError, r"sparse must be \[B, F, D\]"),
    (dict(dense=np.ones(4, np.float32)), ValueError, "dense must be 2-D"),
    (dict(dense=np.ones((4, 2), np.float64)), TypeError, "dense must have dtype float32"),
    (dict(pairs="lower"), ValueError, "pairs must be 'dlrm', 'torchrec'"),
    (dict(pairs=3), TypeError, "pairs must be 'dlrm', 'torchrec' or a tuple"),
    (dict(pairs=([0], [-1])), IndexError, r"pairs lj\[0\] = -1 is out of range for 3 rows"),
    (dict(pairs=([0, 1], [0])), ValueError, "li and lj have 2 and 1 entries"),
    (dict(pairs=([0.5], [0])), TypeError, "pairs li must be a 1-D integer array"),
    (dict(out=np.ones((4, 3), np.float32)), ValueError, "out has shape"),
])
def test_argument_errors(kw, exc, msg):
    args = dict(dense=np.ones((4, 2), np.float32), sparse=np.ones((4, 2, 2), np.float32))
    args.update(kw)
    with pytest.raises(exc, match=msg):
        pk.dot_interaction(args.pop("dense"), args.pop("sparse"), **args)


# --------------------------------------------------------------------------- the gradient

def check_grads(got, expected):
    for g, e in zip(got, expected):
        assert g.shape == e.value.shape and g.dtype == np.float32
        reference.assert_close(g, e.value, e.magnitude + 1.0, rtol=1e-5)


@pytest.mark.parametrize("D", AWKWARD_DIMS)
@pytest.mark.parametrize("pairs,itself", PAIR_FORMS)
def test_backward_matches_reference(isa, rng, D, pairs, itself):
    B, F = 9, 6
    dense, sparse = dense_sparse(rng, B, F, D)
    P = (F + 1) * F // 2 + (F + 1 if itself else 0)
    grad = rng.standard_normal((B, D + P)).astype(np.float32)
    got = pk.dot_interaction_backward(grad, dense, sparse, pairs=pairs, self_interaction=itself)
    check_grads(got, reference.dot_interaction_backward(grad, dense, sparse, pairs=pairs,
                                                         self_interaction=itself))
    # the pooled rows as F separate arrays: the same bits
    apart = pk.dot_interaction_backward(grad, dense, [sparse[:, f].copy() for f in range(F)],
                                        pairs=pairs, self_interaction=itself)
    assert all(a.tobytes() == g.tobytes() for a, g in zip(apart, got))


@pytest.mark.parametrize("pairs,itself", [("dlrm", False), ("torchrec", True)])
def test_backward_matches_torch_autograd_and_any_thread_count(isa, rng, pairs, itself):
    torch = pytest.importorskip("torch")
    B, F, D = 700, 26, 16
    dense, sparse = dense_sparse(rng, B, F, D)
    li, lj = pair_lists(F + 1, pairs, itself)
    grad = rng.standard_normal((B, D + len(li))).astype(np.float32)
    results = [pk.dot_interaction_backward(grad, dense, sparse, pairs=pairs,
                                           self_interaction=itself, num_threads=nt)
               for nt in (1, 2, 3, 8)]
    assert all(r[k].tobytes() == results[0][k].tobytes() for r in results for k in (0, 1))
    # the models' own code: cat([x, bmm(T, T^T)[:, li, lj]]), differentiated by autograd
    x = torch.from_numpy(dense).requires_grad_()
    s = torch.from_numpy(sparse).requires_grad_()
    T = torch.cat([x.unsqueeze(1), s], 1)
    Z = torch.bmm(T, T.transpose(1, 2))
    out = torch.cat([x, Z[:, torch.from_numpy(li).long(), torch.from_numpy(lj).long()]], 1)
    out.backward(torch.from_numpy(grad))
    np.testing.assert_allclose(results[0][0], x.grad.numpy(), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(results[0][1], s.grad.numpy(), rtol=1e-5, atol=1e-4)


def test_backward_out_explicit_pairs_and_unusual_inputs(isa, rng):
    dense = rng.standard_normal((4, 9)).astype(np.float32)
    sparse = rng.standard_normal((4, 3, 9)).astype(np.float32)
    pairs = (np.array([3, 0, 2, 2]), np.array([3, 1, 0, 0]))     # a repeated pair adds up
    grad = rng.standard_normal((4, 13)).astype(np.float32)
    expected = pk.dot_interaction_backward(grad, dense, sparse, pairs=pairs)
    check_grads(expected, reference.dot_interaction_backward(grad, dense, sparse, pairs=pairs))
    outs = (np.full((4, 9), 7.0, np.float32), np.full((4, 3, 9), 7.0, np.float32))
    got = pk.dot_interaction_backward(grad, dense, sparse, pairs=pairs, out=outs)
    assert got[0] is outs[0] and got[1] is outs[1]
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)
    odd = pk.dot_interaction_backward(readonly(grad), unaligned(dense),
                                      np.ascontiguousarray(np.repeat(sparse, 2, axis=2))[:, :, ::2],
                                      pairs=pairs)
    for g, e in zip(odd, expected):
        np.testing.assert_array_equal(g, e)
    empty = pk.dot_interaction_backward(np.zeros((0, 15), np.float32), np.zeros((0, 9), np.float32),
                                        np.zeros((0, 3, 9), np.float32))
    assert empty[0].shape == (0, 9) and empty[1].shape == (0, 3, 9)
    alone = pk.dot_interaction_backward(grad[:, :9], dense, [])
    np.testing.assert_array_equal(alone[0], grad[:, :9])
    assert alone[1].shape == (4, 0, 9)


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(grad=np.ones((4, 4), np.float32)), ValueError, r"grad must be \[B, D \+ P\] = \[4, 5\]"),
    (dict(sparse=np.ones((4, 2, 3), np.float32)), ValueError, r"sparse must be \[B, F, D\]"),
    (dict(sparse=[np.ones((4, 2), np.float32), np.ones((3, 2), np.float32)]), ValueError,
     r"sparse\[1\] must be \[B, D\] = \[4, 2\]"),
    (dict(sparse=[np.ones((4, 2), np.float64)] * 2), TypeError, r"sparse\[0\] must have dtype"),
    (dict(dense=np.ones(4, np.float32)), ValueError, "dense must be 2-D"),
    (dict(grad=np.ones((4, 5), np.float64)), TypeError, "grad must have dtype float32"),
    (dict(pairs="lower"), ValueError, "pairs must be 'dlrm', 'torchrec'"),
    (dict(out=np.ones((4, 2), np.float32)), TypeError, r"out must be a tuple \(d_dense, d_sparse\)"),
    (dict(out=(None, np.ones((4, 2, 3), np.float32))), ValueError, "out has shape"),
])
def test_backward_argument_errors(kw, exc, msg):
    args = dict(grad=np.ones((4, 5), np.float32), dense=np.ones((4, 2), np.float32),
                sparse=np.ones((4, 2, 2), np.float32))
    args.update(kw)
    keep = np.ones((4, 2), np.float32)
    if "out" not in kw:
        args["out"] = (keep, None)
    with pytest.raises(exc, match=msg):
        pk.dot_interaction_backward(args.pop("grad"), args.pop("dense"), args.pop("sparse"),
                                    **args)
    np.testing.assert_array_equal(keep, 1.0)        # an out= is untouched on error
