"""Intra-op threads: the thread-count setting, results that do not depend on the thread count, many
user threads at once, fork() and errors on the multi-threaded paths.

Each kernel family is called on inputs big enough to be split across 8 threads (the pool splits a
call only when every thread gets >= MIN_BYTES_PER_THREAD bytes), at 1, 2, 3 and 8 threads (more
than this machine's cores), on every ISA level; the results must be bit-identical to the 1-thread
call and agree with an independent float64 / NumPy / ml_dtypes reference.
"""
import os
import threading

import ml_dtypes
import numpy as np
import pytest

import perfkernels as pk
from perfkernels import _parallel, reference

from conftest import run_python

THREADS = (1, 2, 3, 8)
SPLIT_BYTES = 8 * _parallel.MIN_BYTES_PER_THREAD + 4096   # enough work for 8 threads


def bags_reference(table, indices, offsets, weights=None, mean=False, padding=None):
    """The float64 reference bags (value, magnitude)."""
    return reference.embedding_bag(table, indices, offsets, per_sample_weights=weights,
                                   mode="mean" if mean else "sum", padding_idx=padding)


def assert_close(got, ref, mag, rtol=2e-6):
    reference.assert_close(got, ref, mag, rtol=rtol, atol=1e-30)


def assert_same_for_every_thread_count(call):
    """call(num_threads) at 1, 2, 3, 8 threads: every result bit-identical to the 1-thread one."""
    first = call(1)
    firsts = first if isinstance(first, tuple) else (first,)
    for nt in THREADS[1:]:
        got = call(nt)
        gots = got if isinstance(got, tuple) else (got,)
        for a, b in zip(firsts, gots):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert a.tobytes() == b.tobytes(), f"num_threads={nt} differs from 1 thread"
    return first


def bag_inputs(rng, rows, D, itemsize, index_dtype=np.int64, max_len=40):
    """Random bags touching about SPLIT_BYTES bytes of rows, with empty bags mixed in."""
    n_target = max(int(SPLIT_BYTES // (D * itemsize + 8)), 64)
    lens = rng.integers(0, max_len, size=max(2 * n_target // max_len, 4))
    lens[rng.random(lens.size) < 0.1] = 0
    indices = rng.integers(0, rows, size=int(lens.sum())).astype(index_dtype)
    offsets = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    return indices, offsets


# ---------------------------------------------------------------------------------------------
# the setting
# ---------------------------------------------------------------------------------------------

def test_default_is_the_affinity_and_setter_roundtrips():
    assert _parallel.available_cores() == len(os.sched_getaffinity(0))
    old = pk.get_num_threads()
    try:
        pk.set_num_threads(5)
        assert pk.get_num_threads() == 5
        pk.set_num_threads(np.int64(300))   # no cap below 256
        assert pk.get_num_threads() == 300
    finally:
        pk.set_num_threads(old)


@pytest.mark.parametrize("bad,exc,msg", [
    (0, ValueError, "set_num_threads\\(n\\) = 0 is out of range"),
    (-3, ValueError, "= -3 is out of range"),
    (10 ** 9, ValueError, "out of range"),
    (1.5, TypeError, "must be a positive integer"),
    ("2", TypeError, "must be a positive integer"),
    (True, TypeError, "must be a positive integer"),
    (None, TypeError, "must be a positive integer"),
])
def test_setter_rejects_bad_values(bad, exc, msg):
    old = pk.get_num_threads()
    with pytest.raises(exc, match=msg):
        pk.set_num_threads(bad)
    assert pk.get_num_threads() == old


@pytest.mark.parametrize("bad,exc", [(0, ValueError), (-1, ValueError), (2.0, TypeError),
                                     ("4", TypeError), (False, TypeError)])
def test_per_call_keyword_rejects_bad_values(bad, exc):
    w = np.ones((4, 3), np.float32)
    x = np.ones(8, np.float32)
    h = np.zeros((2, 3), np.float32)
    calls = [
        lambda: pk.embedding_bag(w, np.array([[0, 1]]), num_threads=bad),
        lambda: pk.embedding_bag_quantized(pk.quantize_rowwise(w), np.array([[0]]), num_threads=bad),
        lambda: pk.quantize_rowwise(w, num_threads=bad),
        lambda: pk.dequantize_rowwise(pk.quantize_rowwise(w), num_threads=bad),
        lambda: pk.float_to_half(x, num_threads=bad),
        lambda: pk.half_to_float(x.astype(np.float16), num_threads=bad),
        lambda: pk.float_to_bfloat16(x, num_threads=bad),
        lambda: pk.bfloat16_to_float(x.astype(ml_dtypes.bfloat16), num_threads=bad),
        lambda: pk.lstm_unit(h, h, np.zeros((2, 12), np.float32), num_threads=bad),
        lambda: pk.embedding_bags_multi([w], np.array([0]), lengths=np.array([1]), num_threads=bad),
    ]
    for call in calls:
        with pytest.raises(exc, match="num_threads"):
            call()


@pytest.mark.parametrize("value,expected", [("3", 3), (" 1 ", 1), ("300", 300), ("", None)])
def test_environment_variable(value, expected):
    env = dict(os.environ, PERFKERNELS_NUM_THREADS=value)
    r = run_python(["-c", "import perfkernels; print(perfkernels.get_num_threads())"], env=env)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) == (expected or len(os.sched_getaffinity(0)))


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5", "1e3", "99999999"])
def test_environment_variable_rejects_bad_values(value):
    env = dict(os.environ, PERFKERNELS_NUM_THREADS=value)
    r = run_python(["-c", "import perfkernels"], env=env)
    assert r.returncode != 0
    assert "PERFKERNELS_NUM_THREADS" in r.stderr and repr(value) in r.stderr or value in r.stderr


def test_default_follows_a_restricted_affinity():
    code = ("import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
            "import perfkernels; print(perfkernels.get_num_threads())")
    r = run_python(["-c", code])
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) == 1


# ---------------------------------------------------------------------------------------------
# every family: bit-identical at 1, 2, 3, 8 threads, and right
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("D", [1, 17, 64, 129])
def test_embedding_bag_same_for_any_thread_count(isa, rng, dtype, D):
    rows = 3000
    table = rng.standard_normal((rows, D)).astype(np.float32).astype(dtype)
    indices, offsets = bag_inputs(rng, rows, D, np.dtype(dtype).itemsize,
                                  np.int32 if D % 2 else np.int64)
    weights = rng.standard_normal(indices.size).astype(np.float32)
    mean = D % 2 == 0
    got = assert_same_for_every_thread_count(lambda nt: pk.embedding_bag(
        table, indices, offsets, per_sample_weights=weights, mode="mean" if mean else "sum",
        padding_idx=7, num_threads=nt))
    ref, mag = bags_reference(table, indices, offsets, weights, mean, 7)
    assert_close(got, ref, mag)


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("D", [8, 64, 127])
def test_embedding_bag_quantized_same_for_any_thread_count(isa, rng, bits, D):
    rows = 2000
    packed = pk.quantize_rowwise(rng.standard_normal((rows, D)).astype(np.float32), bits)
    indices, offsets = bag_inputs(rng, rows, D, packed.shape[1] / D)
    got = assert_same_for_every_thread_count(lambda nt: pk.embedding_bag_quantized(
        packed, indices, offsets, bits=bits, dim=D, num_threads=nt))
    table64 = reference.dequantize_rowwise(packed, bits, D)
    ref, mag = bags_reference(table64, indices, offsets)
    assert_close(got, ref, mag + 1.0, rtol=1e-5)   # the kernel sums w*scale*q and w*bias apart


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_quantize_and_dequantize_same_for_any_thread_count(isa, rng, bits):
    D = 63
    w = rng.standard_normal((SPLIT_BYTES // (D * 4), D)).astype(np.float32)
    packed = assert_same_for_every_thread_count(lambda nt: pk.quantize_rowwise(w, bits, num_threads=nt))
    reference.assert_same_bits(packed, reference.quantize_rowwise(w, bits))
    back = assert_same_for_every_thread_count(
        lambda nt: pk.dequantize_rowwise(packed, bits, D, num_threads=nt))
    reference.assert_close(back, reference.dequantize_rowwise(packed, bits, D), rtol=1e-6, atol=1e-6)


def test_quantize_reports_first_nonfinite_row_with_threads(rng):
    w = rng.standard_normal((SPLIT_BYTES // 256, 64)).astype(np.float32)
    w[-5, 3] = np.nan     # in the last range
    w[w.shape[0] // 2 + 1, 0] = np.inf   # in a middle range: the one reported
    for nt in THREADS:
        with pytest.raises(ValueError, match=f"row {w.shape[0] // 2 + 1} contains NaN or inf"):
            pk.quantize_rowwise(w, 8, num_threads=nt)


def test_conversions_same_for_any_thread_count(isa, rng):
    n = SPLIT_BYTES // 2 + 37   # not a multiple of any vector width
    x = (rng.standard_normal(n) * 1000).astype(np.float32)
    x[::97] = np.inf
    x[::101] = np.nan
    h = assert_same_for_every_thread_count(lambda nt: pk.float_to_half(x, num_threads=nt))
    reference.assert_same_bits(h, reference.float_to_half(x))
    hc = assert_same_for_every_thread_count(lambda nt: pk.float_to_half(x, clip=True, num_threads=nt))
    reference.assert_same_bits(hc, reference.float_to_half(x, clip=True))
    f = assert_same_for_every_thread_count(lambda nt: pk.half_to_float(h, num_threads=nt))
    reference.assert_same_bits(f, reference.half_to_float(h))
    b = assert_same_for_every_thread_count(lambda nt: pk.float_to_bfloat16(x, num_threads=nt))
    reference.assert_same_bits(b, reference.float_to_bfloat16(x))
    fb = assert_same_for_every_thread_count(lambda nt: pk.bfloat16_to_float(b, num_threads=nt))
    reference.assert_same_bits(fb, reference.bfloat16_to_float(b))


@pytest.mark.parametrize("D", [7, 64])
def test_lstm_same_for_any_thread_count(isa, rng, D):
    N = SPLIT_BYTES // (D * 32) + 3
    h0, c0 = (rng.standard_normal((N, D)).astype(np.float32) for _ in range(2))
    gates = rng.standard_normal((N, 4 * D)).astype(np.float32)
    seq = rng.integers(0, 3, size=N).astype(np.int32)
    h, c = assert_same_for_every_thread_count(lambda nt: pk.lstm_unit(
        h0, c0, gates, seq_lengths=seq, t=1, forget_bias=0.5, num_threads=nt))
    kw = dict(seq_lengths=seq, t=1, forget_bias=0.5)
    h_ref, c_ref = reference.lstm_unit(h0, c0, gates, **kw)
    reference.assert_close(c, c_ref, rtol=1e-5, atol=1e-6)
    reference.assert_close(h, h_ref, rtol=1e-5, atol=1e-6)
    dh, dc = (rng.standard_normal((N, D)).astype(np.float32) for _ in range(2))
    grads = assert_same_for_every_thread_count(lambda nt: pk.lstm_unit_backward(
        c0, gates, c, dh, dc, num_threads=nt, **kw))
    for got, want in zip(grads, reference.lstm_unit_backward(c0, gates, c, dh, dc, **kw)):
        reference.assert_close(got, want, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# errors on the multi-threaded path
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("quantized", [False, True])
def test_first_bad_index_reported_and_out_untouched(isa, rng, quantized):
    rows, D = 1000, 64
    table = rng.standard_normal((rows, D)).astype(np.float32)
    packed = pk.quantize_rowwise(table)
    indices, offsets = bag_inputs(rng, rows, D, 4)
    n = indices.size
    first = n // 2 + 3
    indices[[first, n - 2, n // 5 * 4]] = [rows, -1, rows + 5]
    first_bad = min(first, n // 5 * 4)

    def call(nt, out=None):
        if quantized:
            return pk.embedding_bag_quantized(packed, indices, offsets, out=out, num_threads=nt)
        return pk.embedding_bag(table, indices, offsets, out=out, num_threads=nt)

    for nt in THREADS:
        with pytest.raises(IndexError, match=rf"indices\[{first_bad}\] = {indices[first_bad]} "):
            call(nt)
        out = np.full((offsets.size, D), 7.0, np.float32)
        with pytest.raises(IndexError, match=rf"indices\[{first_bad}\]"):
            call(nt, out)
        assert np.all(out == 7.0)


# ---------------------------------------------------------------------------------------------
# many user threads at once, nested pools, fork
# ---------------------------------------------------------------------------------------------

def test_eight_user_threads_at_once(rng):
    rows, D = 5000, 64
    table = rng.standard_normal((rows, D)).astype(np.float32)
    packed = pk.quantize_rowwise(table)
    cases = [bag_inputs(rng, rows, D, 4) for _ in range(8)]
    refs = [bags_reference(table, ix, off) for ix, off in cases]
    qtable = reference.dequantize_rowwise(packed)
    qrefs = [bags_reference(qtable, ix, off) for ix, off in cases]
    x = rng.standard_normal(SPLIT_BYTES).astype(np.float32)
    errors = []
    barrier = threading.Barrier(8)

    def worker(k):
        try:
            barrier.wait()
            for _ in range(3):
                ix, off = cases[k]
                assert_close(pk.embedding_bag(table, ix, off), *refs[k])
                qref, qmag = qrefs[k]
                assert_close(pk.embedding_bag_quantized(packed, ix, off), qref, qmag + 1.0, rtol=1e-5)
                assert pk.float_to_half(x).tobytes() == x.astype(np.float16).tobytes()
        except Exception as exc:  # reported below, in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a user thread hung"
    assert not errors, errors[0]
    # the pool never grows past what one call asked for (no per-caller thread sets)
    assert _parallel._num_workers() <= max(THREADS) - 1


EVERY_FAMILY = r"""
import os, signal, sys, threading
import numpy as np, ml_dtypes
import perfkernels as pk
from perfkernels import _parallel, reference

def every_family(nt):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((20000, 64)).astype(np.float32)
    ix = rng.integers(0, 20000, size=40000)
    off = np.arange(0, 40000, 20)
    x = rng.standard_normal(1 << 20).astype(np.float32)
    p = pk.quantize_rowwise(w, num_threads=nt)
    out = [pk.embedding_bag(w, ix, off, num_threads=nt),
           pk.embedding_bag_quantized(p, ix, off, num_threads=nt),
           pk.embedding_bags_multi([w, p], np.concatenate([ix, ix]),
                                   offsets=np.append(np.concatenate([off, off + 40000]), 80000),
                                   bits=[None, 8], num_threads=nt),
           p, pk.dequantize_rowwise(p, num_threads=nt),
           pk.float_to_half(x, num_threads=nt), pk.half_to_float(x.astype(np.float16), num_threads=nt),
           pk.float_to_bfloat16(x, num_threads=nt),
           pk.bfloat16_to_float(x.astype(ml_dtypes.bfloat16), num_threads=nt),
           *pk.lstm_unit(w[:4096], w[:4096], np.tile(w[:4096], 4), num_threads=nt)]
    table, state = w.copy(), np.zeros(20000, np.float32)
    pk.embedding_bag_backward_update(table, ix, off, grad_output=out[0], optimizer="rowwise_adagrad",
                                     state=state, lr=0.01, num_threads=nt)
    out += [table, state]
    dense = rng.standard_normal((2000, 64)).astype(np.float32)
    sparse = rng.standard_normal((2000, 3, 64)).astype(np.float32)
    two = [ix[:4000], ix[4000:8000]]
    starts = [np.arange(0, 4000, 2)] * 2
    out += [pk.embedding(w, ix.reshape(400, 100), num_threads=nt),
            pk.embedding_quantized(p, ix, num_threads=nt),
            pk.dot_interaction(dense, sparse, num_threads=nt),
            *pk.dot_interaction_backward(np.tile(dense, 2)[:, :70], dense, sparse, num_threads=nt),
            pk.embedding_bags_interaction(dense, [w, p], two, starts, bits=[None, 8],
                                          num_threads=nt)]
    return [a.tobytes() for a in out]

def run_in_forked_child(check):
    # fork; the child exits 0 when check() is true; print the child's exit code
    pid = os.fork()
    if pid == 0:
        try:
            ok = check()
        except BaseException:
            ok = False
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status))
"""

FORK_SCRIPT = EVERY_FAMILY + r"""
expected = every_family(1)
assert every_family(4) == expected
assert _parallel._num_workers() >= 1, "the parent never used its workers"
run_in_forked_child(lambda: _parallel._num_workers() == 0 and every_family(4) == expected
                            and _parallel._num_workers() >= 1)
"""


def test_forked_child_runs_every_family():
    r = run_python(["-c", FORK_SCRIPT], timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "child 0", r.stdout + r.stderr


TORCH_THREADS_SCRIPT = EVERY_FAMILY + r"""
import torch
import perfkernels.torch as pt
if not pt.torch_threads_in_use():
    print("skip: PyTorch does not run on GNU OpenMP here:", torch.__config__.parallel_info())
    sys.exit(0)
assert pt.use_torch_threads(False) is False and not pt.torch_threads_in_use()
own = [every_family(nt) for nt in (1, 2, 3, 8)]
assert all(r == own[0] for r in own), "own pool: results depend on the thread count"
workers = _parallel._num_workers()
assert pt.use_torch_threads(True) is True and pt.torch_threads_in_use()
a = torch.randn(512, 512)
for nt in (1, 2, 3, 8):
    (a @ a).sum()                               # PyTorch's OpenMP team, between our jobs
    assert every_family(nt) == own[0], f"on PyTorch's threads, num_threads={nt} differs"
assert _parallel._num_workers() == workers, "the own pool started workers while not in use"
errors = []
def user(i):
    try:
        for _ in range(3):
            assert every_family(4) == own[0]
            (a @ a).sum()
    except BaseException as e:
        errors.append(e)
threads = [threading.Thread(target=user, args=(i,)) for i in range(8)]
for t in threads: t.start()
for t in threads: t.join(timeout=300)
assert not any(t.is_alive() for t in threads), "a user thread hung"
assert not errors, errors[0]
run_in_forked_child(lambda: not pt.torch_threads_in_use() and every_family(4) == own[0]
                            and _parallel._num_workers() >= 1)
"""


def test_jobs_on_pytorchs_openmp_threads():
    """With perfkernels.torch imported, jobs run on PyTorch's OpenMP team: every family gives the
    own pool's bytes at every thread count, with PyTorch ops in between and from 8 user threads at
    once, without starting the own workers; a forked child goes back to the own pool and finishes."""
    pytest.importorskip("torch")
    r = run_python(["-c", TORCH_THREADS_SCRIPT], timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    if r.stdout.startswith("skip:"):
        pytest.skip(r.stdout.strip())
    assert r.stdout.strip() == "child 0", r.stdout + r.stderr


def env_with(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFKERNELS_")}
    env.update(extra)
    return env


@pytest.mark.parametrize("value", ["2", "yes", "-1", " "])
def test_torch_threads_environment_variable_is_validated(value):
    pytest.importorskip("torch")
    r = run_python(["-c", "import perfkernels.torch"], env=env_with(PERFKERNELS_TORCH_THREADS=value))
    assert r.returncode != 0
    assert "PERFKERNELS_TORCH_THREADS" in r.stderr and repr(value.strip()) in r.stderr


def test_torch_threads_environment_variable_off():
    pytest.importorskip("torch")
    r = run_python(["-c", "import perfkernels.torch as pt; print(pt.torch_threads_in_use())"],
                   env=env_with(PERFKERNELS_TORCH_THREADS="0"))
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stdout + r.stderr


IDLE_SCRIPT = r"""
import os, time
import numpy as np
import perfkernels as pk
from perfkernels import _parallel
ticks = os.sysconf("SC_CLK_TCK")
def cpu_ticks():
    used = {}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        used[tid] = int(fields[11]) + int(fields[12])   # utime + stime
    return used
table = np.ones((4096, 64), np.float32)
ix = np.arange(4096 * 64, dtype=np.int64) % 4096
for _ in range(20):
    pk.embedding(table, ix, num_threads=8)
assert _parallel._num_workers() >= 1, "no worker started"
time.sleep(0.05)                  # past the spin: every worker should be asleep now
before = cpu_ticks()
time.sleep(0.5)
after = cpu_ticks()
main = str(os.getpid())
spun = {t: after[t] - before.get(t, 0) for t in after if t != main}
print("max", max(spun.values()) / ticks)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc/self/task")
def test_an_idle_pool_sleeps():
    """After a burst of calls the workers spin only briefly, then sleep: over half a second of
    idleness no worker uses more than a tenth of a second of CPU (a spin that never ended, say a
    deadline that never passed, would use all of it)."""
    r = run_python(["-c", IDLE_SCRIPT], timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("max "), r.stdout + r.stderr
    assert float(r.stdout.split()[1]) < 0.1, r.stdout


def test_busy_pool_runs_the_call_on_its_own_thread(rng):
    """A call made while the pool serves another (here: from inside the user thread that is
    waiting on the GIL-free kernel of another) still completes and is right."""
    rows, D = 2000, 64
    table = rng.standard_normal((rows, D)).astype(np.float32)
    ix, off = bag_inputs(rng, rows, D, 4)
    ref = pk.embedding_bag(table, ix, off, num_threads=1)
    results = []

    def hammer():
        for _ in range(20):
            results.append(pk.embedding_bag(table, ix, off, num_threads=8).tobytes())

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 60 and all(r == ref.tobytes() for r in results)


def test_automatic_thread_count_follows_torchs_on_its_threads():
    """With perfkernels.torch imported and no explicit perfkernels count, the default is capped by
    torch's thread count (OMP_NUM_THREADS, torch.set_num_threads); an explicit count is kept;
    without perfkernels.torch the default is the cores."""
    pytest.importorskip("torch")
    code = """if True:
        import os, perfkernels
        cores = len(os.sched_getaffinity(0))
        assert perfkernels.get_num_threads() == cores, perfkernels.get_num_threads()
        import torch, perfkernels.torch as pt
        assert pt.torch_threads_in_use()
        assert perfkernels.get_num_threads() == 1, perfkernels.get_num_threads()
        torch.set_num_threads(64)
        assert perfkernels.get_num_threads() == cores, perfkernels.get_num_threads()
        torch.set_num_threads(1)
        perfkernels.set_num_threads(3)
        assert perfkernels.get_num_threads() == 3
        print("OK")
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFKERNELS_")}
    env["OMP_NUM_THREADS"] = "1"
    out = run_python(["-c", code], env=env, timeout=120)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]
