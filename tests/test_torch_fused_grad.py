"""The fused whole-model ops with grad mode on: an optimized model's eager call records its
gradient through a lean autograd function (not torch.library's per-call autograd wrapper),
gives the no-grad forward's output bit for bit, the gradients of the unfused model, and takes the
no-grad route where no input needs a gradient; the profiler still sees the registered op."""
import copy

import pytest

torch = pytest.importorskip("torch")

import perfkernels.torch as pkt  # noqa: E402
from perfkernels.torch import _fused_ops  # noqa: E402
from perfkernels.torch import (EmbeddingBagCollection, EmbeddingBagConfig,  # noqa: E402
                               KeyedJaggedTensor)

from dlrm_models import TorchRecDLRM, dlrm_inputs, dlrm_net  # noqa: E402

ROWS = [10, 200, 3, 57, 1000]


def _model(interaction, seed=0):
    return dlrm_net(ROWS, 4, [6, 9, 4], [7, 1], interaction, False, seed=seed)


def _torchrec_model(F=3, D=8, seed=0):
    torch.manual_seed(seed)
    tables = [EmbeddingBagConfig(num_embeddings=20 + 7 * f, embedding_dim=D, name=f"t{f}",
                                 feature_names=[f"f{f}"]) for f in range(F)]
    return TorchRecDLRM(EmbeddingBagCollection(tables), dense_in_features=5,
                        dense_arch_layer_sizes=[12, D], over_arch_layer_sizes=[9, 1])


def _kjt(F, B, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 3, (F * B,), generator=g)
    values = torch.cat([torch.randint(0, 20 + 7 * f, (int(lengths[f * B:(f + 1) * B].sum()),),
                                      generator=g) for f in range(F)])
    return KeyedJaggedTensor([f"f{f}" for f in range(F)], values, lengths=lengths)


class _Spy:
    """Counts the calls of a module-level function of _fused_ops while in place."""

    def __init__(self, monkeypatch, name):
        self.calls = 0
        original = getattr(_fused_ops, name)

        def spy(*args):
            self.calls += 1
            return original(*args)
        monkeypatch.setattr(_fused_ops, name, spy)


def _dense(g):
    return None if g is None else (g.to_dense() if g.is_sparse else g)


@pytest.mark.parametrize("interaction", ["dot", "cat"])
def test_grad_on_forward_equals_no_grad_bit_for_bit_and_gradients_the_unfused(interaction,
                                                                             monkeypatch):
    stock = _model(interaction, seed=1)
    ref = copy.deepcopy(stock)
    opt = pkt.optimize(stock)
    inputs = dlrm_inputs(ROWS, 16, 6, bag=3, seed=2)
    with torch.no_grad():
        opt(*inputs)                                 # capture
        want = opt(*inputs)
    lean = _Spy(monkeypatch, "_bags_interaction_apply")
    got = opt(*inputs)
    assert lean.calls == 1 and got.requires_grad
    assert torch.equal(got, want)
    got.sum().backward()
    ref(*inputs).sum().backward()
    for (name, a), b in zip(ref.named_parameters(), stock.parameters()):
        torch.testing.assert_close(_dense(b.grad), _dense(a.grad), rtol=1e-5, atol=1e-6,
                                   msg=name)


@pytest.mark.parametrize("interaction", ["dot", "cat"])
def test_no_input_needing_a_gradient_takes_the_no_grad_route(interaction, monkeypatch):
    """requires_grad False everywhere, grad mode on: the no-grad route, the no-grad output."""
    opt = pkt.optimize(_model(interaction, seed=2)).requires_grad_(False)
    inputs = dlrm_inputs(ROWS, 8, 6, bag=2, seed=3)
    with torch.no_grad():
        opt(*inputs)
        want = opt(*inputs)
    lean = _Spy(monkeypatch, "_bags_interaction_apply")
    eager = _Spy(monkeypatch, "_eager")
    got = opt(*inputs)
    assert torch.is_grad_enabled() and not got.requires_grad
    assert lean.calls == 0 and eager.calls == 1
    assert torch.equal(got, want)


def test_frozen_tables_still_give_the_dense_gradient(monkeypatch):
    """Tables frozen, the MLPs not: the interaction's gradient reaches the bottom MLP, the tables
    get none, the forward is the no-grad one's bit for bit."""
    stock = _model("dot", seed=3)
    ref = copy.deepcopy(stock)
    opt = pkt.optimize(stock)
    for m in (stock, ref):
        for bag in m.emb_l:
            bag.weight.requires_grad_(False)
    inputs = dlrm_inputs(ROWS, 8, 6, seed=4)
    with torch.no_grad():
        opt(*inputs)
        want = opt(*inputs)
    got = opt(*inputs)
    assert torch.equal(got, want)
    got.sum().backward()
    ref(*inputs).sum().backward()
    for (name, a), b in zip(ref.named_parameters(), stock.parameters()):
        if name.startswith("emb_l"):
            assert a.grad is None and b.grad is None
        else:
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_collection_model_grad_on(monkeypatch):
    """The KJT form: grad-on forward bit for bit the no-grad one, gradients the unfused
    model's."""
    stock = _torchrec_model(seed=5)
    ref = copy.deepcopy(stock)
    opt = pkt.optimize(stock)
    dense = torch.rand(12, 5)
    with torch.no_grad():
        opt(dense, _kjt(3, 12, 6))
        want = opt(dense, _kjt(3, 12, 6))
    lean = _Spy(monkeypatch, "_collection_interaction_apply")
    got = opt(dense, _kjt(3, 12, 6))
    assert lean.calls == 1 and torch.equal(got, want)
    got.square().sum().backward()
    ref(dense, _kjt(3, 12, 6)).square().sum().backward()
    for (name, a), b in zip(ref.named_parameters(), stock.parameters()):
        torch.testing.assert_close(_dense(b.grad), _dense(a.grad), rtol=1e-5, atol=1e-6,
                                   msg=name)


def test_profiler_sees_the_op_with_grad_on():
    stock = _model("dot", seed=6)
    ref = copy.deepcopy(stock)
    opt = pkt.optimize(stock)
    inputs = dlrm_inputs(ROWS, 4, 6, seed=7)
    with torch.no_grad():
        opt(*inputs)
    with torch.profiler.profile() as prof:
        out = opt(*inputs)
    names = {e.name for e in prof.events()}
    assert "perfkernels::embedding_bags_interaction" in names
    out.sum().backward()
    ref(*inputs).sum().backward()
    for (name, a), b in zip(ref.named_parameters(), stock.parameters()):
        torch.testing.assert_close(_dense(b.grad), _dense(a.grad), rtol=1e-5, atol=1e-6,
                                   msg=name)
