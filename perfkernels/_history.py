"""``python -m perfkernels history``: the asv performance history of the last N commits.

Wraps ``asv run`` and ``asv publish`` for a checkout of the repository (run it from the directory
holding ``asv.conf.json``).  Quick mode (the default) times the headline benchmarks
(``benchmarks/headline.py``: the DLRM-shape embedding bags, quantized bags, conversions and the
LSTM unit, each with its speed-up over PyTorch) at this CPU's default ISA level, one sample per
time benchmark; ``--full`` times every benchmark under every ISA level of the matrix.

asv builds every commit in its own environment.  What keeps that fast here:

- ccache, when installed: ``CC="ccache gcc"`` with ``CCACHE_BASEDIR`` at the checkout, so a
  commit's C sources (and Cython's C output) that did not change are not compiled again;
- one environment per ISA level chosen (``-E``), not the whole matrix, unless asked;
- ``--skip-existing``: commits that already have results on this machine are not run again;
- the forkserver launch method: the benchmark suite (NumPy, PyTorch, perfkernels) is imported once
  per commit instead of once per benchmark.

The published pages load jQuery/flot/bootstrap from CDNs; where Debian's copies are installed
(libjs-jquery, libghc-js-flot-data, libjs-bootstrap, libjs-jquery-stupidtable, node-blueimp-md5)
they are copied next to the pages instead, so the history also opens on a machine offline.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

#: The history subset: every benchmark of benchmarks/headline.py.
HEADLINE = r"^headline\."

#: Local copies of the libraries asv's index.html loads from CDNs, by the URL's file name.
#: Flot must be 0.8.3 (the version asv is written for), which Debian ships in libghc-js-flot-data.
LOCAL_ASSETS = {
    "jquery-3.3.1.min.js": "/usr/share/javascript/jquery/jquery.min.js",
    "jquery.flot.min.js": "/usr/share/haskell-js-flot/jquery.flot.min.js",
    "jquery.flot.time.min.js": "/usr/share/haskell-js-flot/jquery.flot.time.min.js",
    "jquery.flot.selection.min.js": "/usr/share/haskell-js-flot/jquery.flot.selection.min.js",
    "jquery.flot.categories.min.js": "/usr/share/haskell-js-flot/jquery.flot.categories.min.js",
    "stupidtable.min.js": "/usr/share/javascript/jquery-stupidtable/stupidtable.min.js",
    "md5.min.js": "/usr/share/javascript/blueimp-md5/md5.min.js",
    "bootstrap.min.js": "/usr/share/javascript/bootstrap/js/bootstrap.min.js",
    "bootstrap.min.css": "/usr/share/javascript/bootstrap/css/bootstrap.min.css",
}
#: Plugins whose absence only degrades a view (bar order in the by-parameter plot); an offline page
#: drops them instead of failing to load.
OPTIONAL_ASSETS = {"jquery.flot.orderBars.js"}

_CDN_TAG = re.compile(r'<(script|link)\b[^>]*?(?:src|href)="(https://[^"]+)"[^>]*>(?:</script>)?')


def localize_html(html_dir: str | os.PathLike) -> list[str]:
    """Point index.html at local copies of its CDN libraries where they are installed.

    Copies them into ``<html_dir>/vendor/``; a library with no local copy keeps its CDN address,
    except the optional plugins, which are dropped once everything else is local.  Returns the
    CDN addresses still used (empty: the pages need no network)."""
    html_dir = Path(html_dir)
    index = html_dir / "index.html"
    text = index.read_text(encoding="utf-8")
    vendor = html_dir / "vendor"
    remaining: list[str] = []

    def replace(m: re.Match) -> str:
        kind, url = m.group(1), m.group(2)
        name = url.rsplit("/", 1)[-1]
        local = LOCAL_ASSETS.get(name)
        if local is None or not os.path.isfile(local):
            remaining.append(url)
            return m.group(0)
        vendor.mkdir(exist_ok=True)
        shutil.copyfile(local, vendor / name)
        if kind == "link":
            return f'<link rel="stylesheet" href="vendor/{name}">'
        return f'<script src="vendor/{name}" onerror="js_load_failure()"></script>'

    text = _CDN_TAG.sub(replace, text)
    if remaining and all(u.rsplit("/", 1)[-1] in OPTIONAL_ASSETS for u in remaining):
        for url in remaining:
            text = re.sub(r'<script\b[^>]*src="' + re.escape(url) + r'"[^>]*></script>\s*', "", text)
        remaining = []
    index.write_text(text, encoding="utf-8")
    return remaining


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


def cmd_history(args) -> int:
    """The ``history`` subcommand (see :func:`add_parser`)."""
    start = time.perf_counter()
    config = args.config
    if not os.path.isfile(config):
        raise SystemExit(f"error: {config} not found: run this from the repository's top directory "
                         "(a git checkout of perfkernels), or pass --config")
    if shutil.which("asv") is None:
        raise SystemExit("error: asv is not installed: pip install asv")
    if args.isa:
        isas = None if args.isa == ["all"] else args.isa
    elif args.full:
        isas = None
    else:
        import perfkernels
        isas = [perfkernels.active_isa()]
    envs = environment_names(config, isas)
    branch = _git("rev-parse", "--abbrev-ref", args.rev) if args.rev == "HEAD" else args.rev
    config = _config_for_branch(config, branch)
    commits = last_commits(args.commits, args.rev)
    Path(".asv").mkdir(exist_ok=True)
    hashfile = os.path.join(".asv", "history-commits.txt")
    Path(hashfile).write_text("\n".join(commits) + "\n")
    env = build_environment()

    if args.machine:
        machine = ["--machine", args.machine]
    else:
        machine = []
    # records this machine (asv's defaults, or the name given) unless it is known already
    rc = _run(["asv", "machine", "--config", config, "--yes", *machine], env)
    if rc:
        return rc

    run = ["asv", "run", "--config", config, f"HASHFILE:{hashfile}", "--launch-method",
           "forkserver", "--show-stderr", *machine]
    for name in envs:
        run += ["-E", name]
    if not args.full:
        run.append("--quick")
    for pattern in args.bench or ([] if args.full else [HEADLINE]):
        run += ["--bench", pattern]
    if not args.rerun:
        run.append("--skip-existing")
    print(f"history of {len(commits)} commit(s) of {args.rev} ({commits[-1][:8]}..{commits[0][:8]}), "
          f"{'full' if args.full else 'quick'} mode, environment(s): {', '.join(envs)}", flush=True)
    rc = _run(run, env)
    # asv run exits non-zero when a benchmark failed; publish what there is all the same
    html_dir = args.html_dir
    publish = ["asv", "publish", "--config", config] + (["--html-dir", html_dir] if html_dir else [])
    prc = _run(publish, env)
    if prc:
        return prc
    if html_dir is None:
        from asv import util
        html_dir = util.load_json(config, js_comments=True).get("html_dir", "html")
    remaining = localize_html(html_dir)
    elapsed = time.perf_counter() - start
    print(f"\nhistory published to {html_dir}/index.html in {elapsed / 60:.1f} min"
          + (f" (asv run exit status {rc})" if rc else ""))
    print("open it: asv preview  (or: python -m http.server -d " + html_dir + ")")
    if remaining:
        print("the pages load these from the network (install Debian's libjs-* packages to make "
              "them local): " + ", ".join(remaining))
    return 0


def add_parser(sub) -> None:
    h = sub.add_parser(
        "history", help="asv performance history of the last N commits (asv run + asv publish)",
        description="Build the asv performance history of the last N commits and publish it as "
                    "HTML.  Run from the repository's top directory.  Quick mode (default): the "
                    "headline benchmarks at this CPU's default ISA level, one sample each.")
    h.add_argument("--commits", type=int, default=10, help="how many commits (default 10)")
    h.add_argument("--rev", default="HEAD", help="the last commit (default HEAD); earlier ones "
                   "follow its first parents")
    h.add_argument("--full", action="store_true",
                   help="every benchmark, every ISA level of the matrix, asv's full sampling")
    h.add_argument("--isa", action="append",
                   help="time under this ISA level (repeatable; 'all' for the whole matrix)")
    h.add_argument("--bench", action="append", help="benchmarks matching this regex instead of "
                   "the headline set (asv --bench; repeatable)")
    h.add_argument("--rerun", action="store_true",
                   help="run commits that already have results on this machine again")
    h.add_argument("--machine", help="asv machine name (default: this host's asv machine)")
    h.add_argument("--config", default="asv.conf.json", help="asv config (default asv.conf.json)")
    h.add_argument("--html-dir", help="where to publish (default: the config's html_dir)")


__all__ = ["add_parser", "cmd_history", "localize_html", "last_commits", "environment_names"]
