"""The Arm levels (neon, sve) built with Debian's cross compiler and run under qemu-aarch64.

The kernels of the families that tests/emulated/arm_driver.c checks (conversions, float and
quantized bags, quantization, the dot interaction, the LSTM unit, the fused sparse optimizers,
unpooled lookups) are compiled for aarch64 exactly as setup.py compiles them (the registry's base
flags, each level's file with the level's flags), linked statically with the driver, and run with
SVE off (NEON only) and at SVE vector lengths 128, 256 and 512 bits.  The driver compares each
level with the scalar level and with float64 references of its own (see its header), so a wrong
primitive in simd/neon.h fails here.  The objects are kept under build/arm-emulated/ and
recompiled only when a source or header is newer.

Skips when aarch64-linux-gnu-gcc or qemu-aarch64 is missing, unless PERFKERNELS_REQUIRE_CROSS /
PERFKERNELS_REQUIRE_QEMU is set (CI sets them once it has installed Debian's
gcc-aarch64-linux-gnu and qemu-user).
"""
import concurrent.futures
import os
import runpy
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "perfkernels" / "csrc"
REGISTRY = runpy.run_path(str(ROOT / "perfkernels" / "_registry.py"))
CODEGEN = runpy.run_path(str(ROOT / "perfkernels" / "_codegen.py"))
FAMILY_DIR = ROOT / REGISTRY["FAMILIES_DIR"]
DRIVER = Path(__file__).parent / "emulated" / "arm_driver.c"
#: the families the driver calls
FAMILIES = ("convert", "embedding", "quantized", "interaction", "lstm", "training", "sequence")

CROSS = shutil.which("aarch64-linux-gnu-gcc")
QEMU = shutil.which("qemu-aarch64")
REQUIRED = bool(os.environ.get("PERFKERNELS_REQUIRE_CROSS")) and \
    os.environ.get("PERFKERNELS_REQUIRE_QEMU") == "1"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif((CROSS is None or QEMU is None) and not REQUIRED,
                       reason="needs aarch64-linux-gnu-gcc and qemu-aarch64 (Debian: "
                              "gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)"),
    pytest.mark.skipif(not DRIVER.exists(), reason="C sources not found (tests run from a checkout)"),
]

#: (QEMU -cpu value, the SVE vector length the driver must report, in bits; 0: no SVE)
CPUS = [("max,sve=off", 0), ("max,sve128=on", 128), ("max,sve256=on", 256), ("max,sve512=on", 512)]


def _sources(generated):
    folders = [CSRC / "cpu"] + [FAMILY_DIR / name for name in FAMILIES]
    return [src for folder in folders
            for src in CODEGEN["family_sources"](folder, folder.name, generated, REGISTRY["NAMES"])]


def _flags(src):
    level = REGISTRY["BY_NAME"].get(src.stem)
    extra = list(level.flags) if level is not None and level.arch == "aarch64" else []
    return list(REGISTRY["BASE_FLAGS"]) + extra


@pytest.fixture(scope="module")
def driver():
    """The static aarch64 driver, linked with the families' kernels at every level."""
    assert CROSS, "PERFKERNELS_REQUIRE_CROSS is set but aarch64-linux-gnu-gcc is missing"
    assert QEMU, "PERFKERNELS_REQUIRE_QEMU=1 but qemu-aarch64 is not on PATH"
    out = ROOT / "build" / "arm-emulated"
    generated = out / "generated"
    generated.mkdir(parents=True, exist_ok=True)
    sources = _sources(generated)
    headers = [*CSRC.glob("**/*.h"), *FAMILY_DIR.glob("*/*.h"), *(ROOT / "include").glob("**/*.h")]
    newest_header = max(p.stat().st_mtime for p in headers)
    includes = ["-I", str(ROOT / "include"), "-I", str(CSRC), "-I", str(FAMILY_DIR)]

    def compile_one(src):
        obj = out / f"{src.parent.name}_{src.stem}.o"
        if obj.exists() and obj.stat().st_mtime > max(src.stat().st_mtime, newest_header):
            return obj
        proc = subprocess.run([CROSS, *_flags(src), *includes, "-I", str(generated / src.parent.name),
                               "-I", str(generated), "-c", str(src), "-o", str(obj) + ".tmp"],
                              capture_output=True, text=True)
        assert proc.returncode == 0, f"{src} does not build for aarch64:\n{proc.stderr}"
        os.replace(str(obj) + ".tmp", obj)
        return obj

    # the slowest files (the levels' bodies) first, two at a time
    sources.sort(key=lambda s: s.stem not in REGISTRY["BY_NAME"] or s.stem == "scalar")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        objects = list(pool.map(compile_one, sources))
    exe = out / "arm_driver"
    proc = subprocess.run([CROSS, "-O2", "-std=c11", "-Wall", "-static", *includes, str(DRIVER),
                           *map(str, objects), "-o", str(exe), "-lm", "-lpthread"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return exe


def _run(exe, cpu, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFKERNELS_")}
    return subprocess.run([QEMU, "-cpu", cpu, str(exe), *args], capture_output=True, text=True,
                          env=env, timeout=600)


def _explain(proc):
    died = f" (killed by {signal.Signals(-proc.returncode).name})" if proc.returncode < 0 else ""
    return f"exit {proc.returncode}{died}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-2000:]}"


@pytest.mark.parametrize("cpu,sve_bits", CPUS)
def test_arm_levels_match_scalar_and_float64(driver, cpu, sve_bits):
    proc = _run(driver, cpu)
    assert proc.returncode == 0, _explain(proc)
    assert f"sve vector length {sve_bits} bits" in proc.stdout, _explain(proc)
    assert "level neon: ok" in proc.stdout, _explain(proc)
    if sve_bits:
        assert "level sve: ok" in proc.stdout, _explain(proc)
    else:   # SVE off: the level is refused (the CPU lacks it), never run
        assert "level sve: skipped (cpu lacks sve)" in proc.stdout, _explain(proc)
