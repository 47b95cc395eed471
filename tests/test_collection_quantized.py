"""Quantized tables in perfkernels.torch.EmbeddingBagCollection: made by convert(bits=) of a float
collection or read from table files, alone or beside float tables, on every route (eager without
and with grad, meta, fx, jit.trace, torch.export, torch.compile).

The reference, one feature at a time, written from the collection's definition (output slot i
holds feature i's bags, sum or mean, side by side in the tables' feature order): float64 bags of
the rows as perfkernels.reference (the NumPy oracle, itself checked against torch's prepack and
unpack ops) quantizes and dequantizes them; the packed rows are compared byte for byte with that
oracle and, where torch's prepack takes the width (D a multiple of 8 / bits), with torch's own.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import perfkernels as pk  # noqa: E402
import perfkernels.torch as pkt  # noqa: E402
from perfkernels import reference  # noqa: E402
from perfkernels import tables as T  # noqa: E402

PREPACK = {8: torch.ops.quantized.embedding_bag_byte_prepack,
           4: torch.ops.quantized.embedding_bag_4bit_prepack,
           2: torch.ops.quantized.embedding_bag_2bit_prepack}
#: (name, rows, D, features, pooling): a shared table, a mean table, awkward widths
TABLES = [("item", 300, 17, ["item"], "sum"),
          ("user", 50, 8, ["user", "friend"], "sum"),
          ("geo", 40, 9, ["geo"], "mean")]


def _collection(seed=0, weighted=False):
    torch.manual_seed(seed)
    return pkt.EmbeddingBagCollection(
        [pkt.EmbeddingBagConfig(rows, dim, name=name, feature_names=feats, pooling=pooling,
                                data_type=torch.float32)     # (whatever torch's default dtype)
         for name, rows, dim, feats, pooling in TABLES], is_weighted=weighted)


def _kjt(batch=5, seed=1, weighted=False, keys=None):
    g = np.random.default_rng(seed)
    keys = keys or [f for _, _, _, feats, _ in TABLES for f in feats]
    rows = {f: r for _, r, _, feats, _ in TABLES for f in feats}
    lengths, values = [], []
    for k in keys:
        ln = g.integers(0, 4, batch)
        ln[0] = 0                                  # an empty bag in every feature
        lengths += ln.tolist()
        values += g.integers(0, rows[k], int(ln.sum())).tolist()
    w = torch.from_numpy(g.random(len(values)).astype(np.float32)) if weighted else None
    return pkt.KeyedJaggedTensor(keys, torch.tensor(values, dtype=torch.int64), weights=w,
                                 lengths=torch.tensor(lengths))


def _packed(w, bits):
    return torch.from_numpy(reference.quantize_rowwise(w.detach().numpy(), bits))


def _reference(float_tables, bits, kjt, weighted=False, tables=TABLES):
    """Each feature's float64 bags of its table's rows (dequantized by the reference where
    ``bits[name]`` is given), in the tables' feature order."""
    keys = kjt.keys()
    batch = (kjt.offsets().numel() - 1) // len(keys)
    offsets = kjt.offsets()
    cols = []
    for name, _, dim, feats, pooling in tables:
        w = float_tables[name]
        for f in feats:
            i = keys.index(f)
            o = offsets[i * batch:(i + 1) * batch + 1]
            v = kjt.values()[o[0]:o[-1]]
            psw = kjt.weights_or_none()[o[0]:o[-1]] if weighted else None
            o = o - o[0]
            b = bits.get(name)
            table = w.double() if b is None else torch.from_numpy(
                reference.dequantize_rowwise(_packed(w, b).numpy(), b, dim)).double()
            out = torch.nn.functional.embedding_bag(
                v, table, o, mode="sum", include_last_offset=True,
                per_sample_weights=None if psw is None else psw.double())
            if pooling == "mean":
                n = (o[1:] - o[:-1]).clamp(min=1).double().unsqueeze(1)
                out = out / n if psw is None else out / (
                    torch.zeros(batch).double().index_add_(
                        0, torch.repeat_interleave(torch.arange(batch), o[1:] - o[:-1]),
                        torch.ones(len(v)).double()).clamp(min=1).unsqueeze(1))
            cols.append(out)
    return torch.cat(cols, 1)


def _tables(ebc):
    return {name: ebc.embedding_bags[name].weight.detach().clone() for name, *_ in TABLES}


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_convert_collection_quantizes_every_table_as_torch(bits):
    ebc = _collection()
    floats = _tables(ebc)
    conv = pkt.convert(ebc, bits=bits)
    report = pkt.last_report()
    assert len(report.swapped) == 3 and not report.skipped
    for name, *_ in TABLES:
        bag = conv.embedding_bags[name]
        assert isinstance(bag, pkt.QuantizedEmbeddingBag) and bag.bits == bits
        # our packed rows are the reference's (and torch's prepack's) bytes
        assert torch.equal(bag.packed_weight, _packed(floats[name], bits))
        if bag.embedding_dim % (8 // bits) == 0:
            assert torch.equal(bag.packed_weight, PREPACK[bits](floats[name]))
    assert [c.data_type for c in conv.embedding_bag_configs()] == [f"INT{bits}"] * 3
    assert ebc.embedding_bags["item"].weight.dtype == torch.float32    # inplace=False
    kjt = _kjt()
    want = _reference(floats, {n: bits for n, *_ in TABLES}, kjt)
    out = conv(kjt)
    assert out.keys() == ["item", "user", "friend", "geo"]
    assert out.values().dtype == torch.float32 and out.values().shape == (5, 17 + 8 + 8 + 9)
    torch.testing.assert_close(out.values().double(), want, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(conv(kjt).values(), out.values(), rtol=0, atol=0)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_every_isa_and_thread_count_give_the_same_bits(isa, threads):
    """The one-call route (NumPy API) and the graph op (native library) at this level and
    thread count, against the reference; per-sample weights and a 2-bit table too."""
    ebc = _collection(weighted=True)
    floats = _tables(ebc)
    conv = pkt.convert(ebc, bits=4)
    conv.embedding_bags["geo"] = pkt.convert(ebc.embedding_bags["geo"], bits=2)
    kjt = _kjt(batch=40, seed=3, weighted=True)
    want = _reference(floats, {"item": 4, "user": 4, "geo": 2}, kjt, weighted=True)
    before = (pk.get_num_threads(), torch.get_num_threads())
    pk.set_num_threads(threads)
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            eager = conv(kjt).values()
            graph = torch.fx.symbolic_trace(conv)(kjt).values()
    finally:
        pk.set_num_threads(before[0])
        torch.set_num_threads(before[1])
    torch.testing.assert_close(eager.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(graph, eager, rtol=1e-6, atol=1e-6)


def test_weighted_features_as_the_reference():
    ebc = _collection(weighted=True)
    floats = _tables(ebc)
    conv = pkt.convert(ebc, bits=8)
    kjt = _kjt(weighted=True, seed=5)
    want = _reference(floats, {n: 8 for n, *_ in TABLES}, kjt, weighted=True)
    torch.testing.assert_close(conv(kjt).values().double(), want, rtol=1e-5, atol=1e-5)


def test_mixed_float_and_quantized_tables_and_grad_mode():
    """A collection of a float table (trained) and quantized ones: without grad one call, with
    grad the float table gets torch's gradient and the quantized ones none."""
    ebc = _collection()
    floats = _tables(ebc)
    conv = pkt.convert(ebc, bits=4)
    item = pkt.EmbeddingBag(300, 17, mode="sum", include_last_offset=True,
                            _weight=floats["item"].clone(), dtype=torch.float32)
    item.output_dtype = torch.float32
    conv.embedding_bags["item"] = item
    kjt = _kjt(seed=7)
    want = _reference(floats, {"user": 4, "geo": 4}, kjt)
    with torch.no_grad():
        torch.testing.assert_close(conv(kjt).values().double(), want, rtol=1e-5, atol=1e-5)
    out = conv(kjt).values()
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    out[:, :17].sum().backward()
    counts = torch.zeros(300, dtype=torch.float32)
    keys, offs = kjt.keys(), kjt.offsets()
    o = offs[:5 + 1]
    counts.index_add_(0, kjt.values()[o[0]:o[-1]],
                      torch.ones(int(o[-1] - o[0]), dtype=torch.float32))
    torch.testing.assert_close(item.weight.grad, counts.unsqueeze(1).expand(300, 17))
    # a graph cannot record a lookup of quantized rows with a gradient: said, not dropped
    with pytest.raises(RuntimeError, match="without gradients"):
        torch.fx.symbolic_trace(conv)(kjt)


class _Wrap(torch.nn.Module):
    """A model taking the KJT's values and offsets (what jit.trace and export take)."""

    def __init__(self, ebc, keys):
        super().__init__()
        self.ebc, self.keys = ebc, keys

    def forward(self, values, offsets):
        return self.ebc(pkt.KeyedJaggedTensor(self.keys, values, offsets=offsets)).values()


def test_meta_fx_trace_and_export_record_one_op():
    conv = pkt.convert(_collection(), bits=4)
    kjt, other = _kjt(seed=1), _kjt(seed=2, batch=7)
    with torch.no_grad():
        want, want_other = conv(kjt).values(), conv(other).values()
        gm = torch.fx.symbolic_trace(conv)
        assert "embedding_bag_collection_packed" in str(gm.graph) or "_traced_collection" in str(
            gm.graph)
        torch.testing.assert_close(gm(other).values(), want_other, rtol=0, atol=0)
        traced = torch.jit.trace(_Wrap(conv, kjt.keys()), (kjt.values(), kjt.offsets()))
        assert "embedding_bag_collection_packed" in str(traced.inlined_graph)
        for _ in range(3):          # (TorchScript's executor optimises from the second call)
            torch.testing.assert_close(traced(other.values(), other.offsets()), want_other,
                                       rtol=0, atol=0)
    meta = pkt.convert(_collection(), bits=4).to("meta")
    mk = pkt.KeyedJaggedTensor(kjt.keys(), kjt.values().to("meta"),
                               offsets=kjt.offsets().to("meta"))
    assert meta(mk).values().shape == want.shape and meta(mk).values().device.type == "meta"
    ep = torch.export.export(_Wrap(conv, kjt.keys()), (kjt.values(), kjt.offsets()))
    assert "embedding_bag_collection_packed" in str(ep.graph)
    torch.testing.assert_close(ep.module()(kjt.values(), kjt.offsets()), want, rtol=0, atol=0)


def test_compile_fullgraph_answers_as_eager():
    conv = pkt.convert(_collection(), bits=4)
    kjt = _kjt(seed=4)
    with torch.no_grad():
        want = conv(kjt).values()
        f = torch.compile(_Wrap(conv, kjt.keys()), fullgraph=True)
        torch.testing.assert_close(f(kjt.values(), kjt.offsets()), want, rtol=0, atol=0)


def test_from_files_mixes_formats_and_maps_without_reading(tmp_path):
    ebc = _collection()
    floats = _tables(ebc)
    files = {}
    for name, *_ in TABLES:
        files[name] = str(tmp_path / f"{name}.pkt")
    T.save_table(files["item"], _packed(floats["item"], 4).numpy(), bits=4, dim=17)
    T.save_table(files["user"], _packed(floats["user"], 8).numpy(), bits=8, dim=8)
    T.save_table(files["geo"], floats["geo"].numpy())
    loaded = pkt.EmbeddingBagCollection.from_files(
        files, feature_names={"user": ["user", "friend"]}, pooling="sum")   # geo summed here
    cfgs = loaded.embedding_bag_configs()
    assert [c.data_type for c in cfgs] == ["INT4", "INT8", torch.float32]
    assert loaded.embedding_bags["item"].table_file == files["item"]
    kjt = _kjt(seed=9)
    summed = [(n, r, d, f, "sum") for n, r, d, f, _ in TABLES]
    want = _reference(floats, {"item": 4, "user": 8}, kjt, tables=summed)
    torch.testing.assert_close(loaded(kjt).values().double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loaded(kjt).values(), ebc_lookup_loop(loaded, kjt),
                               rtol=1e-6, atol=1e-6)


def ebc_lookup_loop(ebc, kjt):
    """The collection's answer assembled from its own table modules one feature at a time (each
    module as a user would call it): the one-call route must equal it."""
    keys, batch = kjt.keys(), (kjt.offsets().numel() - 1) // len(kjt.keys())
    cols = []
    for cfg in ebc.embedding_bag_configs():
        bag = ebc.embedding_bags[cfg.name]
        for f in cfg.feature_names:
            i = keys.index(f)
            o = kjt.offsets()[i * batch:(i + 1) * batch + 1]
            cols.append(bag(kjt.values()[o[0]:o[-1]], o - o[0]).float())
    return torch.cat(cols, 1)


def test_bad_input_is_refused_clearly():
    conv = pkt.convert(_collection(), bits=4)
    kjt = _kjt()
    bad = kjt.values().clone()
    bad[-1] = 40                  # geo has 40 rows
    with pytest.raises(IndexError, match=r"value 40 which is not in the valid range \[0, 40\)"):
        conv(pkt.KeyedJaggedTensor(kjt.keys(), bad, lengths=kjt.lengths()))
    with pytest.raises(KeyError, match="geo"):
        conv(_kjt(keys=["item", "user", "friend"]))
    with pytest.raises(ValueError, match="INT4"):
        pkt.EmbeddingBagCollection([pkt.EmbeddingBagConfig(10, 4, name="t", data_type="INT4")])


def test_convert_our_own_modules_with_bits_and_dtype():
    torch.manual_seed(0)
    bag = pkt.EmbeddingBag(100, 9, mode="mean", dtype=torch.float32)
    emb = pkt.Embedding(100, 9, dtype=torch.float32)
    model = torch.nn.ModuleDict({"bag": bag, "emb": emb})
    conv = pkt.convert(model, bits=8)
    assert isinstance(conv["bag"], pkt.QuantizedEmbeddingBag)
    assert isinstance(conv["emb"], pkt.QuantizedEmbedding)
    idx, offs = torch.tensor([1, 5, 99, 3]), torch.tensor([0, 1])
    def dequantized(w):
        return torch.from_numpy(reference.dequantize_rowwise(_packed(w, 8).numpy(), 8, 9))

    want = torch.nn.functional.embedding_bag(idx, dequantized(bag.weight).double(), offs,
                                             mode="mean")      # the float module's mode
    torch.testing.assert_close(conv["bag"](idx, offs).double(), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(conv["emb"](idx).double(), dequantized(emb.weight)[idx],
                               rtol=1e-6, atol=1e-6)
    # dtype= converts torch's tables; ours are left, and the report says so
    pkt.convert(model, dtype=torch.float16)
    assert pkt.last_report().skipped and "already perfkernels" in str(pkt.last_report())


def test_one_call_sees_edits_between_calls():
    """The one-call route keeps what it worked out per key order only while the table modules
    are the same objects: a replaced table, a changed mode or table, another key order are seen
    at the next call (each compared with the per-feature loop of the modules)."""
    conv = pkt.convert(_collection(), bits=4)
    kjt = _kjt(seed=11)
    with torch.no_grad():
        conv(kjt)
        torch.manual_seed(7)
        conv.embedding_bags["geo"] = pkt.convert(
            pkt.EmbeddingBag(40, 9, mode="mean", include_last_offset=True, dtype=torch.float32),
            bits=8)
        torch.testing.assert_close(conv(kjt).values(), ebc_lookup_loop(conv, kjt),
                                   rtol=1e-6, atol=1e-6)
        conv.embedding_bags["item"].mode = "mean"
        torch.testing.assert_close(conv(kjt).values(), ebc_lookup_loop(conv, kjt),
                                   rtol=1e-6, atol=1e-6)
        user = conv.embedding_bags["user"]
        user.packed_weight = torch.flip(user.packed_weight, [0]).contiguous()
        torch.testing.assert_close(conv(kjt).values(), ebc_lookup_loop(conv, kjt),
                                   rtol=1e-6, atol=1e-6)
        keys = ["geo", "friend", "item", "user"]
        sub = {k: i for i, k in enumerate(kjt.keys())}
        batch = 5
        lengths = torch.cat([kjt.lengths()[sub[k] * batch:(sub[k] + 1) * batch] for k in keys])
        offs = kjt.offsets()
        values = torch.cat([kjt.values()[offs[sub[k] * batch]:offs[(sub[k] + 1) * batch]]
                            for k in keys])
        again = pkt.KeyedJaggedTensor(keys, values, lengths=lengths)
        torch.testing.assert_close(conv(again).values(), conv(kjt).values(), rtol=0, atol=0)


def test_from_files_pooling_per_table(tmp_path):
    """``pooling={table: mode}``: each table pools as its entry says; a dict that misses a
    table or names another is refused."""
    floats = _tables(_collection())
    files = {}
    for name, *_ in TABLES:
        files[name] = str(tmp_path / f"{name}.pkt")
        T.save_table(files[name], floats[name].numpy())
    pooling = {n: p for n, _, _, _, p in TABLES}
    assert set(pooling.values()) == {"sum", "mean"}      # the test needs both
    loaded = pkt.EmbeddingBagCollection.from_files(
        files, feature_names={"user": ["user", "friend"]}, pooling=pooling)
    assert [c.pooling for c in loaded.embedding_bag_configs()] == [p for *_, p in TABLES]
    kjt = _kjt(seed=4)
    want = _reference(floats, {}, kjt, tables=TABLES)
    torch.testing.assert_close(loaded(kjt).values().double(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"missing \['geo'\]"):
        pkt.EmbeddingBagCollection.from_files(
            files, pooling={n: p for n, p in pooling.items() if n != "geo"})
    with pytest.raises(ValueError, match=r"extra \['other'\]"):
        pkt.EmbeddingBagCollection.from_files(files, pooling={**pooling, "other": "sum"})


@pytest.mark.parametrize("as_numpy", [True, False])
def test_from_tables_uses_the_tables_in_place(as_numpy):
    """from_tables: packed rows and float tables of every dtype, mixed, used where they are (no
    copy), answering as the float64 reference; the per-table pooling and features taken."""
    floats = _tables(_collection(seed=4))
    item = _packed(floats["item"], 4).numpy()
    user = floats["user"].numpy().astype(np.float16)
    geo = floats["geo"].numpy()
    given = {"item": item, "user": user, "geo": geo}
    if not as_numpy:
        given = {k: torch.from_numpy(v) for k, v in given.items()}
    ebc = pkt.EmbeddingBagCollection.from_tables(
        given, bits={"item": 4}, dims={"item": 17}, feature_names={"user": ["user", "friend"]},
        pooling={"item": "sum", "user": "sum", "geo": "mean"})
    assert [c.data_type for c in ebc.embedding_bag_configs()] == ["INT4", torch.float16,
                                                                   torch.float32]
    assert ebc.embedding_bags["item"].packed_weight.data_ptr() == \
        (item.ctypes.data if as_numpy else given["item"].data_ptr())
    assert ebc.embedding_bags["geo"].weight.data_ptr() == \
        (geo.ctypes.data if as_numpy else given["geo"].data_ptr())
    kjt = _kjt(seed=11)
    want_floats = dict(floats, user=torch.from_numpy(user.astype(np.float32)))
    with torch.no_grad():
        got = ebc(kjt).values()
    torch.testing.assert_close(got.double(), _reference(want_floats, {"item": 4}, kjt),
                               rtol=1e-5, atol=1e-5)
    # an edit of the caller's table is what the next lookup reads (the same memory)
    geo[:] = 0
    with torch.no_grad():
        again = ebc(kjt).values()
    assert float(again[:, -9:].abs().max()) == 0.0 and torch.equal(again[:, :-9], got[:, :-9])


def test_from_tables_bfloat16_table():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    w = np.random.default_rng(0).standard_normal((30, 7)).astype(ml_dtypes.bfloat16)
    ebc = pkt.EmbeddingBagCollection.from_tables({"t": w})
    kjt = pkt.KeyedJaggedTensor(["t"], torch.tensor([1, 2, 29]), lengths=torch.tensor([2, 1]))
    want = np.stack([w[[1, 2]].astype(np.float64).sum(0), w[29].astype(np.float64)])
    with torch.no_grad():
        got = ebc(kjt).values()
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)


def test_from_tables_refuses_what_it_cannot_use():
    w = np.ones((10, 4), np.float32)
    packed = pk.quantize_rowwise(w, bits=8)
    ro = w.copy()
    ro.flags.writeable = False
    cases = [
        ({"t": ro}, {}, ValueError, "read-only"),
        ({"t": packed}, {}, ValueError, "give its bits"),
        ({"t": w}, {"bits": {"t": 8}}, ValueError, "not packed"),
        ({"t": w}, {"bits": {"u": 8}}, ValueError, r"\['u'\]"),
        ({"t": w.astype(np.float64)}, {}, TypeError, "float64"),
        ({"t": np.ones(4, np.float32)}, {}, ValueError, "2-D"),
        ({"t": [[1.0]]}, {}, TypeError, "list"),
        ([w], {}, TypeError, "map table names"),
        ({"t": w}, {"feature_names": {"u": ["u"]}}, ValueError, r"\['u'\]"),
        ({"t": w}, {"pooling": {"u": "sum"}}, ValueError, "pooling must name"),
        ({"t": w}, {"dims": {"t": 5}}, ValueError, "D = 5"),
        ({"t": w}, {"dims": {"u": 4}}, ValueError, r"dims names tables .*\['u'\]"),
    ]
    for tables, kwargs, exc, match in cases:
        with pytest.raises(exc, match=match):
            pkt.EmbeddingBagCollection.from_tables(tables, **kwargs)
