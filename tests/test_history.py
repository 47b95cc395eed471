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

from perfkernels import _history, _registry

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "asv.conf.json")
asv = pytest.importorskip("asv", reason="asv is not installed (the [test] extra has it)")


def _git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def _new_repo(tmp_path, monkeypatch):
    """An empty git repository on branch main, and a function that commits one new file (a file
    per commit: merges are clean) and returns the new HEAD."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    monkeypatch.setattr(os, "environ", {**os.environ, **env})

    def commit(msg):
        (repo / msg).write_text(msg)
        _git(repo, "add", msg)
        _git(repo, "commit", "-q", "-m", msg)
        return _git(repo, "rev-parse", "HEAD")
    return repo, commit


def test_last_commits_follow_first_parents_through_a_merge(tmp_path, monkeypatch):
    base, side = _repo_with_a_merged_side_branch(tmp_path, monkeypatch)
    main2, merge, main1 = (_git(".", "rev-parse", rev) for rev in ("HEAD", "HEAD~1", "HEAD~2"))
    # the side commit is not one
    assert _history.last_commits(4) == [main2, merge, main1, base]
    assert side not in _history.last_commits(10)
    with pytest.raises(ValueError, match="at least 1"):
        _history.last_commits(0)


def test_environment_names_one_per_isa_level():
    every = _history.environment_names(CONFIG, None)
    assert len(every) == len(_registry.NAMES)       # every level of every architecture
    for isa in _registry.NAMES:
        (name,) = _history.environment_names(CONFIG, [isa])
        assert name.endswith(f"-PERFKERNELS_ISA{isa}") and name in every
    with pytest.raises(SystemExit, match="avx9"):
        _history.environment_names(CONFIG, ["avx9"])


def _history_args(tmp_path, **kw):
    html = tmp_path / "html"
    html.mkdir(exist_ok=True)
    args = dict(current=False, commits=3, publish_only=False, rev="main", full=False, isa=None,
                bench=None, rerun=False, machine=None, config="asv.conf.json", html_dir=str(html))
    args.update(kw)
    return SimpleNamespace(**args)


@pytest.fixture
def recorded(monkeypatch):
    """asv itself replaced by a recorder (and the page finishing, which needs asv's output)."""
    calls = []
    monkeypatch.setattr(_history, "_run", lambda cmd, env: calls.append((cmd, env)) or 0)
    monkeypatch.setattr(_history, "finish_html", lambda html, results: calls.append(
        (["finish_html", str(html), str(results)], None)) or [])
    monkeypatch.setattr(_history, "refused_points", lambda *a: [])   # whatever is committed
    monkeypatch.chdir(ROOT)
    return calls


def test_quick_history_runs_the_headline_set_at_every_level_of_this_cpu(tmp_path, recorded):
    import perfkernels as pk
    args = _history_args(tmp_path, machine="m1")
    assert _history.cmd_history(args) == 0
    (machine, _), (run, env), (publish, _), (finish, _) = recorded
    assert machine[:2] == ["asv", "machine"] and machine[machine.index("--machine") + 1] == "m1"
    assert "ISA levels " + ", ".join(pk.available_isas()) in machine[machine.index("--cpu") + 1]
    assert run[:2] == ["asv", "run"] and "--quick" in run and "--skip-existing" in run
    assert run[run.index("--bench") + 1] == r"^headline\."
    assert run[run.index("--launch-method") + 1] == "forkserver"
    envs = [run[i + 1] for i, a in enumerate(run) if a == "-E"]
    assert envs == _history.environment_names(CONFIG, list(pk.available_isas()))
    hashfile = next(a for a in run if a.startswith("HASHFILE:")).split(":", 1)[1]
    assert Path(hashfile).read_text().split() == _history.last_commits(3, "main")
    assert publish[:2] == ["asv", "publish"] and args.html_dir in publish
    assert finish[0] == "finish_html" and finish[1] == args.html_dir
    if shutil.which("ccache") and "CC" not in os.environ:
        assert env["CC"] == "ccache gcc" and env["CCACHE_BASEDIR"] == str(ROOT)


def test_current_appends_head_only_under_the_cpu_derived_machine_name(tmp_path, recorded):
    import perfkernels as pk
    assert _history.cmd_history(_history_args(tmp_path, current=True, isa=["scalar"])) == 0
    machine, run = recorded[0][0], recorded[1][0]
    name = _history.machine_info(pk.available_isas())["machine"]
    assert machine[machine.index("--machine") + 1] == name == run[run.index("--machine") + 1]
    hashfile = next(a for a in run if a.startswith("HASHFILE:")).split(":", 1)[1]
    assert Path(hashfile).read_text().split() == [_git(ROOT, "rev-parse", "HEAD")]
    assert [run[i + 1] for i, a in enumerate(run) if a == "-E"] == \
        _history.environment_names(CONFIG, ["scalar"])


def test_publish_only_runs_nothing(tmp_path, recorded):
    assert _history.cmd_history(_history_args(tmp_path, publish_only=True)) == 0
    assert [c[0][:2] for c in recorded] == [["asv", "publish"], ["finish_html", recorded[1][0][1]]]


def test_a_refused_point_fails_the_run(tmp_path, recorded, monkeypatch):
    monkeypatch.setattr(_history, "refused_points", lambda *a: ["headline.X.track_y @ abc"])
    assert _history.cmd_history(_history_args(tmp_path, current=True)) == 1
    assert recorded[2][0][:2] == ["asv", "publish"]      # published all the same, with a gap


def test_full_history_runs_everything_under_every_level(tmp_path, recorded):
    import perfkernels as pk
    assert _history.cmd_history(_history_args(tmp_path, commits=1, full=True, rerun=True)) == 0
    run = recorded[1][0]
    assert "--quick" not in run and "--bench" not in run and "--skip-existing" not in run
    assert run.count("-E") == len(pk.available_isas())


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


class _Clock:
    """A stand-in for time.perf_counter that the timed calls advance: the measurement's logic is
    tested exactly, whatever the load on the machine running the tests."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    def spend(self, seconds):
        self.now += seconds


def _common(monkeypatch):
    """benchmarks.common with its clock replaced: (module, clock)."""
    pytest.importorskip("torch", reason="the ratios are to PyTorch")
    monkeypatch.syspath_prepend(str(ROOT))
    common = importlib.import_module("benchmarks.common")
    clock = _Clock()
    monkeypatch.setattr(common, "time", clock)
    return common, clock


def test_measure_is_our_time_over_theirs_sampled_in_turn(monkeypatch):
    """A headline point: ours / theirs (lower is better), each round timing both in turn, with
    PyTorch at its default thread count (or both at one thread) and the threads restored after."""
    import torch
    common, clock = _common(monkeypatch)
    monkeypatch.setattr(common, "TORCH_DEFAULT_THREADS", 1)    # no oversubscription probe here
    log, seen = [], []
    tick = 2.0 ** -9                   # ~2 ms, exact in binary: the sums below are exact
    ours = lambda: (log.append("ours"), seen.append(torch.get_num_threads()), clock.spend(tick))  # noqa: E731
    theirs = lambda: (log.append("theirs"), clock.spend(3 * tick))  # noqa: E731
    before = torch.get_num_threads()
    m = common.measure(ours, theirs, one_thread=False, rounds=5, min_time=0.0)
    assert m.ratio == pytest.approx(1 / 3) and m.spread == pytest.approx(0, abs=1e-9)
    assert (m.ours, m.theirs) == pytest.approx((tick, 3 * tick))
    assert m.rounds == 5 and m.attempts == 1
    assert log[4:] == ["ours", "theirs"] * 5           # after two warm-up calls each, in turn
    assert set(seen) == {1} and torch.get_num_threads() == before
    seen.clear()
    log.clear()
    m = common.measure(ours, theirs, one_thread=True, rounds=3, min_time=64 * tick)
    assert log.count("ours") == 2 + 3 * 64             # samples of at least min_time: 64 calls
    assert set(seen) == {1} and torch.get_num_threads() == before


def test_a_point_whose_rounds_disagree_is_measured_again_then_refused(monkeypatch):
    common, clock = _common(monkeypatch)
    monkeypatch.setattr(common, "TORCH_DEFAULT_THREADS", 1)
    calls = {"theirs": 0}

    def theirs():                       # alternately 8 ms and 1 ms: the rounds never agree
        calls["theirs"] += 1
        clock.spend(0.008 if calls["theirs"] % 2 else 0.001)
    with pytest.raises(common.Unreliable, match=r"refused after 3 attempts.*spread"):
        common.measure(lambda: clock.spend(0.002), theirs, one_thread=True, rounds=6, min_time=0.0)
    assert calls["theirs"] == 3 * (2 + 6)                 # three attempts of warm-up + 6 rounds
    steady = {"n": 0}

    def settles():                      # the first attempt is disturbed, the second is not
        steady["n"] += 1
        clock.spend(0.008 if steady["n"] <= 8 and steady["n"] % 2 else 0.003)
    m = common.measure(lambda: clock.spend(0.003), settles, one_thread=True, rounds=6,
                       min_time=0.0)
    assert m.attempts == 2 and m.ratio == pytest.approx(1) and m.spread == pytest.approx(0)
    # a spread just under the limit passes at once
    wobble = {"n": 0}

    def slightly():
        wobble["n"] += 1
        clock.spend(0.003 * (1.05 if wobble["n"] % 2 else 0.95))
    assert common.measure(lambda: clock.spend(0.003), slightly, one_thread=True, rounds=9,
                          min_time=0.0).attempts == 1


def test_pytorch_starved_of_its_threads_is_refused(monkeypatch):
    """The artefact of the old history (628x, 24x): PyTorch's threads waiting for cores that other
    processes hold, so its multi-threaded call takes many times its 1-thread time."""
    import torch
    common, clock = _common(monkeypatch)
    monkeypatch.setattr(common, "TORCH_DEFAULT_THREADS", 2)
    theirs = lambda: clock.spend(0.002 if torch.get_num_threads() == 1 else 0.02)  # noqa: E731
    with pytest.raises(common.Unreliable, match="2 threads took 10.0x its 1-thread time"):
        common.measure(lambda: clock.spend(0.002), theirs, one_thread=False, rounds=3, min_time=0.0)
    healthy = lambda: clock.spend(0.004 if torch.get_num_threads() == 1 else 0.003)  # noqa: E731
    m = common.measure(lambda: clock.spend(0.002), healthy, one_thread=False, rounds=3,
                       min_time=0.0)
    assert m.ratio == pytest.approx(2 / 3) and m.attempts == 1


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


def test_machine_names_keep_cpu_classes_apart():
    """AVX2-only and AVX-512 machines, and Intel and AMD families, never share a results folder."""
    xeon = _history.machine_name("Intel(R) Xeon(R) Processor", 2, ("scalar", "avx2", "avx512"))
    epyc = _history.machine_name("AMD EPYC 7B12 64-Core Processor", 2, ("scalar", "avx2"))
    xeon_avx2 = _history.machine_name("Intel(R) Xeon(R) CPU E5-2680 v3 @ 2.50GHz", 2,
                                      ("scalar", "avx2"))
    assert (xeon, epyc, xeon_avx2) == ("xeon-2core-avx512", "epyc-2core-avx2", "xeon-2core-avx2")
    info = _history.machine_info(("scalar", "avx2"))
    assert info["machine"].endswith("-avx2") and "ISA levels scalar, avx2" in info["cpu"]
    assert info["cpu"].startswith(_history.cpu_model())


def test_the_cpu_label_names_the_generation_a_vm_hides():
    """A VM's "AMD EPYC" says neither Zen 1 (AVX2 on 128-bit units) nor Zen 4 (AVX-512)."""
    amd = "vendor_id\t: AuthenticAMD\ncpu family\t: {}\nmodel\t\t: {}\nmodel name\t: AMD EPYC\n"
    assert _history.cpu_signature(amd.format(25, 17)) == "family 25, model 17: Zen 4"
    assert _history.cpu_signature(amd.format(23, 1)) == "family 23, model 1: Zen 1/Zen+"
    assert _history.cpu_signature(amd.format(23, 49)) == "family 23, model 49: Zen 2"
    intel = "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
    assert _history.cpu_signature(intel) == "family 6, model 143"
    assert _history.cpu_signature("processor\t: 0\n") == ""
    sig = _history.cpu_signature()
    info = _history.machine_info(("scalar",))
    assert (f"({sig}); ISA levels" in info["cpu"]) if sig else "(" not in info["cpu"]


def _repo_with_a_merged_side_branch(tmp_path, monkeypatch):
    """A repository (the working directory now): base, then main1 and a side branch's commit
    merged with --no-ff, then main2.  Returns (base, side)."""
    repo, commit = _new_repo(tmp_path, monkeypatch)
    base = commit("base")
    _git(repo, "checkout", "-q", "-b", "side")
    side = commit("side")
    _git(repo, "checkout", "-q", "main")
    commit("main1")
    _git(repo, "merge", "-q", "--no-ff", "-m", "merge", "side")
    commit("main2")
    monkeypatch.chdir(repo)
    return base, side


def test_commits_behind_counts_first_parents_also_from_a_merged_side_commit(tmp_path, monkeypatch):
    base, side = _repo_with_a_merged_side_branch(tmp_path, monkeypatch)
    assert _history.commits_behind(base) == 3            # main1, the merge, main2
    assert _history.commits_behind(side) == 3            # main1 is not reachable from side either
    assert _history.commits_behind(_git(".", "rev-parse", "HEAD")) == 0
    assert _history.commits_behind("0" * 40) is None      # not in this repository


def test_a_side_branch_result_is_published_on_its_merge(tmp_path, monkeypatch):
    """asv graphs a branch's first-parent line only: a result measured on a merged side branch's
    commit is staged on the merge that brought it in; a merge's own result wins over it."""
    import json
    base, side = _repo_with_a_merged_side_branch(tmp_path, monkeypatch)
    merge = _git(".", "rev-parse", "HEAD~1")
    assert _history.first_parent_home(side) == merge
    assert _history.first_parent_home(base) == base
    assert _history.first_parent_home("0" * 40) is None
    folder = tmp_path / "results" / "m"
    folder.mkdir(parents=True)
    (folder / "machine.json").write_text('{"machine": "m"}')
    for commit, env in ((base, "e1"), (side, "e1"), (side, "e2"), (merge, "e2")):
        (folder / f"{commit[:8]}-{env}.json").write_text(json.dumps(
            {"commit_hash": commit, "env_name": env, "date": 0, "results": {}}))
    staged = _history.stage_results(tmp_path / "results", tmp_path / "staged")
    got = sorted((d["commit_hash"], d["env_name"], d.get("measured_at"))
                 for d in (json.loads(p.read_text()) for p in (staged / "m").glob("*-e*.json")))
    assert got == sorted([(base, "e1", None), (merge, "e1", side), (merge, "e2", None)])


@pytest.mark.parametrize("behind,status", [(0, 0), (_history.MAX_BEHIND, 0),
                                            (_history.MAX_BEHIND + 1, 1)])
def test_check_fails_when_the_newest_result_trails_head(monkeypatch, capsys, behind, status):
    """``history --check`` (a CI step, not a unit test: the rule is about the repository's state,
    not the code) passes while the newest committed result is at most MAX_BEHIND first-parent
    commits behind HEAD, and otherwise fails saying what to run."""
    monkeypatch.setattr(_history, "_git", lambda *a: "false")
    monkeypatch.setattr(_history, "newest_result", lambda d: (behind, "0123456789abcdef", "m"))
    monkeypatch.chdir(ROOT)
    assert _history.check_current("unused") == status
    err = capsys.readouterr().err
    assert ("history --current" in err) == bool(status)


def test_check_is_a_history_option():
    import argparse
    parser = argparse.ArgumentParser()
    _history.add_parser(parser.add_subparsers())
    assert parser.parse_args(["history", "--check"]).check is True


def test_committed_results_are_labelled_with_cpu_and_level():
    """Every machine folder is named after its CPU class and records the CPU model and levels;
    every result names its ISA level."""
    results = ROOT / "benchmarks" / "results"
    machines = list(results.glob("*/machine.json"))
    assert machines
    for path in machines:
        info = __import__("json").loads(path.read_text())
        assert info["machine"] == path.parent.name
        levels = info["cpu"].split("ISA levels ")[-1].split(", ")
        assert "ISA levels" in info["cpu"] and levels[0] == "scalar", info["cpu"]
        assert path.parent.name.endswith("-" + levels[-1])
        for result in path.parent.glob("*.json"):
            if result.name != "machine.json":
                data = __import__("json").loads(result.read_text())
                assert data["env_vars"]["PERFKERNELS_ISA"] in levels, result.name


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    import history_planting
    try:
        return history_planting.plant(tmp_path_factory.mktemp("planted"))
    except FileNotFoundError as exc:
        pytest.fail(str(exc))


def test_regressions_list_a_planted_slowdown_and_not_a_planted_speedup(planted):
    """Our time / PyTorch's doubles: listed; it halves: not listed; PyTorch's own time or a
    spread triples: not listed (not our slowdowns); flat lines: nothing."""
    import json
    data = json.loads((planted["html"] / "regressions.json").read_text())
    listed = [entry[0] for entry in data["regressions"]]
    assert planted["slower"] in listed, listed
    assert not [n for n in listed if n.startswith(planted["faster"])], listed
    assert listed == [planted["slower"]], listed
    (entry,) = data["regressions"]
    old, new = entry[-1][0][2], entry[-1][0][3]
    assert (old, new) == (0.8, 1.6)


def test_published_index_has_only_benchmarks_with_values_headline_first(planted):
    import json
    index = json.loads((planted["html"] / "index.json").read_text())
    names = list(index["benchmarks"])
    assert names and all(n.startswith("headline.") for n in names)
    assert ".track_time_ratio_vs_torch" in names[0], names[:4]
    kinds = [next(i for i, k in enumerate(_history.FIRST[1:]) if k in n) for n in names]
    assert kinds == sorted(kinds), names
    for name in names:
        assert _history._has_values(planted["html"] / "graphs" / "summary" / f"{name}.json"), name
    html = (planted["html"] / "index.html").read_text()
    assert "perfkernels-history.js" in html and 'href="summary.html"' in html
    summary = (planted["html"] / "summary.html").read_text()
    assert "lower is better" in summary and planted["commits"][-1][:8] in summary
    assert "planted-2core-avx512" in summary


def test_summary_rows_are_the_newest_results_per_machine_and_level(planted):
    (row,) = _history.latest_points(planted["results"])
    assert row["commit"] == planted["commits"][-1] and row["machine"] == "planted-2core-avx512"
    table = {(cls, params): ratio for cls, params, _, ratio, *_ in _history._ratio_table(row)}
    assert table["DLRMEmbeddingBag", "float32, uniform"] == 1.6
    assert table["LSTMUnit", ""] == 0.25


def test_refused_points_are_the_ratios_without_a_value(tmp_path):
    """A refused ratio (asv stores None; a whole row is None when every combination failed) is
    listed once per combination; spreads and times failing with it are not listed again."""
    import json
    folder = tmp_path / "m"
    folder.mkdir()
    pq = [["'p'", "'q'"]]
    (folder / "a-e.json").write_text(json.dumps({"commit_hash": "a" * 40, "env_name": "e", "results": {
        "headline.X.track_time_ratio_vs_torch": [[0.5, None], pq],
        "headline.X.track_time_ratio_vs_torch_1thread": [None, pq],
        "headline.X.track_ratio_spread": [None, pq],
        "headline.Y.track_time_ratio_vs_torch": [[0.7], []]}}))
    got = _history.refused_points(tmp_path, "m", ["a" * 40])
    expected = [("track_time_ratio_vs_torch", "q"), ("track_time_ratio_vs_torch_1thread", "p"),
                ("track_time_ratio_vs_torch_1thread", "q")]
    assert sorted(got) == sorted(f"headline.X.{name}{[repr(p)]} @ aaaaaaaa (e)" for name, p in expected)
    assert _history.refused_points(tmp_path, "m", ["b" * 40]) == []


def test_the_grid_line_follows_one_machine_and_level(tmp_path):
    """The grid's line of a benchmark is drawn from the newest result's machine class at its
    highest level, and only from commits where every combination of that series has a value:
    an older, slower machine, the scalar level and a commit whose fast combination was refused
    (asv's own line averages whatever is there: 4x to 10x jumps that are no regression) are
    not on it.  Expected values by hand: geometric mean of 1 and 4 is 2."""
    import json
    name = "headline.X.track_seconds_perfkernels"
    ab = [["'a'", "'b'"]]
    commits = [c * 40 for c in "12345"]

    def result(machine, level, commit, values):
        folder = tmp_path / "results" / machine
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "machine.json").write_text(json.dumps({"machine": machine}))
        (folder / f"{commit[:8]}-{level}.json").write_text(json.dumps({
            "commit_hash": commit, "env_name": level, "date": int(commit[0]) * 1000,
            "env_vars": {"PERFKERNELS_ISA": level}, "result_columns": ["result", "params"],
            "results": {name: [values, ab]}}))
    result("slow-2core-avx2", "avx2", commits[0], [4.0, 4.0])          # another machine class
    result("fast-2core-avx512", "avx512", commits[1], [1.0, 4.0])
    result("fast-2core-avx512", "scalar", commits[1], [10.0, 40.0])
    result("fast-2core-avx512", "avx512", commits[2], [None, 4.0])     # the fast one refused
    result("fast-2core-avx512", "scalar", commits[2], [10.0, 40.0])
    result("fast-2core-avx512", "scalar", commits[3], [10.0, 40.0])    # only the scalar level
    result("fast-2core-avx512", "avx512", commits[4], [1.0, float("nan")])   # b skipped
    result("fast-2core-avx512", "avx512", "6" * 40, [1.0, 4.0])        # not on the published line
    html = tmp_path / "html"
    (html / "graphs" / "summary").mkdir(parents=True)
    (html / "index.json").write_text(json.dumps(
        {"revision_to_hash": {str(10 * (i + 1)): c for i, c in enumerate(commits)}}))
    (html / "graphs" / "summary" / f"{name}.json").write_text("[[10, 4.0], [30, 12.0]]")
    sources = _history.consistent_summaries(html, tmp_path / "results")
    assert sources == {name: "fast-2core-avx512, level avx512"}
    points = json.loads((html / "graphs" / "summary" / f"{name}.json").read_text())
    assert points == [[20, pytest.approx(2.0)]], points


@pytest.mark.slow
def test_published_grid_lines_of_the_committed_results_have_no_machine_jumps(tmp_path):
    """The committed history as published: no headline time or ratio line has a point 3x its
    median (asv's own lines had 5.5x and 5.7x in DLRMQuantizedBag and DLRMEmbeddingBag's
    seconds, from commits measured on another machine or only at some levels), and the grid
    says which machine and level each line shows."""
    import json
    import statistics
    if shutil.which("asv") is None:
        pytest.skip("the asv command is not on PATH")
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.chdir(ROOT)
    try:
        rc, _ = _history.publish(CONFIG, str(tmp_path / "html"))
    finally:
        monkeypatch.undo()
    assert rc == 0
    summary = tmp_path / "html" / "graphs" / "summary"
    checked = 0
    for path in summary.glob("headline.*.json"):
        if ".track_seconds_" not in path.name and ".track_time_ratio" not in path.name:
            continue
        values = [v for _, v in json.loads(path.read_text()) if v is not None]
        assert values and max(values) < 3 * statistics.median(values), (path.name, values)
        checked += 1
    assert checked >= 16
    sources = (tmp_path / "html" / "perfkernels-summary-sources.js").read_text()
    assert "headline.DLRMEmbeddingBag.track_seconds_perfkernels" in sources and ", level " in sources
