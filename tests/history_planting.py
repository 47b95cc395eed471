"""A planted performance history for the history tests: a copy of a committed headline result
turned into a small history of a throw-away git repository, with one real slowdown and one real
speed-up planted, published with asv and finished the way ``python -m perfkernels history`` does.

Used by tests/test_history.py (the regression list, read from regressions.json) and
tests/test_history_html.py (the same, read from the Regressions page in a browser)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from perfkernels import _history

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

#: Planted at the 4th of 6 commits: our time doubles against PyTorch's (a slowdown) ...
SLOWER = "headline.DLRMEmbeddingBag.track_time_ratio_vs_torch"
SLOWER_PARAMS = ("'float32'", "'uniform'")
#: ... and halves (a speed-up, which must not be listed as a regression).
FASTER = "headline.LSTMUnit.track_time_ratio_vs_torch"
#: ... and rises that are not our slowdowns: PyTorch's own time, a measurement's spread.
NOT_OURS = ("headline.DLRMEmbeddingBag.track_seconds_torch", "headline.Conversion.track_ratio_spread")
COMMITS = 6
STEP_AT = 3
MACHINE = "planted-2core-avx512"


def template() -> Path | None:
    """The newest committed result file that has the headline ratios, or None."""
    newest = None
    for path in RESULTS.glob("*/*.json"):
        if path.name == "machine.json":
            continue
        data = json.loads(path.read_text())
        if SLOWER in data.get("results", {}) and FASTER in data["results"]:
            if newest is None or data.get("date", 0) > newest[0]:
                newest = (data.get("date", 0), path)
    return newest and newest[1]


def _git(cwd, *args, date=None):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    if date:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = date
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def _set(row: list, columns: list, params_wanted, value: float) -> None:
    """Set the value of one parameter combination (all of them for None) in a result row."""
    import itertools
    row_d = dict(zip(columns, row))
    combos = list(itertools.product(*row_d["params"])) if row_d.get("params") else [()]
    values = row[0] if isinstance(row[0], list) else [row[0]] * len(combos)   # None: all failed
    row[0] = [value if params_wanted is None or combo == params_wanted else v
              for v, combo in zip(values, combos)]


def plant(tmp: Path) -> dict:
    """Build the planted history under ``tmp`` and publish it; returns paths and what was planted.

    Every benchmark keeps the template's values at every commit (flat lines), except the planted
    series: SLOWER[float32, uniform] goes 0.8 -> 1.6, FASTER goes 0.5 -> 0.25 and the NOT_OURS
    series triple at commit STEP_AT (0-based).  Raises FileNotFoundError when no committed result has the headline ratios."""
    source = template()
    if source is None:
        raise FileNotFoundError("no committed result in benchmarks/results has the headline ratios")
    repo = tmp / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    commits = []
    for i in range(COMMITS):
        (repo / "f").write_text(str(i))
        _git(repo, "add", "f")
        _git(repo, "commit", "-q", "-m", f"c{i}", date=f"2026-01-0{i + 1}T12:00:00")
        commits.append(_git(repo, "rev-parse", "HEAD"))
    results = tmp / "results"
    (results / MACHINE).mkdir(parents=True)
    shutil.copy(RESULTS / "benchmarks.json", results / "benchmarks.json")
    machine = json.loads((source.parent / "machine.json").read_text())
    machine["machine"] = MACHINE
    (results / MACHINE / "machine.json").write_text(json.dumps(machine))
    base = json.loads(source.read_text())
    for i, commit in enumerate(commits):
        data = json.loads(json.dumps(base))
        data["commit_hash"] = commit
        data["date"] = int(_git(repo, "show", "-s", "--format=%ct", commit)) * 1000
        data["params"]["machine"] = MACHINE
        cols = data["result_columns"]
        after = i >= STEP_AT
        _set(data["results"][SLOWER], cols, None, 0.8)
        _set(data["results"][SLOWER], cols, SLOWER_PARAMS, 1.6 if after else 0.8)
        _set(data["results"][FASTER], cols, None, 0.25 if after else 0.5)
        for name in NOT_OURS:
            _set(data["results"][name], cols, None, 0.3 if after else 0.1)
        (results / MACHINE / f"{commit[:8]}-{data['env_name']}.json").write_text(json.dumps(data))
    config = json.loads(json.dumps(
        __import__("asv.util", fromlist=["load_json"]).load_json(str(ROOT / "asv.conf.json"),
                                                                 js_comments=True)))
    html = tmp / "html"
    config.update(repo=str(repo), results_dir=str(results), html_dir=str(html),
                  branches=["main"], env_dir=str(tmp / "env"),
                  benchmark_dir=str(ROOT / "benchmarks"))
    (tmp / "asv.conf.json").write_text(json.dumps(config))
    proc = subprocess.run(["asv", "publish", "--config", str(tmp / "asv.conf.json")], cwd=tmp,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode:
        raise RuntimeError(proc.stdout[-3000:] + proc.stderr[-3000:])
    remaining = _history.finish_html(html, results)
    return {"html": html, "results": results, "commits": commits, "remaining": remaining,
            "slower": f"{SLOWER}({', '.join(SLOWER_PARAMS)})", "faster": FASTER}
