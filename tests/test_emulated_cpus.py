"""Older CPUs, emulated with QEMU user mode: one build must run on any x86-64.

Each case runs ``tests/emulated/smoke.py`` under ``qemu-x86_64 -cpu <model>``: import, show_runtime,
the level chosen for that CPU, and one call of every kernel on every level it can run, checked
against NumPy.  A kernel compiled with instructions the CPU lacks would die with SIGILL here.
Skips when qemu-x86_64 is not installed, unless PERFKERNELS_REQUIRE_QEMU=1 (CI sets it after
installing Debian's qemu-user).
"""
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PACKAGE_PARENT

QEMU = shutil.which("qemu-x86_64")
SMOKE = str(Path(__file__).parent / "emulated" / "smoke.py")

pytestmark = [
    pytest.mark.skipif(QEMU is None and os.environ.get("PERFKERNELS_REQUIRE_QEMU") != "1",
                       reason="qemu-x86_64 not installed (apt-get install qemu-user)"),
    pytest.mark.skipif(os.environ.get("PERFKERNELS_SANITIZE_RUN") == "1",
                       reason="not under the sanitizer build (QEMU cannot host ASan's shadow memory)"),
]

#: (QEMU CPU model, the level perfkernels must choose there).  Sandy Bridge: AVX, no AVX2, FMA or
#: F16C (NumPy 2.4 needs AVX, so an older model cannot import it: Westmere, used before, now dies
#: in NumPy's own import).  Haswell: AVX2 + FMA + F16C, no AVX-512.
CPUS = [("SandyBridge", "scalar"), ("Haswell", "avx2")]


def _emulated(cpu, args, extra_env=None):
    assert QEMU is not None, "PERFKERNELS_REQUIRE_QEMU=1 but qemu-x86_64 is not on PATH"
    # OPENBLAS_CORETYPE names the host's core (some machines set it): under emulation it would
    # make NumPy's OpenBLAS run the host's instructions on the emulated CPU
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PERFKERNELS_") and not k.startswith("OPENBLAS_")}
    env["PYTHONPATH"] = PACKAGE_PARENT   # the smoke script imports the perfkernels under test
    env.update(extra_env or {})
    return subprocess.run([QEMU, "-cpu", cpu, sys.executable, *args], capture_output=True, text=True,
                          env=env, cwd=PACKAGE_PARENT, timeout=600)


def _explain(proc):
    died = f" (killed by {signal.Signals(-proc.returncode).name})" if proc.returncode < 0 else ""
    return f"exit {proc.returncode}{died}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


@pytest.mark.parametrize("cpu,expected", CPUS)
def test_every_kernel_on_emulated_cpu(cpu, expected):
    proc = _emulated(cpu, [SMOKE, expected])
    assert proc.returncode == 0, _explain(proc)
    assert f"active        {expected}" in proc.stdout
    assert f"checked every kernel on {expected}" in proc.stdout


def test_forcing_avx512_on_haswell_fails_cleanly_at_import():
    proc = _emulated("Haswell", ["-c", "import perfkernels"], {"PERFKERNELS_ISA": "avx512"})
    assert proc.returncode == 1, _explain(proc)
    assert "PERFKERNELS_ISA='avx512' cannot run on this CPU: missing avx512f" in proc.stderr, _explain(proc)
    assert "valid choices here: scalar, avx2" in proc.stderr


def test_forcing_avx2_on_sandy_bridge_fails_cleanly_at_import():
    proc = _emulated("SandyBridge", ["-c", "import perfkernels"], {"PERFKERNELS_ISA": "avx2"})
    assert proc.returncode == 1, _explain(proc)
    assert "PERFKERNELS_ISA='avx2' cannot run on this CPU: missing avx2, fma, f16c" in proc.stderr, \
        _explain(proc)
