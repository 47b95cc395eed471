"""An out-of-range index in an EmbeddingBag lookup with a padding_idx: torch's exception class
and torch's message (which there differs from the one it gives without a padding_idx), for int32
and int64 indices, negative and too large, with and without per_sample_weights, grad mode on and
off."""
import re

import pytest

torch = pytest.importorskip("torch")

import perfkernels.torch as pkt  # noqa: E402


def _error(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return exc
    raise AssertionError("no exception")


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("bad", [[[-1, 1]], [[11, 8]]])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_out_of_range_index_with_padding_idx_gets_torchs_error(index_dtype, bad, weighted, grad):
    torch.manual_seed(0)
    stock = torch.nn.EmbeddingBag(10, 2, mode="sum", padding_idx=0)
    ours = pkt.convert(torch.nn.Sequential(stock))[0]
    assert isinstance(ours, pkt.EmbeddingBag)
    idx = torch.tensor(bad, dtype=index_dtype)
    psw = torch.ones(idx.shape) if weighted else None
    with torch.set_grad_enabled(grad):
        want = _error(lambda: stock(idx, per_sample_weights=psw))
        got = _error(lambda: ours(idx, per_sample_weights=psw))
    assert isinstance(got, type(want)), (got, want)
    # torch's own message (its test matches this pattern), ours may add position and range
    pattern = r"embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to be -?\d+"
    assert re.search(pattern, str(want)), want
    assert str(want).splitlines()[0] in str(got), (got, want)
