"""examples/dlrm.py at a CI size: the converted model trains and predicts like stock PyTorch."""
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("tqdm")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "dlrm.py"


def _load_example():
    """examples/dlrm.py as a fresh module."""
    spec = importlib.util.spec_from_file_location("dlrm_example", EXAMPLE)
    dlrm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dlrm)
    return dlrm


def _check_fused_training(optimizer, steps, lr):
    """examples/dlrm.py training with ``--fused-optimizer optimizer``: the loss curve must agree
    with the same optimizer run unfused on torch's sparse gradients, and fall."""
    dlrm = _load_example()
    result = dlrm.run(dlrm.parse_args([
        "--batch", "32", "--max-rows", "300", "--dim", "16", "--bag-size", "3",
        "--train-steps", str(steps), "--infer-batches", "0", "--lr", str(lr),
        "--fused-optimizer", optimizer]))
    assert result["train"]["fused_optimizer"] == optimizer
    assert result["train"]["max_loss_diff"] <= 1e-4
    assert result["train"]["loss_last"] < result["train"]["loss_first"]


@pytest.mark.skipif(not EXAMPLE.exists(), reason="examples/dlrm.py not found next to tests/")
def test_dlrm_example_agrees_with_stock_torch(tmp_path):
    dlrm = _load_example()
    plot = tmp_path / "dlrm.png"
    try:
        import matplotlib  # noqa: F401  (the [bench] extra; the test extra does without)
        plot_args = ["--plot", str(plot)]
    except ImportError:
        plot_args = []
    # run() raises SystemExit when the loss curves or the predictions disagree
    result = dlrm.run(dlrm.parse_args([
        "--batch", "32", "--max-rows", "300", "--dim", "16", "--bag-size", "3",
        "--train-steps", "8", "--infer-batches", "2", "--repeat", "1", *plot_args]))
    assert result["train"]["max_loss_diff"] <= 1e-4
    assert set(result["infer"]) == {"float32", "float16", "8-bit"}
    assert result["infer"]["float32"]["max_pred_diff"] <= 1e-4
    assert not plot_args or plot.stat().st_size > 0


@pytest.mark.skipif(not EXAMPLE.exists(), reason="examples/dlrm.py not found next to tests/")
def test_dlrm_example_fused_optimizer_tracks_torch():
    """A few hundred steps: the tables updated during backward by the fused row-wise Adagrad,
    against the same optimizer run unfused on torch's sparse gradients; the loss curves must agree
    (element-wise Adagrad: tests/test_torch_fused.py)."""
    _check_fused_training("rowwise_adagrad", 200, 0.01)


@pytest.mark.skipif(not EXAMPLE.exists(), reason="examples/dlrm.py not found next to tests/")
def test_dlrm_example_fused_adam_tracks_sparse_adam():
    """--fused-optimizer adam: the tables updated during backward by the fused lazy Adam, against
    torch.optim.SparseAdam on torch's sparse gradients; the loss curves must agree."""
    _check_fused_training("adam", 40, 0.001)


@pytest.mark.skipif(not EXAMPLE.exists(), reason="examples/dlrm.py not found next to tests/")
@pytest.mark.parametrize("model", ["rm1", "rm2", "rm3"])
def test_dlrm_example_model_classes(model):
    """DeepRecSys's public configurations (tables x rows x dim, lookups, MLPs), at a tiny row cap:
    the converted model still trains and predicts like stock PyTorch, and both placements are
    reported."""
    configs = {"rm1": (8, 4_000_000, 32, 80, 128), "rm2": (32, 500_000, 64, 120, 256),
               "rm3": (10, 2_000_000, 32, 20, 2560)}
    dlrm = _load_example()
    cls = dlrm.MODEL_CLASSES[model]
    tables, rows, dim, lookups, dense = configs[model]
    assert (len(cls.table_rows), cls.table_rows[0], cls.dim, cls.lookups, cls.bottom[0]) == (
        tables, rows, dim, lookups, dense)
    result = dlrm.run(dlrm.parse_args([
        "--model", model, "--batch", "8", "--max-rows", "200", "--indices", "uniform",
        "--train-steps", "2", "--infer-batches", "1", "--repeat", "1"]))
    assert result["model"] == model and result["table_rows"] == [200] * tables
    assert result["train"]["max_loss_diff"] <= 1e-4
    assert result["infer"]["float32"]["max_pred_diff"] <= 1e-4
    assert "torch_hp" in result["infer"]["float32"] and "MiB" in result["infer"]["float32"][
        "huge_pages"]


@pytest.mark.skipif(not EXAMPLE.exists(), reason="examples/dlrm.py not found next to tests/")
def test_dlrm_example_optimize_predicts_like_stock(capsys):
    """--optimize: every table format's optimized model fuses its lookups with the interaction
    and predicts what stock torch does (the example raises past --pred-tol)."""
    dlrm = _load_example()
    result = dlrm.run(dlrm.parse_args([
        "--batch", "16", "--max-rows", "300", "--dim", "8", "--bag-size", "2",
        "--train-steps", "0", "--infer-batches", "2", "--repeat", "1", "--optimize"]))
    assert set(result["infer"]) == {"float32", "float16", "8-bit"}
    for name, r in result["infer"].items():
        assert r["max_pred_diff"] <= (1e-3 if name == "float16" else 1e-4), (name, r)
    out = capsys.readouterr().out
    assert out.count("26 lookups + dot interaction") == 3, out
