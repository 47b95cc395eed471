"""README.md as a new user meets it: every ```python block runs as written (and those of the
guides its examples grew out of), it stays short, its links lead to files that exist, and (in CI)
the two install-and-run commands work verbatim from the root of a fresh clone in a fresh venv."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TEXT = README.read_text() if README.exists() else ""
BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, re.S)
#: The guides whose examples left the README for docs/: every ```python block runs as written.
GUIDES = ["docs/numpy-api.md", "docs/torch-layer.md"]
GUIDE_BLOCKS = [(guide, i, block) for guide in GUIDES
                for i, block in enumerate(re.findall(r"```python\n(.*?)```",
                                                     (ROOT / guide).read_text(), re.S))]
#: The commands CI runs, each alone on a line of the README (.ci/run greps for them).
CI_COMMANDS = ['pip install ".[test]" && pytest',
               'pip install ".[bench]" && python -m perfkernels bench --quick']
#: The one-line commands of the README's ```bash blocks that install perfkernels.
INSTALL_COMMANDS = [line for block in re.findall(r"```bash\n(.*?)```", TEXT, re.S)
                    for line in block.splitlines() if line.startswith("pip install ")]


@pytest.mark.skipif(not BLOCKS, reason="README.md not found next to tests/")
@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(code, capsys):
    exec(compile(code, str(README), "exec"), {})


@pytest.mark.parametrize("guide, index, code", GUIDE_BLOCKS,
                         ids=[f"{g.split('/')[-1]}-block{i}" for g, i, _ in GUIDE_BLOCKS])
def test_guide_example_runs(guide, index, code, capsys):
    exec(compile(code, str(ROOT / guide), "exec"), {})


def test_guides_have_their_examples():
    assert all(any(g == guide for g, _, _ in GUIDE_BLOCKS) for guide in GUIDES), GUIDE_BLOCKS


def test_readme_is_short_and_keeps_the_ci_commands():
    lines = TEXT.splitlines()
    assert 0 < len(lines) <= 200, len(lines)
    for command in CI_COMMANDS:
        assert command in lines, command
    assert set(CI_COMMANDS) <= set(INSTALL_COMMANDS), INSTALL_COMMANDS


def test_readme_links_lead_to_files_and_headings():
    """Every relative link of the README names a file of the repository, and an anchor one of
    that file's headings (as GitHub and the docs site make them)."""
    links = re.findall(r"\]\(([^)\s]+)\)", TEXT)
    assert links
    for link in links:
        if "://" in link:
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), link
        if anchor:
            slugs = [re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                     for h in re.findall(r"^#+ (.*)$", target.read_text(), re.M)]
            assert anchor in slugs, (link, slugs)


def test_readme_has_the_install_commands():
    bench = [c for c in INSTALL_COMMANDS if "perfkernels bench" in c]
    tests = [c for c in INSTALL_COMMANDS if c.endswith("&& pytest")]
    assert len(bench) == 1 and len(tests) == 1, INSTALL_COMMANDS


@pytest.mark.skipif(not os.environ.get("PERFKERNELS_TEST_README_COMMANDS"),
                    reason="slow (a fresh venv and two builds): CI runs it "
                           "(.ci/run sets PERFKERNELS_TEST_README_COMMANDS=1)")
def test_readme_commands_in_a_fresh_clone(tmp_path):
    """Clone the committed tree, make a fresh venv, and run the README's install commands verbatim
    from the clone's root, in the README's order, as a new user would: the bench command whole,
    the test command with PYTEST_ADDOPTS narrowing the suite it runs (CI's main step already runs
    all of it), which still proves that pytest collects and imports the installed package from
    the repository root."""
    clone, venv = tmp_path / "clone", tmp_path / "venv"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PERFKERNELS_", "PYTHON", "VIRTUAL_ENV", "PYTEST"))}
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               PYTEST_ADDOPTS="-q -x -p no:cacheprovider tests/test_readme.py tests/test_cli.py")
    for command in INSTALL_COMMANDS:
        proc = subprocess.run(["bash", "-c", command], cwd=clone, env=env, capture_output=True,
                              text=True, timeout=3600)
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"`{command}` failed:\n{output[-5000:]}"
        if "perfkernels bench" in command:
            assert "copy bandwidth" in output and "vs torch" in output, output[-3000:]
        else:
            assert " passed" in output, output[-3000:]
