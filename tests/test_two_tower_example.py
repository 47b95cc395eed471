"""examples/two_tower.py at a CI size: the converted retriever trains and retrieves like stock
PyTorch."""
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "two_tower.py"


@pytest.mark.skipif(not EXAMPLE.exists(), reason="examples/two_tower.py not found next to tests/")
def test_two_tower_example_agrees_with_stock_torch():
    spec = importlib.util.spec_from_file_location("two_tower_example", EXAMPLE)
    two_tower = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(two_tower)
    # run() raises SystemExit when the loss curves, the index or the scores disagree
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
