"""perfkernels.torch.optimize on DCN models: lookups that meet in the cross network's input
``cat([dense.unsqueeze(1), pooled], 1)`` ([B, F + 1, D], flattened after) become one fused op.
Each model is checked against its own stock forward (outputs and gradients); TorchRec's
DLRM_DCN where TorchRec is installed."""
import copy

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import perfkernels.torch as pkt  # noqa: E402
from perfkernels.torch import _fused_ops  # noqa: E402
from perfkernels.torch import (EmbeddingBagCollection, EmbeddingBagConfig,  # noqa: E402
                               KeyedJaggedTensor)

ROWS = [30, 7, 120, 55]
D = 8
FUSED = torch.ops.perfkernels.embedding_bags_interaction.default
FUSED_INFERENCE = torch.ops.perfkernels.embedding_bags_interaction_inference.default


class CrossNet(nn.Module):
    """Low-rank cross layers: x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l."""

    def __init__(self, width, layers=2, rank=5):
        super().__init__()
        self.V = nn.ParameterList(nn.Parameter(torch.randn(rank, width) * 0.3)
                                  for _ in range(layers))
        self.W = nn.ParameterList(nn.Parameter(torch.randn(width, rank) * 0.3)
                                  for _ in range(layers))
        self.b = nn.ParameterList(nn.Parameter(torch.randn(width) * 0.1) for _ in range(layers))

    def forward(self, x0):
        x = x0
        for V, W, b in zip(self.V, self.W, self.b):
            x = x0 * (nn.functional.linear(nn.functional.linear(x, V), W) + b) + x
        return x


class BagsDCN(nn.Module):
    """A DCN over a list of nn.EmbeddingBag: ``form`` "stack" (cat([x.unsqueeze(1),
    stack(e, 1)], 1); "flatten": the same, flattened by .flatten(1)), "unsqueeze" (cat([x.unsqueeze(1), e_0.unsqueeze(1), ...], 1)) or "view"
    (cat([x.unsqueeze(1), cat(e, 1).view(B, F, D)], 1)); flattened into the cross network."""

    def __init__(self, form="stack", mode="sum", seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.form = form
        self.bottom = nn.Sequential(nn.Linear(5, 12), nn.ReLU(), nn.Linear(12, D), nn.ReLU())
        self.emb = nn.ModuleList(nn.EmbeddingBag(r, D, mode=mode) for r in ROWS)
        self.cross = CrossNet((len(ROWS) + 1) * D)
        self.top = nn.Sequential(nn.Linear((len(ROWS) + 1) * D, 9), nn.ReLU(), nn.Linear(9, 1))

    def forward(self, dense, indices, offsets):
        x = self.bottom(dense)
        e = [m(i, o) for m, i, o in zip(self.emb, indices, offsets)]
        if self.form == "flatten":
            return self.top(self.cross(torch.cat([x.unsqueeze(1), torch.stack(e, 1)], 1)
                                       .flatten(1)))
        if self.form == "stack":
            c = torch.cat([x.unsqueeze(1), torch.stack(e, 1)], 1)
        elif self.form == "unsqueeze":
            c = torch.cat([x.unsqueeze(1)] + [v.unsqueeze(1) for v in e], 1)
        else:
            c = torch.cat([x.unsqueeze(1), torch.cat(e, 1).view(-1, len(e), D)], 1)
        return self.top(self.cross(c.reshape(x.shape[0], -1)))


def bag_inputs(batch, seed=0, bag=3):
    g = torch.Generator().manual_seed(seed)
    dense = torch.rand(batch, 5, generator=g)
    indices, offsets = [], []
    for r in ROWS:
        lengths = torch.randint(0, bag + 1, (batch,), generator=g)
        indices.append(torch.randint(0, r, (int(lengths.sum()),), generator=g))
        offsets.append(torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]]))
    return dense, indices, offsets


class CollectionDCN(nn.Module):
    """MLPerf DLRM-v2's shape over perfkernels' EmbeddingBagCollection and a KeyedJaggedTensor:
    the pooled rows as [B, F, D] (to_dict, cat in key order, reshape), then DCN's input."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.keys = [f"f{i}" for i in range(len(ROWS))]
        self.ebc = EmbeddingBagCollection([
            EmbeddingBagConfig(num_embeddings=r, embedding_dim=D, name=f"t{i}",
                               feature_names=[k]) for i, (r, k) in enumerate(zip(ROWS, self.keys))])
        self.bottom = nn.Sequential(nn.Linear(5, D), nn.ReLU())
        self.cross = CrossNet((len(ROWS) + 1) * D)
        self.top = nn.Linear((len(ROWS) + 1) * D, 1)

    def forward(self, dense, kjt):
        x = self.bottom(dense)
        by_key = self.ebc(kjt).to_dict()
        s = torch.cat([by_key[k] for k in self.keys], 1).reshape(-1, len(self.keys), D)
        c = torch.cat((x.unsqueeze(1), s), dim=1)
        return self.top(self.cross(c.reshape([x.shape[0], -1])))


def kjt_inputs(batch, seed=0, kjt_class=KeyedJaggedTensor):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(ROWS) * batch,), generator=g)
    values = torch.cat([torch.randint(0, r, (int(lengths[f * batch:(f + 1) * batch].sum()),),
                                      generator=g) for f, r in enumerate(ROWS)])
    return torch.rand(batch, 5, generator=g), kjt_class(
        [f"f{i}" for i in range(len(ROWS))], values, lengths=lengths)


def fused_report():
    report = pkt.last_optimize_report()
    return [what for _, _, what in report.fused], report


def check_grads(stock, opt, inputs,
                eager=(_fused_ops.embedding_bags_interaction, _fused_ops.collection_interaction)):
    """Both models' parameter gradients equal, and every capture of ``opt`` calls one of the
    ``eager`` fused functions once."""
    for model in (stock, opt):
        model.zero_grad()
        model(*inputs).square().sum().backward()
    for (name, a), b in zip(stock.named_parameters(), opt.parameters()):
        assert b.grad is not None, name
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6, msg=name)
    graphs = [c.gm.graph for c in opt.__dict__["_perfkernels_optimize"].ordered]
    assert graphs and all(sum(n.target in eager for n in g.nodes) == 1 for g in graphs)


@pytest.mark.parametrize("form", ["stack", "unsqueeze", "view", "flatten"])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_bag_list_dcn_fuses_and_matches(form, mode):
    stock = BagsDCN(form, mode).eval()
    opt = pkt.optimize(copy.deepcopy(stock), bag_inputs(6))
    fused, report = fused_report()
    assert len(fused) == 1 and "DCN" in fused[0], str(report)
    assert not [w for w in report.not_fused if "lookup" in str(w)], str(report)
    for batch in (1, 6, 33):
        inputs = bag_inputs(batch, seed=batch)
        with torch.no_grad():
            torch.testing.assert_close(opt(*inputs), stock(*inputs), rtol=1e-5, atol=1e-5)
    check_grads(stock, opt, bag_inputs(7, seed=3))


def test_collection_dcn_fuses_and_matches():
    stock = CollectionDCN().eval()
    opt = pkt.optimize(copy.deepcopy(stock), kjt_inputs(6))
    fused, report = fused_report()
    assert len(fused) == 1 and "DCN" in fused[0], str(report)
    for batch in (1, 6, 40):
        with torch.no_grad():
            torch.testing.assert_close(opt(*kjt_inputs(batch, batch)),
                                       stock(*kjt_inputs(batch, batch)), rtol=1e-5, atol=1e-5)
    check_grads(stock, opt, kjt_inputs(9, seed=4))


def test_dcn_pooled_rows_used_elsewhere_are_not_fused():
    class Twice(BagsDCN):
        def forward(self, dense, indices, offsets):
            x = self.bottom(dense)
            e = [m(i, o) for m, i, o in zip(self.emb, indices, offsets)]
            c = torch.cat([x.unsqueeze(1), torch.stack(e, 1)], 1).reshape(x.shape[0], -1)
            return self.top(self.cross(c)) + e[0].sum(1, keepdim=True)

    stock = Twice().eval()
    opt = pkt.optimize(copy.deepcopy(stock), bag_inputs(6))
    fused, report = fused_report()
    assert not any("DCN" in f for f in fused), str(report)
    inputs = bag_inputs(5, seed=2)
    with torch.no_grad():
        torch.testing.assert_close(opt(*inputs), stock(*inputs), rtol=1e-5, atol=1e-5)


def test_dcn_compile_and_export():
    stock = BagsDCN("stack").eval()
    inputs = bag_inputs(8)
    opt = pkt.optimize(copy.deepcopy(stock), inputs)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(opt, backend=backend, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), stock(*inputs), rtol=1e-5, atol=1e-5)
    assert sum(sum(1 for n in g.graph.nodes if n.target is FUSED_INFERENCE)
               for g in graphs) == 1
    ep = torch.export.export(opt, inputs, strict=False)
    assert sum(1 for n in ep.graph.nodes if n.target is FUSED) == 1
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(*inputs), stock(*inputs), rtol=1e-5, atol=1e-5)


def test_torchrec_dlrm_dcn_fuses_and_matches():
    torchrec = pytest.importorskip("torchrec")
    from torchrec.models.dlrm import DLRM_DCN
    torch.manual_seed(1)
    ebc = torchrec.EmbeddingBagCollection(tables=[
        torchrec.EmbeddingBagConfig(num_embeddings=r, embedding_dim=D, name=f"t{i}",
                                    feature_names=[f"f{i}"]) for i, r in enumerate(ROWS)],
        device=torch.device("cpu"))
    stock = DLRM_DCN(ebc, dense_in_features=5, dense_arch_layer_sizes=[12, D],
                     over_arch_layer_sizes=[9, 1], dcn_num_layers=2, dcn_low_rank_dim=4).eval()
    TRKJT = torchrec.KeyedJaggedTensor
    opt = pkt.optimize(copy.deepcopy(stock), kjt_inputs(6, kjt_class=TRKJT))
    fused, report = fused_report()
    assert len(fused) == 1 and "DCN" in fused[0], str(report)
    assert not report.not_fused, str(report)
    for batch in (1, 6, 40):
        with torch.no_grad():
            torch.testing.assert_close(opt(*kjt_inputs(batch, batch, TRKJT)),
                                       stock(*kjt_inputs(batch, batch, TRKJT)),
                                       rtol=1e-5, atol=1e-5)
    check_grads(stock, opt, kjt_inputs(9, 4, TRKJT))


def test_collection_dcn_compile_and_export():
    stock = CollectionDCN().eval()
    inputs = kjt_inputs(8)
    opt = pkt.optimize(copy.deepcopy(stock), inputs)
    compiled = torch.compile(opt, backend="eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), stock(*inputs), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled(*inputs), stock(*inputs), rtol=1e-5, atol=1e-5)
    ep = torch.export.export(opt, inputs, strict=False)
    fused = torch.ops.perfkernels.collection_interaction.default
    assert sum(1 for n in ep.graph.nodes if n.target is fused) == 1
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(*inputs), stock(*inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_packed_collection_dcn_fuses_and_matches(bits):
    """A collection of packed tables (``optimize(bits=)`` quantizes as ``convert(bits=)``): its
    lookups and the DCN concatenation become one op in eager calls, answering as the converted
    model's unfused collection; compiled and exported, the packed collection op and the
    concatenation."""
    stock = CollectionDCN().eval()
    converted = pkt.convert(copy.deepcopy(stock), bits=bits)
    opt = pkt.optimize(copy.deepcopy(stock), kjt_inputs(6), bits=bits)
    fused, report = fused_report()
    assert len(fused) == 1 and "DCN" in fused[0], str(report)
    for batch in (1, 6, 40):
        inputs = kjt_inputs(batch, batch)
        with torch.no_grad():
            torch.testing.assert_close(opt(*inputs), converted(*inputs), rtol=1e-5, atol=1e-5)
    # grad mode on (a serving loop without no_grad, or training the dense part): the dense
    # part's gradients as the unfused model's
    check_grads(converted, opt, kjt_inputs(7, 3), eager=(_fused_ops.packed_collection_cat,))
    inputs = kjt_inputs(8)
    compiled = torch.compile(opt, backend="eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), converted(*inputs), rtol=1e-5, atol=1e-5)
        ep = torch.export.export(opt, inputs, strict=False)
        torch.testing.assert_close(ep.module()(*inputs), converted(*inputs), rtol=1e-5,
                                   atol=1e-5)
    # an out-of-range ID: refused as the converted model refuses it
    dense, kjt = kjt_inputs(4, 5)
    values = kjt.values().clone()
    values[0] = 10 ** 6
    bad = KeyedJaggedTensor(kjt.keys(), values, lengths=kjt.lengths())
    with torch.no_grad():
        for model in (converted, opt):
            with pytest.raises(IndexError, match=str(10 ** 6)):
                model(dense, bad)
