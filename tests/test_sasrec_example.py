"""examples/sasrec.py at a CI size: the converted model serves and trains like stock PyTorch."""
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sasrec.py"


@pytest.mark.skipif(not EXAMPLE.exists(), reason="examples/sasrec.py not found next to tests/")
def test_sasrec_example_agrees_with_stock_torch():
    spec = importlib.util.spec_from_file_location("sasrec_example", EXAMPLE)
    sasrec = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sasrec)
    # run() raises SystemExit when the loss curves or the predictions disagree
    result = sasrec.run(sasrec.parse_args([
        "--items", "3000", "--dim", "16", "--seq", "12", "--batch", "16", "--train-steps", "6",
        "--infer-batches", "2", "--repeat", "1", "--threads", "1"]))
    assert result["train"]["max_loss_diff"] <= 1e-4
    assert len(result["train"]["losses"]["ours"]) == 6
    assert result["infer"]["max_pred_diff"] <= 1e-5
