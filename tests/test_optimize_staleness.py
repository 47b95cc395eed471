"""optimize() after the model changes: a new head, a replaced table, a table's options edited,
hooks added, present or removed, train() / eval().  Each call must answer what the model's stock
forward answers with the same edits (the captured graph captured again, or the modules run),
and hooks run on real calls exactly as on the stock model."""
import copy
import warnings

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import perfkernels.torch as pkt  # noqa: E402
from perfkernels.torch import _optimize  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensor  # noqa: E402

IDS = torch.tensor([1, 2, 3, 4, 0, 7])
OFFSETS = torch.tensor([0, 2, 5])


class TwoTables(nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.a = nn.EmbeddingBag(20, 4, mode="sum")
        self.b = nn.EmbeddingBag(20, 4, mode="sum")
        self.top = nn.Linear(8, 1)
        self.scale = 1.0

    def forward(self, ids, offsets):
        return self.top(torch.cat([self.a(ids, offsets), self.b(ids, offsets)], 1)) * self.scale


def pair():
    """A stock model and its optimized copy (sharing the parameters), captured once."""
    stock = TwoTables()
    opt = pkt.optimize(stock)
    with torch.no_grad():
        torch.testing.assert_close(opt(IDS, OFFSETS), stock(IDS, OFFSETS), rtol=1e-6, atol=1e-6)
    assert _state(opt).ordered, "the first call captures"
    return stock, opt


def _state(opt):
    return opt.__dict__["_perfkernels_optimize"]


def same(stock, opt, ids=IDS, offsets=OFFSETS):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = stock(ids, offsets)
        got = opt(ids, offsets)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    return got


def test_a_new_head_is_used():
    stock, opt = pair()
    head = nn.Linear(8, 1)
    stock.top = head
    opt.top = head
    same(stock, opt)


def test_a_replaced_table_is_used():
    stock, opt = pair()
    table = nn.EmbeddingBag(20, 4, mode="mean")
    stock.a = table
    opt.a = table
    same(stock, opt)
    assert "a:" in str(pkt.last_optimize_report()) or "module tree" in str(
        pkt.last_optimize_report())


@pytest.mark.parametrize("attr,value", [("padding_idx", 2), ("mode", "mean"), ("mode", "max"),
                                        ("max_norm", 0.5), ("scale_grad_by_freq", True)])
def test_an_edited_table_option_is_used(attr, value):
    stock, opt = pair()
    for model in (stock, opt):
        setattr(model.a, attr, value)
    same(stock, opt)
    assert f"a.{attr}: changed" in str(pkt.last_optimize_report())


def test_include_last_offset_set_later():
    stock, opt = pair()
    for model in (stock, opt):
        model.a.include_last_offset = True
        model.b.include_last_offset = True
    same(stock, opt, offsets=torch.tensor([0, 2, 5, 6]))


def test_a_models_own_attribute_is_watched():
    stock, opt = pair()
    stock.scale = opt.scale = -3.0
    same(stock, opt)


@pytest.mark.parametrize("where", ["table", "head"])
def test_forward_hooks_run_on_real_calls(where):
    stock, opt = pair()
    seen = {"stock": [], "opt": []}

    def hook_of(name):
        def hook(module, inputs, output):
            seen[name].append(type(output))
            return output * 2
        return hook
    handles = [getattr(m, "a" if where == "table" else "top").register_forward_hook(hook_of(n))
               for n, m in (("stock", stock), ("opt", opt))]
    same(stock, opt)
    same(stock, opt)
    assert seen["opt"] == seen["stock"] == [torch.Tensor, torch.Tensor]
    for h in handles:
        h.remove()
    same(stock, opt)
    assert len(seen["opt"]) == 2
    # without the hook, the captured graph runs again (no capture is made while it is there)
    assert _state(opt).watch.hooked is False


def test_a_hook_present_at_capture_never_sees_a_fake_tensor():
    stock = TwoTables()
    seen = []
    stock.b.register_forward_hook(lambda m, i, o: seen.append(isinstance(o, FakeTensor)))
    opt = pkt.optimize(stock, (IDS, OFFSETS))      # captures now, if it can
    count = len(seen)
    with torch.no_grad():
        want = TwoTables.forward(stock, IDS, OFFSETS)
        got = opt(IDS, OFFSETS)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert seen and not any(seen)
    assert len(seen) == count + 2     # the stock call and the optimized one


def test_pre_hooks_backward_hooks_and_global_hooks_run():
    stock, opt = pair()
    calls = {"pre": 0, "backward": 0, "global": 0}

    def pre(module, inputs):
        calls["pre"] += 1
        return (inputs[0].flip(0), inputs[1])
    opt.a.register_forward_pre_hook(pre)
    stock.a.register_forward_pre_hook(pre)
    same(stock, opt)
    assert calls["pre"] == 2

    def backward(module, grad_in, grad_out):
        calls["backward"] += 1
    opt.top.register_full_backward_hook(backward)
    opt(IDS, OFFSETS).sum().backward()
    assert calls["backward"] == 1

    handle = nn.modules.module.register_module_forward_hook(
        lambda m, i, o: calls.__setitem__("global", calls["global"] + 1))
    try:
        with torch.no_grad():
            opt(IDS, OFFSETS)
    finally:
        handle.remove()
    assert calls["global"] == 4       # a, b, top and the model itself


def test_hooks_on_the_model_itself_keep_the_captured_graph():
    stock, opt = pair()
    seen = []
    opt.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    same(stock, opt)
    assert seen == [(3, 1)]
    assert not _state(opt).watch.hooked


def test_train_eval_flips_reuse_their_captures():
    stock, opt = pair()
    captured = len(pkt.last_optimize_report().captures)
    for _ in range(3):
        for model in (stock, opt):
            model.train()
        same(stock, opt)
        for model in (stock, opt):
            model.eval()
        same(stock, opt)
    # one more capture (train mode), then the two states' captures are found again
    assert len([c for c in pkt.last_optimize_report().captures[captured:]
                if c[1] == "captured"]) == 1


def test_a_submodules_training_flag_is_watched():
    class WithDropout(TwoTables):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.5)

        def forward(self, ids, offsets):
            return self.drop(super().forward(ids, offsets))
    stock = WithDropout().eval()
    opt = pkt.optimize(stock)
    same(stock, opt)
    opt.drop.train()          # the model stays in eval mode: only the dropout changes
    torch.manual_seed(1)
    with torch.no_grad():
        out = opt(IDS, OFFSETS)
    assert (out == 0).any() or (out.abs() > stock(IDS, OFFSETS).abs()).any()


def test_a_model_edited_at_every_call_ends_running_its_own_forward():
    stock, opt = pair()

    def edit(model, inputs):     # a hook on the model runs around the replaced forward
        model.scale = model.scale + 1.0
    for model in (stock, opt):
        model.register_forward_pre_hook(edit)
    for _ in range(_optimize.MAX_CHANGES + 3):
        same(stock, opt)
    assert _state(opt).eager
    assert "runs its own forward" in str(pkt.last_optimize_report())


def test_replaced_parameter_and_loaded_state_are_read():
    stock, opt = pair()
    new = nn.Parameter(torch.randn(20, 4))
    stock.a.weight = new
    opt.a.weight = new
    same(stock, opt)
    other = TwoTables(seed=5)
    stock.load_state_dict(other.state_dict())
    opt.load_state_dict(other.state_dict())
    same(stock, opt)


@pytest.mark.parametrize("kind", ["bag", "embedding"])
def test_sparse_tables_keep_coo_gradients(kind):
    """A lookup the capture leaves unfused runs the registered op, whose gradient is dense: with
    sparse=True, calls that record a gradient run the modules, as stock (COO gradient)."""
    torch.manual_seed(0)
    stock = (nn.EmbeddingBag(20, 4, mode="sum", sparse=True) if kind == "bag"
             else nn.Embedding(20, 4, sparse=True))
    opt = pkt.optimize(copy.deepcopy(stock))
    ids = torch.tensor([[1, 2, 2], [0, 5, 7]])
    with torch.no_grad():
        torch.testing.assert_close(opt(ids), stock(ids))
    for model in (stock, opt):
        model.weight.grad = None
        model(ids).pow(2).sum().backward()
    assert opt.weight.grad.layout == stock.weight.grad.layout == torch.sparse_coo
    torch.testing.assert_close(opt.weight.grad.to_dense(), stock.weight.grad.to_dense())


def test_a_model_captured_without_grad_then_trained_gets_gradients():
    """A capture made under no_grad holds lookups that record no gradient: a training call is a
    signature of its own (and a table unfrozen since its capture runs the modules)."""
    ids = torch.tensor([[1, 2, 2], [0, 5, 7]])

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.EmbeddingBag(20, 4, mode="sum"), nn.Linear(4, 1))
    stock = make()
    opt = pkt.optimize(make())
    with torch.no_grad():
        torch.testing.assert_close(opt(ids), stock(ids))
    for model in (stock, opt):
        model(ids).pow(2).sum().backward()
    for p, w in zip(opt.parameters(), stock.parameters()):
        assert p.grad is not None
        torch.testing.assert_close(p.grad, w.grad)
    # frozen table at the capture (grad on), unfrozen later
    stock = make()
    opt = pkt.optimize(make())
    for model in (stock, opt):
        model[0].weight.requires_grad_(False)
        model(ids).sum().backward()
        model[0].weight.requires_grad_(True)
        model.zero_grad()
        model(ids).pow(2).sum().backward()
    assert opt[0].weight.grad is not None
    torch.testing.assert_close(opt[0].weight.grad, stock[0].weight.grad)


def test_an_index_the_captured_lookup_refuses_raises_the_modules_error():
    """An op of the captured graph refusing an index raises RuntimeError; the module raises
    torch's IndexError: the model's own forward answers (raises) instead."""
    torch.manual_seed(0)
    stock = nn.Embedding(12, 4)
    converted = pkt.convert(copy.deepcopy(stock), bits=8)
    opt = pkt.optimize(copy.deepcopy(stock), bits=8)
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with torch.no_grad():
        opt(ids)
        bad = torch.tensor([[1, 2, 3], [4, 12, 6]])
        with pytest.raises(IndexError):
            stock(bad)
        with pytest.raises(IndexError) as want:
            converted(bad)
        with pytest.raises(IndexError, match=str(want.value)):
            opt(bad)
