"""The fuzz harness in the ordinary test run: replay the stored corpus (every input atheris kept
for new coverage, plus the inputs that once found a bug), then a fixed set of random byte strings.

No atheris needed: the harness decodes its inputs itself.  Each input checks one call against the
float64 reference, or the documented exception with out= untouched (see tests/fuzz/fuzz_kernels.py).
"""
import sys
from pathlib import Path

import numpy as np
import pytest

FUZZ = Path(__file__).parent / "fuzz"
sys.path.insert(0, str(FUZZ))
import fuzz_kernels  # noqa: E402

CORPUS = sorted(p for p in (FUZZ / "corpus").rglob("*") if p.is_file())


def test_corpus_is_stored():
    assert len(CORPUS) >= 50, "tests/fuzz/corpus should hold the corpus of the last long fuzz run"


@pytest.mark.parametrize("chunk", range(4))
def test_replay_corpus(chunk):
    for path in CORPUS[chunk::4]:
        try:
            fuzz_kernels.one_input(path.read_bytes())
        except Exception as exc:
            raise AssertionError(f"corpus input {path.relative_to(FUZZ)} fails") from exc


def test_random_inputs():
    rng = np.random.default_rng(20261123)
    for k in range(300):
        data = rng.integers(0, 256, int(rng.integers(0, 400)), dtype=np.uint8).tobytes()
        try:
            fuzz_kernels.one_input(data)
        except Exception as exc:
            raise AssertionError(f"random input {k}: {data.hex()}") from exc
