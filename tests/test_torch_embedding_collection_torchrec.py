"""perfkernels.torch.EmbeddingCollection side by side with TorchRec's, the same weights loaded
into both: the output's names, order, dtype, rows, lengths and indices; input keys no table reads;
a missing feature; a feature of two tables; gradients."""
import warnings

import pytest

torch = pytest.importorskip("torch")

import perfkernels.torch as pkt  # noqa: E402


def configs(torchrec, dtype, shared=False):
    dt = torchrec.DataType.FP16 if dtype is torch.float16 else torchrec.DataType.FP32
    out = [torchrec.EmbeddingConfig(num_embeddings=30, embedding_dim=4, name="item_ids",
                                    feature_names=["hist", "target"], data_type=dt),
           torchrec.EmbeddingConfig(num_embeddings=12, embedding_dim=4, name="cats",
                                    feature_names=["cat"] + (["hist"] if shared else []),
                                    data_type=dt)]
    return out


def pair(torchrec, dtype=torch.float32, shared=False, need_indices=False):
    theirs = torchrec.EmbeddingCollection(configs(torchrec, dtype, shared),
                                          need_indices=need_indices)
    ours = pkt.EmbeddingCollection(configs(torchrec, dtype, shared), need_indices=need_indices)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def features(torchrec, keys, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (3 * len(keys),), generator=gen)
    values = torch.randint(0, 12, (int(lengths.sum()),), generator=gen)
    return torchrec.KeyedJaggedTensor.from_lengths_sync(keys, values, lengths)


def assert_same(theirs, ours):
    assert list(ours) == list(theirs)
    for name in theirs:
        a, b = theirs[name], ours[name]
        assert b.values().dtype == a.values().dtype
        torch.testing.assert_close(b.values(), a.values(), rtol=0, atol=0)
        assert torch.equal(b.lengths(), a.lengths())
        wa, wb = a.weights_or_none(), b.weights_or_none()
        assert (wa is None) == (wb is None)
        if wa is not None:
            assert torch.equal(wa, wb)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("keys", [["hist", "target", "cat"], ["cat", "target", "hist"],
                                  ["cat", "extra", "hist", "target"], ["extra", "cat", "hist",
                                                                       "target", "more"]])
@pytest.mark.parametrize("need_indices", [False, True])
def test_outputs_equal_torchrecs(torchrec, dtype, keys, need_indices):
    theirs, ours = pair(torchrec, dtype, need_indices=need_indices)
    kjt = features(torchrec, keys)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_same(theirs(kjt), ours(kjt))
        # our own KeyedJaggedTensor too
        mine = pkt.KeyedJaggedTensor(kjt.keys(), kjt.values(), lengths=kjt.lengths())
        assert_same(theirs(kjt), ours(mine))


def test_a_feature_of_two_tables(torchrec):
    theirs, ours = pair(torchrec, shared=True)
    kjt = features(torchrec, ["target", "cat", "hist"], seed=3)
    with torch.no_grad():
        want = theirs(kjt)
        assert "hist@item_ids" in want and "hist@cats" in want
        assert_same(want, ours(kjt))


def test_a_missing_feature_is_missing_from_the_output(torchrec):
    """TorchRec raises KeyError; ours leaves the feature out (a rank of a sharded collection may
    hold no sample of a feature), and reading it is the same KeyError."""
    theirs, ours = pair(torchrec)
    kjt = features(torchrec, ["hist", "extra", "cat"])
    with pytest.raises(KeyError):
        theirs(kjt)
    with torch.no_grad():
        out = ours(kjt)
    assert list(out) == ["hist", "cat"]
    with pytest.raises(KeyError):
        out["target"]
    full = torchrec.KeyedJaggedTensor.from_lengths_sync(["hist", "target", "cat"], kjt.values(),
                                                        kjt.lengths())
    with torch.no_grad():
        want = theirs(full)
    for key in out:
        torch.testing.assert_close(out[key].values(), want[key].values(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gradients_equal_torchrecs(torchrec, dtype):
    theirs, ours = pair(torchrec, dtype)
    kjt = features(torchrec, ["cat", "extra", "hist", "target"], seed=5)
    for model in (theirs, ours):
        out = model(kjt)
        sum((jt.values() * (i + 1)).sum() for i, jt in enumerate(out.values())).backward()
    for name in ("item_ids", "cats"):
        got, want = ours.embeddings[name].weight.grad, theirs.embeddings[name].weight.grad
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-3, atol=1e-3)
