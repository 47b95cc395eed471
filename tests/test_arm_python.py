"""The Python tests on aarch64, under qemu-aarch64 (.ci/arm_python; docs/arm.md, "Testing under
emulation").

Runs where PERFKERNELS_ARM_ROOT names a directory that ``.ci/arm_python root DIR`` prepared (an
arm64 root with Python 3.11, NumPy, ml_dtypes and pytest): it cross-compiles this checkout into it
(``.ci/arm_python build DIR``: incremental, a first build takes 10-20 minutes on 2 cores) and runs
the conversion tests with SVE off (``neon``) and at 256-bit SVE (``neon`` and ``sve``), checking
that each level the CPU has ran and passed and that ``sve`` was refused where SVE is off.  Skipped
otherwise; tests/test_emulated_arm.py covers the Arm levels without a root.
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "arm_python"
ARM_DIR = os.environ.get("PERFKERNELS_ARM_ROOT", "")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not ARM_DIR, reason="PERFKERNELS_ARM_ROOT is not set (a directory made by "
                                           "`.ci/arm_python root DIR`)"),
    pytest.mark.skipif(not SCRIPT.exists(), reason="needs the checkout's .ci/arm_python"),
]

#: (QEMU CPU, the levels that must run, the levels that must be refused as missing a feature)
CPUS = [("max,sve=off", ("scalar", "neon"), ("sve",)),
        ("max,sve256=on", ("scalar", "neon", "sve"), ())]


@pytest.fixture(scope="module")
def built():
    arm_dir = Path(ARM_DIR)
    assert (arm_dir / "root" / ".wheels-done").exists(), (
        f"PERFKERNELS_ARM_ROOT={ARM_DIR} has no root: run .ci/arm_python root {ARM_DIR}")
    for tool in ("qemu-aarch64", "aarch64-linux-gnu-gcc", "aarch64-linux-gnu-g++"):
        assert shutil.which(tool), f"{tool} is not on PATH"
    proc = subprocess.run([str(SCRIPT), "build", str(arm_dir)], capture_output=True, text=True,
                          timeout=3600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return arm_dir


@pytest.mark.parametrize("cpu,runs,refused", CPUS, ids=[c for c, _, _ in CPUS])
def test_conversions_on_every_arm_level(built, cpu, runs, refused):
    proc = subprocess.run([str(SCRIPT), "test", str(built), "-c", cpu, "tests/test_convert.py",
                           "-k", "every_half_pattern_to_float or float_edge_cases", "-vv", "-rs"],
                          capture_output=True, text=True, timeout=1800)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for level in runs:
        assert re.search(rf"test_every_half_pattern_to_float\[{level}\] PASSED", out), (level, out[-4000:])
    for level in refused:
        assert re.search(rf"test_every_half_pattern_to_float\[{level}\] SKIPPED", out), (level, out[-4000:])
        assert f"{level} cannot run here: missing {level}" in out, out[-4000:]
