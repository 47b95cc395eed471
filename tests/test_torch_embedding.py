"""perfkernels.torch.Embedding and the functional embedding against torch.nn.Embedding /
torch.nn.functional.embedding: results, exceptions, gradients, state_dict, convert(),
route_functional(), torch.compile / torch.export and the fused optimizers."""
import copy
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import perfkernels.torch as pkt  # noqa: E402
from perfkernels import reference  # noqa: E402

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SHAPES = ((), (0,), (7,), (3, 5), (2, 3, 4), (0, 4))


def same(a, b):
    """Equal dtype, shape and bits (NaN payloads included)."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    if a.dtype.is_floating_point:
        a, b = a.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]), \
            b.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[b.element_size()])
    assert torch.equal(a, b)


def pair(rows, dim, **kw):
    """A torch Embedding and ours with the same weight (values; separate Parameters)."""
    torch.manual_seed(0)
    ref = torch.nn.Embedding(rows, dim, **kw)
    ours = pkt.Embedding(rows, dim, placement="keep", **kw)
    with torch.no_grad():
        ours.weight.copy_(ref.weight)
    return ref, ours


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dim", [1, 7, 16, 64, 65, 128])
def test_forward_matches_torch(isa, dtype, dim):
    ref, ours = pair(50, dim, padding_idx=3, dtype=dtype)
    gen = torch.Generator().manual_seed(dim)
    for shape in SHAPES:
        for idt in (torch.int64, torch.int32):
            x = torch.randint(0, 50, shape, generator=gen, dtype=idt)
            with torch.no_grad():
                same(ours(x), ref(x))
            same(ours(x).detach(), ref(x).detach())              # with autograd
            same(pkt.embedding(x, ours.weight.detach()), F.embedding(x, ref.weight.detach()))


def test_non_contiguous_and_sliced():
    ref, ours = pair(40, 12)
    x = torch.randint(0, 40, (6, 5)).t()                       # non-contiguous indices
    same(ours(x), ref(x))
    w = torch.randn(40, 20)
    for wt in (w[:, 3:15], w.t().contiguous().t(), w[::2]):
        same(pkt.embedding(x % wt.shape[0], wt), F.embedding(x % wt.shape[0], wt))


def _outcome(fn):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return "ok", fn()
    except Exception as exc:   # noqa: BLE001 - the class and message are what is compared
        return type(exc), str(exc)


BAD_INPUTS = [
    ("index == rows", lambda: torch.tensor([1, 10])),
    ("negative index", lambda: torch.tensor([[1], [-1]])),
    ("huge index", lambda: torch.tensor([2**40])),
    ("int32 bad", lambda: torch.tensor([11], dtype=torch.int32)),
    ("float indices", lambda: torch.tensor([1.0])),
    ("int16 indices", lambda: torch.tensor([1], dtype=torch.int16)),
    ("uint8 indices", lambda: torch.tensor([1], dtype=torch.uint8)),
    ("bool indices", lambda: torch.tensor([True])),
    ("list", lambda: [1, 2]),
    ("None", lambda: None),
]


@pytest.mark.parametrize("name,make", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
@pytest.mark.parametrize("grad", [False, True])
def test_bad_input_same_exception(name, make, grad):
    ref, ours = pair(10, 4)
    with torch.set_grad_enabled(grad):
        got, want = _outcome(lambda: ours(make())), _outcome(lambda: ref(make()))
        assert got[0] == want[0] and (got[0] == "ok" or got[1] == want[1]), (got, want)
        fw = ref.weight.detach()
        got = _outcome(lambda: pkt.embedding(make(), fw))
        want = _outcome(lambda: F.embedding(make(), fw))
        assert got[0] == want[0] and (got[0] == "ok" or got[1] == want[1]), (got, want)


def test_bad_index_writes_nothing_and_no_grad_step():
    ref, ours = pair(10, 4)
    before = ours.weight.detach().clone()
    with pytest.raises(IndexError, match="index out of range in self"):
        ours(torch.tensor([0, 1, 2, 99]))
    same(ours.weight.detach(), before)


@pytest.mark.parametrize("pad", [None, 0, 5, -1, 10, -11, 2.5])
def test_padding_idx_arguments(pad):
    w = torch.randn(10, 3)
    x = torch.tensor([0, 5, 9])
    got = _outcome(lambda: pkt.embedding(x, w, padding_idx=pad))
    want = _outcome(lambda: F.embedding(x, w, padding_idx=pad))
    assert got[0] == want[0] and (got[0] == "ok" or got[1] == want[1]), (got, want)
    got = _outcome(lambda: pkt.Embedding(10, 3, padding_idx=pad))
    want = _outcome(lambda: torch.nn.Embedding(10, 3, padding_idx=pad))
    assert got[0] == want[0] and (got[0] == "ok" or got[1] == want[1]), (got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("pad", [None, 2])
def test_gradients_match_torch(dtype, sparse, pad):
    ref, ours = pair(30, 9, padding_idx=pad, sparse=sparse, dtype=dtype)
    x = torch.tensor([[2, 5, 5, 29], [0, 2, 7, 5]])
    g = torch.randn(2, 4, 9).to(dtype)
    ref(x).backward(g)
    ours(x).backward(g)
    assert ours.weight.grad.is_sparse == sparse
    if sparse:
        same(ours.weight.grad._indices(), ref.weight.grad._indices())
        same(ours.weight.grad._values(), ref.weight.grad._values())
        dense = ours.weight.grad.to_dense()
    else:
        same(ours.weight.grad, ref.weight.grad)
        dense = ours.weight.grad
    # independently: the gradient of row r is the sum of g at the positions of r, none for pad
    want = np.zeros((30, 9))
    for pos, r in enumerate(x.reshape(-1).tolist()):
        if r != pad:
            want[r] += g.reshape(-1, 9)[pos].double().numpy()
    np.testing.assert_allclose(dense.double().numpy(), want, rtol=1e-2 if dtype != torch.float32
                               else 1e-6, atol=1e-2 if dtype != torch.float32 else 1e-6)
    if pad is not None:
        assert (dense[pad] == 0).all()


def test_functional_gradient_and_sparse_optimizer():
    w_ref = torch.randn(20, 6, requires_grad=True)
    w_ours = w_ref.detach().clone().requires_grad_()
    x = torch.randint(0, 20, (5, 7))
    F.embedding(x, w_ref, sparse=True).square().sum().backward()
    pkt.embedding(x, w_ours, sparse=True).square().sum().backward()
    same(w_ours.grad._values(), w_ref.grad._values())
    opt_r, opt_o = torch.optim.SparseAdam([w_ref]), torch.optim.SparseAdam([w_ours])
    opt_r.step()
    opt_o.step()
    same(w_ours.detach(), w_ref.detach())


def test_module_api_state_dict_from_pretrained():
    ref, ours = pair(12, 5, padding_idx=1)
    assert isinstance(ours, torch.nn.Embedding)
    assert repr(ours) == repr(ref).replace("Embedding", "Embedding", 1)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    back = torch.nn.Embedding(12, 5, padding_idx=1)
    back.load_state_dict(ours.state_dict())
    same(back.weight.detach(), ref.weight.detach())
    w = torch.randn(8, 3)
    for kw in ({}, {"freeze": False}, {"padding_idx": 2}, {"sparse": True}):
        a = torch.nn.Embedding.from_pretrained(w, **kw)
        b = pkt.Embedding.from_pretrained(w, **kw)
        assert type(b) is pkt.Embedding
        assert (a.weight.requires_grad, a.padding_idx, a.sparse) == \
            (b.weight.requires_grad, b.padding_idx, b.sparse)
        x = torch.tensor([[1, 2], [7, 0]])
        same(b(x).detach(), a(x).detach())
    copy.deepcopy(ours)(torch.tensor([1]))
    import pickle
    pickle.loads(pickle.dumps(ours))(torch.tensor([1]))


@pytest.mark.parametrize("opt", ["max_norm", "scale_grad_by_freq"])
def test_torch_options_fall_back_with_warning(opt):
    kw = {"max_norm": 1.0} if opt == "max_norm" else {"scale_grad_by_freq": True}
    ref, ours = pair(10, 4, **kw)
    x = torch.tensor([1, 1, 3])
    from perfkernels.torch import _fallback
    _fallback._warned.clear()
    with pytest.warns(RuntimeWarning, match=opt):
        out = ours(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours(x)                                    # once only
    out_ref = ref(x)
    same(out.detach(), out_ref.detach())
    same(ours.weight.detach(), ref.weight.detach())   # max_norm renormalised both tables
    out.sum().backward()
    out_ref.sum().backward()
    same(ours.weight.grad, ref.weight.grad)


def test_other_dtype_and_meta_device():
    ref, ours = pair(10, 4, dtype=torch.float64)
    x = torch.tensor([1, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        same(ours(x), ref(x))
    meta = pkt.Embedding(10, 4, device="meta")
    assert meta(x.to("meta")).device.type == "meta"


def test_convert_and_route_functional():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.items = torch.nn.Embedding(100, 8, padding_idx=0)
            self.pos = torch.nn.Embedding(10, 8)
            self.renorm = torch.nn.Embedding(10, 8, max_norm=1.0)
            self.bag = torch.nn.EmbeddingBag(10, 8)

        def forward(self, x):
            return self.items(x) + self.pos(torch.arange(x.shape[1]))

    m = Model()
    c = pkt.convert(m)
    assert type(c.items) is pkt.Embedding and type(c.pos) is pkt.Embedding
    assert type(c.renorm) is torch.nn.Embedding and type(c.bag) is pkt.EmbeddingBag
    assert c.items.weight is m.items.weight
    x = torch.randint(0, 100, (4, 10))
    same(c(x), m(x))
    reasons = {n: why for n, _, why in pkt.last_report().skipped}
    assert "max_norm" in reasons["renorm"]
    orig = F.embedding
    with pkt.route_functional():
        assert F.embedding is pkt.embedding
        w = torch.randn(5, 3)
        same(F.embedding(torch.tensor([4, 0]), w), orig(torch.tensor([4, 0]), w))
    assert F.embedding is orig


def test_compile_and_export():
    ref, ours = pair(50, 16, padding_idx=0)
    x = torch.randint(0, 50, (4, 6))
    compiled = torch.compile(ours, fullgraph=True, backend="eager")
    same(compiled(x).detach(), ref(x).detach())
    compiled(x).sum().backward()
    ref(x).sum().backward()
    same(ours.weight.grad, ref.weight.grad)
    ep = torch.export.export(ours, (x,))
    same(ep.module()(x).detach(), ref(x).detach())
    assert "perfkernels.embedding" in str(ep.graph)
    torch.library.opcheck(torch.ops.perfkernels.embedding.default, (ours.weight, x, 0))


@pytest.mark.parametrize("name", ["sgd", "adagrad", "rowwise_adagrad"])
def test_fused_optimizer(name):
    rows, dim = 40, 8
    torch.manual_seed(1)
    w0 = torch.randn(rows, dim)
    ours = pkt.Embedding.from_pretrained(w0.clone(), freeze=False, padding_idx=3)
    ours.set_fused_optimizer((name, {"lr": 0.1, "eps": 1e-8}))
    x = torch.tensor([[1, 3, 5, 1], [7, 7, 7, 39]])
    g = torch.randn(2, 4, dim)
    ours(x).backward(g)
    assert ours.weight.grad is None
    # the float64 reference of the same update, each index a bag of one
    state0 = None if name == "sgd" else np.zeros((rows, dim) if name == "adagrad" else rows,
                                                  np.float32)
    want = reference.embedding_bag_backward_update(
        w0.numpy(), x.reshape(-1, 1).numpy(), None, state=state0,
        grad_output=g.reshape(-1, dim).numpy(), optimizer=name, lr=0.1, eps=1e-8,
        padding_idx=3)
    reference.assert_update_close(ours.weight.detach().numpy(),
                                  None if state0 is None else ours.momentum1.numpy(),
                                  w0.numpy(), state0, want, optimizer=name, lr=0.1, eps=1e-8,
                                  weight_decay=0.0)
    assert torch.equal(ours.weight.detach()[3], w0[3])          # padding row untouched
    if name == "adagrad":   # and torch's own sparse Adagrad agrees
        t = torch.nn.Embedding.from_pretrained(w0.clone(), freeze=False, padding_idx=3,
                                               sparse=True)
        opt = torch.optim.Adagrad(t.parameters(), lr=0.1, eps=1e-8)
        t(x).backward(g)
        opt.step()
        torch.testing.assert_close(ours.weight.detach(), t.weight.detach(), rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize("name, options", [
    ("adam", {}), ("adamw", {"weight_decay": 0.1}), ("rowwise_adam", {}),
    ("sgd", {"momentum": 0.9}), ("sgd", {"momentum": 0.9, "nesterov": True})])
def test_fused_adam_family_and_momentum(name, options):
    """The Adam family and momentum on an unpooled table, each index a bag of one: three steps
    against the float64 reference (and adam against torch's SparseAdam); the step count and
    both moments are the module's buffers."""
    rows, dim = 40, 8
    torch.manual_seed(2)
    w0 = torch.randn(rows, dim)
    ours = pkt.Embedding.from_pretrained(w0.clone(), freeze=False, padding_idx=3)
    ours.set_fused_optimizer((name, {"lr": 0.05, **options}))
    t = torch.nn.Embedding.from_pretrained(w0.clone(), freeze=False, padding_idx=3, sparse=True)
    sparse_adam = torch.optim.SparseAdam(t.parameters(), lr=0.05)
    w = w0.numpy().astype(np.float64)
    if name == "sgd":
        state = np.zeros((rows, dim))
    else:
        state = (np.zeros((rows, dim)), np.zeros(rows if name == "rowwise_adam" else (rows, dim)))
    for step in range(1, 4):
        x = torch.randint(0, rows, (3, 5))
        x[0, 0] = 3
        g = torch.randn(3, 5, dim)
        ours(x).backward(g)
        assert ours.weight.grad is None
        kw = dict(options) if name == "sgd" else dict(options, step=step)
        r = reference.embedding_bag_backward_adam(
            w, x.reshape(-1, 1).numpy(), None, grad_output=g.reshape(-1, dim).numpy(),
            optimizer=name, state=state, lr=0.05, eps=1e-8, padding_idx=3, **kw)
        w, state = r.weight, (r.state[0] if name == "sgd" else r.state)
        np.testing.assert_allclose(ours.weight.detach().numpy(), w, rtol=1e-5, atol=1e-5)
        if name == "adam":
            t(x).backward(g)
            sparse_adam.step()
            sparse_adam.zero_grad()
            torch.testing.assert_close(ours.weight.detach(), t.weight.detach(), rtol=1e-5,
                                       atol=1e-5)
    if name != "sgd":
        assert int(ours.step) == 3
    np.testing.assert_allclose(ours.momentum1.numpy(), state if name == "sgd" else state[0],
                               rtol=1e-5, atol=1e-6)


def test_threads_and_large_calls_match():
    ref, ours = pair(100_000, 64)
    x = torch.randint(0, 100_000, (256, 50))
    with torch.no_grad():
        same(ours(x), ref(x))
    import perfkernels as pk
    with pk.use_isa("scalar"), torch.no_grad():
        same(ours(x), ref(x))


@pytest.mark.parametrize("cls", [pkt.Embedding, pkt.EmbeddingBag])
def test_fused_optimizer_refuses_a_table_torch_would_look_up(cls):
    """A float64 table runs torch's lookup, whose backward returns a gradient: a fused optimizer
    there would never step, so it is refused when set."""
    with pytest.raises(TypeError, match="float32, float16 or bfloat16 tables; this table is "
                                        "torch.float64"):
        cls(10, 4, dtype=torch.float64, fused_optimizer=("sgd", {"lr": 0.1}))
    m = cls(10, 4)
    m.double()
    with pytest.raises(TypeError, match="torch.float64"):
        m.set_fused_optimizer(("adam", {"lr": 0.1}))


def _has_tensor_views():
    from perfkernels.torch import _tensor_bags
    return _tensor_bags.has_tensor_views()


@pytest.mark.skipif(not _has_tensor_views(),
                    reason="this torch has no DLPack C exchange API: the C path answers None")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
def test_c_fast_path_takes_plain_lookups_only(isa, dtype, index_dtype):
    """The module's C path (no NumPy view, no Python checks) answers plain lookups without a
    gradient, bit for bit as torch, and None for everything else: the full path then gives
    torch's answer (tested above); the module's result is the same either way."""
    from perfkernels.torch import _tensor_bags
    ref, ours = pair(300, 9, dtype=dtype, padding_idx=3)
    fast = _tensor_bags.embedding_module_lookup
    with torch.no_grad():
        for shape in ((0,), (1,), (7,), (3, 5), (256, 50)):
            ix = torch.randint(0, 300, shape, dtype=index_dtype)
            got = fast(ours, ix)
            assert got is not None, shape
            same(got, F.embedding(ix, ref.weight))
            same(ours(ix), got)
        ix = torch.randint(0, 300, (2, 3, 4), dtype=index_dtype)
        refused = {
            "3-D input": (ours, ix),
            "strided input": (ours, torch.arange(20, dtype=index_dtype)[::2]),
            "float input": (ours, ix.float()),
            "bad index": (ours, torch.tensor([0, 300], dtype=index_dtype)),
            "negative index": (ours, torch.tensor([-1], dtype=index_dtype)),
        }
        for name, (module, arg) in refused.items():
            assert fast(module, arg) is None, name
        same(ours(ix), F.embedding(ix, ref.weight))     # the full path's answer
        with pytest.raises(IndexError, match="index out of range in self"):
            ours(torch.tensor([0, 300], dtype=index_dtype))
    # with a gradient to record the full path runs (autograd)
    ix = torch.randint(0, 300, (4, 5), dtype=index_dtype)
    assert fast(ours, ix) is None
    assert ours(ix).requires_grad
    max_norm = pkt.Embedding(10, 4, max_norm=1.0)
    with torch.no_grad():
        assert fast(max_norm, torch.tensor([1])) is None


def test_c_fast_path_leaves_function_modes_and_the_profiler_to_the_full_path():
    from torch.overrides import TorchFunctionMode

    from perfkernels.torch import _tensor_bags
    _, ours = pair(50, 8)
    ix = torch.tensor([[1, 2], [3, 4]])
    seen = []

    class Spy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with torch.no_grad():
        with Spy():
            assert _tensor_bags.embedding_module_lookup(ours, ix) is None
            ours(ix)
        assert seen
        with torch.profiler.profile():
            assert _tensor_bags.embedding_module_lookup(ours, ix) is None
