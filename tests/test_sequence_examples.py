"""examples/sasrec.py and examples/two_tower.py at a CI size: the converted models serve, retrieve
and train like stock PyTorch (each example's run() raises SystemExit when the loss curves, the
predictions or the retrieval scores disagree)."""
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name: str):
    path = EXAMPLES / f"{name}.py"
    if not path.exists():
        pytest.skip(f"examples/{name}.py not found next to tests/")
    spec = importlib.util.spec_from_file_location(f"{name}_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sasrec_example_agrees_with_stock_torch():
    sasrec = load("sasrec")
    result = sasrec.run(sasrec.parse_args([
        "--items", "3000", "--dim", "16", "--seq", "12", "--batch", "16", "--train-steps", "6",
        "--infer-batches", "2", "--repeat", "1", "--threads", "1"]))
    assert result["train"]["max_loss_diff"] <= 1e-4
    assert len(result["train"]["losses"]["ours"]) == 6
    assert result["infer"]["max_pred_diff"] <= 1e-5


def test_two_tower_example_agrees_with_stock_torch():
    two_tower = load("two_tower")
    result = two_tower.run(two_tower.parse_args([
        "--users", "3000", "--items", "2000", "--categories", "50", "--dim", "16", "--out", "8",
        "--history", "7", "--batch", "32", "--train-steps", "6", "--corpus", "500",
        "--index-batch", "128", "--query-batches", "2", "--k", "10", "--repeat", "1",
        "--threads", "1"]))
    assert result["train"]["max_loss_diff"] <= 1e-4
    assert len(result["train"]["losses"]["ours"]) == 6
    # the losses fell: the fused optimizers did update the tables
    assert result["train"]["losses"]["ours"][-1] < result["train"]["losses"]["ours"][0]
    assert result["retrieve"]["max_index_diff"] <= 1e-5
    assert result["retrieve"]["max_score_diff"] <= 1e-5
