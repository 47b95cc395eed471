"""examples/dlrm.py at a CI size: the converted model trains and predicts like stock PyTorch."""
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("tqdm")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "dlrm.py"


@pytest.mark.skipif(not EXAMPLE.exists(), reason="examples/dlrm.py not found next to tests/")
def test_dlrm_example_agrees_with_stock_torch(tmp_path):
    spec = importlib.util.spec_from_file_location("dlrm_example", EXAMPLE)
    dlrm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dlrm)
    plot = tmp_path / "dlrm.png"
    # run() raises SystemExit when the loss curves or the predictions disagree
    result = dlrm.run(dlrm.parse_args([
        "--batch", "32", "--max-rows", "300", "--dim", "16", "--bag-size", "3",
        "--train-steps", "8", "--infer-batches", "2", "--repeat", "1", "--plot", str(plot)]))
    assert result["train"]["max_loss_diff"] <= 1e-4
    assert set(result["infer"]) == {"float32", "float16", "8-bit"}
    assert result["infer"]["float32"]["max_pred_diff"] <= 1e-4
    assert plot.stat().st_size > 0
