"""Fused optimizers in the PyTorch layer: EmbeddingBag / EmbeddingBagCollection update their
tables during backward (perfkernels.embedding_bag_backward_update), against torch's sparse
gradients + torch.optim, against the float64 reference, and in a small DLRM-style training run
whose loss must track the unfused torch run's."""
import copy
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import perfkernels.torch as pt  # noqa: E402
from perfkernels import reference  # noqa: E402
from sparse_training import torch_bags_of as _bags  # noqa: E402


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_rowwise_step_matches_reference(mode):
    gen = torch.Generator().manual_seed(1)
    rows, dim = 30, 12
    bag = pt.EmbeddingBag(rows, dim, mode=mode, padding_idx=2,
                          fused_optimizer=("rowwise_adagrad", {"lr": 0.1, "eps": 1e-8}))
    w0 = bag.weight.detach().numpy().astype(np.float64)
    h0 = np.zeros(rows)
    ix, off = _bags(gen, 8, 6, 9)
    g = torch.randn(6, dim, generator=gen)
    (bag(ix, off) * g).sum().backward()
    assert bag.weight.grad is None
    exp = reference.embedding_bag_backward_update(
        w0, ix.numpy(), off.numpy(), grad_output=g.numpy(), optimizer="rowwise_adagrad",
        state=h0, lr=0.1, eps=1e-8, mode=mode, padding_idx=2)
    np.testing.assert_allclose(bag.weight.detach().numpy(), exp.weight, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(bag.momentum1.numpy(), exp.state, rtol=2e-5, atol=1e-9)
    assert "momentum1" in bag.state_dict()


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_torch_sparse_optim(optimizer, weighted):
    """Several steps against nn.EmbeddingBag(sparse=True) + torch.optim; per_sample_weights'
    gradient is taken with the table as it was in the forward."""
    gen = torch.Generator().manual_seed(2)
    rows, dim, lr, eps = 40, 9, 0.05, 1e-10
    ref = torch.nn.EmbeddingBag(rows, dim, mode="sum", sparse=True)
    opts = {"lr": lr, "eps": eps} if optimizer == "adagrad" else {"lr": lr}
    ours = pt.EmbeddingBag(rows, dim, mode="sum", fused_optimizer=(optimizer, opts))
    with torch.no_grad():
        ours.weight.copy_(ref.weight)
    topt = (torch.optim.SGD(ref.parameters(), lr=lr) if optimizer == "sgd"
            else torch.optim.Adagrad(ref.parameters(), lr=lr, eps=eps))
    for _ in range(4):
        ix, off = _bags(gen, 10, 8, 6)
        g = torch.randn(8, dim, generator=gen)
        psw = torch.randn(ix.numel(), generator=gen) if weighted else None
        psw_ref = psw_ours = None
        if weighted:
            psw_ref, psw_ours = psw.clone().requires_grad_(), psw.clone().requires_grad_()
        topt.zero_grad()
        (ref(ix, off, per_sample_weights=psw_ref) * g).sum().backward()
        topt.step()
        (ours(ix, off, per_sample_weights=psw_ours) * g).sum().backward()
        if weighted:
            torch.testing.assert_close(psw_ours.grad, psw_ref.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.weight.detach(), ref.weight.detach(), rtol=2e-5, atol=2e-6)
    if optimizer == "adagrad":
        torch.testing.assert_close(ours.momentum1, topt.state[ref.weight]["sum"],
                                   rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("layout", ["offsets", "last_offset", "2d"])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("mode,padding_idx", [("sum", None), ("mean", None), ("mean", 3)])
def test_training_lookup_route_matches_torch_sgd(layout, index_dtype, mode, padding_idx):
    """A training step's lookup with a fused optimizer and no per_sample_weights takes the lean
    autograd function; the table after several steps is torch's after its SGD on the sparse
    gradient of nn.EmbeddingBag, for every input layout and index dtype, and the other
    arguments still take the full route (same answer)."""
    gen = torch.Generator().manual_seed(7)
    rows, dim, lr = 25, 9, 0.1
    ref = torch.nn.EmbeddingBag(rows, dim, mode=mode, sparse=True, padding_idx=padding_idx,
                                include_last_offset=layout == "last_offset")
    ours = pt.EmbeddingBag(rows, dim, mode=mode, padding_idx=padding_idx,
                           include_last_offset=layout == "last_offset",
                           fused_optimizer=("sgd", {"lr": lr}))
    with torch.no_grad():
        ours.weight.copy_(ref.weight)
    topt = torch.optim.SGD(ref.parameters(), lr=lr)
    for step in range(3):
        if layout == "2d":
            ix, off = torch.randint(0, rows, (5, 3), generator=gen), None
        else:
            ix, off = _bags(gen, rows, 5, 4)
            if layout == "last_offset":
                off = torch.cat([off, torch.tensor([ix.numel()])])
        ix = ix.to(index_dtype)
        g = torch.randn(5, dim, generator=gen)
        topt.zero_grad()
        (ref(ix, off) * g).sum().backward()
        topt.step()
        out = ours(ix, off)
        assert type(out.grad_fn).__name__ == "WeightBackwardBagBackward"
        (out * g).sum().backward()
        assert ours.weight.grad is None
    torch.testing.assert_close(ours.weight.detach(), ref.weight.detach(), rtol=1e-5, atol=1e-6)
    psw = torch.ones(ix.shape)                        # weights: the full route, as before
    assert type(ours(ix, off, per_sample_weights=psw if mode == "sum" else None).grad_fn
                ).__name__ in ("WeightBackwardBagBackward", "BagFunctionBackward")
    if mode == "sum":
        assert type(ours(ix, off, per_sample_weights=psw).grad_fn).__name__ == \
            "BagFunctionBackward"
    with torch.no_grad():                             # no gradient: the inference kernel
        assert ours(ix, off).grad_fn is None


def test_training_lookup_route_errors_as_torch():
    """Out-of-range IDs and malformed offsets on the lean route: torch's exception class and
    message, and the table untouched."""
    bag = pt.EmbeddingBag(10, 4, mode="sum", fused_optimizer=("sgd", {"lr": 0.1}))
    stock = torch.nn.EmbeddingBag(10, 4, mode="sum")
    before = bag.weight.detach().clone()
    for ix, off in ((torch.tensor([1, 10]), torch.tensor([0, 1])),
                    (torch.tensor([1, 2]), torch.tensor([0, 5])),
                    (torch.tensor([1, 2]), torch.tensor([1, 0]))):
        with pytest.raises(Exception) as theirs:
            stock(ix, off)
        with pytest.raises(type(theirs.value)) as mine:
            bag(ix, off).sum().backward()
        assert str(theirs.value).split("\n")[0][:40] in str(mine.value) or \
            isinstance(mine.value, IndexError), (mine.value, theirs.value)
    assert torch.equal(bag.weight.detach(), before)


def test_state_dict_round_trip_and_unfused():
    bag = pt.EmbeddingBag(20, 4, mode="sum", fused_optimizer=("adagrad", {"lr": 0.1}))
    ix, off = torch.tensor([1, 2, 1]), torch.tensor([0, 1])
    bag(ix, off).sum().backward()
    buf = io.BytesIO()
    torch.save(bag.state_dict(), buf)
    buf.seek(0)
    other = pt.EmbeddingBag(20, 4, mode="sum", fused_optimizer=("adagrad", {"lr": 0.1}))
    other.load_state_dict(torch.load(buf))
    assert torch.equal(other.momentum1, bag.momentum1) and torch.equal(other.weight, bag.weight)
    assert bag.momentum1[1].min() > 0 and bag.momentum1[0].max() == 0
    clone = copy.deepcopy(bag)           # the fused backward follows the copy, not the original
    before = bag.weight.detach().clone()
    clone(ix, off).sum().backward()
    assert torch.equal(bag.weight, before) and not torch.equal(clone.weight, before)
    bag.set_fused_optimizer(None)        # back to ordinary gradients
    bag(ix, off).sum().backward()
    assert bag.weight.grad is not None and "momentum1" not in bag.state_dict()


def test_bad_fused_optimizer():
    with pytest.raises(ValueError, match="nadam"):
        pt.EmbeddingBag(5, 2, fused_optimizer=("nadam", {"lr": 0.1}))
    with pytest.raises(ValueError, match="learning rate"):
        pt.EmbeddingBag(5, 2, fused_optimizer=("sgd", {}))
    with pytest.raises(ValueError, match="lr"):
        pt.EmbeddingBag(5, 2, fused_optimizer=("sgd", {"lr": float("nan")}))
    with pytest.raises(ValueError, match="momentum"):
        pt.EmbeddingBag(5, 2, fused_optimizer=("adagrad", {"lr": 0.1, "momentum": 0.9}))
    bag = pt.EmbeddingBag(5, 2, mode="sum", fused_optimizer=("sgd", {"lr": 0.1}))
    before = bag.weight.detach().clone()
    with pytest.raises(IndexError, match="not in the valid range"):
        bag(torch.tensor([1, 7]), torch.tensor([0])).sum().backward()
    assert torch.equal(bag.weight, before)


def test_collection_fused():
    tables = [pt.EmbeddingBagConfig(50, 8, name="t0", feature_names=["f0"]),
              pt.EmbeddingBagConfig(30, 4, name="t1", feature_names=["f1"])]
    ebc = pt.EmbeddingBagCollection(tables, fused_optimizer=("rowwise_adagrad", {"lr": 0.1}))
    kjt = pt.KeyedJaggedTensor(["f0", "f1"], torch.tensor([3, 4, 3, 7, 1, 2]),
                               lengths=torch.tensor([2, 1, 2, 1]))
    before = {k: v.clone() for k, v in ebc.state_dict().items()}
    ebc(kjt).values().sum().backward()
    sd = ebc.state_dict()
    assert set(sd) == {"embedding_bags.t0.weight", "embedding_bags.t0.momentum1",
                       "embedding_bags.t1.weight", "embedding_bags.t1.momentum1"}
    for name, rows_hit in (("t0", [3, 4]), ("t1", [1, 2, 7])):
        w, h = sd[f"embedding_bags.{name}.weight"], sd[f"embedding_bags.{name}.momentum1"]
        changed = torch.nonzero((w != before[f"embedding_bags.{name}.weight"]).any(1)).flatten()
        assert changed.tolist() == rows_hit
        assert torch.nonzero(h).flatten().tolist() == rows_hit
        assert ebc.embedding_bags[name].weight.grad is None


def test_collection_shared_table_updated_once_per_step():
    """A table read by two features gets one exact update from both features' rows (duplicates
    across the features summed first), like FBGEMM's fused TBE, not one update per feature."""
    rows, dim = 40, 6
    tables = [pt.EmbeddingBagConfig(rows, dim, name="t0", feature_names=["f0", "f1"]),
              pt.EmbeddingBagConfig(rows, 3, name="t1", feature_names=["f2"])]
    ebc = pt.EmbeddingBagCollection(tables, fused_optimizer=("rowwise_adagrad", {"lr": 0.5}))
    # B = 2: f0 bags [5, 9], [5]; f1 bags [9, 9, 1], []; f2 bags [2], [3]
    values = torch.tensor([5, 9, 5, 9, 9, 1, 2, 3])
    lengths = torch.tensor([2, 1, 3, 0, 1, 1])
    kjt = pt.KeyedJaggedTensor(["f0", "f1", "f2"], values, lengths=lengths)
    w0 = ebc.embedding_bags["t0"].weight.detach().numpy().copy()
    upstream = torch.randn(2, 2 * dim + 3, generator=torch.Generator().manual_seed(3))
    out = ebc(kjt).values()
    torch.testing.assert_close(out[:, :dim].sum(), torch.from_numpy(w0[[5, 9, 5]]).sum())
    (out * upstream).sum().backward()
    grad = torch.cat([upstream[:, :dim], upstream[:, dim:2 * dim]]).numpy()
    exp_w, exp_h, _, _ = reference.embedding_bag_backward_update(
        w0, np.array([5, 9, 5, 9, 9, 1]), np.array([0, 2, 3, 6]), grad_output=grad,
        optimizer="rowwise_adagrad", state=np.zeros(rows, np.float32), lr=0.5, eps=1e-8,
        weight_decay=0.0)
    np.testing.assert_allclose(ebc.embedding_bags["t0"].weight.detach().numpy(), exp_w,
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ebc.embedding_bags["t0"].momentum1.numpy(), exp_h, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# a small DLRM-style model: the fused run's loss tracks the unfused torch run's
# ---------------------------------------------------------------------------------------------

def _rowwise_adagrad(params, lr, eps):
    """The unfused row-wise Adagrad of examples/dlrm.py (coalesce the sparse gradient, then one
    update per row), for comparing with the fused kernel."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "examples" / "dlrm.py"
    if not path.exists():
        pytest.skip("examples/dlrm.py not found next to tests/")
    spec = importlib.util.spec_from_file_location("dlrm_example_optim", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.RowwiseAdagrad(params, lr=lr, eps=eps)


def _tiny_dlrm(fused, optimizer, seed=0):
    torch.manual_seed(seed)
    num_tables, rows, dim = 3, 200, 8
    if fused:
        opts = {"lr": 0.05, "eps": 1e-8}
        tables = [pt.EmbeddingBag(rows, dim, mode="sum", fused_optimizer=(optimizer, opts))
                  for _ in range(num_tables)]
    else:
        tables = [torch.nn.EmbeddingBag(rows, dim, mode="sum", sparse=True)
                  for _ in range(num_tables)]
    torch.manual_seed(seed + 1)
    init = [torch.randn(rows, dim) * 0.1 for _ in range(num_tables)]
    with torch.no_grad():
        for t, w in zip(tables, init):
            t.weight.copy_(w)
    mlp = torch.nn.Sequential(torch.nn.Linear(4 + num_tables * dim, 16), torch.nn.ReLU(),
                              torch.nn.Linear(16, 1))
    torch.manual_seed(seed + 2)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape) * 0.3)
    return torch.nn.ModuleList(tables), mlp


@pytest.mark.parametrize("optimizer", ["adagrad", "rowwise_adagrad"])
def test_dlrm_training_tracks_unfused_torch(optimizer):
    steps, batch, bag_len = 300, 32, 5
    data = torch.Generator().manual_seed(7)
    batches = []
    for _ in range(steps):
        dense = torch.randn(batch, 4, generator=data)
        hot = torch.randint(0, 20, (3, batch * bag_len), generator=data)   # skewed: duplicates
        cold = torch.randint(0, 200, (3, batch * bag_len), generator=data)
        ix = torch.where(torch.rand(3, batch * bag_len, generator=data) < 0.6, hot, cold)
        label = (dense[:, :1] + 0.1 * torch.randn(batch, 1, generator=data) > 0).float()
        batches.append((dense, ix, label))
    offsets = torch.arange(batch) * bag_len
    losses = {}
    for fused in (False, True):
        tables, mlp = _tiny_dlrm(fused, optimizer)
        dense_opt = torch.optim.SGD(mlp.parameters(), lr=0.05)
        sparse_opt = None
        if not fused:
            sparse_opt = (torch.optim.Adagrad(tables.parameters(), lr=0.05, eps=1e-8)
                          if optimizer == "adagrad" else
                          _rowwise_adagrad(tables.parameters(), lr=0.05, eps=1e-8))
        run = []
        for dense, ix, label in batches:
            emb = [t(ix[k], offsets) for k, t in enumerate(tables)]
            logit = mlp(torch.cat([dense] + emb, dim=1))
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, label)
            dense_opt.zero_grad()
            if sparse_opt is not None:
                sparse_opt.zero_grad()
            loss.backward()
            dense_opt.step()
            if sparse_opt is not None:
                sparse_opt.step()
            run.append(loss.item())
        losses[fused] = np.array(run)
    unfused, fused = losses[False], losses[True]
    assert unfused[-50:].mean() < unfused[:50].mean() * 0.9        # the model does learn
    np.testing.assert_allclose(fused, unfused, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_one_backward_steps_its_tables_in_one_call(monkeypatch, optimizer):
    """The tables a backward pass steps with one optimizer's options go to the native op in one
    call (a per-sample-weighted lookup, another optimizer's options: their own calls); every
    table ends as torch.optim leaves nn.EmbeddingBag(sparse=True)."""
    from perfkernels.torch import _fused
    calls = {"many": 0, "one": 0}
    many, one = _fused.fused_steps_op, _fused.fused_step_op

    def count_many(*args):
        calls["many"] += 1
        return many(*args)

    def count_one(*args):
        calls["one"] += 1
        return one(*args)
    monkeypatch.setattr(_fused, "fused_steps_op", count_many)
    monkeypatch.setattr(_fused, "fused_step_op", count_one)
    gen = torch.Generator().manual_seed(5)
    lr, eps = 0.05, 1e-10
    opts = {"lr": lr, "eps": eps} if optimizer == "adagrad" else {"lr": lr}
    shapes = [(30, 7, "sum"), (50, 16, "mean"), (20, 1, "sum"), (40, 9, "sum")]
    refs = [torch.nn.EmbeddingBag(r, d, mode=m, sparse=True) for r, d, m in shapes]
    ours = [pt.EmbeddingBag(r, d, mode=m, fused_optimizer=(optimizer, opts))
            for r, d, m in shapes]
    # the last table: the same optimizer at another learning rate (a call of its own)
    last_opts = dict(opts, lr=2 * lr)
    ours[-1].set_fused_optimizer((optimizer, last_opts))
    for r, o in zip(refs, ours):
        with torch.no_grad():
            o.weight.copy_(r.weight)
    make = torch.optim.SGD if optimizer == "sgd" else torch.optim.Adagrad
    extra = {} if optimizer == "sgd" else {"eps": eps}
    topts = [make(r.parameters(), lr=lr * (2 if k == len(refs) - 1 else 1), **extra)
             for k, r in enumerate(refs)]
    for step in range(3):
        batch = []
        for r, d, _ in shapes:
            ix, off = _bags(gen, r, 6, 5)
            batch.append((ix, off, torch.randn(6, d, generator=gen)))
        psw = torch.rand(batch[0][0].numel(), generator=gen)
        for t in topts:
            t.zero_grad()
        sum((r(ix, off, per_sample_weights=psw if k == 0 else None) * g).sum()
            for k, (r, (ix, off, g)) in enumerate(zip(refs, batch))).backward()
        for t in topts:
            t.step()
        sum((o(ix, off, per_sample_weights=psw if k == 0 else None) * g).sum()
            for k, (o, (ix, off, g)) in enumerate(zip(ours, batch))).backward()
    # per pass: tables 1 and 2 in one call; table 0 (weighted) and 3 (its lr) one each
    assert calls == {"many": 3, "one": 6}, calls
    for r, o in zip(refs, ours):
        torch.testing.assert_close(o.weight.detach(), r.weight.detach(), rtol=2e-5, atol=2e-6)


def test_table_used_twice_in_a_pass_steps_twice_in_order():
    """A fused Adam table read twice in one forward steps twice in that backward (the step
    count goes up by two), as two backward passes of the two reads would step it."""
    gen = torch.Generator().manual_seed(3)
    a = pt.EmbeddingBag(30, 8, mode="sum", fused_optimizer=("adam", {"lr": 0.05}))
    other = pt.EmbeddingBag(30, 8, mode="sum", fused_optimizer=("adam", {"lr": 0.05}))
    b = copy.deepcopy(a)
    other_b = copy.deepcopy(other)
    ix1, off1 = _bags(gen, 30, 4, 3)
    ix2, off2 = _bags(gen, 30, 4, 3)
    g1, g2 = torch.randn(4, 8, generator=gen), torch.randn(4, 8, generator=gen)
    ((a(ix1, off1) * g1).sum() + (other(ix1, off1) * g1).sum()
     + (a(ix2, off2) * g2).sum()).backward()
    # the same steps one pass each, in the order the engine reaches the reads (the later first)
    (b(ix2, off2) * g2).sum().backward()
    ((b(ix1, off1) * g1).sum() + (other_b(ix1, off1) * g1).sum()).backward()
    assert int(a.step) == 2 and int(other.step) == 1
    assert torch.equal(a.weight, b.weight) and torch.equal(a.momentum2, b.momentum2)
    assert torch.equal(other.weight, other_b.weight)


def test_backward_passes_on_two_threads_step_their_own_tables():
    """Two threads training their own fused tables at once: each pass steps its own tables (the
    steps queued per pass do not mix), as the same steps run one thread after the other."""
    import threading
    gen = torch.Generator().manual_seed(8)
    data = [[(*_bags(gen, 60, 5, 4), torch.randn(5, 6, generator=gen)) for _ in range(30)]
            for _ in range(2)]

    def make():
        torch.manual_seed(1)
        return [pt.EmbeddingBag(60, 6, mode="sum", fused_optimizer=("adagrad", {"lr": 0.1}))
                for _ in range(3)]

    def train(tables, batches):
        for ix, off, g in batches:
            sum((t(ix, off) * g).sum() for t in tables).backward()
    alone = [make(), make()]
    for tables, batches in zip(alone, data):
        train(tables, batches)
    together = [make(), make()]
    threads = [threading.Thread(target=train, args=(tables, batches))
               for tables, batches in zip(together, data)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    for a, b in zip(alone, together):
        for x, y in zip(a, b):
            assert torch.equal(x.weight, y.weight) and torch.equal(x.momentum1, y.momentum1)
