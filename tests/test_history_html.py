"""The published performance history, opened in a real browser.

`asv publish` turns the committed results (benchmarks/results/) into HTML, finished the way
`python -m perfkernels history` finishes it; this serves it over HTTP, opens it in headless
Chromium driven over the DevTools protocol (a pipe, no extra Python package), and asserts from the
live page what a reader sees:

- the first screen of the grid is the headline group, every box on it drawn with data points
  (flot's series hold finite points, the canvases have coloured pixels);
- each headline graph draws its points, says "lower is better" on its y axis, labels its commit
  axis with commit hashes and, where the unit is a ratio to PyTorch, has a line at 1 in view;
- summary.html gives the latest ratios with links to the graphs;
- on a planted history (tests/history_planting.py) the Regressions page lists the planted
  slowdown and not the planted speed-up.

A screenshot of the first screen is written to pytest's temporary directory (never into the
repository).

Skipped, with the reason, where Chromium or asv is not installed or where the page libraries
asv loads from CDNs have no local copy (CI installs Debian's chromium and libjs-* packages).
"""
import fcntl
import functools
import http.server
import json
import os
import select
import shutil
import subprocess
import threading
import sys
import time
from pathlib import Path

import pytest

from perfkernels import _history

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

#: The ratio graphs a reader opens first: those of them with committed values must be published.
RATIO_GRAPHS = [f"headline.{cls}.track_time_ratio_vs_torch{mode}"
                for cls in ("DLRMEmbeddingBag", "DLRMQuantizedBag", "Conversion", "LSTMUnit")
                for mode in ("", "_1thread")]


def _skip(reason: str):
    """Skip, unless CI installed the browser and libraries (then a skip would hide a failure)."""
    if os.environ.get("PERFKERNELS_REQUIRE_BROWSER"):
        pytest.fail(f"PERFKERNELS_REQUIRE_BROWSER is set, but: {reason}")
    pytest.skip(reason)


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


class DevTools:
    """A minimal Chrome DevTools protocol client over ``--remote-debugging-pipe``: the browser
    reads NUL-terminated JSON commands on fd 3 and writes replies and events on fd 4."""

    def __init__(self, browser: str, profile: str):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def child_fds():
            # move both ends above 10 first, so that neither dup2 can clobber the other
            a = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", f"--user-data-dir={profile}",
             "--window-size=1400,1000", "--remote-debugging-pipe", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, pass_fds=(3, 4),
            preexec_fn=child_fds)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next_id = 0
        self._buffer = b""
        self.session = None

    def call(self, method: str, timeout: float = 30, **params):
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._next_id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply["result"]
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError(f"no reply to {method} in {timeout} s")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("the browser closed the pipe: "
                                   + self.proc.stderr.read().decode(errors="replace")[-2000:])
            self._buffer += chunk

    def open(self, url: str):
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable")
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30):
        """Poll ``expression`` in the page until it is truthy; return its last value."""
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.2)
        return value

    def close(self):
        """Closing the command pipe makes the browser exit; kill it if it does not."""
        os.close(self._to_browser)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._from_browser)
        self.proc.stderr.close()


#: JavaScript: a summary of the flot plot drawn into the element `el` (null until it is drawn):
#: its series' finite points and the coloured (non-grey) pixels of its canvas.
_PLOT_STATE = """
(function (el) {
    if (!el || !window.jQuery) return null;
    var plot = jQuery(el).data('plot');
    if (!plot) return null;
    var points = 0, series = plot.getData();
    for (var i = 0; i < series.length; i++) {
        var d = series[i].data;
        for (var j = 0; j < d.length; j++) {
            if (d[j] && d[j][1] !== null && isFinite(d[j][1])) points++;
        }
    }
    // a pixel of any series colour, pale ones included (grid, frame and parity line are grey)
    var canvas = plot.getCanvas(), px = canvas.getContext('2d')
        .getImageData(0, 0, canvas.width, canvas.height).data, coloured = 0;
    for (var k = 0; k < px.length; k += 4) {
        var r = px[k], g = px[k + 1], b = px[k + 2];
        if (px[k + 3] > 0 && Math.max(r, g, b) - Math.min(r, g, b) > 24) coloured++;
    }
    return {series: series.length, points: points, coloured: coloured};
})(%s)
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A folder served over HTTP: committed/ (the committed results published) and planted/html/
    (the planted history), both finished like ``history`` finishes them, libraries made local."""
    if shutil.which("asv") is None:
        _skip("asv is not installed (the [test] extra has it)")
    if not (RESULTS / "benchmarks.json").is_file():
        _skip(f"no committed asv results in {RESULTS}")
    if not (ROOT / ".git").exists():
        _skip("not a git checkout: asv publish needs the repository's history")
    root = tmp_path_factory.mktemp("site")
    html = root / "committed"
    cwd = os.getcwd()
    os.chdir(ROOT)              # publish works from the checkout's top, as `history` does
    try:
        rc, remaining = _history.publish("asv.conf.json", str(html))
    finally:
        os.chdir(cwd)
    assert rc == 0 and (html / "index.html").is_file()
    if remaining:
        _skip("the page libraries asv loads from CDNs have no local copy (apt-get install "
                    "libjs-jquery libghc-js-flot-data libjs-bootstrap libjs-jquery-stupidtable "
                    f"node-blueimp-md5): {', '.join(remaining)}")
    sys.path.insert(0, str(Path(__file__).parent))
    import history_planting
    (root / "planted").mkdir()
    planted = history_planting.plant(root / "planted")
    return root, planted


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        """A page navigated away mid-download (a broken pipe) is not an error of the test."""


@pytest.fixture(scope="module")
def browser(site, tmp_path_factory):
    path = _chromium()
    if path is None:
        _skip("Chromium is not installed (Debian: apt-get install chromium; CI installs it)")
    handler = functools.partial(_QuietHandler, directory=str(site[0]))
    server = _QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    tools = DevTools(path, str(tmp_path_factory.mktemp("chromium-profile")))
    try:
        tools.base = f"http://127.0.0.1:{server.server_port}"
        tools.open(f"{tools.base}/committed/index.html")
        yield tools
    finally:
        tools.close()
        server.shutdown()
        server.server_close()


def _goto(browser, url):
    browser.call("Page.navigate", url=url)
    assert browser.wait_for("document.readyState === 'complete' && !!window.jQuery "
                            "&& !!(jQuery.asv && jQuery.asv.main_json)"), \
        f"{url} did not load (a library failed: see error.html)"


#: JavaScript: the boxes of the grid wholly or partly on the first screen, with their plot states.
_FIRST_SCREEN = """
(function () {
    var out = [];
    jQuery('.benchmark-plot').each(function () {
        var r = this.getBoundingClientRect();
        if (r.bottom > 0 && r.top < window.innerHeight && r.width > 0)
            out.push({name: this.id.slice(12), state: %s});
    });
    return out;
})()
""" % (_PLOT_STATE % "this")


def test_first_screen_is_the_headline_graphs_all_drawn(browser, tmp_path):
    _goto(browser, f"{browser.base}/committed/index.html")
    first_group = browser.wait_for("jQuery('.benchmark-group h1').first().text()")
    assert first_group == "headline", first_group
    boxes = browser.wait_for(
        f"(function () {{ var b = {_FIRST_SCREEN}; return b.length && b.every(function (x) "
        "{ return x.state && x.state.points > 0 && x.state.coloured > 8; }) ? b : null; })()",
        timeout=60)
    shot = browser.call("Page.captureScreenshot", format="png")["data"]
    out = tmp_path / "asv-first-screen.png"
    out.write_bytes(__import__("base64").b64decode(shot))
    print(f"first screen: {out}")
    assert boxes, f"an empty box on the first screen: {browser.evaluate(_FIRST_SCREEN)}"
    assert all(b["name"].startswith("headline.") for b in boxes), boxes
    assert ".track_time_ratio_vs_torch" in boxes[0]["name"], boxes
    labels = browser.evaluate("jQuery('.pk-reading').map(function () { return jQuery(this).text(); })"
                              ".get()")
    assert len(labels) >= len(boxes) and all("lower is better" in t for t in labels), labels


def _published_headline(site):
    index = json.loads((site[0] / "committed" / "index.json").read_text())
    return [n for n in index["benchmarks"] if n.startswith("headline.")]


def test_every_ratio_graph_with_a_committed_value_is_published(site):
    published = _published_headline(site)
    valued = set()
    for path in RESULTS.glob("*/*.json"):
        if path.name in ("machine.json", "benchmarks.json"):
            continue
        for name, row in json.loads(path.read_text()).get("results", {}).items():
            values = row[0] if isinstance(row[0], list) else [row[0]]
            if any(isinstance(v, float) and v == v for v in values):
                valued.add(name)
    assert valued & set(RATIO_GRAPHS), "no headline ratio has a committed value"
    for name in RATIO_GRAPHS:
        assert (name in valued) == (name in published), name


def test_summary_page_draws_the_headline_plots(browser, site):
    _goto(browser, f"{browser.base}/committed/index.html")
    states = {}
    for name in _published_headline(site):
        el = f"document.getElementById('summarygrid-{name}')"
        assert browser.wait_for(f"!!{el}"), f"{name} is not on the summary page"
        # plots are drawn when they scroll into view
        browser.evaluate(f"{el}.scrollIntoView(); jQuery(window).trigger('scroll'); true")
        states[name] = browser.wait_for(_PLOT_STATE % el)
    for name, state in states.items():
        assert state, f"{name}: no plot drawn on the summary page"
        assert state["points"] >= 1, f"{name}: no data points: {state}"
        assert state["coloured"] > 8, f"{name}: nothing drawn: {state}"


#: JavaScript: how the main graph reads: its y axis label, range and parity line, its x ticks.
_READING = """
(function () {
    var plot = jQuery('#main-graph').data('plot'), o = plot.getOptions(), y = plot.getAxes().yaxis;
    var marks = (o.grid.markings || []).filter(function (m) {
        return m.yaxis && m.yaxis.from === 1 && m.yaxis.to === 1; });
    return {label: o.yaxis.axisLabel, ymin: y.min, ymax: y.max, parity: marks.length,
            ticks: plot.getAxes().xaxis.ticks.map(function (t) { return t.label; })};
})()
"""


def test_headline_graphs_render_and_say_how_to_read_them(browser, site, tmp_path):
    """Each published headline graph draws points, labels its commit axis with commit hashes, and
    a ratio graph says "lower is better" and has its parity line at 1 in view."""
    _goto(browser, f"{browser.base}/committed/index.html")
    el = "document.getElementById('main-graph')"
    for name in _published_headline(site):
        browser.evaluate(f"window.location.hash = {json.dumps(name)}; true")
        drawn = (f"(function () {{ var s = {_PLOT_STATE % el}; "
                 f"return s && s.points > 0 && jQuery('#title').text().indexOf({json.dumps(name)})"
                 " >= 0 ? s : null; })()")
        state = browser.wait_for(drawn)
        assert state, f"{name}: the graph page drew no data points"
        state = browser.wait_for(f"(function () {{ var s = {drawn}; "
                                 "return s && s.coloured > 20 ? s : null; })()", timeout=10) or state
        if state["coloured"] <= 20:
            shot = tmp_path / f"{name}.png"
            shot.write_bytes(__import__("base64").b64decode(
                browser.call("Page.captureScreenshot", format="png")["data"]))
            print(f"screenshot: {shot}")
        # one point alone is a small circle (~50 pixels); lines draw many more
        assert state["coloured"] > 20, f"{name}: the plot canvas has no coloured pixels: {state}"
        # the axis label and parity line are redrawn after the points: wait for this graph's
        # (a reading taken too early can still be the previous graph's)
        ratio = "time_ratio" in name
        deadline = time.monotonic() + 10
        reading = browser.evaluate(_READING)
        while (reading["parity"] == 1) != ratio and time.monotonic() < deadline:
            time.sleep(0.1)
            reading = browser.evaluate(_READING)
        hashes = [t for t in reading["ticks"] if t]
        assert hashes and all(len(t) == 8 and int(t, 16) >= 0 for t in hashes), (name, reading)
        assert "lower is better" in reading["label"], (name, reading)
        if "time_ratio" in name:
            assert reading["parity"] == 1 and reading["ymin"] <= 1 <= reading["ymax"], (name, reading)
        else:
            assert reading["parity"] == 0, (name, reading)


def test_summary_html_gives_the_latest_ratios_with_links(browser):
    browser.call("Page.navigate", url=f"{browser.base}/committed/summary.html")
    rows = browser.wait_for("document.readyState === 'complete' && "
                            "Array.from(document.querySelectorAll('tr')).slice(1).map("
                            "function (r) { return r.innerText; })")
    assert rows and any("DLRMEmbeddingBag" in r for r in rows), rows
    links = browser.evaluate("Array.from(document.querySelectorAll('a[href^=\"index.html#\"]'))"
                             ".map(function (a) { return a.getAttribute('href'); })")
    assert links and all("track_time_ratio_vs_torch" in a and "machine=" in a for a in links)
    assert "lower is better" in browser.evaluate("document.body.innerText")


def test_regressions_page_lists_the_planted_slowdown_not_the_speedup(browser, site):
    planted = site[1]
    _goto(browser, f"{browser.base}/planted/html/index.html#/regressions")
    text = browser.wait_for("(function () { var t = jQuery('#regressions-display').text(); "
                            "return t.indexOf('track_time_ratio') >= 0 ? t : null; })()")
    assert text and "DLRMEmbeddingBag.track_time_ratio_vs_torch" in text, text
    assert "LSTMUnit" not in text, text
    assert planted["slower"].split(".")[1] in text
