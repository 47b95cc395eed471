"""The AVX-512 kernels, run under Bochs' CPU emulator on a machine without AVX-512.

On an AVX2-only CPU every ``isa``-parametrised test skips its AVX-512 case, and QEMU's user mode
has no AVX-512 either.  Here those cases run anyway: a subprocess of pytest with
``PERFKERNELS_EMULATE_AVX512=1`` (``tests/conftest.py`` then routes every family's AVX-512
dispatch row through ``tests/emulated/avx512.py``) runs the AVX-512 cases of the kernel test
modules, which compare with the float64 NumPy references and with PyTorch as they do natively.
First the emulator itself is checked: the AVX2 kernels run under it must give bit for bit what
they give natively.

Skips when bochscpu-python is not installed, unless PERFKERNELS_REQUIRE_BOCHS=1 (CI installs it),
and on a CPU that runs AVX-512 natively (the ordinary test run covers the level there).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import perfkernels
from conftest import PACKAGE_PARENT

HERE = Path(__file__).resolve().parent
REQUIRED = os.environ.get("PERFKERNELS_REQUIRE_BOCHS") == "1"


def _bochs_missing():
    sys.path.insert(0, str(HERE / "emulated"))
    try:
        import avx512
        avx512.import_bochscpu()
    except ImportError as exc:
        return f"bochscpu-python is not installed (pip install bochscpu-python): {exc}"
    finally:
        sys.path.pop(0)
    return None


_MISSING = _bochs_missing()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_MISSING is not None and not REQUIRED, reason=str(_MISSING)),
    pytest.mark.skipif("avx512" in perfkernels.available_isas(),
                       reason="this CPU runs AVX-512 natively: the ordinary test run covers it"),
    pytest.mark.skipif(os.environ.get("PERFKERNELS_SANITIZE_RUN") == "1",
                       reason="not under the sanitizer build (its shadow memory is not mapped)"),
]

#: the kernel test modules whose AVX-512 cases run emulated, and a pytest -k filter for each.
#: Every family's: 1,279 cases in about 5 minutes on 2 cores (training_adam 90 s, multi 50 s).
SUITES = {f"tests/test_{name}.py": "avx512" for name in (
    "embedding", "quantized", "multi", "sequence", "convert", "interaction", "lstm", "training",
    "training_adam")}


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFKERNELS_")}
    env.update(PERFKERNELS_EMULATE_AVX512="1", PYTHONPATH=PACKAGE_PARENT)
    return env


def test_emulator_reproduces_native_avx2_bit_for_bit():
    assert _MISSING is None, f"PERFKERNELS_REQUIRE_BOCHS=1 but {_MISSING}"
    done = subprocess.run([sys.executable, str(HERE / "emulated" / "avx512.py"), "--self-check"],
                          env=_env(), cwd=HERE, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "self-check passed" in done.stdout


@pytest.mark.parametrize("module", sorted(SUITES))
def test_avx512_cases_pass_under_emulation(module):
    assert _MISSING is None, f"PERFKERNELS_REQUIRE_BOCHS=1 but {_MISSING}"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-x",
                           module, "-k", SUITES[module]],
                          env=_env(), cwd=HERE.parent, capture_output=True, text=True, timeout=1500)
    tail = done.stdout[-6000:] + done.stderr[-3000:]
    assert done.returncode == 0, tail
    # the AVX-512 cases ran (a run that skipped them all would prove nothing)
    assert " passed" in tail and "avx512 cannot run here" not in tail, tail
