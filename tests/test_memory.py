"""The output pool (perfkernels._memory, csrc/memory/outpool.c): outputs of the kernels come from
a bounded, thread-safe, fork-safe pool of reusable blocks, so a steady-state loop makes no page
faults for them, while NumPy and torch see ordinary arrays with ordinary lifetimes."""
import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import perfkernels as pk
from perfkernels import _memory, reference as ref

ROOT = Path(__file__).resolve().parents[1]
# an AddressSanitizer build keeps nothing in the pool (ASan must see exact bounds and every free)
pytestmark = pytest.mark.skipif(_memory._sanitized(), reason="the pool is off under ASan")
MIN = 4096   # _memory.pxd's POOL_MIN_BYTES: smaller arrays come from NumPy's allocator
BLOCK = "_Block"


def pooled(a: np.ndarray) -> bool:
    """Whether `a` (or the array it views) owns a block of the pool."""
    while isinstance(a, np.ndarray):
        a = a.base
    return type(a).__name__ == BLOCK


@pytest.fixture(autouse=True)
def restore_limit():
    old = pk.get_pool_limit()
    yield
    pk.set_pool_limit(old)


def test_pooled_arrays_are_ordinary_writeable_aligned_arrays():
    for shape, dtype in [((1024,), np.float32), ((256, 1024), np.float32), ((3, 5, 700), np.int64),
                         ((4097,), np.uint8), ((MIN // 2,), np.float16), ((100, 13), np.float64)]:
        a = _memory.empty(shape, dtype)
        assert a.shape == shape and a.dtype == dtype
        assert a.flags.c_contiguous and a.flags.writeable and a.flags.aligned
        assert pooled(a) == (a.nbytes >= MIN)
        if pooled(a):
            assert a.ctypes.data % 64 == 0
        a[...] = 7
        assert (a == 7).all()
    assert _memory.empty((0, 5), np.float32).shape == (0, 5)


def test_size_classes():
    """Multiples of 64 up to 4 KiB, then 8 classes per power of two: at most 12.5% over."""
    for n in [1, 63, 64, 65, 4095, 4096, 4097, 5000, 65536, 65537, 1 << 20, (1 << 20) + 1,
              3 * (1 << 20) + 7, 10**9]:
        c = _memory._class_size(n)
        assert n <= c <= max(64 * ((n + 63) // 64), int(n * 1.125) + 1), (n, c)
        assert _memory._class_size(c) == c


def test_block_returns_to_the_pool_when_the_last_reference_dies():
    pk.release_memory()
    s0 = pk.pool_stats()
    a = _memory.empty((1 << 18,), np.float32)          # 1 MiB
    addr = a.ctypes.data
    view = a[10:20]
    del a
    gc.collect()
    s1 = pk.pool_stats()
    assert s1["live_blocks"] == s0["live_blocks"] + 1   # the view keeps it alive
    view[:] = 1
    del view
    s2 = pk.pool_stats()
    assert s2["live_blocks"] == s0["live_blocks"] and s2["cached_blocks"] == s0["cached_blocks"] + 1
    b = _memory.empty((1 << 18,), np.float32)
    assert b.ctypes.data == addr                        # reused, not asked from the system
    assert pk.pool_stats()["hits"] == s2["hits"] + 1


def test_torch_tensor_keeps_the_block_alive():
    torch = pytest.importorskip("torch")
    a = _memory.empty((512, 512), np.float32)
    a[...] = 3.0
    t = torch.from_numpy(a)
    live = pk.pool_stats()["live_blocks"]
    del a
    gc.collect()
    b = _memory.empty((512, 512), np.float32)           # must not get t's memory
    b[...] = -1.0
    assert pk.pool_stats()["live_blocks"] == live + 1
    assert bool((t == 3.0).all())
    del t, b
    assert pk.pool_stats()["live_blocks"] == live - 1


def test_no_aliasing_between_live_arrays(rng):
    sizes = rng.integers(1, 300_000, 200)
    live = {}
    for step, n in enumerate(sizes):
        a = _memory.empty((int(n),), np.uint8)
        a[...] = step % 251
        live[step] = a
        if step % 3 == 2:                               # free some, so blocks get reused
            for k in list(live)[: len(live) // 3]:
                del live[k]
    spans = sorted((a.ctypes.data, a.ctypes.data + a.nbytes, k) for k, a in live.items())
    for (lo0, hi0, k0), (lo1, hi1, k1) in zip(spans, spans[1:]):
        assert hi0 <= lo1, (k0, k1)
    for k, a in live.items():
        assert (a == k % 251).all(), k


def test_many_threads_allocate_and_free():
    pk.set_pool_limit(8 << 20)
    base = pk.pool_stats()["live_blocks"]
    errors = []

    def work(seed):
        r = np.random.default_rng(seed)
        try:
            held = []
            for i in range(400):
                a = _memory.empty((int(r.integers(1000, 200_000)),), np.uint8)
                a[...] = seed
                held.append(a)
                if len(held) > 4:
                    b = held.pop(int(r.integers(0, len(held))))
                    if not (b == seed).all():
                        errors.append(f"thread {seed}: a block was overwritten")
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    s = pk.pool_stats()
    assert s["live_blocks"] == base and s["cached_bytes"] <= 8 << 20


def test_limit_bounds_the_idle_memory():
    pk.release_memory()
    pk.set_pool_limit(1 << 20)
    arrays = [_memory.empty((256 * 1024,), np.uint8) for _ in range(8)]   # 8 x 256 KiB
    del arrays
    s = pk.pool_stats()
    assert s["cached_bytes"] <= 1 << 20 and s["cached_blocks"] == 4
    big = _memory.empty((2 << 20,), np.uint8)           # larger than the limit: never kept
    del big
    assert pk.pool_stats()["cached_bytes"] <= 1 << 20
    assert pk.set_pool_limit("256K") == 1 << 20
    assert pk.get_pool_limit() == 256 << 10 and pk.pool_stats()["cached_bytes"] <= 256 << 10
    pk.set_pool_limit(0)
    assert pk.pool_stats()["cached_bytes"] == 0
    a = _memory.empty((1 << 16,), np.float32)
    del a
    assert pk.pool_stats()["cached_bytes"] == 0


def test_release_memory():
    pk.set_pool_limit(64 << 20)
    arrays = [_memory.empty((1 << 18,), np.float32) for _ in range(3)]
    keep = arrays.pop()
    del arrays
    cached = pk.pool_stats()["cached_bytes"]
    assert cached >= 2 << 20
    released = pk.pool_stats()["released_bytes"]
    assert pk.release_memory() == cached
    s = pk.pool_stats()
    assert s["cached_bytes"] == 0 and s["cached_blocks"] == 0
    assert s["released_bytes"] == released + cached
    keep[...] = 1                                       # live arrays keep their memory
    assert (keep == 1).all()


@pytest.mark.parametrize("bad,exc", [(-1, ValueError), (1.5, TypeError), ("lots", ValueError),
                                     (True, TypeError), (1 << 64, ValueError)])
def test_set_pool_limit_rejects_bad_values(bad, exc):
    with pytest.raises(exc, match="limit"):
        pk.set_pool_limit(bad)


def run_python(code: str, env_extra=None, timeout=120):
    env = dict(os.environ, **(env_extra or {}))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_limit_from_the_environment():
    p = run_python("import perfkernels as pk; print(pk.get_pool_limit())",
                   {"PERFKERNELS_POOL_LIMIT": "64M"})
    assert p.returncode == 0, p.stderr
    assert int(p.stdout) == 64 << 20
    p = run_python("import perfkernels", {"PERFKERNELS_POOL_LIMIT": "sixty"})
    assert p.returncode != 0 and "PERFKERNELS_POOL_LIMIT" in p.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_pool_is_valid_after_fork():
    """Fork while other threads allocate and free: the child can allocate, its inherited arrays
    are intact, and its pool's books balance."""
    pk.set_pool_limit(16 << 20)
    parent_array = _memory.empty((1 << 18,), np.float32)
    parent_array[...] = 5.0
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            a = _memory.empty((300_000,), np.uint8)
            a[0] = 1
            del a

    threads = [threading.Thread(target=churn) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in range(5):
            pid = os.fork()
            if pid == 0:   # the child: any failure exits non-zero
                code = 1
                try:
                    signal.alarm(30)
                    live = pk.pool_stats()["live_blocks"]
                    arrays = [_memory.empty((n,), np.uint8) for n in (5000, 300_000, 1 << 20)]
                    for k, a in enumerate(arrays):
                        a[...] = k + 1
                    ok = all((a == k + 1).all() for k, a in enumerate(arrays))
                    ok = ok and bool((parent_array == 5.0).all())
                    h, c = pk.lstm_unit(*(np.zeros((64, d), np.float32) for d in (64, 64, 256)))
                    ok = ok and h.shape == (64, 64)
                    del arrays, a, h, c
                    # (<=: arrays of the parent's other threads may die in the child meanwhile)
                    ok = ok and pk.pool_stats()["live_blocks"] <= live
                    pk.release_memory()
                    code = 0 if ok else 2
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert (parent_array == 5.0).all()


# ---- the kernels' outputs come from the pool -----------------------------------------------------

def test_numpy_api_outputs_are_pooled(rng):
    x = rng.standard_normal((300, 200)).astype(np.float32)
    h16 = pk.float_to_half(x)
    assert pooled(h16) and (h16 == x.astype(np.float16)).all()
    back = pk.half_to_float(h16)
    assert pooled(back) and (back == h16.astype(np.float32)).all()

    n, d = 64, 256
    hp, cp = (rng.standard_normal((n, d)).astype(np.float32) for _ in range(2))
    g = rng.standard_normal((n, 4 * d)).astype(np.float32)
    h, c = pk.lstm_unit(hp, cp, g)
    rh, rc = ref.lstm_unit(hp, cp, g)
    assert pooled(h) and pooled(c) and not np.shares_memory(h, c)
    ref.assert_close(h, rh, np.abs(rh) + 1, rtol=1e-5)
    ref.assert_close(c, rc, np.abs(rc) + 1, rtol=1e-5)
    grads = pk.lstm_unit_backward(cp, g, c, h, c)
    assert all(pooled(a) for a in grads)

    table = rng.standard_normal((1000, 64)).astype(np.float32)
    ix = rng.integers(0, 1000, 4096)
    off = np.arange(0, 4096, 4)
    out = pk.embedding_bag(table, ix, off, mode="sum")
    assert pooled(out)
    ref.assert_close(out, ref.embedding_bag(table, ix, off, mode="sum"))
    multi = pk.embedding_bags_multi([table, table], np.concatenate([ix, ix]),
                                    lengths=np.full(2048, 4))
    assert pooled(multi)
    ref.assert_close(multi[:, :64], ref.embedding_bag(table, ix, off, mode="sum"))
    packed = pk.quantize_rowwise(table, 8)
    assert pooled(packed)
    assert pooled(pk.dequantize_rowwise(packed, 8))
    q = pk.embedding_bag_quantized(packed, ix, off, bits=8)
    assert pooled(q)
    ref.assert_close(q, ref.embedding_bag_quantized(packed, ix, off, bits=8))


def test_torch_fast_path_outputs_are_pooled(rng):
    torch = pytest.importorskip("torch")
    import perfkernels.torch as pt
    bag = pt.EmbeddingBag(1000, 64, mode="sum")
    ix = torch.from_numpy(rng.integers(0, 1000, 4096))
    off = torch.arange(0, 4096, 4)
    with torch.no_grad():
        out = bag(ix, off)
        want = torch.nn.functional.embedding_bag(ix, bag.weight, off, mode="sum")
    torch.testing.assert_close(out, want)
    live = pk.pool_stats()["live_blocks"]
    del out
    assert pk.pool_stats()["live_blocks"] == live - 1   # the tensor held a block of the pool


# ---- no page faults in a steady-state loop ----------------------------------------------------------

FAULTS = """
import resource, sys, numpy as np, perfkernels as pk
rng = np.random.default_rng(0)
case = sys.argv[1]
if case == "lstm":
    n, d = 256, 1024
    args = [rng.standard_normal(s).astype(np.float32) for s in ((n, d), (n, d), (n, 4 * d))]
    call = lambda: pk.lstm_unit(*args)
elif case == "embedding":
    table = rng.standard_normal((10000, 128)).astype(np.float32)
    ix = rng.integers(0, 10000, 4096 * 2)
    off = np.arange(0, 4096 * 2, 2)
    call = lambda: pk.embedding_bag(table, ix, off, mode="sum")      # [4096, 128]: 2 MiB
elif case == "multi":
    tables = [rng.standard_normal((1000, 16)).astype(np.float32) for _ in range(26)]
    ix = rng.integers(0, 1000, 26 * 2048)
    lengths = np.ones(26 * 2048, np.int64)
    call = lambda: pk.embedding_bags_multi(tables, ix, lengths=lengths)
elif case == "fused":
    import torch
    from perfkernels.torch import _fused_ops
    torch.set_grad_enabled(False)
    weights = [torch.randn(1000, 16) for _ in range(26)]
    ix = [torch.from_numpy(rng.integers(0, 1000, 2048)) for _ in range(26)]
    off = [torch.arange(2048) for _ in range(26)]
    dense = torch.randn(2048, 16)
    # what optimize()'s eager graph calls: 26 lookups and the dot interaction, [2048, 367]
    call = lambda: _fused_ops.embedding_bags_interaction(
        dense, weights, ix, off, False, "dot", "dlrm", False, [0] * 26, [-1] * 26, [0] * 26,
        [0] * 26, 0)
else:
    import torch, perfkernels.torch as pt
    bag = pt.EmbeddingBag(10000, 128, mode="sum")
    ix = torch.from_numpy(rng.integers(0, 10000, 8192))
    off = torch.arange(0, 8192, 2)
    torch.set_grad_enabled(False)
    call = lambda: bag(ix, off)
for _ in range(20):
    r = call()
del r
calls = 200
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(calls):
    r = call()
    del r
after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print((after - before) / calls)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="ru_minflt as Linux counts it")
@pytest.mark.parametrize("malloc", ["default", "static-threshold"])
@pytest.mark.parametrize("case", ["lstm", "embedding", "multi", "torch", "fused"])
def test_steady_state_loop_makes_no_page_faults(case, malloc):
    """Also where glibc's mmap threshold does not adapt (set explicitly, or after the process
    freed a block over 32 MiB): there NumPy's allocator faults every page of every output in
    again, ~512 faults per call here."""
    if case in ("torch", "fused"):
        pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PERFKERNELS_NUM_THREADS="1")
    if malloc == "static-threshold":
        env["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
    p = subprocess.run([sys.executable, "-c", FAULTS, case], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    per_call = float(p.stdout.split()[-1])
    # without the pool: ~500 (lstm: two 1 MiB outputs) or ~500 (a 2 MiB output) faults per call
    assert per_call < 5, f"{case}: {per_call} minor page faults per call"


def test_a_larger_idle_block_serves_a_smaller_request_cut_to_its_class():
    """A request whose class has no idle block takes a mapped block of up to twice its size,
    its tail given back (no new mapping to fault in): outputs whose size varies call to call
    (a server's batches) are served from the pool from the first calls."""
    pk.release_memory()
    a = _memory.empty((3 << 18,), np.float32)            # 3 MiB
    addr = a.ctypes.data
    a[:] = 1
    del a
    gc.collect()
    s0 = pk.pool_stats()
    small = 5 << 17                                       # 2.5 MiB: two classes below
    b = _memory.empty((small,), np.float32)
    assert b.ctypes.data == addr                          # the idle block, not a new one
    s1 = pk.pool_stats()
    assert s1["hits"] == s0["hits"] + 1 and s1["misses"] == s0["misses"]
    assert s1["cached_blocks"] == s0["cached_blocks"] - 1
    cap = _memory._class_size(small * 4)
    assert s1["live_bytes"] == s0["live_bytes"] + cap
    assert s1["released_bytes"] == s0["released_bytes"] + (_memory._class_size(3 << 20) - cap)
    b[:] = 2                                              # all of it is still ours
    assert float(b.sum()) == 2.0 * small
    del b
    gc.collect()
    s2 = pk.pool_stats()
    assert s2["cached_bytes"] == s1["cached_bytes"] + cap   # back, at its new class's size
    c = _memory.empty((small,), np.float32)
    assert c.ctypes.data == addr
    del c
    # more than twice the size: not cut, a new block
    d = _memory.empty((1 << 17,), np.float32)             # 512 KiB
    assert d.ctypes.data != addr


def test_varying_sizes_reuse_blocks_without_page_faults():
    """Outputs of sizes that vary call to call, largest first: after the first, no page faults
    (each smaller one cut from the idle block)."""
    import resource
    pk.release_memory()
    sizes = [int(s) for s in np.linspace(9 << 20, 5 << 20, 12)]  # bytes, decreasing
    a = _memory.empty((sizes[0] // 4,), np.float32)
    a[:] = 0
    del a
    gc.collect()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for s in sizes[1:]:
        x = _memory.empty((s // 4,), np.float32)
        x[:] = 1
        del x
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < 50, f"{faults} page faults for {len(sizes) - 1} reused outputs"
