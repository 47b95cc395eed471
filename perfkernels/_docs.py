"""``python -m perfkernels docs``: build the documentation site with Sphinx, from a checkout.

The site's sources are ``docs/`` (``docs/conf.py``, ``docs/index.md``, the API reference in
``docs/api/``, the Markdown guides, a page per example in ``docs/examples/``).  The build treats
every warning as an error (``-W --keep-going``) and checks cross-references (``-n``); then two
checks Sphinx does not make: every public name of ``perfkernels`` and ``perfkernels.torch``
(their ``__all__``) has its entry in the API reference (:func:`undocumented`), and every link
inside the site leads to a page and an anchor that exist (:func:`broken_links`; Sphinx's own
``linkcheck`` needs the network and checks only external links well).
"""
from __future__ import annotations

import argparse
import html.parser
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

#: The extra that installs what the build needs (``pip install ".[docs]"``).
EXTRA = "docs"


def source_dir() -> Path:
    """The ``docs/`` folder of the checkout: the current directory's, else the one beside this
    package's source (an in-place or editable build)."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[1]):
        if (root / "docs" / "conf.py").is_file():
            return root / "docs"
    raise SystemExit("error: no docs/conf.py here: run `python -m perfkernels docs` from the "
                     "root of a perfkernels checkout")


def public_names() -> list[str]:
    """The qualified public names the API reference must document: ``perfkernels.__all__`` and
    ``perfkernels.torch.__all__`` (the torch layer only where PyTorch is installed)."""
    import perfkernels
    names = [f"perfkernels.{n}" for n in perfkernels.__all__]
    try:
        import perfkernels.torch as pkt
    except ImportError:
        return names
    return names + [f"perfkernels.torch.{n}" for n in pkt.__all__]


class _Page(html.parser.HTMLParser):
    """The anchors (``id`` and ``<a name>``) and the link targets (``href``) of one page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("name"):
            self.ids.add(attrs["name"])
        if tag in ("a", "link") and attrs.get("href") is not None:
            self.hrefs.append(attrs["href"])


def _pages(html_dir: Path) -> dict[Path, _Page]:
    pages = {}
    for path in sorted(html_dir.rglob("*.html")):
        page = _Page()
        page.feed(path.read_text(encoding="utf-8", errors="replace"))
        pages[path.resolve()] = page
    return pages


def broken_links(html_dir: str | os.PathLike) -> list[str]:
    """Every link between the site's own pages that leads nowhere, as ``"page: href"``: a file
    that does not exist, or an anchor (``#...``) that the target page does not define.  External
    links (with a scheme, or ``//host``) are not followed."""
    html_dir = Path(html_dir).resolve()
    pages = _pages(html_dir)
    broken = []
    for path, page in pages.items():
        for href in page.hrefs:
            parts = urlsplit(href)
            if parts.scheme or parts.netloc or href.startswith("//"):
                continue
            target = path if not parts.path else (path.parent / unquote(parts.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            rel = path.relative_to(html_dir)
            if not target.exists():
                broken.append(f"{rel}: {href} (no such file)")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _pages(target.parent)[target].ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{rel}: {href} (no such anchor)")
    return broken


def undocumented(html_dir: str | os.PathLike, names: list[str] | None = None) -> list[str]:
    """The public names (default :func:`public_names`) with no entry of their own in the built
    API reference: no element of ``api/*.html`` has the name as its ``id``."""
    ids: set[str] = set()
    for page in _pages(Path(html_dir) / "api").values():
        ids |= page.ids
    return [n for n in (public_names() if names is None else names) if n not in ids]


def build(out: str | os.PathLike, *, strict: bool = True) -> int:
    """Run Sphinx on :func:`source_dir` into ``out`` (HTML); ``strict``: warnings are errors
    (``-W --keep-going``) and cross-references are checked (``-n``).  Returns its exit status."""
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-E"]    # -E: every page read again
    if strict:
        cmd += ["-W", "--keep-going", "-n"]
    return subprocess.call(cmd + [str(source_dir()), str(out)])


def cmd_docs(args) -> int:
    try:
        import furo  # noqa: F401
        import myst_parser  # noqa: F401
        import sphinx  # noqa: F401
    except ImportError as exc:
        raise SystemExit(f"error: {exc.name} is not installed: pip install \".[{EXTRA}]\"")
    out = Path(args.out or source_dir() / "_build" / "html").resolve()
    start = time.perf_counter()
    rc = build(out, strict=not args.no_strict)
    if rc:
        print(f"error: the Sphinx build failed (exit status {rc}); its warnings are above",
              file=sys.stderr)
        return rc
    problems = [f"not in the API reference: {n}" for n in undocumented(out)]
    problems += [f"broken link: {b}" for b in broken_links(out)]
    for p in problems:
        print("error: " + p, file=sys.stderr)
    print(f"documentation built in {time.perf_counter() - start:.0f} s: {out / 'index.html'}")
    return 1 if problems else 0


def add_parser(sub) -> None:
    d = sub.add_parser("docs", help="build the documentation site (Sphinx) from a checkout",
                       description="Build the documentation site (API reference, guides, "
                                   "examples) from docs/ with Sphinx, warnings as errors, then "
                                   "check that every public name is documented and every "
                                   "internal link resolves.  Needs pip install \".[docs]\".")
    d.add_argument("--out", help="output folder (default: docs/_build/html)")
    d.add_argument("--no-strict", action="store_true",
                   help="let warnings pass (a quick local look; CI builds strictly)")


__all__ = ["source_dir", "public_names", "broken_links", "undocumented", "build", "cmd_docs",
           "add_parser"]


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command", required=True))
    sys.exit(cmd_docs(parser.parse_args()))
