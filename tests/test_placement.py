"""Table placement: alignment, huge pages (confirmed in /proc/self/smaps), padded row strides, and
the torch modules whose tables move into placed memory (same Parameter, same results)."""
import copy
import warnings

import numpy as np
import pytest

import perfkernels as pk
from perfkernels import _placement

HUGE = _placement.HUGE_PAGE
#: a table above the "auto" threshold: 10000 x 64 float32 = 2.56 MB
ROWS, DIM = 10000, 64


def _address(a):
    return a.__array_interface__["data"][0]


def _thp_unavailable():
    return _placement._no_huge_pages_reason()


def _bags_reference(table, indices, offsets):
    """float64 sums of the rows of each bag, from the semantics."""
    t = np.asarray(table, np.float64)
    ends = list(offsets[1:]) + [len(indices)]
    return np.stack([t[indices[s:e]].sum(0) for s, e in zip(offsets, ends)])


def test_empty_table_is_2mib_aligned_zeroed_and_recorded():
    t = pk.empty_table(ROWS, DIM, np.float32)
    assert t.shape == (ROWS, DIM) and t.dtype == np.float32 and not t.any()
    assert _address(t) % HUGE == 0
    p = pk.placement_of(t)
    assert p is not None and p.row_stride == DIM * 4 and p.nbytes == ROWS * DIM * 4
    assert pk.placement_of(t[5:]) is p                 # a view lies in the same table
    assert pk.placement_of(np.zeros((ROWS, DIM), np.float32)) is None


def test_small_tables_get_line_aligned_ordinary_memory_under_auto():
    t = pk.empty_table(100, 16, np.float32)
    assert _address(t) % 64 == 0 and pk.placement_of(t) is None
    h = pk.empty_table(100, 16, np.float32, placement="hugepage")
    assert _address(h) % HUGE == 0 and pk.placement_of(h) is not None


def test_row_stride_is_padded_only_when_rows_would_span_an_extra_line():
    # 240-byte rows: unpadded, some start 48 bytes into a line and span 5 lines instead of 4
    t = pk.empty_table(1000, 60, np.float32)
    assert t.strides == (256, 4) and t.shape == (1000, 60)
    assert all((_address(t) + i * t.strides[0]) % 64 == 0 for i in range(8))
    # 256-byte rows already span 4 lines; 40-byte rows would cost 60% more memory padded
    assert pk.empty_table(1000, 64, np.float32).strides == (256, 4)
    assert pk.empty_table(1000, 10, np.float32).strides == (40, 4)
    assert _placement.padded_row_stride(40, 4)[1] is not None    # the reason is recorded
    # packed quantized rows stay contiguous (the quantized kernels read them so)
    assert pk.empty_table(1000, 36, np.uint8).strides == (36, 1)


def test_as_table_keeps_values_and_results_equal_the_unplaced_table():
    rng = np.random.default_rng(0)
    for dim in (64, 60):
        a = rng.standard_normal((ROWS, dim)).astype(np.float32)
        placed = pk.as_table(a)
        assert placed is not a and np.array_equal(placed, a)
        assert pk.placement_of(placed) is not None
        assert pk.as_table(placed) is placed          # already placed: no second copy
        idx = rng.integers(0, ROWS, 4000)
        off = np.arange(0, 4000, 40)
        got = pk.embedding_bag(placed, idx, off)
        np.testing.assert_array_equal(got, pk.embedding_bag(a, idx, off))
        np.testing.assert_allclose(got, _bags_reference(a, idx, off), rtol=1e-5, atol=1e-4)
    q = pk.quantize_rowwise(a[:, :56].copy(), 8)
    qp = pk.as_table(q, placement="hugepage")       # 640 KB: below the "auto" threshold
    assert qp.flags.c_contiguous and pk.placement_of(qp) is not None
    np.testing.assert_array_equal(pk.embedding_bag_quantized(qp, idx, off, bits=8),
                                  pk.embedding_bag_quantized(q, idx, off, bits=8))


def test_keep_and_bad_placements():
    a = np.ones((10, 4), np.float32)
    assert pk.as_table(a, placement="keep") is a
    with pytest.raises(ValueError, match="placement must be one of.*'huge'"):
        pk.as_table(a, placement="huge")
    with pytest.raises(ValueError, match="2-D"):
        pk.as_table(np.ones(5, np.float32))


def test_placed_tables_really_get_huge_pages():
    why = _thp_unavailable()
    if why:
        pytest.skip(why)
    t = pk.empty_table(2 * HUGE // 256, 64, np.float32, placement="hugepage")   # 4 MiB
    p = pk.placement_of(t)
    assert p.huge_pages.startswith("MADV_HUGEPAGE")
    assert p.anon_huge_bytes() == t.nbytes, p.reason
    assert p.huge_bytes == t.nbytes


def test_thp_never_warns_once_and_gives_plain_pages(monkeypatch):
    monkeypatch.setattr(_placement, "thp_mode", lambda: {"enabled": "never", "defrag": "never"})
    monkeypatch.setattr(_placement, "_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = pk.empty_table(ROWS, DIM, np.float32)
        b = pk.empty_table(ROWS, DIM, np.float32)
    assert [w.category for w in caught] == [_placement.PlacementWarning]
    assert "never" in str(caught[0].message)
    p = pk.placement_of(a)
    assert p.huge_pages == "none" and "never" in p.reason
    assert _address(b) % HUGE == 0


def test_freed_tables_leave_the_registry():
    import gc
    t = pk.empty_table(ROWS, DIM, np.float32)
    start = _address(t)
    del t
    gc.collect()
    assert start not in _placement._regions


# --------------------------------------------------------------------------- torch

torch = pytest.importorskip("torch")
pt = pytest.importorskip("perfkernels.torch")


def _batch(rows, n=2000, bag=20, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, rows, (n,), generator=g), torch.arange(0, n, bag)


def test_embedding_bag_weight_is_a_parameter_on_placed_memory():
    torch.manual_seed(0)
    bag = pt.EmbeddingBag(ROWS, DIM, mode="sum")
    assert isinstance(bag.weight, torch.nn.Parameter)
    assert bag.weight.data_ptr() % HUGE == 0 and pk.placement_of(bag.weight) is not None
    kept = pt.EmbeddingBag(ROWS, DIM, mode="sum", placement="keep")
    assert pk.placement_of(kept.weight) is None
    with torch.no_grad():
        kept.weight.copy_(bag.weight)
    idx, off = _batch(ROWS)
    with torch.no_grad():
        ref = torch.nn.functional.embedding_bag(idx, kept.weight, off, mode="sum")
        torch.testing.assert_close(bag(idx, off), ref)
        assert torch.equal(bag(idx, off), kept(idx, off))
    pre = pt.EmbeddingBag.from_pretrained(kept.weight.detach().clone())
    assert pk.placement_of(pre.weight) is not None and torch.equal(pre.weight, kept.weight)


def test_state_dict_round_trips_into_placed_memory(tmp_path):
    torch.manual_seed(0)
    a = pt.EmbeddingBag(ROWS, DIM)
    path = tmp_path / "bag.pt"
    torch.save(a.state_dict(), path)
    b = pt.EmbeddingBag(ROWS, DIM)
    ptr = b.weight.data_ptr()
    b.load_state_dict(torch.load(path))
    assert torch.equal(a.weight, b.weight) and b.weight.data_ptr() == ptr   # loaded in place


def test_optimizer_steps_update_the_placed_parameter_like_an_unplaced_one():
    torch.manual_seed(0)
    placed = pt.EmbeddingBag(ROWS, DIM, mode="sum", sparse=True)
    plain = pt.EmbeddingBag(ROWS, DIM, mode="sum", sparse=True, placement="keep")
    with torch.no_grad():
        plain.weight.copy_(placed.weight)
    param = placed.weight
    opts = [torch.optim.Adagrad([m.weight], lr=0.1) for m in (placed, plain)]
    for step in range(3):
        idx, off = _batch(ROWS, seed=step)
        for m, opt in zip((placed, plain), opts):
            opt.zero_grad()
            m(idx, off).square().sum().backward()
            opt.step()
    assert placed.weight is param and pk.placement_of(param) is not None
    assert torch.equal(placed.weight, plain.weight)


def test_fused_optimizer_state_is_placed_and_steps_match():
    torch.manual_seed(0)
    spec = ("adagrad", {"lr": 0.05})      # element-wise state: as large as the table
    cfg = [pt.EmbeddingBagConfig(ROWS, DIM, name="t0"), pt.EmbeddingBagConfig(500, 16, name="t1")]
    placed = pt.EmbeddingBagCollection(cfg, fused_optimizer=spec)
    plain = pt.EmbeddingBagCollection(cfg, fused_optimizer=spec, placement="keep")
    plain.load_state_dict(placed.state_dict())
    big = placed.embedding_bags["t0"]
    assert pk.placement_of(big.weight) is not None and pk.placement_of(big.momentum1) is not None
    assert pk.placement_of(plain.embedding_bags["t0"].weight) is None
    rng = np.random.default_rng(2)
    for _ in range(2):
        lengths = torch.from_numpy(rng.integers(0, 5, 2 * 64))
        values = torch.cat([torch.from_numpy(rng.integers(0, n, int(lengths[i * 64:(i + 1) * 64]
                                                                     .sum())))
                            for i, n in enumerate((ROWS, 500))])
        kjt = pt.KeyedJaggedTensor(["t0", "t1"], values, lengths=lengths)
        for m in (placed, plain):
            m(kjt).values().square().sum().backward()
    for name in ("t0", "t1"):
        a, b = placed.embedding_bags[name], plain.embedding_bags[name]
        assert torch.equal(a.weight, b.weight) and torch.equal(a.momentum1, b.momentum1)


def test_convert_places_the_shared_parameter_and_keep_leaves_it():
    torch.manual_seed(0)
    rows = 4 * ROWS                 # its 8-bit rows (72 bytes each) too are above 2 MiB
    model = torch.nn.Sequential(torch.nn.EmbeddingBag(rows, DIM, mode="sum"))
    param = model[0].weight
    kept = pt.convert(model, placement="keep")
    assert pk.placement_of(kept[0].weight) is None
    values = param.detach().clone()
    conv = pt.convert(model)
    assert conv[0].weight is param and pk.placement_of(param) is not None
    assert torch.equal(param, values)
    q = pt.convert(copy.deepcopy(model), bits=8)
    assert pk.placement_of(q[0].packed_weight) is not None
    qk = pt.convert(copy.deepcopy(model), bits=8, placement="keep")
    assert pk.placement_of(qk[0].packed_weight) is None
    idx, off = _batch(rows)
    assert torch.equal(q[0](idx, off), qk[0](idx, off))
    with pytest.raises(ValueError, match="placement"):
        pt.convert(model, placement="huge")


def test_place_a_stock_model_and_report_it():
    model = torch.nn.EmbeddingBag(ROWS, DIM)
    assert pk.placement_of(model.weight) is None
    pt.place(model, "hugepage")
    assert pk.placement_of(model.weight) is not None
    (name, line), = pt.placement_report(model)
    assert name == "weight" and "placed" in line and "AnonHugePages" in line
