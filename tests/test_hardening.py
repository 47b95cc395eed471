"""What a hostile or careless caller of the NumPy API can do: inputs rewritten by another thread
during a call, self-overlapping tables, hyper-parameters and sizes past every range, thread counts
past what an address-space limit allows.  Each test failed before the fix it guards."""
import os
import sys
import textwrap
import threading

import numpy as np
import pytest

import perfkernels as pk
from conftest import run_python

# --------------------------------------------------------------------------- inputs mutated during a call

ROWS, D = 64, 16


def _sum_bags(table, indices, offsets):
    """float64 reference of sum-mode bags (PyTorch offsets convention)."""
    bounds = list(offsets) + [len(indices)]
    return np.stack([table[indices[a:b]].astype(np.float64).sum(0)
                     for a, b in zip(bounds[:-1], bounds[1:])])


def _call(kind, table, packed, ix, off, out):
    if kind == "embedding_bag":
        return pk.embedding_bag(table, ix, off, out=out)
    if kind == "embedding_bag_quantized":
        return pk.embedding_bag_quantized(packed, ix, off, bits=8, out=out)
    # two features on the same index list: feature 0 the first half of the bags
    num_bags = len(off)
    half = num_bags // 2
    offsets = np.append(off, len(ix))
    return pk.embedding_bags_multi([table, table], ix, offsets=offsets,
                                   out=out.reshape(half, 2 * D)).reshape(num_bags, D)


@pytest.mark.parametrize("kind", ["embedding_bag", "embedding_bag_quantized",
                                  "embedding_bags_multi"])
@pytest.mark.parametrize("n, bag", [
    (600, 10),        # a tiny call (GIL held), out= written directly from a checked index copy
    (400_000, 10),    # threaded; long bags: out= through a temporary (fewer bytes moved)
    (400_000, 2)])    # threaded; short bags: out= written directly from a checked index copy
def test_indices_rewritten_during_the_call_never_half_write_out(kind, n, bag):
    """Another thread flips indices between a valid and an out-of-range value while the lookup
    runs with out=.  Every call either succeeds with the result of the valid indices (both values
    flipped are the same valid row) or raises IndexError with out= untouched.  Before the fix the
    indices were checked, then read again by the kernel: a bad value seen by the second read
    raised with out= half written."""
    rng = np.random.default_rng(7)
    table = rng.standard_normal((ROWS, D)).astype(np.float32)
    packed = pk.quantize_rowwise(table, bits=8)
    ix = rng.integers(0, ROWS, n).astype(np.int64)
    off = np.arange(0, n, bag, dtype=np.int64)
    if len(off) % 2:
        off = off[:-1]
    # one entry near the end: checked last, read by the kernel last, so the flip between the
    # check and the read is likely
    positions = np.array([n - 5])
    good = ix[positions].copy()
    expected = (pk.embedding_bag(table, ix, off) if kind != "embedding_bag_quantized" else
                pk.embedding_bag_quantized(packed, ix, off, bits=8))
    rows = pk.dequantize_rowwise(packed, bits=8) if kind.endswith("quantized") else table
    np.testing.assert_allclose(expected, _sum_bags(rows, ix, off), rtol=1e-4, atol=1e-4)
    if kind == "embedding_bags_multi":   # [B, 2D] (feature 0's bags, feature 1's) as [2B, D]
        half = len(off) // 2
        expected = np.concatenate([expected[:half], expected[half:]], axis=1).reshape(-1, D)

    stop = threading.Event()

    def mutate():
        bad = good + ROWS + 1000
        while not stop.is_set():
            ix[positions] = bad
            ix[positions] = good

    out = np.empty((len(off), D), np.float32)
    sentinel = np.float32(-12345.0)
    errors = successes = 0
    worker = threading.Thread(target=mutate)
    worker.start()
    try:
        for _ in range(60 if n > 1000 else 400):
            out.fill(sentinel)
            try:
                _call(kind, table, packed, ix, off, out)
            except IndexError as exc:
                errors += 1
                assert "out of range" in str(exc)
                assert np.all(out == sentinel), "IndexError raised with out= changed"
            else:
                successes += 1
                assert np.array_equal(out, expected)
    finally:
        stop.set()
        worker.join(10)
    assert errors + successes > 0


# --------------------------------------------------------------------------- self-overlapping tables

def _update_args(D_=4):
    return dict(grad_output=np.ones((2, D_), np.float32), lr=0.1)


@pytest.mark.parametrize("what", ["weight", "adagrad_state", "rowwise_state"])
def test_update_refuses_self_overlapping_writable_arrays(what):
    """A writable zero-stride table or state makes several rows one memory row: their updates
    would race on the pool's threads (lost updates).  Refused, like overlap between state and
    weight already is; nothing is written."""
    from numpy.lib.stride_tricks import as_strided
    rows, D_ = 8, 4
    base = np.zeros(D_, np.float32)
    weight = np.zeros((rows, D_), np.float32)
    optimizer, state = "sgd", None
    if what == "weight":
        weight = as_strided(base, (rows, D_), (0, 4), writeable=True)
    elif what == "adagrad_state":
        optimizer = "adagrad"
        state = as_strided(base, (rows, D_), (0, 4), writeable=True)
    else:
        optimizer = "rowwise_adagrad"
        state = as_strided(np.zeros(1, np.float32), (rows,), (0,), writeable=True)
    before = base.copy()
    name = "weight" if what == "weight" else "state"
    with pytest.raises(ValueError, match=f"{name} overlaps itself"):
        pk.embedding_bag_backward_update(weight, np.array([0, 1, 2, 3]), np.array([0, 2]),
                                         optimizer=optimizer, state=state, **_update_args(D_))
    assert np.array_equal(base, before)


def test_update_accepts_rows_a_row_apart():
    """The overlap check is exact: a column slice of a wider table (rows further apart than
    they are long) is still updated in place."""
    wide = np.zeros((3, 8), np.float32)
    weight = wide[:, :4]
    pk.embedding_bag_backward_update(weight, np.array([0, 2]), np.array([0, 1]),
                                     optimizer="sgd", **_update_args())
    assert np.allclose(wide[[0, 2], :4], -0.1) and np.all(wide[:, 4:] == 0) and np.all(wide[1] == 0)


# --------------------------------------------------------------------------- values past every range

@pytest.mark.parametrize("key, value, exc", [
    ("lr", 10 ** 400, ValueError), ("eps", 10 ** 400, ValueError),
    ("weight_decay", 10 ** 400, ValueError), ("lr", "0.1", TypeError), ("lr", True, TypeError),
    ("lr", np.True_, TypeError), ("lr", b"1", TypeError), ("lr", None, TypeError)])
def test_update_hyper_parameters_past_their_range_or_of_the_wrong_type(key, value, exc):
    weight = np.zeros((4, 4), np.float32)
    kw = _update_args()
    kw[key] = value
    with pytest.raises(exc, match=key):
        pk.embedding_bag_backward_update(weight, np.array([0, 1]), np.array([0, 1]),
                                         optimizer="sgd", **kw)
    assert np.all(weight == 0)


def test_update_still_takes_numpy_and_integer_hyper_parameters():
    weight = np.zeros((4, 4), np.float32)
    pk.embedding_bag_backward_update(weight, np.array([0, 1]), np.array([0, 1]),
                                     grad_output=np.ones((2, 4), np.float32), optimizer="sgd",
                                     lr=np.float32(0.5), weight_decay=0)
    assert np.allclose(weight[:2], -0.5)


@pytest.mark.parametrize("fn", ["lstm_unit", "lstm_unit_backward"])
def test_forget_bias_past_doubles_range_is_a_value_error(fn):
    n, d = 2, 3
    c = np.zeros((n, d), np.float32)
    gates = np.zeros((n, 4 * d), np.float32)
    with pytest.raises(ValueError, match="forget_bias"):
        if fn == "lstm_unit":
            pk.lstm_unit(c, c, gates, forget_bias=10 ** 400)
        else:
            pk.lstm_unit_backward(c, gates, c, c, c, forget_bias=10 ** 400)
    with pytest.raises(TypeError, match="forget_bias"):
        pk.lstm_unit(c, c, gates, forget_bias="1")


@pytest.mark.parametrize("dim", [2 ** 63, 2 ** 64 + 3, 10 ** 30])
def test_dim_past_any_array_is_a_value_error(dim):
    packed = pk.quantize_rowwise(np.ones((3, 8), np.float32), bits=4)
    with pytest.raises(ValueError, match="dim"):
        pk.embedding_bag_quantized(packed, np.array([[0, 1]]), bits=4, dim=dim)
    with pytest.raises(ValueError, match="dim"):
        pk.dequantize_rowwise(packed, bits=4, dim=dim)


@pytest.mark.parametrize("bits, width", [(2, 2 ** 62 + 5), (4, 2 ** 62 + 5), (2, 2 ** 63 - 1)])
def test_packed_width_whose_dimension_overflows_int64(bits, width):
    """(width - 4) * (8 // bits) overflowed a signed 64-bit integer (undefined behaviour): a 0-row
    2-bit table 2**62 + 5 bytes wide got D = 4.  Refused before the product is formed (the
    sanitizer run, .ci/sanitize, runs this test with signed-overflow checks on)."""
    packed = np.empty((0, width), np.uint8)
    with pytest.raises(ValueError, match="too wide"):
        pk.embedding_bag_quantized(packed, np.zeros((0, 1), np.int64), bits=bits)
    with pytest.raises(ValueError, match="too wide"):
        pk.dequantize_rowwise(packed, bits=bits)


# --------------------------------------------------------------------------- resource limits

_RLIMIT_SCRIPT = textwrap.dedent("""
    import resource, sys
    import numpy as np
    import perfkernels as pk
    import perfkernels.torch  # jobs on PyTorch's libgomp team where it has one
    rng = np.random.default_rng(0)
    table = rng.standard_normal((64, 256)).astype(np.float32)
    ix = rng.integers(0, 64, 600_000)
    off = np.arange(0, len(ix), 50)
    expected = pk.embedding_bag(table, ix, off, num_threads=1)
    with open("/proc/self/statm") as f:
        vm = int(f.read().split()[0]) * resource.getpagesize()
    # room for a few dozen 8 MiB thread stacks, not for thousands
    resource.setrlimit(resource.{limit}, ({value}, {value}))
    got = pk.embedding_bag(table, ix, off, num_threads={threads})
    assert np.array_equal(got, expected), "wrong result"
    print("ok", pk.torch.torch_threads_in_use())
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux's")
@pytest.mark.skipif(bool(os.environ.get("PERFKERNELS_SANITIZE_RUN")),
                    reason="AddressSanitizer reserves terabytes of address space: no RLIMIT_AS")
@pytest.mark.parametrize("threads", [4096, 300])
def test_huge_thread_count_under_an_address_space_limit_degrades(threads):
    """With perfkernels.torch imported, a job asked for more threads than libgomp's team ran on
    libgomp, which printed "Thread creation failed" and called exit(1) when an address-space
    limit (a memory-capped container) stopped it creating them.  Such a job now runs on the own
    pool, which runs it on the threads it could start."""
    pytest.importorskip("torch")
    script = _RLIMIT_SCRIPT.format(limit="RLIMIT_AS", value="vm + (512 << 20)", threads=threads)
    proc = run_python(["-c", script], timeout=180)
    assert "Thread creation failed" not in proc.stderr
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("ok")
