"""EmbeddingCollection's one call: every feature of a KeyedJaggedTensor looked up by one native op
(perfkernels::embedding_collection) when the tables share a dtype and D.  Rows against torch's
own lookup per feature, bit for bit; gradients (dense, sparse, fused optimizers) against a loop of
torch.nn.Embedding and the float64 reference; errors; threads; the profiler; torch.compile and
torch.export; and the op with no perfkernels Python loaded."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import perfkernels.torch as pkt  # noqa: E402
from perfkernels import reference  # noqa: E402

from conftest import run_with_torch_only  # noqa: E402

F = torch.nn.functional
KEYS = ["hist", "cat", "target", "query"]
#: feature -> table
TABLE_OF = {"hist": "item_ids", "target": "item_ids", "cat": "cats", "query": "words"}
ROWS = {"item_ids": 300, "cats": 20, "words": 1000}


def collection(dim=16, dtype=None, **kw):
    tables = [pkt.EmbeddingConfig(ROWS[name], dim, name=name, data_type=dtype or torch.float32,
                                  feature_names=[k for k in KEYS if TABLE_OF[k] == name])
              for name in ROWS]
    return pkt.EmbeddingCollection(tables, **kw)


def kjt(gen, batch=4, max_len=6, index_dtype=torch.int64, empty_key=None):
    lengths, values = [], []
    for key in KEYS:
        lens = torch.randint(0, max_len + 1, (batch,), generator=gen)
        if key == empty_key:
            lens.zero_()
        lengths.append(lens)
        values.append(torch.randint(0, ROWS[TABLE_OF[key]], (int(lens.sum()),), generator=gen))
    return pkt.KeyedJaggedTensor(KEYS, torch.cat(values).to(index_dtype),
                                 lengths=torch.cat(lengths))


def per_feature(features):
    """(key, ids, lengths) of each feature."""
    values, lengths = features.values(), features.lengths()
    batch = lengths.numel() // len(KEYS)
    out, start = [], 0
    for i, key in enumerate(KEYS):
        lens = lengths[i * batch:(i + 1) * batch]
        n = int(lens.sum())
        out.append((key, values[start:start + n], lens))
        start += n
    return out


def ops_called(fn):
    with torch.profiler.profile() as prof:
        fn()
    return [e.name for e in prof.events() if e.name.startswith("perfkernels::")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dim", [1, 7, 16, 65])
def test_rows_equal_torchs_lookup(isa, dtype, index_dtype, dim):
    gen = torch.Generator().manual_seed(dim)
    ec = collection(dim, dtype, need_indices=True)
    features = kjt(gen, index_dtype=index_dtype, empty_key="cat")
    with torch.no_grad():
        out = ec(features)
    # TorchRec's order (the tables', then their features'), and float32 rows
    assert list(out) == ["hist", "target", "cat", "query"]
    for key, ids, lens in per_feature(features):
        table = ec.embeddings[TABLE_OF[key]].weight
        assert out[key].values().dtype == torch.float32
        assert torch.equal(out[key].values(), F.embedding(ids.long(), table).float())
        assert torch.equal(out[key].lengths(), lens)
        assert torch.equal(out[key].weights_or_none(), ids)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_outputs_from_the_pool(dtype):
    """An eager lookup of at least 128 KiB of rows writes them into pooled memory, key by key:
    the same rows; a bad index is torch's IndexError."""
    gen = torch.Generator().manual_seed(8)
    ec = collection(64, dtype)
    features = kjt(gen, batch=128, max_len=20)
    assert features.values().numel() * 64 * 2 >= 128 << 10
    with torch.no_grad():
        out = ec(features)
    for key, ids, lens in per_feature(features):
        assert torch.equal(out[key].values(),
                           F.embedding(ids, ec.embeddings[TABLE_OF[key]].weight).float())
    values = features.values().clone()
    values[-1] = ROWS[TABLE_OF[KEYS[-1]]]
    with torch.no_grad(), pytest.raises(IndexError, match="index out of range in self"):
        ec(pkt.KeyedJaggedTensor(KEYS, values, lengths=features.lengths()))


def test_one_call_for_every_feature():
    ec = collection()
    features = kjt(torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert ops_called(lambda: ec(features)) == ["perfkernels::embedding_collection_inference"]
    assert ops_called(lambda: ec(features)) == ["perfkernels::embedding_collection"]
    # tables of different D: one lookup per table
    mixed = pkt.EmbeddingCollection([pkt.EmbeddingConfig(300, 8, name="item_ids",
                                                         feature_names=["hist", "target"]),
                                     pkt.EmbeddingConfig(20, 4, name="cats", feature_names=["cat"]),
                                     pkt.EmbeddingConfig(1000, 8, name="words",
                                                         feature_names=["query"])])
    with torch.no_grad():
        assert "perfkernels::embedding_collection_inference" not in ops_called(
            lambda: mixed(features))


def test_empty_batch_and_empty_values():
    ec = collection()
    empty = pkt.KeyedJaggedTensor(KEYS, torch.zeros(0, dtype=torch.int64),
                                  lengths=torch.zeros(0, dtype=torch.int64))
    out = ec(empty)
    assert all(out[k].values().shape == (0, 16) for k in KEYS)
    zeros = pkt.KeyedJaggedTensor(KEYS, torch.zeros(0, dtype=torch.int64),
                                  lengths=torch.zeros(8, dtype=torch.int64))
    assert all(ec(zeros)[k].values().shape == (0, 16) for k in KEYS)


@pytest.mark.parametrize("sparse", [False, True])
def test_gradients_equal_torchs(sparse):
    """Each table's gradient, dense or sparse COO, as a loop of torch.nn.Embedding gives it."""
    gen = torch.Generator().manual_seed(3)
    ec = collection()
    ref = {name: torch.nn.Embedding.from_pretrained(ec.embeddings[name].weight.detach().clone(),
                                                    freeze=False, sparse=sparse)
           for name in ROWS}
    for name in ROWS:
        ec.embeddings[name].sparse = sparse
    features = kjt(gen)
    out = ec(features)
    coef = {key: torch.randn(1, 16, generator=gen) for key in KEYS}
    sum((out[k].values() * coef[k]).sum() for k in KEYS).backward()
    loss = 0
    for key, ids, _ in per_feature(features):
        loss = loss + (ref[TABLE_OF[key]](ids) * coef[key]).sum()
    loss.backward()
    for name in ROWS:
        got, want = ec.embeddings[name].weight.grad, ref[name].weight.grad
        assert got.is_sparse == sparse
        if sparse:
            got, want = got.coalesce().to_dense(), want.coalesce().to_dense()
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["rowwise_adagrad", "adam"])
def test_fused_optimizers_step_each_table(name):
    """One step of each table by its fused optimizer, against the float64 reference of the
    table's features' rows, each ID a bag of one (the features of a table in key order)."""
    gen = torch.Generator().manual_seed(4)
    ec = collection(fused_optimizer=(name, {"lr": 0.05}))
    w0 = {n: ec.embeddings[n].weight.detach().clone() for n in ROWS}
    features = kjt(gen)
    out = ec(features)
    coef = {key: torch.randn(1, 16, generator=gen) for key in KEYS}
    sum((out[k].values() * coef[k]).sum() for k in KEYS).backward()
    parts = per_feature(features)
    for table in ROWS:
        ids = torch.cat([i for k, i, _ in parts if TABLE_OF[k] == table])
        grads = torch.cat([coef[k].expand(i.numel(), 16) for k, i, _ in parts
                           if TABLE_OF[k] == table])
        rows = ROWS[table]
        if name == "adam":
            state = (np.zeros((rows, 16), np.float32), np.zeros((rows, 16), np.float32))
            want = reference.embedding_bag_backward_adam(
                w0[table].numpy(), ids.reshape(-1, 1).numpy(), None, grad_output=grads.numpy(),
                optimizer="adam", state=state, lr=0.05, step=1).weight
        else:
            want = reference.embedding_bag_backward_update(
                w0[table].numpy(), ids.reshape(-1, 1).numpy(), None, grad_output=grads.numpy(),
                optimizer=name, state=np.zeros(rows, np.float32), lr=0.05).weight
        assert ec.embeddings[table].weight.grad is None
        np.testing.assert_allclose(ec.embeddings[table].weight.detach().numpy(), want,
                                   rtol=1e-5, atol=1e-6)


def test_bad_index_is_torchs_index_error():
    ec = collection()
    bad = pkt.KeyedJaggedTensor(KEYS, torch.tensor([1, 20, 2, 3]),
                                lengths=torch.tensor([1, 1, 1, 1]))      # cat's table has 20 rows
    with pytest.raises(IndexError, match="index out of range in self"):
        ec(bad)
    with torch.no_grad(), pytest.raises(IndexError, match="index out of range in self"):
        ec(bad)


def test_op_errors_name_the_argument():
    op = torch.ops.perfkernels.embedding_collection_inference
    w = [torch.ones(4, 3), torch.ones(5, 2)]
    with pytest.raises(RuntimeError, match="share a dtype and a dim"):
        op(w, torch.tensor([0]), torch.tensor([0, 1]), 1, [0], 0)
    with pytest.raises(RuntimeError, match=r"tables\[0\] = 2 is not a table"):
        op(w[:1], torch.tensor([0]), torch.tensor([0, 1]), 1, [2], 0)
    with pytest.raises(RuntimeError, match="tables needs one entry per key"):
        op(w[:1], torch.tensor([0]), torch.tensor([0, 1]), 1, [0, 0], 0)
    with pytest.raises(RuntimeError, match="values must be int32 or int64"):
        op(w[:1], torch.tensor([0.0]), torch.tensor([0, 1]), 1, [0], 0)


def test_threads_bit_identical():
    gen = torch.Generator().manual_seed(6)
    ec = collection(64)
    features = kjt(gen, batch=512, max_len=50)
    old = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            with torch.no_grad():
                outs.append(ec(features))
    finally:
        torch.set_num_threads(old)
    for out in outs[1:]:
        assert all(torch.equal(out[k].values(), outs[0][k].values()) for k in KEYS)


def test_compile_and_export():
    ec = collection()
    features = kjt(torch.Generator().manual_seed(7))

    class Flat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ec = ec

        def forward(self, values, lengths):
            out = self.ec(pkt.KeyedJaggedTensor(KEYS, values, lengths=lengths))
            return torch.cat([out[k].values() for k in KEYS])

    flat = Flat()
    with torch.no_grad():
        want = flat(features.values(), features.lengths())
        compiled = torch.compile(flat, backend="eager")
        assert torch.equal(compiled(features.values(), features.lengths()), want)
        ep = torch.export.export(flat, (features.values(), features.lengths()), strict=False)
    assert "perfkernels.embedding_collection" in str(ep.graph)
    with torch.no_grad():
        assert torch.equal(ep.module()(features.values(), features.lengths()), want)


def test_op_runs_without_perfkernels_python():
    run_with_torch_only(
        "w = [torch.arange(12.).reshape(4, 3), torch.arange(6.).reshape(2, 3) * 10]\n"
        "out = torch.ops.perfkernels.embedding_collection_inference(w, torch.tensor([0, 3, 1, 1, 0]),"
        " torch.tensor([0, 2, 3, 4, 5]), 2, [0, 1], 0)\n"
        "assert out.tolist() == [[0., 1., 2.], [9., 10., 11.], [3., 4., 5.], [30., 40., 50.], "
        "[0., 10., 20.]], out", pkt.native_library_path())
