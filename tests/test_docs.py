"""The documentation: every public name of ``perfkernels`` and ``perfkernels.torch`` has a
docstring with an example that runs and prints what it says, the API reference pages list every
one of them, the site builds with warnings as errors (slow), and the link checker of
``python -m perfkernels docs`` finds the broken links it must find."""
import doctest
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

import perfkernels
from perfkernels import _docs

ROOT = Path(__file__).resolve().parents[1]
torch = pytest.importorskip("torch")
import perfkernels.torch as pkt  # noqa: E402

PUBLIC = ([(perfkernels, n) for n in perfkernels.__all__]
          + [(pkt, n) for n in pkt.__all__])
IDS = [f"{m.__name__}.{n}" for m, n in PUBLIC]


@pytest.mark.parametrize("module, name", PUBLIC, ids=IDS)
def test_public_name_has_an_example_that_runs(module, name):
    obj = getattr(module, name)
    doc = inspect.getdoc(obj) or ""
    assert len(doc) > 40, f"{module.__name__}.{name}: no docstring"
    tests = [t for t in doctest.DocTestFinder(recurse=False).find(
        obj, f"{module.__name__}.{name}", globs={}) if t.examples]
    assert tests, f"{module.__name__}.{name}: no example (a >>> block) in its docstring"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = []
    for t in tests:
        runner.run(t, out=report.append)
    assert runner.failures == 0, "".join(report)


@pytest.mark.parametrize("module, name", [(m, n) for m, n in PUBLIC if not inspect.isclass(
    getattr(m, n)) and "Raises" not in (inspect.getdoc(getattr(m, n)) or "")],
    ids=lambda v: v if isinstance(v, str) else "")
def test_public_functions_without_a_raises_section_say_what_they_raise(module, name):
    """A function's errors are documented: a Raises section, or the exception named in the
    text (the torch layer's functions raise torch's exceptions and say so in prose)."""
    doc = inspect.getdoc(getattr(module, name)) or ""
    takes_input = len(inspect.signature(getattr(module, name)).parameters) > 0
    if takes_input:
        assert re.search(r"\b\w*(Error|Exception)\b|raises|nothing", doc), \
            f"{module.__name__}.{name}: its docstring names no exception"


def test_api_reference_pages_list_every_public_name():
    text = "\n".join(p.read_text() for p in (ROOT / "docs" / "api").glob("*.rst"))
    listed = set(re.findall(r"^\.\. auto(?:function|class):: (\S+)", text, re.M))
    assert set(_docs.public_names()) <= listed, sorted(set(_docs.public_names()) - listed)
    assert listed <= set(_docs.public_names()), sorted(listed - set(_docs.public_names()))


def test_every_example_and_guide_has_a_page():
    index = (ROOT / "docs" / "index.md").read_text()
    for guide in (ROOT / "docs").glob("*.md"):
        if guide.name != "index.md":
            assert re.search(rf"^{re.escape(guide.stem)}$", index, re.M), guide.name
    pages = {p.read_text() for p in (ROOT / "docs" / "examples").glob("*.md")}
    for example in list((ROOT / "examples").glob("*.py")) + [ROOT / "examples" / "deploy"]:
        rel = example.relative_to(ROOT).as_posix()
        assert any(rel in page for page in pages), f"{rel} has no page in docs/examples/"
    for page in (ROOT / "docs" / "examples").glob("*.md"):
        assert f"examples/{page.stem}" in index, page.name


def test_link_checker_finds_missing_pages_and_anchors(tmp_path):
    (tmp_path / "api").mkdir()
    (tmp_path / "index.html").write_text(
        '<h1 id="top">x</h1><a href="guide.html#usage">ok</a> <a href="#top">ok</a>'
        '<a href="guide.html#nowhere">bad anchor</a> <a href="gone.html">bad page</a>'
        '<a href="https://example.org/x.html">external</a> <a href="api/">dir</a>')
    (tmp_path / "guide.html").write_text('<section id="usage"></section><a href="index.html">up</a>')
    (tmp_path / "api" / "index.html").write_text(
        '<dt id="perfkernels.embedding_bag"></dt><a href="../index.html#top">up</a>')
    assert sorted(_docs.broken_links(tmp_path)) == [
        "index.html: gone.html (no such file)", "index.html: guide.html#nowhere (no such anchor)"]
    assert _docs.undocumented(tmp_path, ["perfkernels.embedding_bag", "perfkernels.lstm_unit"]) \
        == ["perfkernels.lstm_unit"]


@pytest.mark.slow
@pytest.mark.skipif(any(importlib.util.find_spec(m) is None
                        for m in ("sphinx", "myst_parser", "furo")),
                    reason='the docs extra is not installed (pip install ".[docs]")')
def test_site_builds_with_warnings_as_errors_and_resolves(tmp_path, capsys):
    """What CI's docs step runs: `python -m perfkernels docs` (about 40 s)."""
    from perfkernels.__main__ import main
    rc = main(["docs", "--out", str(tmp_path / "html")])
    out = capsys.readouterr()
    assert rc == 0, out.out[-3000:] + out.err[-5000:]
    assert _docs.undocumented(tmp_path / "html") == []
    assert _docs.broken_links(tmp_path / "html") == []
    api = (tmp_path / "html" / "api" / "perfkernels-torch.html").read_text()
    assert 'id="perfkernels.torch.convert"' in api and "Examples" in api
