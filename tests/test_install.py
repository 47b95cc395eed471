"""Importing perfkernels from an uncompiled source folder (the checkout's root after
`pip install .`): the import continues from the compiled copy, or fails with a clear message."""
import os
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import perfkernels
from conftest import PACKAGE_PARENT

PACKAGE = Path(perfkernels.__file__).parent


def source_tree(tmp_path: Path) -> Path:
    """A copy of the package without its compiled modules, as in a fresh clone."""
    shutil.copytree(PACKAGE, tmp_path / "perfkernels", ignore=shutil.ignore_patterns(
        *(f"*{suffix}" for suffix in EXTENSION_SUFFIXES), "__pycache__"))
    assert not any(p.name.endswith(tuple(EXTENSION_SUFFIXES))
                   for p in (tmp_path / "perfkernels").iterdir())
    return tmp_path


def run(args, cwd, pythonpath=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERFKERNELS_", "PYTHON"))}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_source_folder_first_on_sys_path_uses_the_compiled_copy(tmp_path):
    root = source_tree(tmp_path)
    code = ("import numpy as np, perfkernels, perfkernels._dispatch as d, perfkernels.reference as r; "
            "print(perfkernels.__file__); print(d.__file__); print(r.__file__); "
            "print(perfkernels.embedding_bag(np.float32([[1], [2]]), [0, 1, 1], [0]).dtype)")
    # python -c / -m put the current directory (the source folder's parent) first on sys.path
    proc = run(["-c", code], cwd=root, pythonpath=PACKAGE_PARENT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split()
    assert all(Path(p).parent == PACKAGE for p in lines[:3]), lines
    assert lines[3] == "float32"
    proc = run(["-m", "perfkernels", "check", "--family", "convert"], cwd=root,
               pythonpath=PACKAGE_PARENT)
    assert proc.returncode == 0 and "all checks passed" in proc.stdout, proc.stdout + proc.stderr


def test_source_folder_alone_is_a_clear_import_error(tmp_path):
    root = source_tree(tmp_path)
    # -S: no site-packages, so no installed copy can be found (the error comes before NumPy)
    proc = run(["-S", "-c", "import perfkernels"], cwd=root)
    assert proc.returncode == 1
    assert "ImportError: perfkernels is being imported from its source folder" in proc.stderr
    assert "pip install ." in proc.stderr and "partially initialized" not in proc.stderr
