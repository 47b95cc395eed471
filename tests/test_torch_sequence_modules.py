"""perfkernels.torch.QuantizedEmbedding (against torch.ao.nn.quantized.Embedding and the float64
dequantisation reference) and EmbeddingCollection (against a loop of torch.nn.Embedding)."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import perfkernels  # noqa: E402
import perfkernels.torch as pkt  # noqa: E402
from perfkernels import reference  # noqa: E402


def _torch_ao_embedding(rows, dim, dtype):
    from torch.ao.nn.quantized import Embedding as QEmbedding
    torch.manual_seed(3)
    m = torch.nn.Embedding(rows, dim)
    qconfig = torch.ao.quantization.float_qparams_weight_only_qconfig
    if dtype == torch.quint4x2:
        qconfig = torch.ao.quantization.float_qparams_weight_only_qconfig_4bit
    m.qconfig = qconfig
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return m, QEmbedding.from_float(m)


@pytest.mark.parametrize("qdtype", ["quint8", "quint4x2"])
def test_from_torch_ao_bit_for_bit(qdtype):
    dtype = getattr(torch, qdtype)
    float_mod, q = _torch_ao_embedding(50, 16, dtype)
    ours = pkt.QuantizedEmbedding.from_torch_ao(q)
    bits = 8 if dtype == torch.quint8 else 4
    assert ours.bits == bits
    # torch.ao's rows read bit for bit: its codes, its float32 scales, bias = -zero_point * scale
    qw = q.weight()
    codes = qw.int_repr().numpy().astype(np.uint8)
    if bits == 4:
        codes = codes.reshape(50, -1)          # quint4x2 holds two codes per byte already
    packed = ours.packed_weight.numpy()
    assert np.array_equal(packed[:, :codes.shape[1]], codes)
    scale = qw.q_per_channel_scales().numpy().astype(np.float32)
    bias = qw.q_per_channel_zero_points().numpy().astype(np.float32) * scale * np.float32(-1)
    tail = np.float32 if bits == 8 else np.float16
    assert np.array_equal(packed[:, codes.shape[1]:].copy().view(tail),
                          np.stack([scale, bias], 1).astype(tail))
    ix = torch.randint(0, 50, (4, 7))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # (torch.ao's from_float labels a 4-bit module quint8, and its forward then calls the
        # 8-bit op on 4-bit rows; its 4-bit op is the oracle there)
        want = q(ix) if bits == 8 else torch.ops.quantized.embedding_4bit(
            q._packed_params._packed_weight, ix)
    got = ours(ix)
    assert got.shape == (4, 7, 16) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    ref = reference.embedding_quantized(ours.packed_weight.numpy(), ix.numpy(), bits, 16)
    reference.assert_close(got.numpy(), ref, rtol=1e-6)
    # torch.ao's state_dict loads into ours
    fresh = pkt.QuantizedEmbedding(50, 16, dtype=dtype)
    fresh.load_state_dict(q.state_dict())
    assert torch.equal(fresh.packed_weight, ours.packed_weight)
    # convert() swaps torch.ao's module
    swapped = pkt.convert(torch.nn.Sequential(q))
    assert type(swapped[0]) is pkt.QuantizedEmbedding
    torch.testing.assert_close(swapped[0](ix), got, rtol=0, atol=0)


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_from_float_and_errors(bits):
    torch.manual_seed(0)
    m = torch.nn.Embedding(30, 12, padding_idx=1)
    q = pkt.QuantizedEmbedding.from_float(m, bits=bits)
    packed = perfkernels.quantize_rowwise(m.weight.detach().numpy(), bits=bits)
    assert np.array_equal(q.packed_weight.numpy(), packed)
    ix = torch.tensor([[0, 1, 29], [5, 5, 2]], dtype=torch.int32)
    ref = reference.embedding_quantized(packed, ix.numpy(), bits, 12)
    reference.assert_close(q(ix).numpy(), ref, rtol=1e-6)
    with pytest.raises(IndexError, match="Index 2 is out of bounds: 30, range 0 to 30"):
        q(torch.tensor([0, 1, 30]))
    # torch's own error for indices of another dtype
    with pytest.raises(RuntimeError, match="to have one of the following scalar types: Long, Int"):
        q(torch.tensor([0.0]))
    c = pkt.convert(torch.nn.Sequential(m), bits=bits)
    assert type(c[0]) is pkt.QuantizedEmbedding
    compiled = torch.compile(q, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(ix), q(ix), rtol=0, atol=0)


def _kjt(keys, per_key_lengths, rows, gen):
    lengths = torch.tensor([n for lens in per_key_lengths for n in lens])
    values = torch.cat([torch.randint(0, rows[k], (sum(lens),), generator=gen)
                        for k, lens in zip(keys, per_key_lengths)])
    return pkt.KeyedJaggedTensor(keys, values, lengths=lengths)


def test_embedding_collection_matches_embeddings():
    tables = [pkt.EmbeddingConfig(100, 8, name="movies", feature_names=["hist", "target"]),
              pkt.EmbeddingConfig(20, 4, name="cats", feature_names=["cat"])]
    ec = pkt.EmbeddingCollection(tables, need_indices=True)
    assert set(ec.state_dict()) == {"embeddings.movies.weight", "embeddings.cats.weight"}
    gen = torch.Generator().manual_seed(5)
    rows = {"hist": 100, "target": 100, "cat": 20}
    kjt = _kjt(["hist", "cat", "target"], [[3, 0, 5], [1, 2, 1], [1, 1, 1]], rows, gen)
    out = ec(kjt)
    assert list(out) == ["hist", "target", "cat"]      # TorchRec's: the tables' feature order
    values, lengths = kjt.values(), kjt.lengths()
    start = 0
    for i, key in enumerate(["hist", "cat", "target"]):
        lens = lengths[3 * i:3 * i + 3]
        n = int(lens.sum())
        ids = values[start:start + n]
        start += n
        table = ec.embeddings["movies" if key != "cat" else "cats"].weight
        want = torch.nn.functional.embedding(ids, table)
        assert torch.equal(out[key].values(), want)
        assert torch.equal(out[key].lengths(), lens)
        assert torch.equal(out[key].weights_or_none(), ids)
        assert [t.shape[0] for t in out[key].to_dense()] == lens.tolist()
    # gradients flow to both tables, torch's dense gradient of the summed rows
    sum(o.values().sum() for o in out.values()).backward()
    for name in ("movies", "cats"):
        assert ec.embeddings[name].weight.grad is not None
    # a key of no table is ignored, as TorchRec does
    assert ec(pkt.KeyedJaggedTensor(["nope"], torch.tensor([1]), lengths=torch.tensor([1]))) == {}


def test_embedding_collection_fused_optimizer():
    tables = [pkt.EmbeddingConfig(50, 8, name="t", feature_names=["a", "b"])]
    ec = pkt.EmbeddingCollection(tables, fused_optimizer=("sgd", {"lr": 0.5}))
    w0 = ec.embeddings["t"].weight.detach().clone()
    kjt = pkt.KeyedJaggedTensor(["a", "b"], torch.tensor([1, 2, 1, 3]),
                                lengths=torch.tensor([2, 0, 1, 1]))
    out = ec(kjt)
    (out["a"].values().sum() + 2 * out["b"].values().sum()).backward()
    w = ec.embeddings["t"].weight.detach()
    assert ec.embeddings["t"].weight.grad is None
    expect = w0.clone()
    expect[1] -= 0.5 * 3      # a: once, b: once (x2)
    expect[2] -= 0.5
    expect[3] -= 0.5 * 2
    torch.testing.assert_close(w, expect)
