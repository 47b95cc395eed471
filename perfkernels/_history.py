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


# --- the published pages: what asv cannot show by itself ---------------------------------------

#: The graphs a reader sees first, in this order: the ratios, then the times behind them.
FIRST = ("headline.", ".track_time_ratio_vs_torch", ".track_seconds_", ".track_ratio_spread")
#: The headline graphs whose unit is a ratio to PyTorch's time (a line is drawn at 1 on them).
RATIO_BENCHMARK = re.compile(r"^headline\.\w+\.track_time_ratio_vs_torch(_1thread)?$")

#: Loaded after asv's scripts: wraps flot's $.plot so that every graph of a ratio to PyTorch has
#: a line at 1 (parity) kept in view, the main graph's commit axis is labelled with commit hashes,
#: every headline graph says which way is better (its box in the grid, its y axis), and the grid's
#: headline boxes draw points as well as lines (a history of one commit is one point).
READING_JS = r"""/* perfkernels: how to read the history (written by `python -m perfkernels history`). */
(function ($) {
    var RATIO = /PyTorch's time/, PARITY = {yaxis: {from: 1, to: 1}, color: "#222", lineWidth: 1};
    function benchmarkOf(placeholder) {
        var box = $(placeholder).closest('.benchmark-plot[id^="summarygrid-"]');
        if (box.length) return box.attr("id").slice("summarygrid-".length);
        if ($(placeholder).is("#main-graph, #overview"))
            return decodeURIComponent(window.location.hash.slice(1)).split("?")[0];
        return null;
    }
    function yRange(data) {
        var lo = Infinity, hi = -Infinity;
        $.each(data, function (i, series) {
            $.each(series.data || series, function (j, p) {
                if (p && p[1] !== null && isFinite(p[1])) { lo = Math.min(lo, p[1]); hi = Math.max(hi, p[1]); }
            });
        });
        return [lo, hi];
    }
    var plot = $.plot;
    $.plot = function (placeholder, data, options) {
        var name = benchmarkOf(placeholder), json = $.asv && $.asv.main_json;
        var bm = name && json && json.benchmarks[name];
        options = options || {};
        if (bm && RATIO.test(bm.unit || "")) {
            options.grid = options.grid || {};
            options.grid.markings = (options.grid.markings || []).concat([PARITY]);
            options.yaxis = options.yaxis || {};
            var r = yRange(data), y = options.yaxis;      // keep the parity line in view
            if (Math.max(y.max == null ? r[1] : y.max, r[1]) < 1.1) y.max = 1.1;
            if (Math.min(y.min == null ? r[0] : y.min, r[0]) > 0.9) y.min = 0.9;
            if (isFinite(r[0]) && isFinite(r[1])) {        // and no point on the frame's edge
                var lo = y.min == null ? r[0] : Math.min(y.min, r[0]);
                var hi = y.max == null ? r[1] : Math.max(y.max, r[1]);
                var pad = 0.05 * Math.max(hi - lo, 0.1);
                y.min = Math.max(0, Math.min(lo, r[0] - pad));
                y.max = Math.max(hi, r[1] + pad);
            }
        }
        var headline = bm && /^headline\./.test(name);
        if (headline && $(placeholder).closest('.benchmark-plot[id^="summarygrid-"]').length) {
            options.series = options.series || {};        // a single commit's point shows too
            options.series.points = {show: true, radius: 2, lineWidth: 1};
            options.yaxis = options.yaxis || {};          // and not on the frame's top edge
            options.yaxis.max = Math.max(options.yaxis.max == null ? 0 : options.yaxis.max,
                                         yRange(data)[1] * 1.15);
            var box = $(placeholder).parent();
            if (!box.find(".pk-reading").length) {
                box.css("position", "relative").append(
                    $('<div class="pk-reading" style="position: absolute; right: 8px; bottom: 6px; '
                      + 'font-size: 11px; color: #333; background: rgba(255,255,255,0.8)">')
                    .text((RATIO.test(bm.unit) ? "our time / PyTorch's, 1 = parity: " : "")
                          + "lower is better"));
            }
        }
        if (headline && $(placeholder).is("#main-graph")) {
            options.series = options.series || {};        // a lone point as a filled dot
            options.series.points = $.extend({}, options.series.points,
                                             {show: true, radius: 4, fill: true, fillColor: false});
        }
        if (headline && $(placeholder).is("#main-graph") && options.yaxis
                && !/lower is better/.test(options.yaxis.axisLabel || "")) {
            options.yaxis.axisLabel = (options.yaxis.axisLabel || "") + " (lower is better)";
        }
        if (bm && $(placeholder).is("#main-graph") && options.xaxis && options.xaxis.mode !== "time") {
            var revs = [];
            $.each(data, function (i, series) {
                $.each(series.data || series, function (j, p) { if (p && revs.indexOf(p[0]) < 0) revs.push(p[0]); });
            });
            revs.sort(function (a, b) { return a - b; });
            var step = Math.max(1, Math.ceil(revs.length / 8));
            options.xaxis.ticks = revs.filter(function (v, i) { return i % step === 0; });
            options.xaxis.tickFormatter = function (v) {
                var hash = json.revision_to_hash[Math.round(v)];
                return hash ? hash.slice(0, 8) : "";
            };
            options.xaxis.axisLabel = "commit";
        }
        return plot.call(this, placeholder, data, options);
    };
    $.extend($.plot, plot);
})(jQuery);
"""


def _has_values(path: Path) -> bool:
    """Whether an asv graph file holds at least one finite value."""
    try:
        points = json.loads(path.read_text())
    except (OSError, ValueError):
        return False

    def finite(v):
        if isinstance(v, list):
            return any(finite(x) for x in v)
        return isinstance(v, (int, float)) and v == v and abs(v) != float("inf")
    return any(finite(p[1:]) for p in points if isinstance(p, list))


def order_and_prune(html_dir: str | os.PathLike) -> list[str]:
    """Keep in the published index only the benchmarks that have a value to draw, the headline
    graphs first (ratios, then times, then spreads); return the names kept, in order.

    asv's grid and list show every benchmark of the suite, grouped in the order of index.json,
    which is alphabetical: the headline group came last, after boxes with nothing in them."""
    html_dir = Path(html_dir)
    index = json.loads((html_dir / "index.json").read_text())
    summary = html_dir / "graphs" / "summary"
    kept = [n for n in index["benchmarks"] if _has_values(summary / f"{n}.json")]

    def rank(name):
        headline = name.startswith(FIRST[0])
        kind = next((i for i, part in enumerate(FIRST[1:]) if part in name), len(FIRST))
        return (not headline, kind if headline else 0, name)
    kept.sort(key=rank)
    index["benchmarks"] = {n: index["benchmarks"][n] for n in kept}
    (html_dir / "index.json").write_text(json.dumps(index))
    return kept


def finish_html(html_dir: str | os.PathLike, results_dir: str | os.PathLike) -> list[str]:
    """Everything ``history`` adds to ``asv publish``'s pages: local libraries
    (:func:`localize_html`), the index pruned and ordered (:func:`order_and_prune`), the reading
    aids (parity line, commit hashes, "lower is better": ``READING_JS``) and ``summary.html``, the
    latest ratios per machine class with links to the graphs, linked from the navigation bar.
    Returns the CDN addresses the pages still load."""
    html_dir = Path(html_dir)
    remaining = localize_html(html_dir)
    order_and_prune(html_dir)
    (html_dir / "perfkernels-history.js").write_text(READING_JS, encoding="utf-8")
    (html_dir / "summary.html").write_text(summary_html(results_dir), encoding="utf-8")
    index = html_dir / "index.html"
    text = index.read_text(encoding="utf-8")
    if "perfkernels-history.js" not in text:
        text = text.replace("</head>", '    <script src="perfkernels-history.js"></script>\n  </head>', 1)
        text = re.sub(r'(<li id="nav-li-regressions">.*?</li>)',
                      r'\1\n\t<li id="nav-li-perfkernels-summary"><a href="summary.html">'
                      r'Latest ratios (how to read)</a></li>', text, count=1)
        index.write_text(text, encoding="utf-8")
    return remaining


# --- the latest ratios, per machine class ---------------------------------------------------------

def _level_rank(level: str) -> int:
    from . import _registry
    return _registry.NAMES.index(level) if level in _registry.NAMES else -1


def latest_points(results_dir: str | os.PathLike) -> list[dict]:
    """The newest result of every machine and ISA level (by commit date), highest level first, as
    rows: machine, cpu, level, commit, date, the commit measured when the result sits on a merge,
    and per headline benchmark and parameters its value (None: refused or failed)."""
    rows = []
    for machine_json in sorted(Path(results_dir).glob("*/machine.json")):
        machine = json.loads(machine_json.read_text())
        newest = {}
        for path in _result_files(results_dir, machine_json.parent.name):
            data = json.loads(path.read_text())
            level = data.get("env_vars", {}).get("PERFKERNELS_ISA", "default")
            if level not in newest or data.get("date", 0) > newest[level].get("date", 0):
                newest[level] = data
        # the highest level first: the one a user's call dispatches to on this machine class
        for level, data in sorted(newest.items(), key=lambda item: -_level_rank(item[0])):
            columns = data.get("result_columns", ["result", "params"])
            values = {}
            for name, row in data.get("results", {}).items():
                if not name.startswith("headline."):
                    continue
                row = dict(zip(columns, row))
                combos = list(itertools.product(*row["params"])) if row.get("params") else [()]
                results = (row["result"] if isinstance(row["result"], list)
                           else [row["result"]] * len(combos))     # None: every combination failed
                for value, combo in zip(results, combos):
                    values[name, combo] = value
            rows.append({"machine": machine.get("machine", machine_json.parent.name),
                         "cpu": machine.get("cpu", ""), "level": level,
                         "commit": data["commit_hash"], "date": data.get("date"),
                         "measured_at": data.get("measured_at"),
                         "values": values})
    return rows


def _ratio_table(row: dict) -> list[tuple]:
    """(class, params, graph name, ratio, ratio at 1 thread, spread, spread at 1 thread) of a
    latest_points row."""
    out = []
    for (name, combo), value in sorted(row["values"].items()):
        if not RATIO_BENCHMARK.match(name) or name.endswith("_1thread"):
            continue
        cls = name.split(".")[1]
        base = name.rsplit(".", 1)[0]
        one = row["values"].get((name + "_1thread", combo))
        spread = row["values"].get((base + ".track_ratio_spread", combo))
        spread1 = row["values"].get((base + ".track_ratio_spread_1thread", combo))
        out.append((cls, ", ".join(str(c).strip("'") for c in combo), name, value, one, spread,
                    spread1))
    return out


def _fmt(v: float | None, spec: str = ".3g") -> str:
    if v is None:
        return "refused"
    if v != v:
        return "skipped"
    return format(v, spec)


def summary_text(results_dir) -> str:
    """The latest ratios per machine class and level, as plain text (what ``history`` prints)."""
    lines = ["latest headline points (our time / PyTorch's: below 1 we are faster; lower is better)"]
    for row in latest_points(results_dir):
        date = time.strftime("%Y-%m-%d", time.gmtime(row["date"] / 1000)) if row["date"] else "?"
        where = row["commit"][:8] + (f", measured at {row['measured_at'][:8]}"
                                     if row["measured_at"] else "")
        lines.append(f"\n{row['machine']} [{row['level']}] ({row['cpu']}) at {where} ({date})")
        lines.append(f"  {'benchmark':<18} {'params':<20} {'default':>9} {'1 thread':>9} "
                     f"{'spreads':>15}")
        for cls, params, _, ratio, one, spread, spread1 in _ratio_table(row):
            lines.append(f"  {cls:<18} {params:<20} {_fmt(ratio):>9} {_fmt(one):>9} "
                         f"{_fmt(spread, '.0%'):>7} {_fmt(spread1, '.0%'):>7}")
    return "\n".join(lines)


def summary_html(results_dir) -> str:
    """summary.html: how to read the history, and the latest ratios per machine class and ISA
    level, each with its commit and date and a link to its graph."""
    import html
    parts = ["""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>perfkernels: latest ratios to PyTorch</title>
<style>body{font-family:sans-serif;margin:2em;max-width:70em} table{border-collapse:collapse;margin-bottom:2em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right} td:first-child,td:nth-child(2),th{text-align:left}
.win{color:#060}.lose{color:#a00}</style></head><body>
<h1>perfkernels against PyTorch: the latest points</h1>
<p>Every number is <b>our time / PyTorch 2.13 CPU's time</b> for the same call on the same inputs:
<b>lower is better</b>, 1 is parity (the line drawn at 1 on the graphs), below 1 we are faster
(0.5: twice as fast). <i>default</i>: PyTorch at its default thread count and ours at ours, as a
user runs them; <i>1 thread</i>: both on one thread, kernel against kernel. Each is the median of
the per-round ratios of interleaved rounds; <i>spread</i> is (q75 - q25) / median of those
rounds. A point whose rounds did not settle is <i>refused</i> and drawn as a gap, never as a value.
The graphs: <a href="index.html">benchmark grid</a> (the headline graphs first; hover a point for
its commit, the x axis is labelled with commit hashes). A machine class is its CPU family, core
count and highest ISA level: AVX2-only and AVX-512 machines are separate lines.</p>
"""]
    rows = latest_points(results_dir)
    if not rows:
        parts.append("<p>No results yet.</p>")
    for row in rows:
        date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(row["date"] / 1000)) if row["date"] else "?"
        parts.append(f"<h2>{html.escape(row['machine'])}, level {html.escape(row['level'])}</h2>"
                     f"<p>{html.escape(row['cpu'])}; commit <code>{row['commit'][:8]}</code> "
                     f"({date})" + (f", measured at <code>{row['measured_at'][:8]}</code> (a "
                                   "side branch's commit, merged here)" if row["measured_at"]
                                   else "") + "</p>")
        parts.append("<table><tr><th>benchmark</th><th>parameters</th><th>default</th>"
                     "<th>1 thread</th><th>spread</th><th>spread, 1 thread</th><th>graph</th></tr>")
        for cls, params, name, ratio, one, spread, spread1 in _ratio_table(row):
            link = (f"index.html#{name}?machine={row['machine']}"
                    f"&env-PERFKERNELS_ISA={row['level']}")
            cells = []
            for v in (ratio, one):
                cls_ = "" if v is None or v != v else (' class="win"' if v < 1 else ' class="lose"')
                cells.append(f"<td{cls_}>{_fmt(v)}</td>")
            parts.append(f"<tr><td>{html.escape(cls)}</td><td>{html.escape(params)}</td>"
                         + "".join(cells) + f"<td>{_fmt(spread, '.0%')}</td>"
                         f"<td>{_fmt(spread1, '.0%')}</td>"
                         f'<td><a href="{html.escape(link)}">graph</a></td></tr>')
        parts.append("</table>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


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


def _result_files(results_dir: str | os.PathLike, machine: str) -> list[Path]:
    folder = Path(results_dir) / machine
    return sorted(p for p in folder.glob("*.json") if p.name != "machine.json")


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


def cmd_history(args) -> int:
    """The ``history`` subcommand (see :func:`add_parser`)."""
    start = time.perf_counter()
    config = args.config
    if not os.path.isfile(config):
        raise SystemExit(f"error: {config} not found: run this from the repository's top directory "
                         "(a git checkout of perfkernels), or pass --config")
    if shutil.which("asv") is None:
        raise SystemExit("error: asv is not installed: pip install asv")
    from asv import util
    conf = util.load_json(config, js_comments=True)
    results_dir = os.path.join(os.path.dirname(os.path.abspath(config)),
                               conf.get("results_dir", "results"))
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
           "order_and_prune", "latest_points", "summary_text", "summary_html", "commits_behind",
           "newest_result", "first_parent_home", "refused_points"]
