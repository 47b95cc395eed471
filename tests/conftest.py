"""Shared fixtures: every test that takes `isa` runs once per ISA level, on the forced level.

Levels this CPU (or build) cannot run are skipped with the missing features as the reason, so a
machine without AVX-512 still runs the scalar and AVX2 paths.
"""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import perfkernels
from perfkernels import _dispatch, _registry
# The variant lists (declared once, shared with the benchmarks), re-exported for the test modules.
from perfkernels._variants import (  # noqa: F401
    AWKWARD_DIMS, BITS, CONVERSIONS, GATE_ORDERS, INDEX_DTYPES, MODES, QUANTIZE_DTYPES,
    SPECIALISED_DIMS, TABLE_DTYPES)

# PERFKERNELS_EMULATE_AVX512=1: the AVX-512 kernels run under Bochs' CPU emulator, so their cases
# below run on a CPU without AVX-512 (tests/emulated/avx512.py; tests/test_emulated_avx512.py).
if os.environ.get("PERFKERNELS_EMULATE_AVX512") == "1":
    sys.path.insert(0, str(Path(__file__).parent / "emulated"))
    import avx512 as _avx512_emulation
    _avx512_emulation.install()

# On an Arm CPU a plain convert() keeps torch's kernels (no route of ours timed there yet); the
# tests check our modules, so they ask for the swap (tests/test_torch_layer.py checks the default).
os.environ.setdefault("PERFKERNELS_ARM_CONVERT", "1")

ALL_ISAS = _dispatch.ISAS


def _isa_param(isa):
    available = perfkernels.available_isas()
    if isa in available:
        return pytest.param(isa, id=isa)
    if not _dispatch._compiled(isa):
        reason = f"{isa} is not in this build (another architecture, or PERFKERNELS_LEVELS)"
    else:
        reason = f"{isa} cannot run here: missing {', '.join(_dispatch._missing(isa))}"
    return pytest.param(isa, id=isa, marks=pytest.mark.skip(reason=reason))


ISA_PARAMS = [_isa_param(isa) for isa in ALL_ISAS]


@pytest.fixture(params=ISA_PARAMS)
def isa(request):
    """Run the test body with every kernel forced to this ISA level."""
    with perfkernels.use_isa(request.param):
        yield request.param


@pytest.fixture
def rng(request):
    """A generator seeded from the test's name, so every test is reproducible on its own."""
    import zlib
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


#: The directory holding the perfkernels that this test run imports (site-packages when it is
#: installed, the checkout when it is built in place).  Subprocesses run from here, so that
#: `python -c` / `python -m` import the same package and never an uncompiled source tree.
PACKAGE_PARENT = str(Path(perfkernels.__file__).resolve().parents[1])


def run_python(args, *, env=None, timeout=600, check=False, **kwargs):
    """Run `python <args>` in a subprocess that imports the same perfkernels as the tests.

    `env` replaces the environment (minus any PERFKERNELS_* variables unless given explicitly)."""
    base = {k: v for k, v in (os.environ if env is None else env).items()}
    if env is None:
        base = {k: v for k, v in base.items() if not k.startswith("PERFKERNELS_")}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=base,
                          cwd=PACKAGE_PARENT, timeout=timeout, check=check, **kwargs)


def run_with_torch_only(body: str, library: str, timeout=120):
    """Run the Python statements `body` in a fresh process that imports torch and loads
    perfkernels' native library (`library`) and nothing of perfkernels' Python; checks afterwards
    that no perfkernels module was imported, and that the process printed "ok" and exited 0."""
    code = (f"import sys, torch\ntorch.ops.load_library({library!r})\n{body}\n"
            "assert not any(m.startswith('perfkernels') for m in sys.modules)\nprint('ok')\n")
    r = run_python(["-c", code], timeout=timeout)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    return r


def without_zero_bias_signs_off_x86(table, *packed):
    """The packed rows of ``table`` (perfkernels' and PyTorch's prepack), ready to compare.

    FBGEMM's x86 kernels take a row's min in 8 lanes, which decides the sign of a min that is a
    zero (of both signs in the row), stored in the bias; the kernels and the reference take that
    order on every architecture.  PyTorch's prepack on aarch64 takes the first of equal values,
    so there the sign bit of those rows' bias (a row's last byte: float32 or float16,
    little-endian) is cleared in every array; on x86-64 they are returned as they are."""
    if _registry.host_arch() == "x86_64":
        return packed
    rows = np.flatnonzero(np.asarray(table, dtype=np.float32).min(axis=1) == 0)
    out = [np.array(p, copy=True) for p in packed]
    for p in out:
        p[rows, -1] &= 0x7F
    return out


def unaligned(a: np.ndarray) -> np.ndarray:
    """A copy of `a` whose data pointer is misaligned by one byte (values unchanged)."""
    raw = np.empty(a.nbytes + 1, dtype=np.uint8)
    view = raw[1:].view(a.dtype).reshape(a.shape)
    view[...] = a
    assert not view.flags.aligned or a.itemsize == 1
    return view


def readonly(a: np.ndarray) -> np.ndarray:
    b = a.copy()
    b.flags.writeable = False
    return b


@pytest.fixture(scope="session")
def torchrec():
    """TorchRec, an optional comparator: skipped where it is missing or its compiled FBGEMM
    library does not load under this torch (FBGEMM builds are tied to one torch release).

    With PERFKERNELS_REQUIRE_TORCHREC=1 (CI's interop step) a failed import fails the test."""
    try:
        import torchrec as module
    except (ImportError, OSError) as exc:
        if os.environ.get("PERFKERNELS_REQUIRE_TORCHREC") == "1":
            raise
        pytest.skip(f"TorchRec is not usable here (optional): {type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}")
    return module


@pytest.fixture(scope="session")
def cuda_sim_libraries():
    """perfkernels' CUDA kernels built for the warp simulator (tests/cuda_sim), once per session;
    skips when g++ is missing."""
    import cuda_sim
    if cuda_sim.build.compiler() is None:
        pytest.skip("g++ is not on this machine: the CUDA warp simulator cannot be built")
    return cuda_sim.prebuild()


#: Test modules that build, start processes (spawned ranks, fresh interpreters, qemu, a browser)
#: or run large inputs: every test in them carries the ``slow`` marker, so that
#: ``pytest -m "not slow"`` is the quick set.  Measured with ``pytest --durations``.
SLOW_MODULES = frozenset({
    "test_build.py", "test_cuda_sim.py", "test_distributed.py", "test_dlrm_example.py",
    "test_emulated_cpus.py", "test_history.py", "test_history_html.py", "test_install.py",
    "test_large_sizes.py", "test_leaks.py", "test_readme.py",
})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
