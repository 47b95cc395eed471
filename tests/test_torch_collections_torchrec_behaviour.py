"""perfkernels.torch.EmbeddingBagCollection / EmbeddingCollection behave as TorchRec's on what
TorchRec's own module tests check: a feature of two tables (``feature@table`` names, the output's
width), ``.device``, construction and forward on the meta device, torch.fx and
torchrec.fx symbolic tracing.  Each test runs TorchRec's class too (the control) and compares
ours with TorchRec's output on the same weights."""
import warnings

import pytest

torch = pytest.importorskip("torch")

import perfkernels.torch as pkt  # noqa: E402

KINDS = ["torchrec", "perfkernels"]


def bag_configs(torchrec):
    return [torchrec.EmbeddingBagConfig(num_embeddings=10, embedding_dim=4, name="t1",
                                        feature_names=["f1", "f2"]),
            torchrec.EmbeddingBagConfig(num_embeddings=12, embedding_dim=8, name="t2",
                                        feature_names=["f1", "f3"], pooling=torchrec.PoolingType.MEAN)]


def configs(torchrec):
    return [torchrec.EmbeddingConfig(num_embeddings=10, embedding_dim=4, name="t1",
                                     feature_names=["f1", "f2"]),
            torchrec.EmbeddingConfig(num_embeddings=12, embedding_dim=4, name="t2",
                                     feature_names=["f1", "f3"])]


def make(torchrec, kind, pooled, device=None):
    """TorchRec's collection and, for kind "perfkernels", ours holding its weights."""
    if pooled:
        theirs = torchrec.EmbeddingBagCollection(tables=bag_configs(torchrec))
        cls = pkt.EmbeddingBagCollection if kind == "perfkernels" else torchrec.EmbeddingBagCollection
        tables = bag_configs(torchrec)
    else:
        theirs = torchrec.EmbeddingCollection(tables=configs(torchrec))
        cls = pkt.EmbeddingCollection if kind == "perfkernels" else torchrec.EmbeddingCollection
        tables = configs(torchrec)
    if device is not None:
        return theirs, cls(tables=tables, device=device)
    module = cls(tables=tables)
    module.load_state_dict(theirs.state_dict())
    return theirs, module


def features(torchrec, keys=("f1", "f2", "f3"), seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (3 * len(keys),), generator=gen)
    values = torch.randint(0, 10, (int(lengths.sum()),), generator=gen)
    return torchrec.KeyedJaggedTensor.from_lengths_sync(list(keys), values, lengths)


def assert_same(theirs, ours, pooled):
    if pooled:
        assert ours.keys() == theirs.keys()
        assert ours.length_per_key() == theirs.length_per_key()
        torch.testing.assert_close(ours.values(), theirs.values(), rtol=1e-6, atol=1e-6)
    else:
        assert list(ours) == list(theirs)
        for name in theirs:
            torch.testing.assert_close(ours[name].values(), theirs[name].values(), rtol=0, atol=0)
            assert torch.equal(ours[name].lengths(), theirs[name].lengths())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pooled", [True, False])
@pytest.mark.parametrize("grad", [True, False])
def test_shared_feature_names_and_width(torchrec, kind, pooled, grad):
    theirs, ours = make(torchrec, kind, pooled)
    kjt = features(torchrec)
    with torch.set_grad_enabled(grad):
        expected, got = theirs(kjt), ours(kjt)
    if pooled:
        assert expected.keys() == ["f1@t1", "f2", "f1@t2", "f3"]
        assert expected.values().shape == (3, 4 + 4 + 8 + 8)
    else:
        assert list(expected) == ["f1@t1", "f2", "f1@t2", "f3"]
    assert_same(expected, got, pooled)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pooled", [True, False])
def test_device(torchrec, kind, pooled):
    _, module = make(torchrec, kind, pooled)
    assert module.device == torch.device("cpu")
    _, on_meta = make(torchrec, kind, pooled, device=torch.device("meta"))
    assert on_meta.device.type == "meta"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pooled", [True, False])
def test_meta_construction_and_forward(torchrec, kind, pooled):
    theirs, _ = make(torchrec, "torchrec", pooled)
    _, module = make(torchrec, kind, pooled, device=torch.device("meta"))
    assert all(p.device.type == "meta" for p in module.parameters())
    kjt = features(torchrec)
    expected = theirs(kjt)
    got = module(kjt.to(torch.device("meta")))
    if pooled:
        assert got.keys() == expected.keys()
        assert got.values().device.type == "meta"
        assert got.values().shape == expected.values().shape
    else:
        assert list(got) == list(expected)
        for name in expected:
            assert got[name].values().device.type == "meta"
            assert got[name].values().shape == expected[name].values().shape


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pooled", [True, False])
@pytest.mark.parametrize("tracer", ["torch.fx", "torchrec.fx"])
def test_symbolic_trace(torchrec, kind, pooled, tracer):
    theirs, module = make(torchrec, kind, pooled)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if tracer == "torch.fx":
            graph = torch.fx.symbolic_trace(module)
        else:
            import torchrec.fx
            graph = torchrec.fx.symbolic_trace(module)
    for seed in range(3):      # the graph answers for inputs other than the traced one
        kjt = features(torchrec, seed=seed)
        with torch.no_grad():
            assert_same(theirs(kjt), graph(kjt), pooled)


@pytest.mark.parametrize("kind", KINDS)
def test_symbolic_trace_key_order_and_gradient(torchrec, kind):
    """The traced pooled collection takes the input's keys in any order and gives TorchRec's
    gradients."""
    theirs, module = make(torchrec, kind, True)
    import torchrec.fx
    graph = torchrec.fx.symbolic_trace(module)
    kjt = features(torchrec, keys=("f3", "f1", "f2"), seed=4)
    expected, got = theirs(kjt), graph(kjt)
    assert_same(expected, got, True)
    expected.values().square().sum().backward()
    got.values().square().sum().backward()
    for name, p in theirs.named_parameters():
        torch.testing.assert_close(dict(graph.named_parameters())[name].grad, p.grad,
                                   rtol=1e-5, atol=1e-6)
