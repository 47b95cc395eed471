"""perfkernels.torch.optimize: whole models (a DLRM running the torch operations of
facebookresearch's DLRM_Net and a TorchRec-shaped DLRM over perfkernels' collection) against their
own stock forward: predictions, errors, a training step, torch.compile(fullgraph=True) and
torch.export."""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import perfkernels.torch as pkt  # noqa: E402
from perfkernels.torch import _fused_ops  # noqa: E402
from perfkernels.torch import (EmbeddingBagCollection, EmbeddingBagConfig,  # noqa: E402
                               KeyedJaggedTensor)

from dlrm_models import TorchRecDLRM, dlrm_inputs, dlrm_net  # noqa: E402

ROWS = [10, 200, 3, 57, 1000]
FUSED = torch.ops.perfkernels.embedding_bags_interaction.default
FUSED_INFERENCE = torch.ops.perfkernels.embedding_bags_interaction_inference.default
FUSED_KJT = torch.ops.perfkernels.collection_interaction.default
# what the optimized model's own (eager) graph calls: the op, or the kernels straight from the
# tensors when there is no gradient to record
EAGER = _fused_ops.embedding_bags_interaction
EAGER_KJT = _fused_ops.collection_interaction


def count(graph, target):
    return sum(1 for n in graph.nodes if n.op == "call_function" and n.target is target)


def model_of(interaction="dot", itself=False, dim=4, seed=0):
    return dlrm_net(ROWS, dim, [6, 9, dim], [7, 1], interaction, itself, seed=seed).eval()


def fused_graphs(model):
    return [c.gm.graph for c in model.__dict__["_perfkernels_optimize"].ordered]


_NOT_OPS = {"aten.lift_fresh_copy.default", "aten.detach_.default", "aten.detach.default",
            "<built-in function getitem>"}   # how export materialises constants and tuples


@pytest.mark.parametrize("interaction,itself", [("dot", False), ("dot", True), ("cat", False)])
def test_reference_model_runs_dlrm_nets_operations(interaction, itself):
    """The graph optimize() matches in the reference-shaped model is the sequence facebookresearch's
    DLRM_Net runs: bottom MLP, one embedding_bag per table, cat / view / transpose / bmm / index
    by two constant pair lists made in the forward / cat (or one cat), top MLP with a sigmoid."""
    model = model_of(interaction, itself)
    ep = torch.export.export(model, dlrm_inputs(ROWS, 3, 6))
    ops = [str(n.target) for n in ep.graph.nodes
           if n.op == "call_function" and str(n.target) not in _NOT_OPS]
    layer = ["aten.linear.default", "aten.relu.default"]
    interact = ["aten.cat.default"] if interaction == "cat" else [
        "aten.cat.default", "aten.view.default", "aten.transpose.int", "aten.bmm.default",
        "aten.index.Tensor", "aten.cat.default"]
    assert ops == (layer * 2 + ["aten.embedding_bag.padding_idx"] * len(ROWS) + interact
                   + layer + ["aten.linear.default", "aten.sigmoid.default"])
    consts = [ep.constants[s.target] for s in ep.graph_signature.input_specs
              if s.kind.name == "CONSTANT_TENSOR"]
    if interaction == "cat":
        assert consts == []
    else:   # the lower triangle of the (F + 1) x (F + 1) products, row by row
        n = len(ROWS) + 1
        want = torch.tril_indices(n, n, offset=0 if itself else -1)
        assert len(consts) == 2
        assert torch.equal(consts[0], want[0]) and torch.equal(consts[1], want[1])


@pytest.mark.parametrize("interaction,itself", [("dot", False), ("dot", True), ("cat", False)])
def test_dlrm_predictions_equal_stock_for_any_batch(interaction, itself):
    stock = model_of(interaction, itself)
    opt = pkt.optimize(stock)
    assert type(opt) is type(stock)
    assert list(opt.state_dict()) == list(stock.state_dict())
    assert all(a is b for a, b in zip(opt.parameters(), stock.parameters()))
    for batch, bag in ((1, 1), (7, 1), (64, 3), (65, 2), (1, 4)):
        inputs = dlrm_inputs(ROWS, batch, 6, bag=bag, seed=batch)
        with torch.no_grad():
            want = stock(*inputs)
            got = opt(*inputs)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    report = pkt.last_optimize_report()
    assert report.fused and all(f"{len(ROWS)} lookups" in what for _, _, what in report.fused)
    assert "fused" in str(report)
    for graph in fused_graphs(opt):
        assert count(graph, EAGER) == 1
        assert count(graph, torch.ops.aten.bmm.default) == 0
        assert count(graph, torch.ops.perfkernels.embedding_bag.default) == 0


def test_example_inputs_capture_now_and_int32_indices():
    stock = model_of()
    inputs = dlrm_inputs(ROWS, 16, 6, index_dtype=torch.int32)
    opt = pkt.optimize(stock, inputs)
    assert len(fused_graphs(opt)) == 1
    with torch.no_grad():
        torch.testing.assert_close(opt(*inputs), stock(*inputs), rtol=1e-5, atol=1e-5)
    assert len(fused_graphs(opt)) == 1            # no second capture for the same signature


def _error_of(fn):
    try:
        fn()
    except Exception as exc:   # noqa: BLE001
        return exc
    return None


@pytest.mark.parametrize("interaction", ["dot", "cat"])
def test_bad_input_raises_the_unfused_models_error(interaction):
    stock = model_of(interaction)
    unfused = pkt.convert(stock)
    opt = pkt.optimize(stock)
    inputs = dlrm_inputs(ROWS, 8, 6)
    with torch.no_grad():
        opt(*inputs)
    dense, offs, idx = inputs
    bad = [i.clone() for i in idx]
    bad[1][5] = 200                               # table 1 has 200 rows
    bad[3][2] = -1
    want = _error_of(lambda: unfused(dense, offs, bad))
    got = _error_of(lambda: opt(dense, offs, bad))
    assert type(got) is type(want) and str(got) == str(want), (got, want)
    assert isinstance(got, type(_error_of(lambda: stock(dense, offs, bad))))   # RuntimeError
    bad_offsets = [o.clone() for o in offs]
    bad_offsets[2][0] = 1
    want = _error_of(lambda: stock(dense, bad_offsets, idx))
    got = _error_of(lambda: opt(dense, bad_offsets, idx))
    assert type(got) is type(want) and str(got) == str(want), (got, want)
    with torch.no_grad():   # the fused op's own error, as under torch.compile
        cap = opt.__dict__["_perfkernels_optimize"].ordered[0]
        with pytest.raises(RuntimeError, match=r"Index 5 of input takes value 200 which is not "
                                               r"in the valid range \[0, 200\)"):
            cap.run([dense, *offs, *bad])


@pytest.mark.parametrize("interaction,itself", [("dot", False), ("dot", True), ("cat", False)])
def test_training_step_equals_the_unfused_model(interaction, itself):
    stock = model_of(interaction, itself, seed=3).train()
    ref = copy.deepcopy(stock)
    opt = pkt.optimize(stock)
    inputs = dlrm_inputs(ROWS, 32, 6, bag=2, seed=5)
    target = torch.rand(32, 1)
    for model in (ref, opt):
        loss = torch.nn.functional.mse_loss(model(*inputs), target)
        loss.backward()
    assert fused_graphs(opt)
    for (name, a), b in zip(ref.named_parameters(), stock.parameters()):
        ga, gb = a.grad, b.grad
        ga = ga.to_dense() if ga.is_sparse else ga
        gb = gb.to_dense() if gb.is_sparse else gb
        torch.testing.assert_close(gb, ga, rtol=1e-5, atol=1e-6, msg=name)


def test_fused_optimizer_applies_per_table():
    base = model_of(seed=4).train()
    unfused = pkt.convert(copy.deepcopy(base))
    opt = pkt.optimize(copy.deepcopy(base))
    for model in (unfused, opt):
        for bag in model.emb_l:
            bag.set_fused_optimizer(("rowwise_adagrad", {"lr": 0.1}))
    inputs = dlrm_inputs(ROWS, 16, 6, bag=2, seed=9)
    for model in (unfused, opt):
        model(*inputs).sum().backward()
    assert fused_graphs(opt)
    for a, b, before in zip(unfused.emb_l, opt.emb_l, base.emb_l):
        assert a.weight.grad is None and b.weight.grad is None
        assert not torch.equal(b.weight, before.weight)          # the step was taken
        torch.testing.assert_close(b.weight, a.weight, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(b.momentum1, a.momentum1, rtol=1e-6, atol=1e-7)


def test_compile_fullgraph_keeps_one_fused_op():
    stock = model_of()
    inputs = dlrm_inputs(ROWS, 8, 6)
    opt = pkt.optimize(stock, inputs)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(opt, backend=backend, fullgraph=True)
    with torch.no_grad():
        got = compiled(*inputs)
        torch.testing.assert_close(got, stock(*inputs), rtol=1e-5, atol=1e-5)
    assert graphs and sum(count(g.graph, FUSED_INFERENCE) for g in graphs) == 1   # no_grad
    assert sum(count(g.graph, FUSED) for g in graphs) == 0
    graphs.clear()
    torch._dynamo.reset()
    compiled = torch.compile(opt, backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(*inputs), stock(*inputs), rtol=1e-5, atol=1e-5)
    assert graphs and sum(count(g.graph, FUSED) for g in graphs) == 1           # with autograd
    inductor = torch.compile(opt, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(inductor(*inputs), stock(*inputs), rtol=1e-5, atol=1e-5)


def test_export_of_the_optimized_model():
    stock = model_of(itself=True)
    inputs = dlrm_inputs(ROWS, 8, 6)
    opt = pkt.optimize(stock, inputs)
    ep = torch.export.export(opt, inputs, strict=False)
    assert count(ep.graph, FUSED) == 1
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(*inputs), stock(*inputs), rtol=1e-5, atol=1e-5)


def _torchrec_model(F=4, D=8, seed=0):
    torch.manual_seed(seed)
    tables = [EmbeddingBagConfig(num_embeddings=20 + 7 * f, embedding_dim=D, name=f"t{f}",
                                 feature_names=[f"f{f}"]) for f in range(F)]
    ebc = EmbeddingBagCollection(tables)
    return TorchRecDLRM(ebc, dense_in_features=5, dense_arch_layer_sizes=[12, D],
                        over_arch_layer_sizes=[9, 1]).eval()


def _kjt(F, B, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 3, (F * B,), generator=g)
    values = torch.cat([torch.randint(0, 20 + 7 * f, (int(lengths[f * B:(f + 1) * B].sum()),),
                                      generator=g) for f in range(F)])
    return KeyedJaggedTensor([f"f{f}" for f in range(F)], values, lengths=lengths)


def test_torchrec_shaped_model_runs_torchrecs_operations():
    """After the collection's pooled vectors, the TorchRec-shaped model's graph is TorchRec
    DLRM's: cat + reshape to [B, F, D], unsqueeze / cat / transpose / bmm / index by the two rows
    of a non-persistent triu_indices(F + 1, F + 1, offset=1) buffer / cat, the over MLP with a
    plain Linear last."""
    from perfkernels.torch import _optimize
    _optimize._register_pytrees()
    model = _torchrec_model(F=4)
    ep = torch.export.export(model, (torch.rand(3, 5), _kjt(4, 3, 0)))
    ops = [str(n.target) for n in ep.graph.nodes
           if n.op == "call_function" and str(n.target) not in _NOT_OPS]
    start = ops.index("aten.unsqueeze.default") - 2      # the pooled vectors' cat and reshape
    assert ops[:4] == ["aten.linear.default", "aten.relu.default"] * 2
    assert "perfkernels.embedding_bag_collection.default" in ops[4:start]
    assert ops[start:] == ["aten.cat.default", "aten.reshape.default", "aten.unsqueeze.default",
                           "aten.cat.default", "aten.transpose.int", "aten.bmm.default",
                           "aten.select.int", "aten.select.int", "aten.index.Tensor",
                           "aten.cat.default", "aten.linear.default", "aten.relu.default",
                           "aten.linear.default"]
    (spec,) = [s for s in ep.graph_signature.input_specs if s.kind.name == "BUFFER"]
    assert spec.target.endswith("triu_indices") and spec.persistent is False
    assert torch.equal(model.get_buffer(spec.target), torch.triu_indices(5, 5, offset=1))


def test_torchrec_style_model_fuses_collection_and_interaction_arch():
    model = _torchrec_model()
    stock = copy.deepcopy(model)
    opt = pkt.optimize(model)
    for batch in (1, 6, 40):
        dense = torch.rand(batch, 5)
        kjt = _kjt(4, batch, batch)
        with torch.no_grad():
            want = stock(dense, kjt)
            got = opt(dense, _kjt(4, batch, batch))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    graphs = fused_graphs(opt)
    assert graphs and all(count(g, EAGER_KJT) == 1 for g in graphs)
    assert all(count(g, torch.ops.aten.bmm.default) == 0 for g in graphs)


def test_copies_and_state_dict_round_trip():
    stock = model_of()
    opt = pkt.optimize(stock)
    inputs = dlrm_inputs(ROWS, 4, 6)
    with torch.no_grad():
        opt(*inputs)
        twin = copy.deepcopy(opt)
        assert twin.__dict__["_perfkernels_optimize"].ordered == []
        for p in twin.parameters():
            p.add_(1.0)
        torch.testing.assert_close(opt(*inputs), stock(*inputs), rtol=1e-5, atol=1e-5)
        fresh = model_of(seed=11)
        fresh.load_state_dict(twin.state_dict())
        torch.testing.assert_close(twin(*inputs), fresh(*inputs), rtol=1e-5, atol=1e-5)
        opt.load_state_dict(twin.state_dict())
        torch.testing.assert_close(opt(*inputs), fresh(*inputs), rtol=1e-5, atol=1e-5)


class _FunctionalDot(torch.nn.Module):
    """Lookups written with torch.nn.functional.embedding_bag on the model's own parameters (mode
    mean, padding_idx, include_last_offset), one of them weighted, then DLRM's dot interaction."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.tables = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(30 + f, 4))
                                              for f in range(3)])
        self.weighted = torch.nn.Parameter(torch.randn(9, 4))
        self.top = torch.nn.Linear(4 + 6, 1)

    def forward(self, x, indices, offsets, psw):
        ly = [torch.nn.functional.embedding_bag(i, t, o, mode="mean", padding_idx=1,
                                                include_last_offset=True)
              for t, i, o in zip(self.tables, indices, offsets)]
        T = torch.cat([x] + ly, dim=1).view((x.shape[0], -1, 4))
        Z = torch.bmm(T, torch.transpose(T, 1, 2))
        li, lj = torch.tril_indices(4, 4, offset=-1)
        extra = torch.nn.functional.embedding_bag(indices[0] % 9, self.weighted, offsets[0],
                                                  mode="sum", per_sample_weights=psw,
                                                  include_last_offset=True)
        return self.top(torch.cat([x, Z[:, li, lj]], dim=1)) + extra.sum(1, keepdim=True)


def test_functional_lookups_are_fused_and_weighted_ones_reported():
    model = _FunctionalDot().eval()
    opt = pkt.optimize(copy.deepcopy(model))
    g = torch.Generator().manual_seed(0)
    for batch in (3, 17):
        lens = [torch.randint(0, 4, (batch,), generator=g) for _ in range(3)]
        offsets = [torch.cat([torch.zeros(1, dtype=torch.long), n.cumsum(0)]) for n in lens]
        indices = [torch.randint(0, 30, (int(o[-1]),), generator=g) for o in offsets]
        psw = torch.rand(indices[0].shape[0], generator=g)
        x = torch.rand(batch, 4, generator=g)
        with torch.no_grad():
            torch.testing.assert_close(opt(x, indices, offsets, psw),
                                       model(x, indices, offsets, psw), rtol=1e-5, atol=1e-5)
    report = pkt.last_optimize_report()
    assert any("3 lookups + dot interaction" in what for _, _, what in report.fused)
    assert any("per_sample_weights" in why for _, _, why in report.not_fused)


class _DataDependent(torch.nn.Module):
    """A branch on a value of the data: torch.export cannot capture it, the model runs unfused."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.emb = torch.nn.ModuleList([torch.nn.EmbeddingBag(10, 3, mode="sum")
                                        for _ in range(2)])

    def forward(self, x, indices, offsets):
        ly = [e(i, o) for e, i, o in zip(self.emb, indices, offsets)]
        if x.sum() > 0:
            return torch.cat([x] + ly, dim=1)
        return torch.cat([x] + ly[::-1], dim=1)


def test_data_dependent_control_flow_runs_unfused_and_is_reported():
    model = _DataDependent().eval()
    opt = pkt.optimize(model)
    indices = [torch.tensor([1, 2, 3]), torch.tensor([4, 5, 9])]
    offsets = [torch.tensor([0, 1, 1]), torch.tensor([0, 2, 3])]
    for sign in (1.0, -1.0):
        x = sign * torch.rand(3, 3)
        with torch.no_grad():
            torch.testing.assert_close(opt(x, indices, offsets), model(x, indices, offsets))
    report = pkt.last_optimize_report()
    assert report.captures and "runs unfused" in report.captures[0][1]
    assert not report.fused and fused_graphs(opt) == []


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("interaction", ["dot", "cat"])
def test_quantized_tables_are_fused(bits, interaction):
    stock = model_of(interaction)
    unfused = pkt.convert(stock, bits=bits)
    opt = pkt.optimize(stock, bits=bits)
    for batch, bag in ((1, 1), (9, 2)):
        inputs = dlrm_inputs(ROWS, batch, 6, bag=bag, seed=batch)
        with torch.no_grad():
            torch.testing.assert_close(opt(*inputs), unfused(*inputs), rtol=1e-5, atol=1e-6)
    assert any(f"{len(ROWS)} lookups" in what for _, _, what in pkt.last_optimize_report().fused)
    assert all(count(g, EAGER) == 1 for g in fused_graphs(opt))


def test_stacked_dot_interaction_of_the_example_model():
    """examples/dlrm.py's interaction (torch.stack, bmm, flatten, flat pair positions, and a
    .float() after each lookup) is fused too: predictions and a training step equal the
    unfused model's."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "examples" / "dlrm.py"
    spec = importlib.util.spec_from_file_location("dlrm_example_for_optimize", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.manual_seed(0)
    stock = example.DLRM(ROWS, dim=8, sparse=False, bottom=(13, 16), top=(12, 1)).eval()
    ref = copy.deepcopy(stock)
    opt = pkt.optimize(stock)
    batches = example.make_batches(ROWS, 9, 2, 2, 4)
    for dense, indices, offsets, _ in batches:
        with torch.no_grad():
            want = ref(dense, indices, offsets)
            got = opt(dense, indices, offsets)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    report = pkt.last_optimize_report()
    assert [what for _, _, what in report.fused] == [
        f"{len(ROWS)} lookups + dot interaction (dlrm order, self_interaction=False)"]
    for graph in fused_graphs(opt):
        assert count(graph, torch.ops.aten.bmm.default) == 0
        assert count(graph, torch.ops.perfkernels.embedding_bag.default) == 0
        assert count(graph, torch.ops.perfkernels.embedding_bag_inference.default) == 0
    opt.train()
    ref.train()
    dense, indices, offsets, _ = batches[0]
    for model in (ref, opt):
        model(dense, indices, offsets).square().sum().backward()
    for (name, a), b in zip(ref.named_parameters(), stock.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6, msg=name)


class _LookupsOnly(torch.nn.Module):
    """Lookups meeting in a plain concatenation or stack (no dense input), then a linear layer."""

    def __init__(self, how: str, dim: int = 4):
        super().__init__()
        self.how = how
        self.tables = torch.nn.ModuleList(torch.nn.EmbeddingBag(r, dim, mode="sum")
                                          for r in ROWS)
        self.head = torch.nn.Linear(len(ROWS) * dim, 1)

    def forward(self, indices, offsets):
        ly = [t(i, o) for t, i, o in zip(self.tables, indices, offsets)]
        if self.how == "cat":
            z = torch.cat(ly, dim=1)
        else:
            z = torch.stack(ly, dim=1).flatten(1)
        return self.head(z)


@pytest.mark.parametrize("how", ["cat", "stack"])
def test_lookups_meeting_in_a_concatenation_or_stack_are_fused(how):
    torch.manual_seed(2)
    stock = _LookupsOnly(how)
    ref = copy.deepcopy(stock)
    opt = pkt.optimize(stock)
    for batch, bag in ((1, 1), (9, 3)):
        _, offsets, indices = dlrm_inputs(ROWS, batch, 6, bag=bag, seed=batch)
        with torch.no_grad():
            torch.testing.assert_close(opt(indices, offsets), ref(indices, offsets), rtol=1e-5,
                                       atol=1e-6)
    report = pkt.last_optimize_report()
    name = {"cat": "concatenation", "stack": "stack"}[how]
    assert report.fused and {what for _, _, what in report.fused} == {
        f"{len(ROWS)} lookups + {name}"}
    for graph in fused_graphs(opt):
        assert count(graph, EAGER) == 1
        assert count(graph, torch.ops.perfkernels.embedding_bag.default) == 0
        assert count(graph, torch.ops.perfkernels.embedding_bag_inference.default) == 0
    # a training step: the same gradients as the unfused model
    _, offsets, indices = dlrm_inputs(ROWS, 7, 6, bag=2, seed=11)
    for model in (ref, opt):
        model(indices, offsets).square().sum().backward()
    for (name, a), b in zip(ref.named_parameters(), stock.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6, msg=name)
