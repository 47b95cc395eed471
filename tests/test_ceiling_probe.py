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


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "ceiling" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("row_bytes", [4, 36, 256, 260])
def test_row_copy_threads_copies_every_row(tmp_path, threads, row_bytes):
    """lookup_ceiling.py's copy loop, on OpenMP threads: output row i is table row indices[i]
    (against NumPy's fancy indexing), whatever the thread count; the read-only loop writes
    nothing; bad arguments are refused."""
    dll = _load("lookup_ceiling").build_library(tmp_path, openmp=True)
    rng = np.random.default_rng(threads)
    table = rng.integers(0, 255, (500, row_bytes), dtype=np.uint8)
    idx = rng.integers(0, 500, 1001).astype(np.int64)
    out = np.zeros((idx.size, row_bytes), np.uint8)
    args = (table.ctypes.data, row_bytes, idx.ctypes.data, idx.size)
    assert dll.row_copy_threads(*args, out.ctypes.data, row_bytes, 16, 0, threads) == 0
    np.testing.assert_array_equal(out, table[idx])
    before = out.copy()
    assert dll.row_copy_threads(*args, None, 0, 8, 1, threads) == 0   # read only
    np.testing.assert_array_equal(out, before)
    assert dll.row_copy_threads(*args, out.ctypes.data, row_bytes, 16, 0, 0) == -1
    assert dll.row_copy_threads(*args, out.ctypes.data, row_bytes - 1, 16, 0, threads) == -1


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("row_bytes", [1, 36, 256, 260])
def test_fill_rows_threads_writes_every_byte_and_no_more(tmp_path, threads, row_bytes):
    """lookup_ceiling.py's write-only loop: every byte of the n rows becomes 0, the bytes around
    them are untouched, whatever the thread count; bad arguments are refused."""
    dll = _load("lookup_ceiling").build_library(tmp_path, openmp=True)
    n = 1001
    buf = np.full(n * row_bytes + 128, 7, np.uint8)
    start = buf.ctypes.data + 64
    assert dll.fill_rows_threads(start, row_bytes, n, threads) == 0
    assert (buf[64:64 + n * row_bytes] == 0).all()
    assert (buf[:64] == 7).all() and (buf[64 + n * row_bytes:] == 7).all()
    assert dll.fill_rows_threads(start, row_bytes, n, 0) == -1
    assert dll.fill_rows_threads(start, -1, n, threads) == -1


def test_spills_counts_stack_vectors_in_inner_loops():
    """spills.py's counter on hand-written loops: stack vector accesses inside an innermost vector
    loop count, prefetches and accesses outside the loop do not."""
    spills = _load("spills")
    body = [(0x10 + i, "vaddps %ymm1,%ymm0,%ymm0") for i in range(8)]
    loop = ([(0x00, "vmovaps 0x20(%rsp),%ymm3")] + body
            + [(0x20, "vmovaps %ymm2,0x40(%rsp)"), (0x21, "vmovaps 0x40(%rsp),%ymm2"),
               (0x22, "prefetcht0 0x40(%rsp)"), (0x30, "jne    10 <f+0x10>")])
    assert spills.worst_spills(loop) == 2
    assert spills.worst_spills([(a, t) for a, t in loop if "rsp" not in t]) == 0
    assert spills.isa_of(loop) == "avx2"


def test_spills_reads_the_built_kernels(capsys):
    """spills.py on the built bag extensions: a section per extension, and it finds the bag
    functions (objdump from binutils)."""
    if shutil.which("objdump") is None:
        pytest.skip("no objdump (binutils) on PATH")
    spills = _load("spills")
    spills.main(["--all"])
    out = capsys.readouterr().out
    assert out.count("== ") == 2
    assert "bags_" in out


def test_kernel_ab_times_one_build_against_itself():
    """kernel_ab.py with the same build on both sides: it checks that both give the same sums,
    and each row's ratio is its two medians' quotient, inside its rounds' range.  No bound is put
    on the ratio itself: a timed assertion on calls of a few microseconds fails on a busy machine
    (one preemption in 2 rounds of 3 calls moved a same-build ratio to 0.16)."""
    import subprocess
    import sys

    import perfkernels

    tree = pathlib.Path(perfkernels.__file__).resolve().parent.parent
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ceiling" / "kernel_ab.py"),
                          str(tree), str(tree), "--rounds", "2", "--reps", "3", "--only", "tiny"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = [line.split() for line in run.stdout.splitlines()[1:]]
    assert len(rows) == 6   # float32, float16, bfloat16, 8-, 4-, 2-bit
    for row in rows:
        a_us, b_us, ratio = float(row[-4]), float(row[-3]), float(row[-2])
        lo, hi = (float(x) for x in row[-1].strip("()").split("-"))
        assert a_us > 0 and b_us > 0, row
        # the times are printed to 0.1 us, the ratios to 0.001
        assert ratio == pytest.approx(b_us / a_us, rel=0.05, abs=0.002), row
        # with 2 rounds, (b1 + b2) / (a1 + a2) lies between b1 / a1 and b2 / a2
        assert 0 < lo <= hi and lo - 0.002 <= ratio <= hi + 0.002, row


def test_lookup_ab_times_two_builds_kernel_against_kernel(tmp_path):
    """benchmarks/ceiling/lookup_ab.py with this build on both sides at a tiny size: a row per
    table format, each with two positive times and their ratio; a tree without a build is refused
    by name."""
    import os
    import subprocess
    import sys

    import perfkernels

    tree = str(pathlib.Path(perfkernels.__file__).resolve().parent.parent)
    script = str(ROOT / "benchmarks" / "ceiling" / "lookup_ab.py")
    env = dict(os.environ, PYTHONPATH=tree)
    run = subprocess.run([sys.executable, script, tree, tree, "--ids", "64", "--rounds", "2",
                          "--only", "100K"], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line.split() for line in run.stdout.splitlines() if "100K x 128" in line]
    assert [r[0] for r in rows] == ["f32", "f16", "bf16", "q8"]
    for r in rows:
        a, b, ratio = float(r[4]), float(r[5]), float(r[6])
        assert a > 0 and b > 0 and ratio == pytest.approx(b / a, rel=0.02)  # times printed to 0.1 us
    bad = subprocess.run([sys.executable, script, str(tmp_path), tree, "--ids", "64"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode != 0 and str(tmp_path) in bad.stderr
