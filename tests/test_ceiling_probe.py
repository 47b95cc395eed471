"""The memory-ceiling probe of docs/benchmarking.md (benchmarks/ceiling/): it builds, runs on its own
threads and on PyTorch's OpenMP team, and rejects bad arguments instead of reading out of bounds."""
import importlib.util
import pathlib
import shutil

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "ceiling" / "gather_ceiling.py"

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("gather_ceiling", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, module.build_library(tmp_path_factory.mktemp("probe"))


def touch(dll, table, idx, threads, team=(None, None), distance=16, into_l2=0):
    return dll.gather_touch(table.ctypes.data, table.strides[0], idx.ctypes.data, idx.size,
                            threads, distance, into_l2, *team)


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("into_l2", [0, 1])
def test_own_threads(probe, threads, into_l2):
    _, dll = probe
    table = np.arange(1000 * 72, dtype=np.uint8).reshape(1000, 72)
    idx = np.random.default_rng(0).integers(0, 1000, 5000)
    assert touch(dll, table, idx, threads, into_l2=into_l2) == 0
    assert touch(dll, table, idx[:0], threads) == 0


def test_bad_arguments_are_rejected(probe):
    _, dll = probe
    table = np.zeros((10, 64), np.float32)
    idx = np.zeros(4, np.int64)
    assert touch(dll, table, idx, 0) == -1
    assert touch(dll, table, idx, 257) == -1
    assert touch(dll, table, idx, 1, distance=-1) == -1


def test_on_torch_openmp_team(probe):
    pytest.importorskip("torch")
    module, dll = probe
    import perfkernels.torch  # noqa: F401
    import torch

    torch.ones(4) @ torch.ones(4)
    team = module.torch_openmp_team()
    if team == (None, None):
        pytest.skip("PyTorch loaded no libgomp here")
    table = np.ones((500, 64), np.float32)
    idx = np.random.default_rng(1).integers(0, 500, 3000)
    for threads in (1, 2, 3):
        assert touch(dll, table, idx, threads, team=team) == 0


@pytest.mark.parametrize("placement", ["torch", "numpy", "hugepage"])
def test_placements_keep_the_values_and_report_huge_pages(probe, placement):
    pytest.importorskip("torch")
    module, _ = probe
    table = np.random.default_rng(2).standard_normal((20000, 64)).astype(np.float32)
    out = module.placed(table, placement)
    assert out is not table and np.array_equal(out, table)
    address = out.__array_interface__["data"][0]
    if placement == "hugepage":
        assert address % (2 << 20) == 0
    elif placement == "torch":
        assert address % 64 == 0
    assert "AnonHugePages" in module.huge_pages(out)


def test_many_tables_runs_each_table_kind(capsys):
    """benchmarks/ceiling/many_tables.py at a tiny size: one line per table kind, every ratio a
    positive number (PyTorch, perfkernels and the touch loop all ran)."""
    pytest.importorskip("torch")
    path = ROOT / "benchmarks" / "ceiling" / "many_tables.py"
    spec = importlib.util.spec_from_file_location("many_tables", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--rows", "3000", "--rounds", "1", "--threads", "1"])
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines[1:]]
    assert [r[0] for r in rows] == ["float32", "float16", "8-bit"]
    for r in rows:
        ratios = [float(r[r.index("torch/ours") + 1]), float(r[r.index("loop/ours") + 1])]
        assert all(x > 0 for x in ratios)
