"""Everything in the repository is written here: no tracked file carries another project's
copyright or licence header, or says that it (or a part of it) was taken over from another
project's source.  Facts from other projects (a model's architecture, the operations its forward
runs, the behaviours a test suite checks) are fine; their code and text are not.

The check reads every tracked text file line by line and reports each line that matches one of
the patterns below, unless the line is on the short allow-list of lines that explain the rule.
The last tests plant such lines in temporary files to show that the check catches them.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: (why, pattern), matched case-insensitively against each line
PATTERNS = [
    ("copyright header", re.compile(
        r"\bcopyright\b\s*($|\(c\)|\u00a9|\d{4}|by\b|holders?\b|notice\b)", re.I)),
    ("copyright header", re.compile(r"\ball rights reserved\b", re.I)),
    ("licence header", re.compile(r"\bSPDX-License-Identifier\b", re.I)),
    ("licence header", re.compile(r"\blicensed under\b", re.I)),
    ("licence text", re.compile(r"\bpermission is hereby granted, free of charge\b", re.I)),
    ("licence text", re.compile(r"\bredistribution and use in source and binary forms\b", re.I)),
    # the words ported, copied or adapted, then "from" and a repository, a URL or a named project
    ("copied from another project", re.compile(
        r"\b(ported|copied|adapted|transcribed|translated|lifted|taken)\s+(verbatim\s+|here\s+)?"
        r"from\s+(https?://|github|[\w.-]+/[\w.-]+|(pytorch|torch|torchrec|fbgemm|"
        r"facebookresearch|tensorflow|jax|numpy|scipy)\b)", re.I)),
    ("copied from another project", re.compile(r"\ba port of\b", re.I)),
    ("copied from another project", re.compile(r"\b(faithful|verbatim|exact)\s+copy\b", re.I)),
    ("copied from another project", re.compile(r"\bcopied (here|verbatim)\b", re.I)),
]

#: Lines allowed to match, each (path, the stripped line): lines that explain the rule.  Kept
#: short; every entry must still be in its file (test_allow_list_is_current).
ALLOWED: set[tuple[str, str]] = set()

#: The project's own name: a copyright line naming it is ours
OWN = "perfkernels"


def findings(path: Path, rel: str) -> list[tuple[str, int, str, str]]:
    """(rel, line number, why, line) of each line of ``path`` that matches a pattern and is not
    allowed; [] for a binary file."""
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return []
    out = []
    for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        for why, pattern in PATTERNS:
            if pattern.search(line) is None:
                continue
            if why.startswith("copyright") and OWN in line.lower():
                continue
            if (rel, line.strip()) in ALLOWED:
                continue
            out.append((rel, number, why, line.strip()[:160]))
            break
    return out


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    proc = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, timeout=60)
    if proc.returncode != 0:
        pytest.skip(f"git ls-files failed: {proc.stderr.decode(errors='replace').strip()}")
    return [p for p in proc.stdout.decode().split("\0") if p]


def test_no_tracked_file_is_another_projects_work():
    found = []
    for rel in tracked_files():
        path = ROOT / rel
        if path.is_file() and not path.is_symlink():
            found += findings(path, rel)
    assert not found, "lines saying a file is another project's work (copyright or licence " \
        "header, copied or ported code); write it here and keep only the facts:\n" + \
        "\n".join(f"  {rel}:{n}: {why}: {line}" for rel, n, why, line in found)


def test_allow_list_is_current():
    for rel, line in ALLOWED:
        text = (ROOT / rel).read_text(encoding="utf-8")
        assert line in [x.strip() for x in text.splitlines()], (rel, line)


# --------------------------------------------------------------------------- the check can fail
# The planted lines are assembled from pieces so that this file itself does not match.

C = "Copy" + "right"
PLANTED = [
    ("copyright header", f"# {C} (c) Meta Platforms, Inc. and affiliates."),
    ("copyright header", f"/* {C} 2019 The TensorFlow Authors. */"),
    ("copyright header", "All rights " + "reserved."),
    ("copyright header", "(tests of the nn module; BSD-3-Clause, " + C),
    ("copyright header", f"THIS SOFTWARE IS PROVIDED BY THE {C.upper()} HOLDERS AND CONTRIBUTORS"),
    ("licence header", "// SPDX-" + "License-Identifier: BSD-3-Clause"),
    ("licence header", "# Licensed " + "under the Apache License, Version 2.0"),
    ("licence text", "Redistribution and use in source " + "and binary forms, with or without"),
    ("copied from another project", "Ported " + "from pytorch/pytorch test/nn/test_embedding.py"),
    ("copied from another project", "its tests are copied " + "here with three changes"),
    ("copied from another project", "The model: a small, faithful " + "copy of DLRM_Net"),
    ("copied from another project", "adapted " + "from https://github.com/example/project"),
    ("copied from another project", "# a port " + "of TorchRec's InteractionArch"),
    ("copied from another project", "code taken " + "from torchrec's dlrm.py"),
]

CLEAN = [
    f"{C} (c) 2026 the {OWN} authors",           # ours
    "the export of every format; a report of the latest call",
    "perfkernels is being imported from its source folder",
    "rows copied from the table bit for bit; a copy of the indices",
    "a tolerance derived from the term bound; TorchRec's InteractionArch (its operations)",
    'license = "BSD-3-Clause"',
]


@pytest.mark.parametrize("why,line", PLANTED)
def test_planted_line_is_caught(tmp_path, why, line):
    f = tmp_path / "planted.py"
    f.write_text(f'"""A module."""\n{line}\nx = 1\n', encoding="utf-8")
    assert findings(f, "planted.py") == [("planted.py", 2, why, line)]


def test_clean_lines_pass(tmp_path):
    f = tmp_path / "clean.md"
    f.write_text("\n".join(CLEAN) + "\n", encoding="utf-8")
    assert findings(f, "clean.md") == []


def test_allow_list_is_per_file(tmp_path, monkeypatch):
    line = PLANTED[6][1]
    monkeypatch.setitem(globals(), "ALLOWED", {("docs/rule.md", line)})
    f = tmp_path / "rule.md"
    f.write_text(line + "\n", encoding="utf-8")
    assert findings(f, "docs/rule.md") == []
    assert len(findings(f, "docs/other.md")) == 1


def test_the_deleted_copies_would_be_caught(tmp_path):
    """The former headers of the three copied files, as they read."""
    old = ["Ported " + "from pytorch/pytorch test/nn/test_embedding.py (the tests of "
           "TestEmbeddingNN and",
           '"""The reference DLRM: a small, faithful ' + "copy of ``DLRM_Net`` from "
           "facebookresearch/dlrm's",
           "``DLRM_Net``: facebookresearch/dlrm ``dlrm_s_pytorch.py``'s model, the faithful "
           + "copy in"]
    f = tmp_path / "old.py"
    f.write_text("\n".join(old) + "\n", encoding="utf-8")
    assert [n for _, n, _, _ in findings(f, "old.py")] == [1, 2, 3]
