"""perfkernels.torch under what a careless model does: tables shared by several names or tied,
a fused-optimizer module used twice in one graph, autograd.grad on a subset, double backward,
malformed KJTs in training, hyper-parameters past float32.  Each test failed before its fix."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import perfkernels.torch as pt  # noqa: E402

# --------------------------------------------------------------------------- convert keeps ties


class _Shared(torch.nn.Module):
    """One EmbeddingBag under two names of one parent and under a second parent, plus a second
    module whose weight is tied to the first's."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.EmbeddingBag(10, 4, mode="sum")
        self.b = self.a
        self.inner = torch.nn.Sequential(self.a)
        self.tied = torch.nn.EmbeddingBag(10, 4, mode="mean")
        self.tied.weight = self.a.weight


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, None])
def test_convert_keeps_shared_and_tied_tables_one_parameter(inplace, dtype):
    model = _Shared()
    converted = pt.convert(model, dtype=dtype, inplace=inplace)
    assert isinstance(converted.a, pt.EmbeddingBag)
    assert converted.b is converted.a and converted.inner[0] is converted.a
    assert isinstance(converted.tied, pt.EmbeddingBag)
    assert converted.tied.weight is converted.a.weight
    assert len(list(converted.parameters())) == 1
    if dtype is not None:
        assert converted.a.weight.dtype == dtype
    # one parameter: an update through one name is seen through every other
    with torch.no_grad():
        converted.b.weight[3] += 1
    ix, off = torch.tensor([3]), torch.tensor([0])
    torch.testing.assert_close(converted.a(ix, off), converted.b(ix, off))
    torch.testing.assert_close(converted.tied(ix, off), converted.a(ix, off))


def test_convert_twice_keeps_the_ties():
    model = pt.convert(pt.convert(_Shared(), dtype=torch.float16), dtype=torch.float16)
    assert model.b is model.a and model.tied.weight is model.a.weight
    assert len(list(model.parameters())) == 1


# --------------------------------------------------------------------------- fused optimizer


def _fused_bag(rows=6, dim=3, lr=0.5):
    gen = torch.Generator().manual_seed(3)
    bag = pt.EmbeddingBag(rows, dim, mode="sum", fused_optimizer=("sgd", {"lr": lr}))
    with torch.no_grad():
        bag.weight.copy_(torch.randn(rows, dim, generator=gen))
    return bag


def _torch_twin(bag):
    twin = torch.nn.EmbeddingBag(bag.num_embeddings, bag.embedding_dim, mode="sum")
    with torch.no_grad():
        twin.weight.copy_(bag.weight)
    return twin


def test_module_used_twice_per_sample_weights_gradients_see_the_table_before_any_update():
    """Both lookups' per_sample_weights gradients come from the table the forward read; the
    table is then stepped with both lookups' gradients (sgd: additive)."""
    lr = 0.5
    bag = _fused_bag(lr=lr)
    twin = _torch_twin(bag)
    ix1, off1 = torch.tensor([0, 1, 1, 2]), torch.tensor([0, 2])
    ix2, off2 = torch.tensor([1, 3, 0]), torch.tensor([0, 1])
    psw1 = torch.tensor([1.0, 2.0, -1.0, 0.5], requires_grad=True)
    psw2 = torch.tensor([3.0, -2.0, 1.5], requires_grad=True)
    r1, r2 = psw1.detach().clone().requires_grad_(), psw2.detach().clone().requires_grad_()

    loss = (bag(ix1, off1, psw1) * 2).sum() + (bag(ix2, off2, psw2) ** 2).sum()
    loss.backward()
    ref = (twin(ix1, off1, r1) * 2).sum() + (twin(ix2, off2, r2) ** 2).sum()
    ref.backward()
    torch.testing.assert_close(psw1.grad, r1.grad)
    torch.testing.assert_close(psw2.grad, r2.grad)
    torch.testing.assert_close(bag.weight.detach(), (twin.weight - lr * twin.weight.grad).detach())


@pytest.mark.parametrize("how", ["autograd.grad", "backward(inputs=)"])
def test_gradient_of_per_sample_weights_alone_does_not_step_the_table(how):
    bag = _fused_bag()
    twin = _torch_twin(bag)
    before = bag.weight.detach().clone()
    ix, off = torch.tensor([0, 2, 5]), torch.tensor([0, 1])
    psw = torch.tensor([1.0, -2.0, 0.5], requires_grad=True)
    ref_psw = psw.detach().clone().requires_grad_()
    loss = bag(ix, off, psw).pow(2).sum()
    if how == "autograd.grad":
        grad, = torch.autograd.grad(loss, [psw])
    else:
        loss.backward(inputs=[psw])
        grad = psw.grad
    ref, = torch.autograd.grad(twin(ix, off, ref_psw).pow(2).sum(), [ref_psw])
    torch.testing.assert_close(grad, ref)
    assert torch.equal(bag.weight.detach(), before)
    # an ordinary backward still steps it
    bag(ix, off, psw).pow(2).sum().backward()
    assert not torch.equal(bag.weight.detach(), before)


def test_fused_step_runs_once_per_backward_with_retain_graph():
    bag = _fused_bag(lr=1.0)
    ix, off = torch.tensor([1]), torch.tensor([0])
    before = bag.weight.detach().clone()
    out = bag(ix, off).sum()
    out.backward(retain_graph=True)
    once = bag.weight.detach().clone()
    torch.testing.assert_close(once[1], before[1] - 1.0)
    out.backward()
    torch.testing.assert_close(bag.weight.detach()[1], before[1] - 2.0)


@pytest.mark.parametrize("fused", [False, True])
def test_double_backward_through_per_sample_weights_raises_like_torch(fused):
    bag = _fused_bag() if fused else pt.EmbeddingBag(6, 3, mode="sum")
    ref = torch.nn.EmbeddingBag(6, 3, mode="sum")
    ix, off = torch.tensor([0, 2, 5]), torch.tensor([0, 1])
    messages = []
    for module in (ref, bag):
        psw = torch.tensor([1.0, -2.0, 0.5], requires_grad=True)
        g, = torch.autograd.grad(module(ix, off, psw).pow(2).sum(), [psw], create_graph=True)
        with pytest.raises(RuntimeError, match="derivative for .* is not implemented") as info:
            (g ** 2).sum().backward()
        messages.append(str(info.value))
    assert messages[0] == messages[1]


@pytest.mark.parametrize("options, exc", [
    ({"lr": 1e39}, ValueError), ({"lr": 10 ** 400}, ValueError), ({"lr": float("nan")}, ValueError),
    ({"lr": "0.1"}, TypeError), ({"lr": True}, TypeError), ({"lr": 0.1, "eps": 1e39}, ValueError),
    ({"lr": 0.1, "initial_accumulator_value": 10 ** 400}, ValueError)])
def test_fused_optimizer_refuses_options_at_construction(options, exc):
    with pytest.raises(exc, match="fused optimizer option"):
        pt.FusedOptimizer("rowwise_adagrad", options)


# --------------------------------------------------------------------------- malformed KJT in training


def _collection():
    tables = [pt.EmbeddingBagConfig(10, 3, name="t0", feature_names=["a", "b"]),
              pt.EmbeddingBagConfig(5, 2, name="t1", feature_names=["c"])]
    return pt.EmbeddingBagCollection(tables)


@pytest.mark.parametrize("case", ["offsets_F_B_plus_2", "offsets_not_from_0", "lengths_not_F_B",
                                  "offsets_decreasing", "offsets_past_values"])
def test_collection_refuses_malformed_input_in_training_as_in_inference(case):
    ebc = _collection()
    keys = ["a", "b", "c"]
    values = torch.tensor([1, 2, 3, 4, 0, 1], dtype=torch.int64)
    if case == "lengths_not_F_B":
        kjt = pt.KeyedJaggedTensor(keys, values, lengths=torch.tensor([1, 1, 1, 1, 1, 0, 1]))
    else:
        offsets = {"offsets_F_B_plus_2": [0, 1, 2, 3, 4, 5, 6, 6],
                   "offsets_not_from_0": [1, 1, 2, 3, 4, 5, 6],
                   "offsets_decreasing": [0, 2, 1, 3, 4, 5, 6],
                   "offsets_past_values": [0, 1, 2, 3, 4, 5, 7]}[case]
        kjt = pt.KeyedJaggedTensor(keys, values, offsets=torch.tensor(offsets))
    with torch.no_grad(), pytest.raises(ValueError, match="offsets") as inference:
        ebc(kjt)
    with pytest.raises(ValueError, match="offsets") as training:
        ebc(kjt)
    assert str(training.value).split(":")[0] == str(inference.value).split(":")[0]
