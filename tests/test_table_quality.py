"""benchmarks/table_quality.py: the rank AUC against a brute-force count of positive-negative
pairs, the log-loss against its formula in float64, and the whole run (training, every format,
the full-size shape with sampled rows) at a tiny size."""
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "table_quality.py"


def _script():
    spec = importlib.util.spec_from_file_location("table_quality", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _brute_auc(scores, labels):
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    won = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return won / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(6))
def test_auc_matches_the_pair_count(seed):
    q = _script()
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 60))
    scores = rng.integers(0, 6, n).astype(np.float32) if seed % 2 else rng.standard_normal(n)
    labels = rng.random(n) < 0.4
    labels[0], labels[1] = True, False
    assert q.auc(scores, labels) == pytest.approx(_brute_auc(scores, labels), abs=1e-12)


def test_auc_edge_cases():
    q = _script()
    assert q.auc([0.1, 0.9], [0, 1]) == 1.0
    assert q.auc([0.9, 0.1], [0, 1]) == 0.0
    assert q.auc([0.5, 0.5, 0.5], [0, 1, 1]) == 0.5
    assert math.isnan(q.auc([0.1, 0.2], [1, 1]))
    with pytest.raises(ValueError, match="differ in shape"):
        q.auc([0.1, 0.2], [1])


def test_log_loss_matches_the_formula():
    q = _script()
    rng = np.random.default_rng(0)
    z = rng.standard_normal(50) * 5
    y = (rng.random(50) < 0.3).astype(np.float64)
    p = 1 / (1 + np.exp(-z))
    want = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    assert q.log_loss(z, y) == pytest.approx(want, rel=1e-10)


def test_tiny_run_every_format(tmp_path):
    q = _script()
    args = q.parse_args(["--scale", "20000", "--cap", "500", "--steps", "3", "--batch", "32",
                         "--eval", "600", "--width", "4", "--full-size-pairs", "4"])
    r = q.train_and_evaluate(args, log=None)
    f = r["formats"]
    assert list(f) == ["float32", "float16", "8", "4", "4:big,8:small"]
    assert f["float32"]["auc_loss"] == 0 and f["float32"]["logit_max_abs_err"] == 0
    # the coarser the rows, the further the logits from float32's
    errs = [f[k]["logit_mean_abs_err"] for k in ("float16", "8", "4")]
    assert 0 < errs[0] < errs[1] < errs[2], errs
    assert f["4"]["table_bytes"] < f["8"]["table_bytes"] < f["float16"]["table_bytes"]
    assert 0.5 < r["teacher_auc"] <= 1 and 0.05 < r["positive_rate"] < 0.6
    if importlib.util.find_spec("matplotlib") is not None:     # the [bench] extra
        q.plot(r, str(tmp_path / "auc.png"))
        assert (tmp_path / "auc.png").stat().st_size > 1000
    fs = q.full_size_logit_errors(args)
    e = fs["formats"]
    assert e["float32"]["logit_max_abs_err"] == 0
    assert 0 < e["8"]["logit_mean_abs_err"] < e["4"]["logit_mean_abs_err"]
