"""The command line (python -m perfkernels) and the asv suite, as a user runs them."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import perfkernels as pk
from conftest import run_python

ROOT = Path(__file__).resolve().parents[1]


def run(*args, timeout=600):
    return run_python(["-m", "perfkernels", *args], timeout=timeout)


def test_info_prints_the_runtime():
    proc = run("info")
    assert proc.returncode == 0, proc.stderr
    assert f"active        {pk.active_isa()}" in proc.stdout
    # the THP mode and what a placed test table really got
    assert "THP           enabled=" in proc.stdout
    assert "a 4 MiB test table got" in proc.stdout and "AnonHugePages" in proc.stdout


def test_bench_quick_prints_a_table_with_ratios():
    proc = run("bench", "--quick", "--family", "convert", "--repeat", "1")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "float_to_half" in out and "vs numpy" in out and "copy bandwidth" in out
    for isa in pk.available_isas():
        assert isa in out.splitlines()[0] or isa in out


def test_bench_scaling_times_every_thread_count_beside_torch():
    proc = run("bench", "--quick", "--scaling", "--family", "convert", "--family", "multi",
               "--threads", "1,2", "--repeat", "1")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Thread scaling" in out and "1 thr" in out and "2 thr" in out and "x2/1" in out
    assert "float_to_half" in out and "criteo 26 tables" in out
    bad = run("bench", "--scaling", "--threads", "0")
    assert bad.returncode != 0 and "--threads" in bad.stderr


def test_interleaved_times_samples_in_turn_inside_each_context():
    """Ratios in `bench` come from samples taken in turn: one per function per round, each inside
    its own context (use_isa for our levels)."""
    from contextlib import contextmanager

    from perfkernels.benchsuite import interleaved_times

    log = []

    @contextmanager
    def context(name):
        log.append(("enter", name))
        yield
        log.append(("exit", name))

    fns = {"a": lambda: log.append(("call", "a")), "b": lambda: log.append(("call", "b"))}
    times = interleaved_times(fns, repeat=3, min_time=0.0, context=context)
    assert set(times) == {"a", "b"} and all(t > 0 for t in times.values())
    rounds = [e for e in log[8:] if e[0] == "enter"]       # after the warm-ups (2 calls each)
    assert [n for _, n in rounds] == ["a", "b"] * 3
    assert all(log[i + 1] == ("call", name) for i, (kind, name) in enumerate(log) if kind == "enter")


def test_bench_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib (the [bench] extra)")
    png = tmp_path / "speedups.png"
    proc = run("bench", "--quick", "--family", "convert", "--isa", "scalar", "--repeat", "1",
               "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_check_compares_every_path_with_the_references():
    proc = run("check", "--family", "convert")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all checks passed" in proc.stdout
    for isa in pk.available_isas():
        assert f" {isa} " in proc.stdout


def test_bad_subcommand_is_a_usage_error():
    proc = run("frobnicate")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def _installed_perfkernels_env():
    """asv runs benchmarks in a clean subprocess: it needs perfkernels installed, not in-place."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run([sys.executable, "-c", "import perfkernels"], cwd="/", env=env,
                           capture_output=True)
    return env if probe.returncode == 0 else None


@pytest.mark.skipif(shutil.which("asv") is None, reason="asv is not installed (the [test] extra has it)")
def test_asv_suite_is_well_formed():
    env = _installed_perfkernels_env()
    if env is None:
        pytest.skip("perfkernels is not installed in this Python (in-place build): asv cannot import it")
    proc = subprocess.run(["asv", "check", "--python=same"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_check_fails_on_a_wrong_result():
    """`check` compares with the references: one wrong bit or one wrong element is a failure."""
    from perfkernels import _selfcheck

    for check in _selfcheck.checks(["convert", "embedding", "lstm"]):
        got = check.run()
        assert _selfcheck.compare(check, got)[0], check.name
        first = got[0] if isinstance(got, tuple) else got
        if check.rtol is None:
            first.view(np.uint8).reshape(-1)[0] ^= 1
        else:
            first.reshape(-1)[first.size // 2] += 1e-3 + abs(first.reshape(-1)[first.size // 2])
        ok, detail = _selfcheck.compare(check, got)
        assert not ok, (check.name, detail)


def test_bench_dlrm_takes_the_model_class(monkeypatch):
    """`bench --family dlrm --model rm2` runs the example's rm2 class (the run itself is
    tests/test_dlrm_example.py's); an unknown class is refused by the parser."""
    from perfkernels import __main__ as cli
    from perfkernels.benchsuite import dlrm
    seen = []
    monkeypatch.setattr(dlrm, "run", lambda quick, plot, model: seen.append((quick, model)))
    assert cli.main(["bench", "--family", "dlrm", "--model", "rm2", "--quick"]) == 0
    assert seen == [(True, "rm2")]
    with pytest.raises(SystemExit):
        cli.main(["bench", "--family", "dlrm", "--model", "rm9"])


@pytest.mark.skipif("avx2" not in pk.available_isas(), reason="this CPU cannot run avx2")
def test_bench_cap_isa_holds_both_sides_to_avx2():
    """--cap-isa avx2 times our avx2 kernels only, and PyTorch really dispatches at AVX2."""
    pytest.importorskip("torch")
    proc = run("bench", "--quick", "--family", "convert", "--repeat", "1", "--cap-isa", "avx2")
    assert proc.returncode == 0, proc.stderr
    assert "both sides held to avx2" in proc.stdout
    assert "levels timed: avx2\n" in proc.stdout
    probe = run_python(["-c", "from perfkernels.__main__ import cap_isa; cap_isa('avx2'); "
                              "import torch; print(torch.backends.cpu.get_cpu_capability())"])
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "AVX2"
    bad = run("bench", "--quick", "--family", "convert", "--isa", "scalar", "--cap-isa", "avx2")
    assert bad.returncode != 0 and "contradicts --cap-isa avx2" in bad.stderr


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cache_bag_probe_runs_and_rejects_bad_sizes(dtype):
    """benchmarks/ceiling/cache_bag.py, the interleaved probe of one bag shape."""
    pytest.importorskip("torch")
    script = str(ROOT / "benchmarks" / "ceiling" / "cache_bag.py")
    proc = run_python([script, "--dtype", dtype, "--rows", "300", "--dim", "17", "--bags", "8",
                       "--bag-len", "5", "--rounds", "2", "--calls", "2"])
    assert proc.returncode == 0, proc.stderr
    assert f"{dtype} 300 x 17, B 8, L 5" in proc.stdout and "PyTorch / ours" in proc.stdout
    if shutil.which("cc"):    # the touch-only loop beside them (compiled at run time)
        proc = run_python([script, "--dtype", dtype, "--rows", "300", "--dim", "17", "--bags",
                           "8", "--bag-len", "5", "--rounds", "2", "--calls", "2", "--loop"])
        assert proc.returncode == 0, proc.stderr
        assert "touch loop" in proc.stdout and "loop / ours" in proc.stdout
    bad = run_python([script, "--rows", "0"])
    assert bad.returncode == 2 and "--rows must be at least 1, got 0" in bad.stderr
