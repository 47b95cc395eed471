"""``python -m perfkernels history``: the asv performance history (docs/performance.md).

Wraps ``asv machine``, ``asv run`` and ``asv publish`` for a checkout of the repository (run it
from the directory holding ``asv.conf.json``).  Quick mode (the default) times the headline
benchmarks (``benchmarks/headline.py``: the DLRM-shape embedding bags, quantized bags,
conversions and the LSTM unit, each as our time / PyTorch's, lower is better) at every ISA level
this CPU has, under a machine name derived from the CPU (``machine_name``: AVX2-only and AVX-512
machines never share one); ``--current`` times HEAD only, ``--publish-only`` runs nothing;
``--full`` times every benchmark.

asv builds every commit in its own environment.  What keeps that fast here:

- ccache, when installed: ``CC="ccache gcc"`` with ``CCACHE_BASEDIR`` at the checkout, so a
  commit's C sources (and Cython's C output) that did not change are not compiled again;
- ``--skip-existing``: commits that already have results on this machine are not run again;
- the forkserver launch method: the benchmark suite (NumPy, PyTorch, perfkernels) is imported once
  per commit instead of once per benchmark.

Publishing (``publish``) stages the results so that a side branch's result sits on the merge that
brought it in (asv graphs first-parent lines only), then finishes asv's pages (``finish_html``):
only benchmarks with values, the headline graphs first, a line at parity on the ratio graphs,
commit hashes on the x axis, "lower is better" on every headline graph, and ``summary.html``
with the latest ratios per machine class.  The pages load jQuery/flot/bootstrap from CDNs; where
Debian's copies are installed (libjs-jquery, libghc-js-flot-data, libjs-bootstrap,
libjs-jquery-stupidtable, node-blueimp-md5) they are copied next to the pages instead, so the
history also opens on a machine offline.
"""
from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ._history_pages import (FIRST, LOCAL_ASSETS, OPTIONAL_ASSETS, RATIO_BENCHMARK,  # noqa: F401
                             _has_values, _ratio_table, _result_files, consistent_summaries, finish_html, latest_points, localize_html,
                             order_and_prune, summary_html, summary_text)

#: The history subset: every benchmark of benchmarks/headline.py.
HEADLINE = r"^headline\."

#: CPU families named in /proc/cpuinfo's model name, by the word that names them there.
CPU_FAMILIES = ("xeon", "epyc", "ryzen", "threadripper", "opteron", "core", "atom", "neoverse")


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo's "model name"; platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine() or "unknown CPU"


#: x86 CPU families (cpuinfo's "cpu family", "model") whose generation a VM's bare model name
#: ("AMD EPYC", "Intel(R) Xeon(R) Processor") hides; the label records it.
_GENERATIONS = {(23, range(0x00, 0x30)): "Zen 1/Zen+", (23, range(0x30, 0x100)): "Zen 2",
                (25, range(0x00, 0x10)): "Zen 3", (25, range(0x10, 0x20)): "Zen 4",
                (25, range(0x20, 0x60)): "Zen 3", (25, range(0x60, 0x100)): "Zen 4",
                (26, range(0x00, 0x100)): "Zen 5"}


def cpu_signature(cpuinfo: str | None = None) -> str:
    """``family F, model M`` of the first CPU in /proc/cpuinfo (decimal, as cpuinfo prints
    them), with the AMD generation where it is known (``family 25, model 17: Zen 4``); "" where
    cpuinfo has no such lines (not Linux, not x86)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                cpuinfo = f.read(8192)
        except OSError:
            return ""
    fields = dict(re.findall(r"^(cpu family|model|vendor_id)\s*:\s*(\S+)", cpuinfo, re.M))
    try:
        family, model = int(fields["cpu family"]), int(fields["model"])
    except (KeyError, ValueError):
        return ""
    generation = next((name for (fam, models), name in _GENERATIONS.items()
                       if fam == family and model in models), None)
    if fields.get("vendor_id") != "AuthenticAMD":
        generation = None
    return f"family {family}, model {model}" + (f": {generation}" if generation else "")


def machine_name(model: str, cores: int, levels) -> str:
    """The asv machine name of a CPU class: its family, core count and highest ISA level, e.g.
    ``xeon-2core-avx512`` or ``epyc-2core-avx2``.  Results of AVX2-only and AVX-512 machines
    therefore never share a name, nor do machines of different families."""
    words = re.findall(r"[a-z0-9]+", re.sub(r"\((r|tm)\)", " ", model.lower()))
    family = next((w for w in words if w in CPU_FAMILIES), None)
    if family is None:
        family = next((w for w in words if w not in ("intel", "amd", "processor", "cpu")), "cpu")
    return f"{family}-{cores}core-{levels[-1]}"


def machine_info(levels) -> dict[str, str]:
    """What ``asv machine`` records for this machine: the derived name and the CPU's model with
    the ISA levels perfkernels can run on it (lowest first)."""
    import platform
    model = cpu_model()
    cores = os.cpu_count() or 1
    try:
        ram = f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    except (ValueError, OSError, AttributeError):
        ram = ""
    return {"machine": machine_name(model, cores, levels),
            "cpu": f"{model}{f' ({sig})' if (sig := cpu_signature()) else ''}; "
                   f"ISA levels {', '.join(levels)}",
            "arch": platform.machine(), "num_cpu": str(cores),
            "os": f"{platform.system()} {platform.release()}", "ram": ram}


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout.strip()


def last_commits(n: int, rev: str = "HEAD") -> list[str]:
    """The last ``n`` commits of ``rev``'s first-parent line (a merge counts once), newest first."""
    if n < 1:
        raise ValueError(f"--commits must be at least 1, got {n}")
    return _git("rev-list", "--first-parent", f"--max-count={n}", rev).split()


def environment_names(config: str, isas: list[str] | None) -> list[str]:
    """asv's names of the environments of the matrix whose PERFKERNELS_ISA is one of ``isas``
    (all of them for None)."""
    from asv import environment
    from asv.config import Config

    conf = Config.load(config)
    names = [env.name for env in environment.get_environments(conf, None, verbose=False)]
    if isas is None:
        return names
    chosen = [n for n in names if any(f"PERFKERNELS_ISA{isa}" in n.split("-") for isa in isas)]
    missing = [isa for isa in isas if not any(f"PERFKERNELS_ISA{isa}" in n.split("-") for n in chosen)]
    if missing:
        raise SystemExit(f"error: ISA level(s) {', '.join(missing)} are not in {config}'s "
                         f"PERFKERNELS_ISA matrix (environments: {', '.join(names)})")
    return chosen


def _config_for_branch(config: str, branch: str) -> str:
    """A copy of the asv config that also graphs ``branch`` (asv publish graphs only the commits
    of the configured branches); the original when it is already configured."""
    from asv import util

    data = util.load_json(config, js_comments=True)
    if branch in data.get("branches", []) or branch == "HEAD":
        return config
    data["branches"] = list(data.get("branches", [])) + [branch]
    # asv reads paths relative to the config file: keep them pointing into the checkout
    base = os.path.dirname(os.path.abspath(config))
    for key in ("repo", "benchmark_dir", "env_dir", "results_dir", "html_dir"):
        if key in data and "://" not in data[key]:
            data[key] = os.path.join(base, data[key])
    Path(".asv").mkdir(exist_ok=True)
    path = os.path.join(".asv", "history.conf.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=4)
    return path


def _is_ancestor(commit: str, of: str) -> bool:
    return subprocess.run(["git", "merge-base", "--is-ancestor", commit, of],
                          capture_output=True).returncode == 0


def first_parent_home(commit: str, rev: str = "HEAD") -> str | None:
    """The commit of ``rev``'s first-parent line where ``commit``'s code is first in it: itself
    when it is on that line, the merge that brought it in when it was a side branch's commit;
    None when it is not an ancestor of ``rev`` (or git does not know it)."""
    try:
        full = _git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
        line = _git("rev-list", "--first-parent", "--reverse", rev).split()
    except (subprocess.CalledProcessError, OSError):
        return None
    if not _is_ancestor(full, rev):
        return None
    lo, hi = 0, len(line) - 1          # the first line[i] that contains it: a binary search,
    while lo < hi:                     # since every later first-parent commit contains it too
        mid = (lo + hi) // 2
        if _is_ancestor(full, line[mid]):
            hi = mid
        else:
            lo = mid + 1
    return line[lo]


def stage_results(results_dir: str | os.PathLike, staging: str | os.PathLike,
                  rev: str = "HEAD") -> Path:
    """A copy of ``results_dir`` for ``asv publish``, which graphs only the first-parent line of
    a branch: a result measured on a side branch's commit is placed on the merge that brought
    that commit in (recording ``measured_at``), unless the merge has a result of its own for
    that environment.  Results of commits that are not ancestors of ``rev`` are left out."""
    staging = Path(staging)
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    results_dir = Path(results_dir)
    if (results_dir / "benchmarks.json").is_file():
        shutil.copy(results_dir / "benchmarks.json", staging / "benchmarks.json")
    homes: dict[str, str | None] = {}
    for machine_json in results_dir.glob("*/machine.json"):
        machine = machine_json.parent.name
        (staging / machine).mkdir()
        shutil.copy(machine_json, staging / machine / "machine.json")
        files = [json.loads(p.read_text()) for p in _result_files(results_dir, machine)]
        own = {(d["commit_hash"], d["env_name"]) for d in files}
        for data in files:
            commit = data["commit_hash"]
            if commit not in homes:
                homes[commit] = first_parent_home(commit, rev)
            home = homes[commit]
            if home is None or (home != commit and (home, data["env_name"]) in own):
                continue
            if home != commit:
                data = dict(data, commit_hash=home, measured_at=commit,
                            date=int(_git("show", "-s", "--format=%ct", home)) * 1000)
            name = f"{home[:8]}-{data['env_name']}.json"
            (staging / machine / name).write_text(json.dumps(data), encoding="utf-8")
    return staging


def publish(config: str, html_dir: str, rev: str = "HEAD") -> tuple[int, list[str]]:
    """``asv publish`` of the committed results as seen from ``rev``'s first-parent line
    (:func:`stage_results`), then :func:`finish_html`.  Run from the checkout's top directory.
    Returns asv publish's exit status and the CDN addresses the pages still load."""
    from asv import util
    data = util.load_json(config, js_comments=True)
    base = os.path.dirname(os.path.abspath(config))
    results_dir = os.path.join(base, data.get("results_dir", "results"))
    Path(".asv").mkdir(exist_ok=True)
    staged = stage_results(results_dir, os.path.join(".asv", "published-results"), rev)
    branch = _git("rev-parse", "--abbrev-ref", rev)
    if branch != "HEAD":
        data["branches"] = [branch]
    for key in ("repo", "benchmark_dir", "env_dir", "html_dir"):
        if key in data and "://" not in data[key]:
            data[key] = os.path.join(base, data[key])
    data["results_dir"] = str(staged.resolve())
    path = os.path.join(".asv", "publish.conf.json")
    Path(path).write_text(json.dumps(data, indent=4), encoding="utf-8")
    rc = _run(["asv", "publish", "--config", path, "--html-dir", os.path.abspath(html_dir)],
              build_environment())
    return rc, (finish_html(html_dir, staged) if rc == 0 else [])


def build_environment() -> dict[str, str]:
    """os.environ plus ccache for asv's per-commit builds, when ccache is installed."""
    env = dict(os.environ)
    if shutil.which("ccache") and "CC" not in env:
        env["CC"] = "ccache gcc"
        # asv builds in .asv/env/<hash>/project: paths relative to the checkout are the same for
        # every commit and every clone, so unchanged sources hit the cache (also across clones:
        # the build directory is left out of the hash, at the cost of its name in debug info).
        env.setdefault("CCACHE_BASEDIR", os.getcwd())
        env.setdefault("CCACHE_NOHASHDIR", "1")
    # no debug info (Python's flags have -g): the same machine code, compiled faster
    env.setdefault("CFLAGS", "-g0")
    return env


def _run(cmd: list[str], env: dict[str, str]) -> int:
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=env).returncode


def commits_behind(commit: str, head: str = "HEAD") -> int | None:
    """How many first-parent commits of ``head`` came after ``commit``
    (``git rev-list --first-parent --count commit..head``); None when git does not know it.

    A commit of a merged side branch counts from its merge: the merge and every first-parent
    commit not reachable from it."""
    try:
        _git("cat-file", "-e", f"{commit}^{{commit}}")
        return int(_git("rev-list", "--first-parent", "--count", f"{commit}..{head}"))
    except (subprocess.CalledProcessError, OSError):
        return None


def newest_result(results_dir: str | os.PathLike, head: str = "HEAD") -> tuple[int, str, str] | None:
    """(commits behind ``head``, commit, machine) of the committed result closest to ``head``
    among every machine's; None when no result's commit is in this repository."""
    best = None
    for machine_json in Path(results_dir).glob("*/machine.json"):
        machine = machine_json.parent.name
        for commit in {json.loads(p.read_text()).get("commit_hash")
                       for p in _result_files(results_dir, machine)}:
            behind = commits_behind(commit, head) if commit else None
            if behind is not None and (best is None or behind < best[0]):
                best = (behind, commit, machine)
    return best


def _machine_levels(isas: list[str] | None, full: bool) -> tuple[list[str], list[str]]:
    """The ISA levels to time (asked for, or every level this CPU has) and every level it has."""
    import perfkernels
    have = list(perfkernels.available_isas())
    if isas == ["all"] or (full and not isas):
        return have, have
    return (isas or have), have


def refused_points(results_dir, machine: str, commits: list[str]) -> list[str]:
    """``benchmark [params] @ commit (environment)`` of each headline ratio of ``commits`` on
    ``machine`` that has no value (a measurement refused as unreliable, or a failure)."""
    refused = []
    for path in _result_files(results_dir, machine):
        data = json.loads(path.read_text())
        if data.get("commit_hash") not in commits:
            continue
        for name, row in data.get("results", {}).items():
            if not RATIO_BENCHMARK.match(name):      # its times and spread fail with it
                continue
            params = list(itertools.product(*row[1])) if len(row) > 1 and row[1] else [()]
            values = row[0] if isinstance(row[0], list) else [row[0]] * len(params)
            for value, combo in zip(values, params):
                if value is None:
                    refused.append(f"{name}{list(combo) if combo else ''} @ "
                                   f"{data['commit_hash'][:8]} ({data.get('env_name', '?')})")
    return refused


#: How far the newest committed result may trail HEAD (first-parent commits): every
#: kernel-changing submission appends its commit (docs/performance.md, "Add a point").
MAX_BEHIND = 20


def check_current(results_dir: str | os.PathLike, max_behind: int = MAX_BEHIND) -> int:
    """``history --check``: 0 when the newest committed result is at most ``max_behind``
    first-parent commits behind HEAD, else 1 with what to run.  A shallow clone (whose history
    does not hold the results' commits) is reported and passes."""
    try:
        shallow = _git("rev-parse", "--is-shallow-repository")
    except (subprocess.CalledProcessError, OSError) as exc:
        print(f"history --check: no git history here ({exc}); nothing to check")
        return 0
    if shallow == "true":
        print("history --check: a shallow clone; the commits of the committed results are not all "
              "here, nothing to check")
        return 0
    newest = newest_result(results_dir)
    if newest is None:
        print(f"history --check: no committed result in {results_dir} has its commit in this "
              "repository's history", file=sys.stderr)
        return 1
    behind, commit, machine = newest
    if behind > max_behind:
        print(f"history --check: the newest committed result ({machine} at {commit[:8]}) is "
              f"{behind} first-parent commits behind HEAD (at most {max_behind}): append a point "
              "with `python -m perfkernels history --current` and commit benchmarks/results/",
              file=sys.stderr)
        return 1
    print(f"history --check: the newest committed result ({machine} at {commit[:8]}) is {behind} "
          f"first-parent commit(s) behind HEAD (at most {max_behind})")
    return 0


def cmd_history(args) -> int:
    """The ``history`` subcommand (see :func:`add_parser`)."""
    start = time.perf_counter()
    config = args.config
    if not os.path.isfile(config):
        raise SystemExit(f"error: {config} not found: run this from the repository's top directory "
                         "(a git checkout of perfkernels), or pass --config")
    try:
        from asv import util
    except ImportError:
        raise SystemExit("error: asv is not installed: pip install asv") from None
    conf = util.load_json(config, js_comments=True)
    results_dir = os.path.join(os.path.dirname(os.path.abspath(config)),
                               conf.get("results_dir", "results"))
    if getattr(args, "check", False):
        return check_current(results_dir)
    if shutil.which("asv") is None:
        raise SystemExit("error: asv is not installed: pip install asv")
    rc = 0
    if not args.publish_only:
        rc = _run_history(args, config, results_dir)
    html_dir = args.html_dir or conf.get("html_dir", "html")
    prc, remaining = publish(config, html_dir)
    if prc:
        return prc
    if remaining:
        print("the pages load these from the network (install Debian's libjs-* packages to make "
              "them local): " + ", ".join(remaining))
    print(summary_text(os.path.join(".asv", "published-results")))
    elapsed = time.perf_counter() - start
    print(f"\nhistory published to {html_dir}/index.html (the latest ratios: {html_dir}/summary.html)"
          f" in {elapsed / 60:.1f} min")
    print("open it: asv preview  (or: python -m http.server -d " + html_dir + ")")
    return rc


def _run_history(args, config: str, results_dir: str) -> int:
    """asv machine + asv run; 1 when a headline point was refused or a benchmark failed."""
    levels, have = _machine_levels(args.isa, args.full)
    envs = environment_names(config, levels)
    info = machine_info(have)
    machine = args.machine or info["machine"]
    commits = last_commits(1 if args.current else args.commits, "HEAD" if args.current else args.rev)
    rev = "HEAD" if args.current else args.rev
    branch = _git("rev-parse", "--abbrev-ref", rev) if rev == "HEAD" else rev
    config = _config_for_branch(config, branch)
    Path(".asv").mkdir(exist_ok=True)
    hashfile = os.path.abspath(os.path.join(".asv", "history-commits.txt"))
    Path(hashfile).write_text("\n".join(commits) + "\n")
    env = build_environment()
    described = ["--machine", machine] + [a for k in ("os", "arch", "cpu", "num_cpu", "ram")
                                          for a in (f"--{k}", info[k])]
    rc = _run(["asv", "machine", "--config", config, "--yes", *described], env)
    if rc:
        return rc
    run = ["asv", "run", "--config", config, f"HASHFILE:{hashfile}", "--launch-method",
           "forkserver", "--show-stderr", "--machine", machine]
    for name in envs:
        run += ["-E", name]
    if not args.full:
        run.append("--quick")
    for pattern in args.bench or ([] if args.full else [HEADLINE]):
        run += ["--bench", pattern]
    if not args.rerun:
        run.append("--skip-existing")
    print(f"history of {len(commits)} commit(s) of {rev} ({commits[-1][:8]}..{commits[0][:8]}) on "
          f"{machine} ({info['cpu']}), {'full' if args.full else 'quick'} mode, "
          f"environment(s): {', '.join(envs)}", flush=True)
    rc = _run(run, env)
    refused = refused_points(results_dir, machine, commits)
    if refused:
        print(f"\nREFUSED: {len(refused)} headline point(s) have no value (the measurement did not "
              "settle on this machine, or failed; see the benchmark output above). They are "
              "published as gaps. Measure again on a quieter machine (--rerun):", file=sys.stderr)
        for line in refused:
            print("  " + line, file=sys.stderr)
        return 1
    return 1 if rc else 0


def add_parser(sub) -> None:
    h = sub.add_parser(
        "history", help="asv performance history (asv run + asv publish)",
        description="Time commits with asv and publish the history as HTML, or (--publish-only) "
                    "publish the committed results.  Run from the repository's top directory.  "
                    "Quick mode (default): the headline benchmarks at every ISA level this CPU "
                    "has, each point one measurement of interleaved rounds.  Exit status 1 when a "
                    "headline point was refused (its rounds did not settle) or failed.")
    which = h.add_mutually_exclusive_group()
    which.add_argument("--current", action="store_true",
                       help="time HEAD only (what a kernel-changing commit appends)")
    which.add_argument("--commits", type=int, default=10,
                       help="the last N first-parent commits of --rev (default 10)")
    which.add_argument("--publish-only", action="store_true",
                       help="run nothing: publish the results in benchmarks/results/")
    which.add_argument("--check", action="store_true",
                       help=f"run nothing: exit 1 when the newest committed result is more than "
                            f"{MAX_BEHIND} first-parent commits behind HEAD (a CI step)")
    h.add_argument("--rev", default="HEAD", help="the last commit (default HEAD); earlier ones "
                   "follow its first parents")
    h.add_argument("--full", action="store_true",
                   help="every benchmark, every ISA level this CPU has, asv's full sampling")
    h.add_argument("--isa", action="append",
                   help="time under this ISA level only (repeatable; default: every level this "
                        "CPU has)")
    h.add_argument("--bench", action="append", help="benchmarks matching this regex instead of "
                   "the headline set (asv --bench; repeatable)")
    h.add_argument("--rerun", action="store_true",
                   help="run commits that already have results on this machine again")
    h.add_argument("--machine", help="asv machine name (default: derived from the CPU: family, "
                   "core count, highest ISA level, e.g. xeon-2core-avx512)")
    h.add_argument("--config", default="asv.conf.json", help="asv config (default asv.conf.json)")
    h.add_argument("--html-dir", help="where to publish (default: the config's html_dir)")


__all__ = ["add_parser", "cmd_history", "localize_html", "last_commits", "environment_names",
           "machine_name", "machine_info", "cpu_signature", "publish", "stage_results", "finish_html",
           "consistent_summaries",
           "order_and_prune", "latest_points", "summary_text", "summary_html", "commits_behind",
           "newest_result", "first_parent_home", "refused_points", "check_current"]
