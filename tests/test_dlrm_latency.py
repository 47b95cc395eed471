"""examples/dlrm.py --latency at a CI size: the reference DLRM (the torch operations of
facebookresearch's DLRM_Net) predicts the same through every column, and the table has p50 / p99
per batch."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
pytestmark = pytest.mark.skipif(not (EXAMPLES / "dlrm_latency.py").exists(),
                                reason="examples/ not found next to tests/")


def load(name):
    spec = importlib.util.spec_from_file_location(f"test_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_dlrm_matches_its_formulas():
    """The reference DLRM's forward, recomputed from the paper's formulas with plain tensor ops:
    bottom MLP, one-hot sums, the lower triangle of the pairwise dot products (without / with the
    diagonal with the self-interaction), top MLP with a sigmoid."""
    ref = load("dlrm_reference")
    rng = np.random.default_rng(0)
    for itself in (False, True):
        m = ref.kaggle_model(max_rows=50, dim=4, self_interaction=itself).eval()
        assert m.top_l[0].in_features == 27 * (28 if itself else 26) // 2 + 4
        dense, lS_o, lS_i = ref.kaggle_batch(m, 5, rng, bag_size=2)
        with torch.no_grad():
            got = m(dense, lS_o, lS_i)
            x = m.bot_l(dense)
            ly = [torch.stack([m.emb_l[k].weight[lS_i[k][o:o + 2]].sum(0)
                               for o in lS_o[k].tolist()]) for k in range(26)]
            t = torch.stack([x] + ly, 1).double()
            z = [(t[:, i] * t[:, j]).sum(1) for i in range(27) for j in range(i + itself)]
            want = m.top_l(torch.cat([x.double()] + [v[:, None] for v in z], 1).float())
        assert got.shape == (5, 1) and bool(((got > 0) & (got < 1)).all())
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    cat = ref.kaggle_model(max_rows=50, dim=4, interaction="cat").eval()
    assert cat.top_l[0].in_features == 27 * 4
    with torch.no_grad():
        assert cat(*ref.kaggle_batch(cat, 3, rng)).shape == (3, 1)


def test_latency_mode_table(tmp_path, capsys):
    dlrm = load("dlrm")
    plot = tmp_path / "latency.png"
    try:
        import matplotlib  # noqa: F401
        plot_args = ["--plot", str(plot)]
    except ImportError:
        plot_args = []
    result = dlrm.run(dlrm.parse_args([
        "--latency", "--max-rows", "200", "--batches", "1,4", "--rounds", "5", "--warmup", "1",
        "--distinct", "2", "--no-compile", *plot_args]))
    assert set(result["batches"]) == {1, 4}
    assert result["columns"][:2] == ["stock", "convert"]
    import perfkernels.torch as pt
    assert ("optimize" in result["columns"]) == hasattr(pt, "optimize")
    for stats in result["batches"].values():
        for col in result["columns"]:
            s = stats[col]
            assert 0 < s["p50"] <= s["p99"] and s["samples"] == 5 and s["speedup"] > 0
            assert s["max_pred_diff"] <= 1e-5
    out = capsys.readouterr().out
    assert "p50 / p99" in out and "stock" in out and "convert" in out
    assert not plot_args or plot.stat().st_size > 0


def test_bench_dlrm_latency_flag(monkeypatch):
    """`bench --family dlrm --latency --threads 1,2` runs the latency mode once per count (the
    run itself is test_latency_mode_table's)."""
    from perfkernels import __main__ as cli
    from perfkernels.benchsuite import dlrm
    seen = []
    monkeypatch.setattr(dlrm, "run", lambda quick, plot, model, latency=False, threads=None:
                        seen.append((quick, latency, threads)))
    assert cli.main(["bench", "--family", "dlrm", "--latency", "--threads", "1,2", "--quick"]) == 0
    assert seen == [(True, True, [1, 2])]
    with pytest.raises(SystemExit):
        cli.main(["bench", "--family", "dlrm", "--latency", "--threads", "0"])


def test_optimize_column_appears_when_perfkernels_has_it(monkeypatch):
    """The optimize() columns are found with hasattr: a stand-in optimize (here convert) shows up
    as its own column, eager and compiled, and is checked against stock like the others."""
    import perfkernels.torch as pt
    calls = []

    def fake_optimize(model, example_inputs=None):
        calls.append(example_inputs)
        return pt.convert(model)

    monkeypatch.setattr(pt, "optimize", fake_optimize, raising=False)
    lat = load("dlrm_latency")
    ref = load("dlrm_reference")
    stock = ref.kaggle_model(max_rows=100).eval()
    example = ref.kaggle_batch(stock, 2, np.random.default_rng(0))
    columns, notes = lat.build_columns(stock, example, compile_=True)
    assert list(columns) == ["stock", "stock compiled", "convert", "optimize",
                             "optimize compiled"] and not notes
    assert len(calls) == 1 and calls[0] is example
    with torch.inference_mode():
        torch.testing.assert_close(columns["optimize"](*example), stock(*example))
    monkeypatch.delattr(pt, "optimize")
    columns, notes = lat.build_columns(stock, example, compile_=False)
    assert list(columns) == ["stock", "convert"] and "optimize" in notes[0]


def test_train_step_mode_table(capsys):
    """``--latency --train-step``: stock, convert(), optimize() and the dense-only bound, each a
    full training step that changes the model."""
    dlrm = load("dlrm")
    result = dlrm.run(dlrm.parse_args([
        "--latency", "--train-step", "--max-rows", "200", "--batches", "1,4", "--rounds", "4",
        "--warmup", "1", "--distinct", "2"]))
    assert set(result["batches"]) == {1, 4}
    assert result["columns"][0] == "stock" and result["columns"][-1] == "dense only"
    for stats in result["batches"].values():
        for col in result["columns"]:
            assert stats[col]["samples"] == 4 and stats[col]["p50"] > 0
    assert "dense only" in capsys.readouterr().out


def test_latency_mode_grad_on():
    """``--latency --grad-on``: the forwards with grad mode on predict as stock does."""
    dlrm = load("dlrm")
    result = dlrm.run(dlrm.parse_args([
        "--latency", "--grad-on", "--max-rows", "200", "--batches", "2", "--rounds", "3",
        "--warmup", "1", "--distinct", "2", "--no-compile"]))
    assert result["grad"] is True
    for col in result["columns"]:
        assert result["batches"][2][col]["max_pred_diff"] <= 1e-5
