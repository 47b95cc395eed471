"""The far-prefetch policy: rows of tables of 16 MiB and more go into L1 on AMD CPUs and into L2
elsewhere, unless PERFKERNELS_FAR_PREFETCH (l1 or l2) says otherwise.  Each setting runs in a
fresh process (the kernels read the variable once), and there every ISA path's far-table lookups
are checked against NumPy and the float64 references."""
import platform

import pytest

from perfkernels import _cpu

from conftest import run_python

# Far tables (past 16 MiB): float32 70K x 64 (17.9 MB), 8-bit 300K x 64 (21.6 MB of 72-byte rows).
BODY = r"""
import numpy as np, perfkernels as pk
from perfkernels import _cpu, reference
print("mode", _cpu.far_prefetch())
rng = np.random.default_rng(7)
w = rng.standard_normal((70_000, 64)).astype(np.float32)
packed = pk.quantize_rowwise(rng.standard_normal((300_000, 64)).astype(np.float32), bits=8)
ix = rng.integers(0, 70_000, 3000)
qix = rng.integers(0, 300_000, 3000)
offsets = np.arange(0, 3000, 30)
for isa in pk.available_isas():
    with pk.use_isa(isa):
        for table in (w, pk.as_table(w)):
            reference.assert_same_bits(pk.embedding(table, ix), w[ix])
            for dtype in (np.float16,):
                reference.assert_same_bits(pk.embedding(table.astype(dtype), ix), w.astype(dtype)[ix])
            reference.assert_close(pk.embedding_bag(table, ix, offsets),
                                   reference.embedding_bag(w, ix, offsets), rtol=1e-5, atol=1e-5)
        reference.assert_close(pk.embedding_quantized(packed, qix, bits=8),
                               reference.dequantize_rowwise(packed, bits=8, dim=64)[qix],
                               rtol=1e-6, atol=1e-6)
        reference.assert_close(pk.embedding_bag_quantized(packed, qix, offsets, bits=8),
                               reference.embedding_bag_quantized(packed, qix, offsets, bits=8),
                               rtol=1e-5, atol=1e-5)
print("ok")
"""


def cpu_vendor() -> str | None:
    """The vendor_id of /proc/cpuinfo (Linux on x86-64), else None."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


@pytest.mark.parametrize("setting", ["l1", "l2", None, "bogus"])
def test_far_tables_under_each_setting(setting):
    import os
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFKERNELS_")}
    if setting is not None:
        env["PERFKERNELS_FAR_PREFETCH"] = setting
    r = run_python(["-c", BODY], env=env, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
    mode = r.stdout.split("mode", 1)[1].split()[0]
    if setting in ("l1", "l2"):
        assert mode == setting
    else:   # unset or not understood: the CPU's vendor decides
        vendor = cpu_vendor()
        if vendor is not None and platform.machine() in ("x86_64", "AMD64"):
            assert mode == ("l1" if vendor == "AuthenticAMD" else "l2")


def test_far_prefetch_reported():
    """``python -m perfkernels info`` names the setting this process has."""
    assert _cpu.far_prefetch() in ("l1", "l2")
    r = run_python(["-m", "perfkernels", "info"], timeout=120)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "far prefetch" in x)
    assert f"into {_cpu.far_prefetch().upper()}" in line
