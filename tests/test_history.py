"""`python -m perfkernels history` and the asv suite's structure, without running benchmarks:
which commits, which environments and which asv commands the history takes, the offline page
libraries, and the GPU benchmarks' single skip on a machine without a GPU."""
import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from perfkernels import _history

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "asv.conf.json")
asv = pytest.importorskip("asv", reason="asv is not installed (the [test] extra has it)")


def _git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def test_last_commits_follow_first_parents_through_a_merge(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    monkeypatch.setattr(os, "environ", {**os.environ, **env})

    def commit(msg):
        (repo / msg).write_text(msg)              # a file per commit: the merge is clean
        _git(repo, "add", msg)
        _git(repo, "commit", "-q", "-m", msg)
        return _git(repo, "rev-parse", "HEAD")

    base = commit("base")
    _git(repo, "checkout", "-q", "-b", "side")
    side = commit("side")
    _git(repo, "checkout", "-q", "main")
    first = commit("first")
    _git(repo, "merge", "-q", "--no-ff", "-m", "merge", "side")
    merge = _git(repo, "rev-parse", "HEAD")
    monkeypatch.chdir(repo)
    assert _history.last_commits(3) == [merge, first, base]       # the side commit is not one
    assert side not in _history.last_commits(10)
    with pytest.raises(ValueError, match="at least 1"):
        _history.last_commits(0)


def test_environment_names_one_per_isa_level():
    every = _history.environment_names(CONFIG, None)
    assert len(every) == 3
    for isa in ("scalar", "avx2", "avx512"):
        (name,) = _history.environment_names(CONFIG, [isa])
        assert name.endswith(f"-PERFKERNELS_ISA{isa}") and name in every
    with pytest.raises(SystemExit, match="avx9"):
        _history.environment_names(CONFIG, ["avx9"])


def test_quick_history_runs_the_headline_set_at_the_default_level(tmp_path, monkeypatch):
    """The asv commands quick mode issues (asv itself is replaced by a recorder)."""
    import perfkernels as pk
    calls = []
    monkeypatch.setattr(_history, "_run", lambda cmd, env: calls.append((cmd, env)) or 0)
    html = tmp_path / "html"
    html.mkdir()
    (html / "index.html").write_text("<html></html>")
    monkeypatch.chdir(ROOT)
    args = SimpleNamespace(commits=3, rev="main", full=False, isa=None, bench=None, rerun=False,
                           machine="m1", config="asv.conf.json", html_dir=str(html))
    assert _history.cmd_history(args) == 0
    (machine, _), (run, env), (publish, _) = calls
    assert machine[:2] == ["asv", "machine"] and "m1" in machine
    assert run[:2] == ["asv", "run"] and "--quick" in run and "--skip-existing" in run
    assert run[run.index("--bench") + 1] == r"^headline\."
    assert run[run.index("--launch-method") + 1] == "forkserver"
    envs = [run[i + 1] for i, a in enumerate(run) if a == "-E"]
    assert envs == [e for e in _history.environment_names(CONFIG, [pk.active_isa()])]
    hashfile = next(a for a in run if a.startswith("HASHFILE:")).split(":", 1)[1]
    assert Path(hashfile).read_text().split() == _history.last_commits(3, "main")
    assert publish[:2] == ["asv", "publish"] and str(html) in publish
    if shutil.which("ccache") and "CC" not in os.environ:
        assert env["CC"] == "ccache gcc" and env["CCACHE_BASEDIR"] == str(ROOT)


def test_full_history_runs_everything_under_every_level(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(_history, "_run", lambda cmd, env: calls.append(cmd) or 0)
    html = tmp_path / "html"
    html.mkdir()
    (html / "index.html").write_text("<html></html>")
    monkeypatch.chdir(ROOT)
    args = SimpleNamespace(commits=1, rev="main", full=True, isa=None, bench=None, rerun=True,
                           machine=None, config="asv.conf.json", html_dir=str(html))
    assert _history.cmd_history(args) == 0
    run = calls[1]
    assert "--quick" not in run and "--bench" not in run and "--skip-existing" not in run
    assert run.count("-E") == 3


def test_localize_html_makes_asv_page_libraries_local(tmp_path):
    www = Path(asv.__file__).parent / "www" / "index.html"
    shutil.copy(www, tmp_path / "index.html")
    remaining = _history.localize_html(tmp_path)
    text = (tmp_path / "index.html").read_text()
    cdn = re.findall(r'<(?:script|link)\b[^>]*(?:src|href)="(https://[^"]+)"', text)
    assert sorted(cdn) == sorted(remaining)
    local = re.findall(r'(?:src|href)="vendor/([^"]+)"', text)
    for name in local:
        assert (tmp_path / "vendor" / name).stat().st_size > 100
    assert "integrity=" not in " ".join(re.findall(r"<[^>]*vendor/[^>]*>", text))
    if not remaining:       # every library found: nothing is left for the network
        assert "jquery.flot.min.js" in local and "jquery-3.3.1.min.js" in local


def test_gpu_benchmarks_skip_once_without_a_gpu(monkeypatch):
    from perfkernels import cuda
    if cuda.is_available():
        pytest.skip("a GPU is available here: the GPU benchmarks run")
    monkeypatch.syspath_prepend(str(ROOT))
    mod = importlib.import_module("benchmarks.bench_cuda")
    assert mod.GpuKernels.params == [[mod.NO_GPU]]
    for cls in (mod.GpuKernels, mod.GpuCopyBandwidth):
        with pytest.raises(NotImplementedError, match="GPU"):
            cls().setup(*([mod.NO_GPU] if cls is mod.GpuKernels else []))
    sys.modules.pop("benchmarks.bench_cuda", None)


def test_speedup_is_their_time_over_ours_sampled_in_turn(monkeypatch):
    """The ratio the headline graphs track: theirs / ours, each round timing both in turn, with
    PyTorch at its default thread count (or both at one thread) and the threads restored after."""
    torch = pytest.importorskip("torch", reason="the speed-ups are over PyTorch")
    import time
    monkeypatch.syspath_prepend(str(ROOT))
    common = importlib.import_module("benchmarks.common")
    log, seen = [], []
    ours = lambda: (log.append("ours"), seen.append(torch.get_num_threads()), time.sleep(0.002))  # noqa: E731
    theirs = lambda: (log.append("theirs"), time.sleep(0.006))  # noqa: E731
    before = torch.get_num_threads()
    ratio = common.speedup(ours, theirs, one_thread=False, rounds=5, min_time=0.0)
    assert 1.5 < ratio < 30, ratio     # ~3: theirs sleeps 3x longer (sleeps overrun under load)
    assert log[4:] == ["ours", "theirs"] * 5           # after two warm-up calls each, in turn
    assert set(seen) == {common.TORCH_DEFAULT_THREADS} and torch.get_num_threads() == before
    seen.clear()
    common.speedup(ours, theirs, one_thread=True, rounds=2, min_time=0.0)
    assert set(seen) == {1} and torch.get_num_threads() == before


def test_a_branch_other_than_main_is_graphed_with_paths_kept(tmp_path, monkeypatch):
    """asv publish graphs only configured branches, and reads paths relative to the config file:
    the derived config adds the branch and keeps every path pointing into the checkout."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(CONFIG, tmp_path / "asv.conf.json")
    assert _history._config_for_branch("asv.conf.json", "main") == "asv.conf.json"
    derived = _history._config_for_branch("asv.conf.json", "feature")
    from asv import util
    data = util.load_json(derived, js_comments=True)
    assert data["branches"][-1] == "feature" and "main" in data["branches"]
    assert data["repo"] == os.path.join(str(tmp_path), ".")
    assert data["results_dir"] == os.path.join(str(tmp_path), "benchmarks/results")
