"""The published pages of ``python -m perfkernels history``: what ``asv publish`` cannot show by
itself (docs/performance.md).

Result staging and the asv runs are in :mod:`perfkernels._history`; this module only turns a
published asv site into the pages a reader opens: the libraries asv loads from CDNs made local
where Debian's copies are installed (:func:`localize_html`), the index pruned to benchmarks with
values and ordered headline first (:func:`order_and_prune`), the reading aids of
``_history_reading.js`` (a parity line on every ratio graph, commit hashes on the commit axis,
"lower is better" on every headline graph) and ``summary.html``, the latest ratios per machine
class (:func:`summary_html`).  The grid's one line per benchmark is redrawn from one machine class
and ISA level (:func:`consistent_summaries`): asv's own averages whatever results a commit has,
across machines and levels, and draws a change of machine as a jump.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import re
import shutil
import time
from pathlib import Path

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


# --- the published pages: what asv cannot show by itself ---------------------------------------

#: The graphs a reader sees first, in this order: the ratios, then the times behind them.
FIRST = ("headline.", ".track_time_ratio_vs_torch", ".track_seconds_", ".track_ratio_spread")
#: The headline graphs whose unit is a ratio to PyTorch's time (a line is drawn at 1 on them).
RATIO_BENCHMARK = re.compile(r"^headline\.\w+\.track_time_ratio_vs_torch(_1thread)?$")

#: Loaded after asv's scripts: wraps flot's $.plot so that every graph of a ratio to PyTorch has
#: a line at 1 (parity) kept in view, the main graph's commit axis is labelled with commit hashes,
#: every headline graph says which way is better (its box in the grid, its y axis), and the grid's
#: headline boxes draw points as well as lines (a history of one commit is one point).
READING_JS = Path(__file__).with_name("_history_reading.js")


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
    aids (parity line, commit hashes, "lower is better": ``_history_reading.js``) and ``summary.html``, the
    latest ratios per machine class with links to the graphs, linked from the navigation bar.
    Returns the CDN addresses the pages still load."""
    html_dir = Path(html_dir)
    remaining = localize_html(html_dir)
    sources = consistent_summaries(html_dir, results_dir)
    order_and_prune(html_dir)
    shutil.copyfile(READING_JS, html_dir / "perfkernels-history.js")
    (html_dir / "perfkernels-summary-sources.js").write_text(
        "window.PK_SUMMARY_SOURCES = " + json.dumps(sources, sort_keys=True) + ";\n",
        encoding="utf-8")
    (html_dir / "summary.html").write_text(summary_html(results_dir), encoding="utf-8")
    index = html_dir / "index.html"
    text = index.read_text(encoding="utf-8")
    if "perfkernels-history.js" not in text:
        text = text.replace("</head>", '    <script src="perfkernels-summary-sources.js"></script>\n'
                            '    <script src="perfkernels-history.js"></script>\n  </head>', 1)
        text = re.sub(r'(<li id="nav-li-regressions">.*?</li>)',
                      r'\1\n\t<li id="nav-li-perfkernels-summary"><a href="summary.html">'
                      r'Latest ratios (how to read)</a></li>', text, count=1)
        index.write_text(text, encoding="utf-8")
    return remaining


def _result_files(results_dir: str | os.PathLike, machine: str) -> list[Path]:
    folder = Path(results_dir) / machine
    return sorted(p for p in folder.glob("*.json") if p.name != "machine.json")


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and v == v and abs(v) != float("inf")


def _geometric_mean(values: list[float]) -> float:
    if min(values) <= 0:
        return 0.0 if min(values) == 0 else float("nan")
    return math.exp(sum(math.log(v) for v in values) / len(values))


# --- the grid's summary lines: one machine class and level each --------------------------------

def _result_rows(results_dir: str | os.PathLike):
    """Every benchmark row of every result file: (benchmark name, machine, level, commit, date,
    {parameter combination: value}); a value is None where refused or failed, NaN where skipped."""
    for machine_json in sorted(Path(results_dir).glob("*/machine.json")):
        machine = machine_json.parent.name
        for path in _result_files(results_dir, machine):
            data = json.loads(path.read_text())
            level = data.get("env_vars", {}).get("PERFKERNELS_ISA", "default")
            columns = data.get("result_columns", ["result", "params"])
            for name, row in data.get("results", {}).items():
                row = dict(zip(columns, row))
                combos = list(itertools.product(*row["params"])) if row.get("params") else [()]
                results = (row["result"] if isinstance(row["result"], list)
                           else [row["result"]] * len(combos))
                yield (name, machine, level, data["commit_hash"], data.get("date") or 0,
                       dict(zip(combos, results)))


def consistent_summaries(html_dir: str | os.PathLike,
                         results_dir: str | os.PathLike) -> dict[str, str]:
    """Redraw the grid's line of every benchmark (``graphs/summary/<name>.json``) from one
    machine class and one ISA level, and only from commits where every parameter combination of
    that series has a value; return, per benchmark, the ``"<machine>, level <level>"`` it shows.

    asv's own summary line is, per commit, the geometric mean of whatever series have a value
    there: every machine class and every ISA level at once.  A commit measured only on a slower
    machine, only at the scalar level, or with the fast combinations refused (the slow ones
    kept) then stands 5x or more above its neighbours: a jump that is no regression.  The line
    drawn instead follows the machine class of the newest result with a value (the history a
    reader checks), at that machine's highest level with a value (the one a user's call runs);
    the other machines and levels stay one click away, in the benchmark's own graph.  A commit
    with a refused combination is left out of the line (a gap), never averaged over the rest."""
    html_dir, summary_dir = Path(html_dir), Path(html_dir) / "graphs" / "summary"
    index = json.loads((html_dir / "index.json").read_text())
    revision = {h: int(r) for r, h in index.get("revision_to_hash", {}).items()}
    rows: dict[str, list[tuple]] = {}
    for name, *rest in _result_rows(results_dir):
        rows.setdefault(name, []).append(tuple(rest))
    sources = {}
    for name, entries in sorted(rows.items()):
        path = summary_dir / f"{name}.json"
        valued = [e for e in entries if e[2] in revision and any(_finite(v) for v in e[4].values())]
        if not path.is_file() or not valued:
            continue
        machine = max(valued, key=lambda e: (e[3], e[2]))[0]
        level = max((e[1] for e in valued if e[0] == machine), key=_level_rank)
        series = [e for e in entries if e[0] == machine and e[1] == level and e[2] in revision]
        # the combinations this series ever measured: a commit counts only with all of them
        wanted = {c for e in series for c, v in e[4].items() if _finite(v)}
        points = {}
        for _, _, commit, _, values in series:
            if all(_finite(values.get(c)) for c in wanted):
                points[revision[commit]] = _geometric_mean([values[c] for c in wanted])
        path.write_text(json.dumps(sorted([r, v] for r, v in points.items())))
        sources[name] = f"{machine}, level {level}"
    return sources


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


