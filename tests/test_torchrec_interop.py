"""TorchRec's collections through perfkernels.torch.convert(), side by side with stock TorchRec.

The behaviours TorchRec's quantized module tests check (outputs per dtype and output dtype,
keys and lengths per key, shared features, key order of the input, state_dict, unpooled
lookups with and without indices), run on TorchRec's module and on the converted one, which
must answer bit for bit.  Skipped without TorchRec; required with PERFKERNELS_REQUIRE_TORCHREC=1.
"""
import copy
import io
import warnings

import pytest
import torch

import perfkernels as pk
import perfkernels.torch as pt

QUANT_DTYPES = [torch.quint8, torch.quint4x2, torch.quint2x4, torch.float16]


@pytest.fixture(scope="module")
def trec(torchrec):
    warnings.filterwarnings("ignore", module="torchrec")
    from torchrec.inference.modules import quantize_embeddings
    import torchrec.quant.embedding_modules as quant
    return torchrec, quantize_embeddings, quant


def _kjt(torchrec, keys, batch, rows, seed=0, weighted=False, max_len=4):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_len, (len(keys) * batch,), generator=g)
    values = torch.randint(0, rows, (int(lengths.sum()),), generator=g)
    weights = torch.rand(values.shape[0], generator=g) if weighted else None
    return torchrec.KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values,
                                                        lengths=lengths, weights=weights)


def _bag_tables(torchrec, shared=False):
    mean = torchrec.PoolingType.MEAN
    return [torchrec.EmbeddingBagConfig(
        num_embeddings=40 + 7 * i, embedding_dim=8 * (i + 1), name=f"t{i}",
        feature_names=[f"f{i}"] + (["fs"] if shared and i < 2 else []),
        pooling=mean if i == 1 else torchrec.PoolingType.SUM) for i in range(3)]


def _quant_ebc(trec, dtype, output_dtype=torch.float32, shared=False, weighted=False, seed=0):
    torchrec, quantize_embeddings, _ = trec
    torch.manual_seed(seed)
    ebc = torchrec.EmbeddingBagCollection(tables=_bag_tables(torchrec, shared),
                                          is_weighted=weighted)
    model = torch.nn.Sequential(ebc)
    return quantize_embeddings(model, dtype=dtype, inplace=False, output_dtype=output_dtype), ebc


@pytest.mark.parametrize("output_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("dtype", QUANT_DTYPES)
def test_quant_ebc_converted_answers_bit_for_bit(trec, dtype, output_dtype):
    torchrec, _, quant = trec
    stock, _ = _quant_ebc(trec, dtype, output_dtype, shared=True)
    converted = pt.convert(stock)
    report = pt.last_report()
    assert len(report.swapped) == 1 and not report.skipped, str(report)
    assert "in one call" in report.swapped[0][3]
    module = converted[0]
    assert isinstance(module, quant.EmbeddingBagCollection)
    assert type(module) is not type(stock[0])          # its forward is ours
    # every input key order, shared features (f@t keys), empty bags, mean and sum tables
    for keys in (["f0", "fs", "f1", "f2"], ["f2", "f0", "fs", "f1"]):
        for batch in (1, 6):
            kjt = _kjt(torchrec, keys, batch, 40, seed=batch)
            want, got = stock(kjt), converted(kjt)
            assert got.keys() == want.keys()
            assert got.length_per_key() == want.length_per_key()
            assert got.values().dtype == want.values().dtype == output_dtype
            assert torch.equal(got.values(), want.values())
    # state_dict: TorchRec's keys and the same rows
    a, b = stock.state_dict(), converted.state_dict()
    assert list(a) == list(b)
    assert all(torch.equal(getattr(a[k], "elem", a[k]), getattr(b[k], "elem", b[k])) for k in a)


def test_quant_ebc_runs_every_feature_in_one_call(trec, monkeypatch):
    torchrec = trec[0]
    stock, _ = _quant_ebc(trec, torch.quint4x2, shared=True)
    converted = pt.convert(stock)
    calls = []
    real = pk.embedding_bags_multi

    def counting(*args, **kwargs):
        calls.append(len(args[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(pk, "embedding_bags_multi", counting)
    converted(_kjt(torchrec, ["f0", "fs", "f1", "f2"], 4, 40))
    assert calls == [5]       # five features (one shared by two tables), one call


def test_quant_ebc_close_to_float_collection(trec):
    """An independent reference: the float collection the quantized one was made from."""
    torchrec = trec[0]
    stock, ebc = _quant_ebc(trec, torch.quint8)
    converted = pt.convert(stock)
    kjt = _kjt(torchrec, ["f0", "f1", "f2"], 5, 40)
    want, got = ebc(kjt).to_dict(), converted(kjt).to_dict()
    assert sorted(want) == sorted(got)
    for k in want:      # (the quantized collection puts its mean tables after its sum tables)
        assert torch.allclose(got[k], want[k].detach(), atol=2e-3, rtol=0.02)


def test_quant_ebc_converted_keeps_the_original(trec):
    torchrec = trec[0]
    stock, _ = _quant_ebc(trec, torch.quint4x2)
    converted = pt.convert(stock)
    assert type(stock[0]).__module__.startswith("torchrec.")
    assert converted[0] is not stock[0]
    assert pt.convert(converted) is not None and not pt.last_report().swapped
    kjt = _kjt(torchrec, ["f0", "f1", "f2"], 3, 40)
    buf = io.BytesIO()
    torch.save(converted, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert torch.equal(loaded(kjt).values(), stock(kjt).values())
    assert torch.equal(copy.deepcopy(converted)(kjt).values(), stock(kjt).values())


def test_quant_ebc_weighted_is_skipped_with_its_reason(trec):
    torchrec = trec[0]
    stock, _ = _quant_ebc(trec, torch.quint4x2, weighted=True)
    converted = pt.convert(stock)
    report = pt.last_report()
    assert not report.swapped and len(report.skipped) == 1
    assert "weighted" in report.skipped[0][2]
    kjt = _kjt(torchrec, ["f0", "f1", "f2"], 3, 40, weighted=True)
    assert torch.equal(converted(kjt).values(), stock(kjt).values())


def test_quant_ebc_bits_is_skipped_with_its_reason(trec):
    stock, _ = _quant_ebc(trec, torch.quint8)
    pt.convert(stock, bits=4)
    report = pt.last_report()
    assert not report.swapped and "bits=4" in report.skipped[0][2]


def test_quant_ebc_missing_feature_raises_key_error(trec):
    torchrec = trec[0]
    stock, _ = _quant_ebc(trec, torch.quint8)
    converted = pt.convert(stock)
    kjt = _kjt(torchrec, ["f0", "f1"], 3, 40)
    with pytest.raises((KeyError, ValueError)):
        stock(kjt)
    with pytest.raises(KeyError, match="f2"):
        converted(kjt)


def test_quant_ebc_out_of_range_id_raises_index_error(trec):
    torchrec = trec[0]
    stock, _ = _quant_ebc(trec, torch.quint8)
    converted = pt.convert(stock)
    kjt = torchrec.KeyedJaggedTensor.from_lengths_sync(
        keys=["f0", "f1", "f2"], values=torch.tensor([40, 1, 2]),
        lengths=torch.tensor([1, 1, 1]))
    with pytest.raises(IndexError, match="40"):
        converted(kjt)


@pytest.mark.parametrize("need_indices", [False, True])
@pytest.mark.parametrize("dtype", [torch.quint8, torch.quint4x2, torch.quint2x4, torch.float16])
def test_quant_ec_converted_answers_bit_for_bit(trec, dtype, need_indices):
    torchrec, quantize_embeddings, quant = trec
    torch.manual_seed(1)
    tables = [torchrec.EmbeddingConfig(num_embeddings=30 + i, embedding_dim=16, name=f"t{i}",
                                       feature_names=[f"f{i}"]) for i in range(3)]
    ec = torchrec.EmbeddingCollection(tables=tables, need_indices=need_indices)
    stock = quantize_embeddings(
        torch.nn.Sequential(ec), dtype=dtype, inplace=False,
        additional_qconfig_spec_keys=[torchrec.EmbeddingCollection],
        additional_mapping={torchrec.EmbeddingCollection: quant.EmbeddingCollection})
    converted = pt.convert(stock)
    assert len(pt.last_report().swapped) == 1, str(pt.last_report())
    assert isinstance(converted[0], quant.EmbeddingCollection)
    for keys, batch in ((["f0", "f1", "f2"], 4), (["f2", "f1", "f0"], 1)):
        kjt = _kjt(torchrec, keys, batch, 30, seed=batch)
        want, got = stock(kjt), converted(kjt)
        assert list(got) == list(want)
        for k in want:
            assert torch.equal(got[k].values(), want[k].values())
            assert torch.equal(got[k].lengths(), want[k].lengths())
            w, g = want[k].weights_or_none(), got[k].weights_or_none()
            assert (w is None) == (g is None)
            if w is not None:
                assert torch.equal(g, w)


@pytest.mark.parametrize("bits", [None, 8, 4, 2])
def test_float_ebc_converted_works_at_the_first_forward(trec, bits):
    """TorchRec's float collection calls each table with input=, offsets=, per_sample_weights=;
    the converted tables take those keywords (the independent reference: stock TorchRec)."""
    torchrec = trec[0]
    torch.manual_seed(3)
    ebc = torchrec.EmbeddingBagCollection(tables=_bag_tables(torchrec, shared=True))
    converted = pt.convert(ebc, bits=bits)
    assert len(pt.last_report().swapped) == 4, str(pt.last_report())   # 3 tables, 1 collection
    assert isinstance(converted, torchrec.EmbeddingBagCollection)
    assert list(converted.state_dict()) == list(pt.convert(ebc, bits=bits).state_dict())
    kjt = _kjt(torchrec, ["f2", "fs", "f1", "f0"], 5, 40)
    want, got = ebc(kjt), converted(kjt)
    assert got.keys() == want.keys()
    tol = {None: 1e-6, 8: 2e-3, 4: 0.05, 2: 0.2}[bits]
    assert torch.allclose(got.values(), want.values().detach(), atol=tol, rtol=0)
    with torch.no_grad():       # one multi-table call: as TorchRec's loop over our tables
        one = converted(kjt)
        loop = converted._torchrec_forward(kjt)
    assert torch.equal(one.values(), loop.values())
    buf = io.BytesIO()
    torch.save(converted, buf)
    buf.seek(0)
    assert torch.equal(torch.load(buf, weights_only=False)(kjt).values(), got.values())


@pytest.mark.parametrize("bits", [8, 4])
def test_converted_embedding_bag_takes_torch_keywords(bits):
    """An nn.EmbeddingBag swapped for a quantized one is called as nn.EmbeddingBag is."""
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(30, 8, mode="sum")
    q = pt.convert(torch.nn.Sequential(bag), bits=bits)[0]
    idx, offs = torch.tensor([1, 2, 3, 29]), torch.tensor([0, 1])
    psw = torch.rand(4)
    want = q(idx, offs, psw)
    assert torch.equal(q(input=idx, offsets=offs, per_sample_weights=psw), want)
    assert torch.allclose(want, bag(idx, offs, psw).detach(), atol={8: 0.02, 4: 0.3}[bits])


def test_quant_collection_graph_tools_as_on_stock(trec):
    """torchrec.fx.symbolic_trace of a converted collection records one call of our op (the
    graph runs and answers as stock's); torch.jit.script of the module refuses where it refuses
    stock's."""
    torchrec = trec[0]
    import torchrec.fx
    stock, _ = _quant_ebc(trec, torch.quint4x2, shared=True)
    converted = pt.convert(stock)
    kjt = _kjt(torchrec, ["f0", "fs", "f1", "f2"], 4, 40)
    want = stock(kjt)
    for model in (stock, converted):
        graph = torchrec.fx.symbolic_trace(model)
        got = graph(kjt)
        assert got.keys() == want.keys() and torch.equal(got.values(), want.values())
    assert "quant_ebc_lookup" in graph.code
    refused = []
    for model in (stock, converted):
        try:
            torch.jit.script(model)
        except Exception as exc:           # torch's own error, as for TorchRec's module
            refused.append(type(exc).__name__)
    assert len(refused) in (0, 2), refused


def _values_model(torchrec, ebc):
    """A model over a collection, as TorchRec's inference packaging takes it (its forward
    annotated, so that TorchScript compiles the traced graph)."""
    kjt_type = torchrec.KeyedJaggedTensor

    class Values(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ebc = ebc

        def forward(self, kjt: kjt_type) -> torch.Tensor:
            return self.ebc(kjt).values()

    return Values()


@pytest.mark.parametrize("dtype", [torch.quint4x2, torch.qint8, torch.float16])
def test_quant_collection_traced_scripted_saved_and_exported_run_our_op(trec, dtype, tmp_path):
    """TorchRec's packaging for C++ (torchrec.fx.symbolic_trace, then torch.jit.script and
    torch.jit.save / load) and torch.export of a converted quantized collection record our op
    over our rows and answer as stock, call after call, any key order; jit.trace records
    TorchRec's forward (FBGEMM's ops), also answering as stock."""
    torchrec = trec[0]
    import torchrec.fx
    stock, _ = _quant_ebc(trec, dtype, shared=True)
    converted = _values_model(torchrec, pt.convert(stock))
    kjts = [_kjt(torchrec, ["f0", "fs", "f1", "f2"], 4, 40, seed=1),
            _kjt(torchrec, ["f2", "f1", "fs", "f0"], 6, 40, seed=2)]
    wants = [stock(k).values() for k in kjts]
    graph = torchrec.fx.symbolic_trace(converted)
    scripted = torch.jit.script(graph)
    assert "perfkernels::embedding_bag_collection_packed" in str(scripted.inlined_graph)
    torch.jit.save(scripted, tmp_path / "m.pt")
    loaded = torch.jit.load(tmp_path / "m.pt")
    for _ in range(2):            # (TorchScript's executor optimises from the second call)
        for k, want in zip(kjts, wants):
            assert torch.equal(graph(k), want)
            assert torch.equal(scripted(k), want)
            assert torch.equal(loaded(k), want)
    ep = torch.export.export(converted, (kjts[0],), strict=False)
    assert "embedding_bag_collection_packed" in str(ep.graph)
    assert torch.equal(ep.module()(kjts[0]), wants[0])


def test_float_ebc_converted_runs_one_call_without_gradient(trec, monkeypatch):
    torchrec = trec[0]
    ebc = torchrec.EmbeddingBagCollection(tables=_bag_tables(torchrec, shared=True))
    converted = pt.convert(ebc, bits=4)
    calls = []
    real = pk.embedding_bags_multi

    def counting(*args, **kwargs):
        calls.append(len(args[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(pk, "embedding_bags_multi", counting)
    with torch.no_grad():
        converted(_kjt(torchrec, ["f0", "fs", "f1", "f2"], 4, 40))
    assert calls == [5]


@pytest.mark.parametrize("bits", [None, 8, 4])
def test_converted_float_collections_and_dlrm_script(trec, bits):
    """torch.jit.script of TorchRec's float collections and DLRM after convert(): TorchScript
    compiles TorchRec's forward over the converted tables, whose scripted forward is ours, and
    the scripted module answers as the converted one does (and as stock TorchRec with the same
    rows)."""
    torchrec = trec[0]
    from torchrec.models.dlrm import DLRM
    torch.manual_seed(4)
    ebc = torchrec.EmbeddingBagCollection(tables=_bag_tables(torchrec, shared=True))
    kjt = _kjt(torchrec, ["f2", "fs", "f1", "f0"], 5, 40, seed=2)
    converted = pt.convert(ebc, bits=bits)
    scripted = torch.jit.script(converted)
    with torch.no_grad():
        want = converted(kjt)
        got = scripted(kjt)
    assert got.keys() == want.keys()
    if bits is None:
        # float tables: the scripted tables run torch's own function (stock's bits), the
        # converted collection our one call (float summation order apart)
        assert torch.equal(got.values(), ebc(kjt).values().detach())
        torch.testing.assert_close(got.values(), want.values(), rtol=1e-6, atol=1e-6)
    else:
        assert torch.equal(got.values(), want.values())
    assert type(converted).__name__.startswith("Converted")   # the module itself is unchanged

    tables = [torchrec.EmbeddingBagConfig(num_embeddings=40, embedding_dim=8, name=f"t{i}",
                                          feature_names=[f"f{i}"]) for i in range(3)]
    dlrm = DLRM(embedding_bag_collection=torchrec.EmbeddingBagCollection(tables=tables),
                dense_in_features=4, dense_arch_layer_sizes=[16, 8],
                over_arch_layer_sizes=[8, 1]).eval()
    conv = pt.convert(dlrm, bits=bits)
    kjt = _kjt(torchrec, ["f0", "f1", "f2"], 5, 40, seed=3)
    dense = torch.rand(5, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.script(conv)(dense, kjt), conv(dense, kjt),
                                   rtol=1e-6, atol=1e-6)


def test_converted_embedding_collection_scripts(trec):
    torchrec = trec[0]
    torch.manual_seed(5)
    tables = [torchrec.EmbeddingConfig(num_embeddings=30, embedding_dim=8, name=f"t{i}",
                                       feature_names=[f"f{i}"]) for i in range(2)]
    ec = torchrec.EmbeddingCollection(tables=tables).eval()
    converted = pt.convert(ec)
    kjt = _kjt(torchrec, ["f0", "f1"], 4, 30, seed=6)
    with torch.no_grad():
        want, got = ec(kjt), torch.jit.script(converted)(kjt)
    assert list(got) == list(want)
    assert all(torch.equal(got[k].values(), want[k].values()) for k in want)


def test_our_collections_refuse_script_clearly(trec):
    torchrec = trec[0]
    ebc = pt.EmbeddingBagCollection(tables=_bag_tables(torchrec))
    with pytest.raises(RuntimeError, match="EmbeddingBagCollection cannot be compiled by "
                                           "torch.jit.script.*convert"):
        torch.jit.script(ebc)
    ec = pt.EmbeddingCollection(tables=[torchrec.EmbeddingConfig(
        num_embeddings=10, embedding_dim=4, name="t", feature_names=["f"])])
    with pytest.raises(RuntimeError, match="EmbeddingCollection cannot be compiled"):
        torch.jit.script(ec)


def test_quant_collection_bad_input_names_the_feature_and_keeps_the_input(trec):
    """An out-of-range ID or lengths that do not add up: an error naming the feature and the
    value (IndexError, also a RuntimeError as FBGEMM's checks raise in their FATAL mode; a
    ValueError for the lengths), the KeyedJaggedTensor left as it was.  (Stock TorchRec's CPU
    collection, in FBGEMM's default bounds-check mode, logs, sets the ID to 0 in the caller's
    tensor and answers.)"""
    torchrec = trec[0]
    stock, _ = _quant_ebc(trec, torch.quint4x2)
    converted = pt.convert(stock)[0]
    names = converted._feature_names
    rows = {f: c.num_embeddings for c in converted.embedding_bag_configs()
            for f in c.feature_names}
    bad_feature = names[1]
    keys = list(names)
    lengths = torch.ones(len(keys) * 2, dtype=torch.int64)
    values = torch.zeros(len(keys) * 2, dtype=torch.int64)
    values[keys.index(bad_feature) * 2 + 1] = rows[bad_feature]
    kjt = torchrec.KeyedJaggedTensor.from_lengths_sync(keys, values.clone(), lengths)
    with pytest.raises(IndexError, match=rf"feature '{bad_feature}'.*value {rows[bad_feature]} "):
        converted(kjt)
    with pytest.raises(RuntimeError):
        converted(kjt)
    assert torch.equal(kjt.values(), values)
    short = torchrec.KeyedJaggedTensor(keys=keys, values=values[:-1].clone(), lengths=lengths)
    with pytest.raises(ValueError, match=rf"feature '{keys[-1]}', sample 1"):
        converted(short)
