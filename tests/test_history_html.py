"""The published performance history, opened in a real browser.

`asv publish` turns the committed results (benchmarks/results/) into HTML; this serves it over HTTP,
opens it in headless Chromium driven over the DevTools protocol (a pipe, no extra Python package),
and asserts from the live page that the headline benchmarks' graphs were drawn with data points:
flot's series hold finite points and the plot canvases have coloured pixels.  A screenshot of the
summary page is written to pytest's temporary directory (never into the repository).

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
import time
from pathlib import Path

import pytest

from perfkernels import _history

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

#: The graphs a reader opens first: each must render with data points from the committed results.
HEADLINE_GRAPHS = [
    "headline.DLRMEmbeddingBag.track_speedup_vs_torch",
    "headline.DLRMEmbeddingBag.track_speedup_vs_torch_1thread",
    "headline.DLRMEmbeddingBag.time_perfkernels",
    "headline.DLRMQuantizedBag.track_speedup_vs_torch",
    "headline.Conversion.track_speedup_vs_torch",
    "headline.LSTMUnit.track_speedup_vs_torch",
]


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
    var canvas = plot.getCanvas(), px = canvas.getContext('2d')
        .getImageData(0, 0, canvas.width, canvas.height).data, coloured = 0;
    for (var k = 0; k < px.length; k += 4) {
        var r = px[k], g = px[k + 1], b = px[k + 2];
        if (px[k + 3] > 0 && Math.max(r, g, b) - Math.min(r, g, b) > 60) coloured++;
    }
    return {series: series.length, points: points, coloured: coloured};
})(%s)
"""


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """The committed results published with asv into a temporary folder, libraries made local."""
    if shutil.which("asv") is None:
        _skip("asv is not installed (the [test] extra has it)")
    if not (RESULTS / "benchmarks.json").is_file():
        _skip(f"no committed asv results in {RESULTS}")
    if not (ROOT / ".git").exists():
        _skip("not a git checkout: asv publish needs the repository's history")
    html = tmp_path_factory.mktemp("asv-html")
    proc = subprocess.run(["asv", "publish", "--html-dir", str(html)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (html / "index.html").is_file()
    remaining = _history.localize_html(html)
    if remaining:
        _skip("the page libraries asv loads from CDNs have no local copy (apt-get install "
                    "libjs-jquery libghc-js-flot-data libjs-bootstrap libjs-jquery-stupidtable "
                    f"node-blueimp-md5): {', '.join(remaining)}")
    return html


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser(published, tmp_path_factory):
    path = _chromium()
    if path is None:
        _skip("Chromium is not installed (Debian: apt-get install chromium; CI installs it)")
    handler = functools.partial(_QuietHandler, directory=str(published))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    tools = DevTools(path, str(tmp_path_factory.mktemp("chromium-profile")))
    try:
        tools.open(f"http://127.0.0.1:{server.server_port}/index.html")
        yield tools
    finally:
        tools.close()
        server.shutdown()
        server.server_close()


def test_summary_page_draws_the_headline_plots(browser, tmp_path):
    assert browser.wait_for("document.readyState === 'complete' && !!window.jQuery "
                            "&& !!(jQuery.asv && jQuery.asv.main_json)"), \
        "the summary page did not load (a library failed: see error.html)"
    states = {}
    for name in HEADLINE_GRAPHS:
        el = f"document.getElementById('summarygrid-{name}')"
        assert browser.wait_for(f"!!{el}"), f"{name} is not on the summary page"
        # plots are drawn when they scroll into view
        browser.evaluate(f"{el}.scrollIntoView(); jQuery(window).trigger('scroll'); true")
        states[name] = browser.wait_for(_PLOT_STATE % el)
    shot = browser.call("Page.captureScreenshot", format="png")["data"]
    out = tmp_path / "asv-summary.png"
    out.write_bytes(__import__("base64").b64decode(shot))
    print(f"summary page screenshot: {out}")
    for name, state in states.items():
        assert state, f"{name}: no plot drawn on the summary page"
        assert state["points"] >= 1, f"{name}: no data points: {state}"
        if state["points"] >= 2:      # thumbnails draw lines only: one point alone is invisible
            assert state["coloured"] > 20, f"{name}: no line drawn: {state}"


@pytest.mark.parametrize("name", HEADLINE_GRAPHS)
def test_headline_graph_renders_with_data_points(browser, name):
    browser.evaluate(f"window.location.hash = {json.dumps(name)}; true")
    el = "document.getElementById('main-graph')"
    state = browser.wait_for(
        f"(function () {{ var s = {_PLOT_STATE % el}; "
        f"return s && s.points > 0 && jQuery('#title').text().indexOf({json.dumps(name)}) >= 0"
        f" ? s : null; }})()")
    assert state, f"{name}: the graph page drew no data points"
    assert state["coloured"] > 50, f"{name}: the plot canvas has no coloured pixels: {state}"
