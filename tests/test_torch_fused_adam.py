"""The Adam family and momentum as fused optimizers of the torch modules: EmbeddingBag against
nn.EmbeddingBag(sparse=True) + torch.optim.SparseAdam and against the float64 reference, the state
buffers (momentum1, momentum2, step) in state_dict, a state_dict round trip in the middle of
training that changes nothing (bit for bit), EmbeddingBagCollection, and options refused at
construction."""
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import perfkernels.torch as pt  # noqa: E402
from perfkernels import reference  # noqa: E402
from sparse_training import torch_bags_of as _bags  # noqa: E402

SPECS = {
    "adam": ("adam", {"lr": 0.01, "betas": (0.8, 0.95)}),
    "adamw": ("adamw", {"lr": 0.01, "weight_decay": 0.1}),
    "rowwise_adam": ("rowwise_adam", {"lr": 0.01, "eps": 1e-6}),
    "momentum": ("sgd", {"lr": 0.05, "momentum": 0.9}),
    "nesterov": ("sgd", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
}


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_adam_matches_sparse_adam(mode, weighted):
    """12 steps against nn.EmbeddingBag(sparse=True) + torch.optim.SparseAdam, padding_idx and
    duplicate rows included: weights and moments within 1e-5, the same step count."""
    if weighted and mode == "mean":
        pytest.skip("torch takes per_sample_weights in sum mode only")
    gen = torch.Generator().manual_seed(5)
    rows, dim, lr, betas = 40, 9, 0.01, (0.8, 0.95)
    ref = torch.nn.EmbeddingBag(rows, dim, mode=mode, sparse=True, padding_idx=3)
    ours = pt.EmbeddingBag(rows, dim, mode=mode, padding_idx=3,
                           fused_optimizer=("adam", {"lr": lr, "betas": betas}))
    with torch.no_grad():
        ours.weight.copy_(ref.weight)
    topt = torch.optim.SparseAdam(ref.parameters(), lr=lr, betas=betas, eps=1e-8)
    for _ in range(12):
        ix, off = _bags(gen, 10, 8, 6)
        g = torch.randn(8, dim, generator=gen)
        psw = torch.randn(ix.numel(), generator=gen) if weighted else None
        topt.zero_grad()
        (ref(ix, off, per_sample_weights=psw) * g).sum().backward()
        topt.step()
        (ours(ix, off, per_sample_weights=psw) * g).sum().backward()
        assert ours.weight.grad is None
    st = topt.state[ref.weight]
    torch.testing.assert_close(ours.weight.detach(), ref.weight.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.momentum1, st["exp_avg"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.momentum2, st["exp_avg_sq"], rtol=1e-5, atol=1e-7)
    assert int(ours.step) == int(st["step"]) == 12
    assert set(ours.state_dict()) == {"weight", "momentum1", "momentum2", "step"}


@pytest.mark.parametrize("name", SPECS)
def test_steps_match_reference(name):
    optimizer, opts = SPECS[name]
    gen = torch.Generator().manual_seed(6)
    rows, dim = 30, 17
    bag = pt.EmbeddingBag(rows, dim, mode="sum", fused_optimizer=(optimizer, opts))
    w = bag.weight.detach().numpy().astype(np.float64)
    if optimizer == "sgd":
        state = np.zeros((rows, dim))
    else:
        state = (np.zeros((rows, dim)), np.zeros(rows if optimizer == "rowwise_adam" else (rows, dim)))
    kw = {k: v for k, v in opts.items()}
    for step in range(1, 6):
        ix, off = _bags(gen, 12, 6, 5)
        g = torch.randn(6, dim, generator=gen)
        (bag(ix, off) * g).sum().backward()
        extra = {} if optimizer == "sgd" else {"step": step}
        w, state, _ = reference.embedding_bag_backward_adam(
            w, ix.numpy(), off.numpy(), grad_output=g.numpy(), optimizer=optimizer,
            state=state if optimizer != "sgd" else state, **kw, **extra)
        if optimizer == "sgd":
            state = state[0]
    np.testing.assert_allclose(bag.weight.detach().numpy(), w, rtol=1e-4, atol=1e-5)
    parts = (state,) if optimizer == "sgd" else state
    for buf, want in zip((bag.momentum1, getattr(bag, "momentum2", None)), parts):
        np.testing.assert_allclose(buf.numpy(), want, rtol=1e-4, atol=1e-6)
    if optimizer != "sgd":
        assert int(bag.step) == 5
    else:
        assert "momentum2" not in bag.state_dict() and "step" not in bag.state_dict()


def _train(bag, batches):
    for ix, off, g in batches:
        (bag(ix, off) * g).sum().backward()


@pytest.mark.parametrize("name", [*SPECS, "adam_bf16_stochastic", "rowwise_adam_f16"])
def test_state_dict_round_trip_mid_training_bit_for_bit(name):
    """Train 4 steps, save, load into a fresh module, train both 4 more: every table, moment and
    step count equal bit for bit (16-bit tables with stochastic rounding included: its bits come
    from the table's own step count)."""
    dtype = torch.float32
    if name == "adam_bf16_stochastic":
        optimizer, opts = "adam", {"lr": 0.01, "stochastic_rounding": True}
        dtype = torch.bfloat16
    elif name == "rowwise_adam_f16":
        optimizer, opts = "rowwise_adam", {"lr": 0.01}
        dtype = torch.float16
    else:
        optimizer, opts = SPECS[name]
    gen = torch.Generator().manual_seed(7)
    rows, dim = 50, 16
    batches = []
    for _ in range(8):
        ix, off = _bags(gen, rows, 8, 6)
        batches.append((ix, off, torch.randn(8, dim, generator=gen)))
    a = pt.EmbeddingBag(rows, dim, mode="mean", dtype=dtype, fused_optimizer=(optimizer, opts))
    _train(a, batches[:4])
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = pt.EmbeddingBag(rows, dim, mode="mean", dtype=dtype, fused_optimizer=(optimizer, opts))
    b.load_state_dict(torch.load(buf))
    _train(a, batches[4:])
    _train(b, batches[4:])
    sa, sb = a.state_dict(), b.state_dict()
    assert set(sa) == set(sb)
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    if optimizer != "sgd":
        assert int(sa["step"]) == 8


def test_collection_fused_adam():
    """EmbeddingBagCollection with fused Adam: each table against its own SparseAdam; the state
    in state_dict as embedding_bags.<table>.momentum1 / momentum2 / step."""
    tables = [pt.EmbeddingBagConfig(50, 8, name="t0", feature_names=["f0"]),
              pt.EmbeddingBagConfig(30, 4, name="t1", feature_names=["f1", "f2"])]
    ebc = pt.EmbeddingBagCollection(tables, fused_optimizer=("adam", {"lr": 0.02}))
    refs = {}
    for name in ("t0", "t1"):
        w = ebc.embedding_bags[name].weight
        ref = torch.nn.EmbeddingBag(w.shape[0], w.shape[1], mode="sum", sparse=True,
                                    include_last_offset=True)
        with torch.no_grad():
            ref.weight.copy_(w)
        refs[name] = (ref, torch.optim.SparseAdam(ref.parameters(), lr=0.02))
    gen = torch.Generator().manual_seed(8)
    B = 3
    for _ in range(6):
        lengths = torch.randint(0, 4, (3 * B,), generator=gen)
        n = int(lengths.sum())
        values = torch.cat([torch.randint(0, 50, (int(lengths[:B].sum()),), generator=gen),
                            torch.randint(0, 30, (n - int(lengths[:B].sum()),), generator=gen)])
        kjt = pt.KeyedJaggedTensor(["f0", "f1", "f2"], values, lengths=lengths)
        up = torch.randn(B, 16, generator=gen)
        (ebc(kjt).values() * up).sum().backward()
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        # t0: feature f0; t1: features f1 and f2 looked up together (one update per step)
        for name, feats, cols in (("t0", [0], [slice(0, 8)]),
                                  ("t1", [1, 2], [slice(8, 12), slice(12, 16)])):
            ref, opt = refs[name]
            lo, hi = int(offsets[feats[0] * B]), int(offsets[(feats[-1] + 1) * B])
            offs = offsets[feats[0] * B:(feats[-1] + 1) * B + 1] - lo
            grad = torch.cat([up[:, c] for c in cols])
            opt.zero_grad()
            (ref(values[lo:hi], offs) * grad).sum().backward()
            opt.step()
    sd = ebc.state_dict()
    assert set(sd) == {f"embedding_bags.{t}.{f}" for t in ("t0", "t1")
                       for f in ("weight", "momentum1", "momentum2", "step")}
    for name, (ref, opt) in refs.items():
        torch.testing.assert_close(sd[f"embedding_bags.{name}.weight"], ref.weight.detach(),
                                   rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(sd[f"embedding_bags.{name}.momentum2"],
                                   opt.state[ref.weight]["exp_avg_sq"], rtol=1e-5, atol=1e-7)
        assert int(sd[f"embedding_bags.{name}.step"]) == 6


@pytest.mark.parametrize("spec,exc,match", [
    (("adam", {"lr": 0.1, "betas": (1.0, 0.9)}), ValueError, r"betas\[0\]"),
    (("adam", {"lr": 0.1, "betas": (0.9, -0.1)}), ValueError, r"betas\[1\]"),
    (("adam", {"lr": 0.1, "betas": 0.9}), TypeError, "betas"),
    (("adam", {"lr": 0.1, "betas": (0.9, 10 ** 400)}), ValueError, r"betas\[1\]"),
    (("adam", {"lr": 0.1, "betas": ("a", 0.9)}), TypeError, "betas"),
    (("adam", {"lr": 0.1, "eps": 0.0}), ValueError, "eps"),
    (("adam", {"lr": 0.1, "momentum": 0.9}), ValueError, "momentum"),
    (("rowwise_adam", {"lr": 0.1, "initial_accumulator_value": 0.5}), ValueError,
     "initial_accumulator_value|takes"),
    (("adagrad", {"lr": 0.1, "betas": (0.9, 0.99)}), ValueError, "betas"),
    (("sgd", {"lr": 0.1, "nesterov": True}), ValueError, "nesterov"),
    (("sgd", {"lr": 0.1, "momentum": -0.5}), ValueError, "momentum"),
    (("sgd", {"lr": 0.1, "momentum": 0.5, "nesterov": 1}), TypeError, "nesterov"),
    (("adamw", {"lr": float("inf")}), ValueError, "lr"),
    (("adamw", {}), ValueError, "learning rate"),
    (("nadam", {"lr": 0.1}), ValueError, "nadam"),
])
def test_bad_options_refused_at_construction(spec, exc, match):
    with pytest.raises(exc, match=match):
        pt.EmbeddingBag(5, 2, fused_optimizer=spec)
    with pytest.raises(exc, match=match):
        pt.EmbeddingBagCollection([pt.EmbeddingBagConfig(5, 2, name="t", feature_names=["f"])],
                                  fused_optimizer=spec)


def test_out_of_range_index_leaves_table_and_state():
    bag = pt.EmbeddingBag(5, 2, mode="sum", fused_optimizer=("adam", {"lr": 0.1}))
    bag(torch.tensor([1, 2]), torch.tensor([0])).sum().backward()
    before = {k: v.clone() for k, v in bag.state_dict().items()}
    with pytest.raises(IndexError, match="not in the valid range"):
        bag(torch.tensor([1, 7]), torch.tensor([0])).sum().backward()
    for k, v in bag.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert int(bag.step) == 1


def test_switching_optimizer_replaces_buffers():
    bag = pt.EmbeddingBag(6, 3, mode="sum", fused_optimizer=("adam", {"lr": 0.1}))
    assert set(bag.state_dict()) == {"weight", "momentum1", "momentum2", "step"}
    bag.set_fused_optimizer(("rowwise_adagrad", {"lr": 0.1}))
    assert set(bag.state_dict()) == {"weight", "momentum1"} and bag.momentum1.shape == (6,)
    bag.set_fused_optimizer(("rowwise_adam", {"lr": 0.1}))
    assert bag.momentum1.shape == (6, 3) and bag.momentum2.shape == (6,)
    bag.set_fused_optimizer(None)
    assert set(bag.state_dict()) == {"weight"}


@pytest.mark.parametrize("name", ["adam", "rowwise_adam"])
def test_any_thread_count_same_bits(name):
    """The module trained with 1, 2 and 3 perfkernels threads: the same table and state, bit for
    bit (a batch large enough for the update to be split across the pool)."""
    import perfkernels
    gen = torch.Generator().manual_seed(9)
    rows, dim, B = 5000, 32, 400
    batches = []
    for _ in range(3):
        ix, off = _bags(gen, rows, B, 60)
        batches.append((ix, off, torch.randn(B, dim, generator=gen)))
    results = []
    before = perfkernels.get_num_threads()
    try:
        for threads in (1, 2, 3):
            perfkernels.set_num_threads(threads)
            torch.manual_seed(0)
            bag = pt.EmbeddingBag(rows, dim, mode="sum", dtype=torch.bfloat16,
                                  fused_optimizer=(name, {"lr": 0.01, "stochastic_rounding": True}))
            _train(bag, batches)
            results.append(bag.state_dict())
    finally:
        perfkernels.set_num_threads(before)
    for sd in results[1:]:
        for k in sd:
            assert torch.equal(sd[k], results[0][k]), k


@pytest.mark.parametrize("name", ["adam", "rowwise_adagrad"])
def test_embedding_fused_steps_match_torch(name):
    """pt.Embedding (unpooled: each index a bag of one) with a fused Adam steps as
    nn.Embedding(sparse=True) + torch.optim.SparseAdam, duplicates included; row-wise Adagrad
    keeps its one state value per row."""
    gen = torch.Generator().manual_seed(8)
    rows, dim, lr = 20, 7, 0.01
    ref = torch.nn.Embedding(rows, dim, sparse=True)
    ours = pt.Embedding(rows, dim, fused_optimizer=(name, {"lr": lr, "eps": 1e-8}))
    with torch.no_grad():
        ours.weight.copy_(ref.weight)
    for _ in range(6):
        ix = torch.randint(0, rows, (3, 4), generator=gen)
        g = torch.randn(3, 4, dim, generator=gen)
        (ours(ix) * g).sum().backward()
        if name == "adam":
            topt = getattr(ref, "_opt", None) or torch.optim.SparseAdam(ref.parameters(), lr=lr)
            ref._opt = topt
            topt.zero_grad()
            (ref(ix) * g).sum().backward()
            topt.step()
    if name == "adam":
        st = ref._opt.state[ref.weight]
        torch.testing.assert_close(ours.weight.detach(), ref.weight.detach(), rtol=1e-5,
                                   atol=1e-5)
        torch.testing.assert_close(ours.momentum2, st["exp_avg_sq"], rtol=1e-5, atol=1e-7)
        assert int(ours.step) == int(st["step"]) == 6
    else:
        assert ours.momentum1.shape == (rows,) and bool((ours.momentum1 > 0).any())
