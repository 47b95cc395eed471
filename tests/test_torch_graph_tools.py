"""Converted modules under PyTorch's graph tools and function transforms, against torch's own
modules under the same tool, on inputs the tool did not see: ``torch.jit.trace`` (with its
trace check, and through ``jit.save`` / ``jit.load``), ``torch.jit.script``,
``torch.fx.symbolic_trace``, ``torch.func`` (``grad``, ``vmap``, ``jacfwd``, ``jacrev``),
forward-mode AD and ``torch.compile`` with a sparse gradient.  Each tool either works as on
torch's modules or raises the exception class torch raises there."""
import copy
import io
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.autograd.forward_ad as fwAD  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.func import functional_call, grad, jacfwd, jacrev, vmap  # noqa: E402

import perfkernels.torch as pkt  # noqa: E402

TORCH_EMBEDDING_BAG = F.embedding_bag       # torch's own, taken before any routing
TORCH_EMBEDDING = F.embedding
ROWS, DIM = 100, 4
TRACE_INPUT = torch.tensor([[1, 2, 3]])
NEW_INPUTS = [torch.tensor([[7, 8, 9]]), torch.tensor([[0, 99, 5], [42, 42, 1]])]


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # torch.jit's deprecation and trace warnings
        yield


def _model(kind, **options):
    torch.manual_seed(0)
    if kind == "embedding":
        table = nn.Embedding(ROWS, DIM, **options)
    else:
        table = nn.EmbeddingBag(ROWS, DIM, mode="sum", **options)
    return nn.Sequential(table, nn.Linear(DIM, 1))


def _pair(kind, convert_kwargs=None, **options):
    """torch's model and its conversion (a deep copy: the two never share a table)."""
    model = _model(kind, **options)
    return model, pkt.convert(copy.deepcopy(model), **(convert_kwargs or {}))


def _reload(traced):
    buf = io.BytesIO()
    torch.jit.save(traced, buf)
    buf.seek(0)
    return torch.jit.load(buf)


def _tolerance(convert_kwargs):
    return dict(rtol=0, atol=0.05) if convert_kwargs else dict(rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- torch.jit.trace

@pytest.mark.parametrize("convert_kwargs", [{}, {"bits": 8}, {"dtype": torch.float16}],
                         ids=["float", "bits8", "float16"])
@pytest.mark.parametrize("grad_mode", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("kind", ["embedding", "bag"])
def test_jit_trace_records_the_op_not_a_constant(kind, grad_mode, convert_kwargs):
    """The trace (with torch's trace check on) answers new inputs as torch's module does, after
    jit.save / jit.load too; its graph calls an op, it holds no result as a constant."""
    model, conv = _pair(kind, convert_kwargs)
    with torch.set_grad_enabled(grad_mode):
        traced = torch.jit.trace(conv, (TRACE_INPUT,))
    reloaded = _reload(traced)
    tol = _tolerance(convert_kwargs)
    for x in NEW_INPUTS:
        want = model(x)
        torch.testing.assert_close(traced(x), want, **tol)
        torch.testing.assert_close(reloaded(x), want, **tol)
    graph = str(traced.inlined_graph)
    assert "perfkernels::" in graph or "aten::embedding" in graph
    assert "prim::PythonOp" not in graph


@pytest.mark.parametrize("kind", ["embedding", "bag"])
def test_jit_trace_with_grad_trains_as_torch(kind):
    """A trace recorded with gradients on gives torch's gradient on new inputs."""
    model, conv = _pair(kind)
    traced = torch.jit.trace(conv, (TRACE_INPUT,))
    x = NEW_INPUTS[1]
    traced(x).sum().backward()
    model(x).sum().backward()
    torch.testing.assert_close(conv[0].weight.grad, model[0].weight.grad)


@pytest.mark.parametrize("kind", ["embedding", "bag"])
def test_jit_trace_of_frozen_tables_records_the_inference_ops(kind):
    model, conv = _pair(kind)
    conv.requires_grad_(False)
    traced = torch.jit.trace(conv, (TRACE_INPUT,))
    assert "_inference(" in str(traced.inlined_graph)
    for x in NEW_INPUTS:
        torch.testing.assert_close(traced(x), model(x))


@pytest.mark.parametrize("kind", ["embedding", "bag"])
def test_jit_trace_keeps_a_sparse_gradient(kind):
    model, conv = _pair(kind, sparse=True)
    traced = torch.jit.trace(conv, (TRACE_INPUT,))
    x = NEW_INPUTS[1]
    traced(x).sum().backward()
    model(x).sum().backward()
    got, want = conv[0].weight.grad, model[0].weight.grad
    assert got.layout == want.layout == torch.sparse_coo
    torch.testing.assert_close(got.to_dense(), want.to_dense())


@pytest.mark.parametrize("convert_kwargs", [{}, {"bits": 8}])
def test_jit_trace_of_2d_input_warns_nothing_and_refuses_zero_columns(convert_kwargs):
    """Tracing a bag with 2-D input records no Python decision about its shape (torch's trace
    has no TracerWarning either), and the trace refuses 2-D input with no columns as torch's
    trace does (RuntimeError)."""
    bag = nn.EmbeddingBag(ROWS, DIM, mode="sum")
    conv = pkt.convert(nn.Sequential(copy.deepcopy(bag)), **convert_kwargs)[0]
    x, empty = torch.tensor([[1, 2], [3, 4]]), torch.empty(2, 0, dtype=torch.long)
    for model in (bag, conv):
        with warnings.catch_warnings():
            warnings.simplefilter("error", torch.jit.TracerWarning)
            traced = torch.jit.trace(model, (x,))
        torch.testing.assert_close(traced(torch.tensor([[5, 6, 7]])),
                                   model(torch.tensor([[5, 6, 7]])))
        with pytest.raises(RuntimeError):
            traced(empty)


def test_jit_trace_of_the_routed_functionals():
    """route_functional: F.embedding_bag / F.embedding under jit.trace record an op too."""
    weight = torch.randn(ROWS, DIM)
    with pkt.route_functional():
        bag = torch.jit.trace(lambda x: F.embedding_bag(x, weight, mode="sum"), (TRACE_INPUT,))
        rows = torch.jit.trace(lambda x: F.embedding(x, weight), (TRACE_INPUT,))
    for x in NEW_INPUTS:
        torch.testing.assert_close(bag(x), TORCH_EMBEDDING_BAG(x, weight, mode="sum"))
        torch.testing.assert_close(rows(x), TORCH_EMBEDDING(x, weight))


@pytest.mark.parametrize("grad_mode", [False, True], ids=["no_grad", "grad"])
def test_jit_trace_of_an_optimized_model(grad_mode):
    """optimize()'s fused lookups and interaction under jit.trace: the fused op is recorded,
    and the trace answers new inputs as the stock model does."""
    from dlrm_models import dlrm_inputs, dlrm_net
    rows = [10, 200, 3, 57, 1000]
    stock = dlrm_net(rows, 4, [6, 9, 4], [7, 1], "dot", False, seed=0).eval()
    example = dlrm_inputs(rows, 4, 6, bag=2, seed=1)
    opt = pkt.optimize(copy.deepcopy(stock), example)
    with torch.set_grad_enabled(grad_mode):
        traced = torch.jit.trace(opt, example)
    assert "perfkernels::embedding_bags_interaction" in str(traced.inlined_graph)
    for seed in (7, 8):
        new = dlrm_inputs(rows, 4, 6, bag=2, seed=seed)
        torch.testing.assert_close(traced(*new), stock(*new), rtol=1e-5, atol=1e-5)


class _CollectionModel(nn.Module):
    """An EmbeddingBagCollection fed a KeyedJaggedTensor built from two tensors."""

    KEYS = ["f0", "f1", "f2"]

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.ebc = pkt.EmbeddingBagCollection(tables=[
            pkt.EmbeddingBagConfig(name="t0", embedding_dim=4, num_embeddings=50,
                                   feature_names=["f0", "f1"]),
            pkt.EmbeddingBagConfig(name="t1", embedding_dim=3, num_embeddings=20,
                                   feature_names=["f2"])])

    def forward(self, values, lengths):
        kjt = pkt.KeyedJaggedTensor.from_lengths_sync(keys=self.KEYS, values=values,
                                                      lengths=lengths)
        return self.ebc(kjt).values()

    def reference(self, values, lengths):
        """torch's F.embedding_bag, feature by feature (batch 2)."""
        bags = self.ebc.embedding_bags
        tables = [bags["t0"].weight, bags["t0"].weight, bags["t1"].weight]
        starts = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        out = []
        for f, weight in enumerate(tables):
            lo, hi = int(starts[2 * f]), int(starts[2 * f + 2])
            out.append(TORCH_EMBEDDING_BAG(values[lo:hi], weight, starts[2 * f:2 * f + 2] - lo,
                                           mode="sum"))
        return torch.cat(out, dim=1)


def _kjt_input(seed):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (6,), generator=gen)
    return torch.randint(0, 20, (int(lengths.sum()),), generator=gen), lengths


@pytest.mark.parametrize("grad_mode", [False, True], ids=["no_grad", "grad"])
def test_jit_trace_of_a_collection(grad_mode):
    model = _CollectionModel()
    with torch.set_grad_enabled(grad_mode):
        traced = torch.jit.trace(model, _kjt_input(1))
    assert "perfkernels::embedding_bag_collection" in str(traced.inlined_graph)
    for seed in (5, 6):
        x = _kjt_input(seed)
        torch.testing.assert_close(traced(*x), model.reference(*x))


# --------------------------------------------------------------------------- torch.jit.script

@pytest.mark.parametrize("convert_kwargs", [{}, {"bits": 8}, {"dtype": torch.float16}],
                         ids=["float", "bits8", "float16"])
@pytest.mark.parametrize("kind", ["embedding", "bag"])
def test_jit_script(kind, convert_kwargs):
    """The scripted model answers new inputs as torch's model, after jit.save / jit.load too,
    and the converted model itself is left as it was (still ours, still the same table)."""
    model, conv = _pair(kind, convert_kwargs)
    table = conv[0]
    scripted = torch.jit.script(conv)
    reloaded = _reload(scripted)
    tol = _tolerance(convert_kwargs)
    for x in NEW_INPUTS:
        want = model(x)
        torch.testing.assert_close(scripted(x), want, **tol)
        torch.testing.assert_close(reloaded(x), want, **tol)
    assert conv[0] is table


def test_jit_script_of_a_bag_with_offsets_and_weights():
    torch.manual_seed(1)
    model = nn.EmbeddingBag(ROWS, DIM, mode="sum", padding_idx=3)
    conv = pkt.convert(copy.deepcopy(model))
    scripted = torch.jit.script(conv)
    ix, off, psw = torch.tensor([3, 5, 9, 3, 11]), torch.tensor([0, 2]), torch.rand(5)
    torch.testing.assert_close(scripted(ix, off, psw), model(ix, off, psw))


@pytest.mark.parametrize("cls", [pkt.EmbeddingBag, pkt.Embedding])
def test_jit_script_refuses_a_fused_optimizer(cls):
    conv = cls(ROWS, DIM, fused_optimizer=("sgd", {"lr": 0.1}))
    with pytest.raises(RuntimeError, match="fused optimizer"):
        torch.jit.script(conv)


# --------------------------------------------------------------------------- torch.fx

@pytest.mark.parametrize("convert_kwargs", [{}, {"bits": 8}, {"dtype": torch.float16}],
                         ids=["float", "bits8", "float16"])
@pytest.mark.parametrize("kind", ["embedding", "bag"])
def test_fx_symbolic_trace(kind, convert_kwargs):
    model, conv = _pair(kind, convert_kwargs)
    graph_module = torch.fx.symbolic_trace(conv)
    tol = _tolerance(convert_kwargs)
    for x in NEW_INPUTS:
        torch.testing.assert_close(graph_module(x), model(x), **tol)


def test_fx_symbolic_trace_of_a_lone_bag_trains_as_torch():
    torch.manual_seed(2)
    model = nn.EmbeddingBag(ROWS, DIM, mode="mean")
    conv = pkt.convert(copy.deepcopy(model))
    graph_module = torch.fx.symbolic_trace(conv)
    ix, off = torch.tensor([4, 5, 6, 7, 8]), torch.tensor([0, 3])
    graph_module(ix, off).pow(2).sum().backward()
    model(ix, off).pow(2).sum().backward()
    torch.testing.assert_close(conv.weight.grad, model.weight.grad)


@pytest.mark.parametrize("cls", [pkt.EmbeddingBag, pkt.Embedding])
def test_fx_symbolic_trace_refuses_a_fused_optimizer(cls):
    conv = cls(ROWS, DIM, fused_optimizer=("sgd", {"lr": 0.1}))
    with pytest.raises(torch.fx.proxy.TraceError, match="fused optimizer"):
        torch.fx.symbolic_trace(conv)


# --------------------------------------------------------------------------- torch.func

def _outcome(fn):
    """fn()'s result, or the class of the exception it raised."""
    try:
        return fn()
    except Exception as exc:        # noqa: BLE001 - the class is what is compared
        return type(exc)


def _same(got, want):
    if isinstance(want, type):
        assert got is want, f"torch raises {want.__name__}; converted: {got!r}"
    else:
        assert not isinstance(got, type), f"torch answers; converted raises {got.__name__}"
        torch.testing.assert_close(got, want)


_BAG_ARGS = {
    "2d": (torch.tensor([[1, 2, 3], [4, 4, 9]]),),
    "offsets": (torch.tensor([1, 2, 3, 4, 9]), torch.tensor([0, 2])),
    "weights": (torch.tensor([1, 2, 3, 4, 9]), torch.tensor([0, 2]), torch.rand(5)),
}


def _transforms(args, batched_args):
    def on_weight(mod, fn):
        return fn(lambda w: functional_call(mod, {"weight": w}, args))
    return {
        "grad": lambda mod: grad(lambda p: functional_call(mod, p, args).pow(2).sum())(
            {"weight": mod.weight.detach()})["weight"],
        "vmap_input": lambda mod: vmap(mod)(*batched_args),
        "vmap_weight": lambda mod: on_weight(mod, vmap)(
            torch.linspace(-1, 1, 2 * ROWS * DIM).reshape(2, ROWS, DIM)),
        "jacfwd": lambda mod: on_weight(mod, jacfwd)(mod.weight.detach()),
        "jacrev": lambda mod: on_weight(mod, jacrev)(mod.weight.detach()),
    }


@pytest.mark.parametrize("transform", ["grad", "vmap_input", "vmap_weight", "jacfwd", "jacrev"])
@pytest.mark.parametrize("case", ["embedding"] + [f"bag-{k}" for k in _BAG_ARGS])
def test_torch_func(case, transform):
    torch.manual_seed(3)
    if case == "embedding":
        model = nn.Embedding(ROWS, DIM)
        args = (torch.tensor([[1, 2, 3], [9, 9, 0]]),)
    else:
        model = nn.EmbeddingBag(ROWS, DIM, mode="sum")
        args = _BAG_ARGS[case[4:]]
    conv = pkt.convert(copy.deepcopy(model))
    batched = tuple(torch.stack([a, a.flip(0)]) for a in args)
    fn = _transforms(args, batched)[transform]
    _same(_outcome(lambda: fn(conv)), _outcome(lambda: fn(model)))


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("case", ["embedding"] + [f"bag-{k}" for k in _BAG_ARGS])
def test_vmap_over_the_input_of_quantized_modules(case, bits):
    """vmap over the indices of a convert(bits=) module: each sample's lookup, as the module
    answers it outside vmap (torch's float modules vmap alike; ours must not read the batched
    tensor's memory)."""
    torch.manual_seed(5)
    model = (nn.Embedding(ROWS, DIM) if case == "embedding"
             else nn.EmbeddingBag(ROWS, DIM, mode="sum"))
    args = (torch.tensor([[1, 2, 3], [9, 9, 0]]),) if case == "embedding" else _BAG_ARGS[case[4:]]
    conv = pkt.convert(nn.Sequential(model), bits=bits)[0]
    batched = tuple(torch.stack([a, a if i == 1 else a.flip(0)])     # (offsets: the same)
                    for i, a in enumerate(args))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # torch's note that vmap loops over the op
        got = vmap(conv)(*batched)
    want = torch.stack([conv(*(a[i] for a in batched)) for i in range(2)])
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("kind, dual", [("embedding", "weight"), ("bag", "weight"),
                                        ("bag", "per_sample_weights")])
def test_forward_mode_ad(kind, dual):
    """A tangent through the lookup: torch's (Embedding) or torch's NotImplementedError
    (EmbeddingBag), never a missing tangent."""
    torch.manual_seed(4)
    model = (nn.Embedding(ROWS, DIM) if kind == "embedding"
             else nn.EmbeddingBag(ROWS, DIM, mode="sum"))
    conv = pkt.convert(copy.deepcopy(model))
    ix, off, psw = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 2]), torch.rand(4)

    def tangent(mod):
        with fwAD.dual_level():
            if dual == "weight":
                w = fwAD.make_dual(mod.weight.detach(), torch.ones(ROWS, DIM))
                args = (ix,) if kind == "embedding" else (ix, off)
                out = functional_call(mod, {"weight": w}, args)
            else:
                out = mod(ix, off, fwAD.make_dual(psw, torch.ones(4)))
            return fwAD.unpack_dual(out).tangent

    want, got = _outcome(lambda: tangent(model)), _outcome(lambda: tangent(conv))
    if not isinstance(got, type):
        assert got is not None, "the converted module dropped the tangent"
    _same(got, want)


# --------------------------------------------------------------------------- torch.compile

@pytest.mark.slow
@pytest.mark.parametrize("kind", ["embedding", "bag"])
def test_compile_keeps_a_sparse_gradient(kind):
    """torch.compile of a sparse=True table gives torch's sparse COO gradient, which
    torch.optim.SparseAdam takes."""
    model, conv = _pair(kind, sparse=True)
    x = NEW_INPUTS[1]
    torch.compile(model)(x).sum().backward()
    torch.compile(conv)(x).sum().backward()
    got, want = conv[0].weight.grad, model[0].weight.grad
    assert got.layout == want.layout == torch.sparse_coo
    torch.testing.assert_close(got.to_dense(), want.to_dense())
    torch.optim.SparseAdam([conv[0].weight], lr=0.1).step()
