"""Runtime dispatch: detection, the environment variables (in subprocesses), use_isa, show_runtime."""
import os
import sys

import numpy as np
import pytest

import conftest
import perfkernels as pk
from perfkernels import _dispatch, _registry


#: this machine's architecture and the levels built for it (the choices an error names)
ARCH = _registry.host_arch()
NATIVE = ", ".join(_dispatch.NATIVE_ISAS)
#: CPU features as Linux's /proc/cpuinfo names them, per architecture: (its line, our name -> its)
PROC_CPUINFO = {
    "x86_64": ("flags", [("sse2", "sse2"), ("avx", "avx"), ("avx2", "avx2"), ("fma", "fma"),
                         ("f16c", "f16c"), ("avx512f", "avx512f"), ("avx512bw", "avx512bw"),
                         ("avx512dq", "avx512dq"), ("avx512vl", "avx512vl"),
                         ("avx512_bf16", "avx512_bf16"), ("avx512_fp16", "avx512_fp16")]),
    "aarch64": ("Features", [(name, name) for name in ("asimd", "asimdhp", "sve", "sve2", "bf16")]),
}
#: per architecture: its top level, the feature only that level needs, the best level left when
#: that feature is hidden, and features to hide so that the top level cannot run (two, on x86-64)
TOP_LEVEL = {"x86_64": ("avx512", "avx512f", "avx2", ("avx512bw", "f16c")),
             "aarch64": ("sve", "sve", "neon", ("sve",))}


def run_python(code, **env):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PERFKERNELS_")}
    full_env.update(env)
    return conftest.run_python(["-c", code], env=full_env)


def test_python_and_c_agree_on_the_levels():
    from perfkernels import _cpu, _registry
    assert _cpu.isa_names() == _registry.NAMES == _dispatch.ISAS
    assert tuple(_dispatch.REQUIREMENTS) == _registry.NAMES


def test_scalar_is_always_available_and_best_is_default():
    assert pk.available_isas()[0] == "scalar"
    proc = run_python("import perfkernels as pk; print(pk.active_isa())")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == pk.available_isas()[-1]


@pytest.mark.skipif(not sys.platform.startswith("linux") or not os.path.exists("/proc/cpuinfo")
                    or ARCH not in PROC_CPUINFO,
                    reason="/proc/cpuinfo is the independent oracle; Linux on x86-64 or aarch64 only")
def test_detected_features_match_proc_cpuinfo():
    key, names = PROC_CPUINFO[ARCH]
    flags = None
    for line in open("/proc/cpuinfo"):
        if line.split(":", 1)[0].strip() == key:
            flags = set(line.split(":", 1)[1].split())
            break
    if flags is None:
        # QEMU 7.2's user mode passes the host's (x86) /proc/cpuinfo through; .ci/arm_python
        # writes one without a Features line (it would describe no particular -cpu)
        pytest.skip(f"/proc/cpuinfo has no {key!r} line (an emulator's)")
    detected = _dispatch._detected
    for ours, linux in names:
        assert detected[ours] == (linux in flags), ours


@pytest.mark.parametrize("isa", _registry.NAMES)
def test_forcing_each_level_in_a_subprocess(isa):
    proc = run_python("import perfkernels as pk, numpy as np;"
                      "x = np.linspace(-3, 3, 1001, dtype=np.float32);"
                      "assert (pk.float_to_half(x) == x.astype(np.float16)).all();"
                      "print(pk.active_isa())", PERFKERNELS_ISA=isa)
    if isa in pk.available_isas():
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == isa
    elif _dispatch._compiled(isa):
        assert proc.returncode != 0 and "cannot run on this CPU" in proc.stderr
    else:
        assert proc.returncode != 0 and f"does not contain {isa} kernels" in proc.stderr


def test_unknown_isa_fails_at_import_with_the_choices():
    proc = run_python("import perfkernels", PERFKERNELS_ISA="avx9000")
    assert proc.returncode != 0
    assert "PERFKERNELS_ISA='avx9000' is not an ISA level" in proc.stderr
    assert f"valid choices: {NATIVE}" in proc.stderr


#: a build that lacks its architecture's top level (avx512, sve; PERFKERNELS_LEVELS left it out,
#: or an architecture with neither) refuses it as not built before it looks at the CPU
needs_top_level_built = pytest.mark.skipif(
    ARCH not in TOP_LEVEL or not _dispatch._compiled(TOP_LEVEL[ARCH][0]),
    reason="this build does not contain its architecture's top level (avx512 or sve)")


@needs_top_level_built
def test_level_the_cpu_lacks_fails_at_import_naming_the_missing_features():
    top, _, _, hidden = TOP_LEVEL[ARCH]
    proc = run_python("import perfkernels", PERFKERNELS_ISA=top,
                      PERFKERNELS_DISABLE_CPU_FEATURES=",".join(hidden))
    assert proc.returncode != 0
    assert f"PERFKERNELS_ISA='{top}' cannot run on this CPU: missing" in proc.stderr
    assert all(feature in proc.stderr for feature in hidden)
    assert "valid choices here: scalar" in proc.stderr


@pytest.mark.skipif(ARCH not in TOP_LEVEL, reason="no SIMD levels on this architecture")
def test_disabled_features_lower_the_default_level():
    _, feature, below, _ = TOP_LEVEL[ARCH]
    proc = run_python("import perfkernels as pk; print(pk.active_isa(), pk.available_isas())",
                      PERFKERNELS_DISABLE_CPU_FEATURES=feature)
    assert proc.returncode == 0, proc.stderr
    expected = below if below in pk.available_isas() else "scalar"
    assert proc.stdout.split()[0] == expected


def test_unknown_disabled_feature_is_an_error():
    known = next(iter(pk.cpu_features()))
    proc = run_python("import perfkernels", PERFKERNELS_DISABLE_CPU_FEATURES=f"{known},sse9")
    assert proc.returncode != 0 and "unknown feature(s) sse9;" in proc.stderr


def test_use_isa_switches_and_restores():
    before = pk.active_isa()
    for isa in pk.available_isas():
        with pk.use_isa(isa) as name:
            assert name == isa and pk.active_isa() == isa
        assert pk.active_isa() == before
    with pytest.raises(RuntimeError):
        with pk.use_isa("scalar"):
            raise RuntimeError("body fails")
    assert pk.active_isa() == before


def test_use_isa_blocks_overlapping_in_two_threads_restore_the_level():
    """Thread A enters, thread B enters, A exits, B exits (not nested): inside B the level stays
    B's, and afterwards the level from before is back (it used to stay at scalar for good)."""
    import threading

    before = pk.active_isa()
    others = [isa for isa in pk.available_isas() if isa != before] or [before]
    a_entered, b_entered, a_exited = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def thread_a():
        with pk.use_isa("scalar"):
            a_entered.set()
            b_entered.wait(10)
        a_exited.set()

    def thread_b():
        a_entered.wait(10)
        with pk.use_isa(others[0]):
            b_entered.set()
            a_exited.wait(10)
            seen["inside b after a exited"] = pk.active_isa()

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen["inside b after a exited"] == others[0]
    assert pk.active_isa() == before
    # the same overlap with both blocks "scalar", driven by hand
    a, b = pk.use_isa("scalar"), pk.use_isa("scalar")
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    assert pk.active_isa() == "scalar"
    b.__exit__(None, None, None)
    assert pk.active_isa() == before


def test_use_isa_rejects_bad_names():
    with pytest.raises(ValueError, match=f"not an ISA level; valid choices: {NATIVE}"):
        with pk.use_isa("sse"):
            pass
    with pytest.raises(ValueError):
        with pk.use_isa(3):
            pass


@needs_top_level_built
def test_use_isa_rejects_a_level_the_cpu_lacks(monkeypatch):
    top, feature, _, _ = TOP_LEVEL[ARCH]
    monkeypatch.setitem(_dispatch._features, feature, False)
    with pytest.raises(RuntimeError, match=f"missing {feature}"):
        with pk.use_isa(top):
            pass


def test_a_level_the_build_left_out_is_refused_as_not_built():
    """A development build of some levels (PERFKERNELS_LEVELS; the sanitizer run builds only the
    levels its CPU runs) reports the rest as not built, and use_isa / PERFKERNELS_ISA refuse them
    naming the reason, whatever the CPU can run."""
    left_out = [isa for isa in _registry.NAMES if not _dispatch._compiled(isa)]
    if not left_out:
        pytest.skip("this build contains every level")
    for isa in left_out:
        assert isa not in pk.available_isas()
        with pytest.raises(RuntimeError, match=f"does not contain {isa} kernels"):
            with pk.use_isa(isa):
                pass
        proc = run_python("import perfkernels", PERFKERNELS_ISA=isa)
        assert proc.returncode != 0 and f"does not contain {isa} kernels" in proc.stderr


def test_show_runtime_and_queries(capsys):
    pk.show_runtime()
    text = capsys.readouterr().out
    assert "active" in text and pk.active_isa() in text and "cpu features" in text
    feats = pk.cpu_features()
    name = {"x86_64": "avx2", "aarch64": "asimd"}.get(ARCH) or next(iter(feats))
    assert isinstance(feats, dict) and name in feats
    feats[name] = "mutated"
    assert pk.cpu_features()[name] != "mutated"


def test_every_level_gives_the_same_conversions():
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    results = []
    for isa in pk.available_isas():
        with pk.use_isa(isa):
            results.append(pk.float_to_half(x).view(np.uint16).copy())
    assert all(np.array_equal(r, results[0]) for r in results)
