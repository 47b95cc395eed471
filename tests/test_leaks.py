"""No leaks: many calls of every public kernel (successful and failing ones) leave reference counts,
traced allocations and the resident set size flat.

Each case runs a warm-up, takes a baseline, repeats the call (10**5 times for small inputs, 10**3
for large ones), and checks:

* ``sys.getrefcount`` of every argument and of ``out=`` is unchanged (a missing DECREF in a
  wrapper shows up as +1 per call);
* the memory traced by ``tracemalloc`` (Python objects and NumPy array buffers) grows by less
  than a small constant, far less than one leaked array or exception per call would make;
* the RSS grows by less than a few MiB (C-level leaks that tracemalloc cannot see: one 64-byte
  block per call over 10**5 calls would be 6 MiB).

Skipped under the sanitizer build (ASan's allocator makes RSS meaningless; it has its own checks).
"""
import gc
import os
import sys
import tracemalloc

import ml_dtypes
import numpy as np
import pytest

import perfkernels as pk

pytestmark = pytest.mark.skipif(os.environ.get("PERFKERNELS_SANITIZE_RUN") == "1",
                                reason="RSS is not meaningful under AddressSanitizer")

PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def _case(size, rng):
    """{name: (callable, args, kwargs, expected exception or None)} for every public kernel."""
    rows, dim, nbags, bag = (50, 8, 4, 3) if size == "small" else (4000, 128, 512, 40)
    f32 = rng.standard_normal((rows, dim)).astype(np.float32)
    f16 = f32.astype(np.float16)
    bf16 = f32.astype(ml_dtypes.bfloat16)
    packed = pk.quantize_rowwise(f32, bits=4)
    ix = rng.integers(0, rows, nbags * bag)
    offs = np.arange(0, nbags * bag, bag)
    bad_ix = ix.copy()
    bad_ix[-1] = rows
    out_bags = np.empty((nbags, dim), np.float32)
    n = 16 if size == "small" else 1024
    h, c = rng.standard_normal((2, n, dim)).astype(np.float32)
    gates = rng.standard_normal((n, 4 * dim)).astype(np.float32)
    seq = rng.integers(0, 3, n).astype(np.int32)
    multi = {"lengths": np.full(2 * nbags, bag), "bits": [None, 4], "dims": [None, dim],
             "modes": ["sum", "mean"]}
    table = f32.copy()
    update = {"grad_output": rng.standard_normal((nbags, dim)).astype(np.float32),
              "optimizer": "rowwise_adagrad", "state": np.zeros(rows, np.float32), "lr": 1e-3}
    return {
        "embedding_bag": (pk.embedding_bag, (f16, ix, offs), {"mode": "mean"}, None),
        "embedding_bag_out": (pk.embedding_bag, (bf16, ix, offs),
                              {"per_sample_weights": np.ones(len(ix), np.float32), "out": out_bags}, None),
        "embedding_bag_bad_index": (pk.embedding_bag, (f32, bad_ix, offs), {"out": out_bags}, IndexError),
        "embedding_bag_bad_offsets": (pk.embedding_bag, (f32, ix, offs[::-1].copy()), {}, ValueError),
        "embedding_bag_bad_dtype": (pk.embedding_bag, (f32.astype(np.float64), ix, offs), {}, TypeError),
        "embedding_bag_quantized": (pk.embedding_bag_quantized, (packed, ix, offs), {"bits": 4}, None),
        "embedding_bag_quantized_bad_index": (pk.embedding_bag_quantized, (packed, bad_ix, offs),
                                              {"bits": 4}, IndexError),
        "quantize_rowwise": (pk.quantize_rowwise, (f32,), {"bits": 8}, None),
        "quantize_rowwise_nonfinite": (pk.quantize_rowwise, (np.full((2, dim), np.inf, np.float32),),
                                       {}, ValueError),
        "dequantize_rowwise": (pk.dequantize_rowwise, (packed,), {"bits": 4}, None),
        "float_to_half": (pk.float_to_half, (f32,), {"out": np.empty_like(f16)}, None),
        "float_to_half_bad_out": (pk.float_to_half, (f32,), {"out": np.empty(3, np.float16)}, ValueError),
        "half_to_float": (pk.half_to_float, (f16,), {}, None),
        "float_to_bfloat16": (pk.float_to_bfloat16, (f32[:, ::2],), {}, None),
        "bfloat16_to_float": (pk.bfloat16_to_float, (bf16,), {}, None),
        "lstm_unit": (pk.lstm_unit, (h, c, gates), {"seq_lengths": seq, "t": 1}, None),
        "lstm_unit_bad_shape": (pk.lstm_unit, (h, c, gates[:, 1:]), {}, ValueError),
        "lstm_unit_backward": (pk.lstm_unit_backward, (c, gates, c, h, h),
                               {"out": (None, np.empty_like(c), None)}, None),
        "embedding_bags_multi": (pk.embedding_bags_multi, ([f16, packed], np.concatenate([ix, ix])),
                                 multi, None),
        "embedding_bags_multi_bad_index": (pk.embedding_bags_multi,
                                           ([f16, packed], np.concatenate([ix, bad_ix])), multi,
                                           IndexError),
        "embedding": (pk.embedding, (bf16, ix.reshape(nbags, bag)), {}, None),
        "embedding_bad_index": (pk.embedding, (f32, bad_ix), {}, IndexError),
        "embedding_quantized": (pk.embedding_quantized, (packed, ix), {"bits": 4}, None),
        "dot_interaction": (pk.dot_interaction, (f32[:nbags], np.stack([f32[:nbags]] * 3, 1)), {}, None),
        "dot_interaction_backward": (pk.dot_interaction_backward,
                                     (np.concatenate([f32[:nbags], f32[:nbags, :6]], 1), f32[:nbags],
                                      [f32[:nbags]] * 3), {}, None),
        "embedding_bags_interaction": (pk.embedding_bags_interaction,
                                       (f32[:nbags], [f16, packed], [ix, ix], [offs, offs]),
                                       {"bits": [None, 4], "dims": [None, dim]}, None),
        "embedding_bag_backward_update": (pk.embedding_bag_backward_update, (table, ix, offs),
                                          update, None),
        "embedding_bag_backward_update_bad_index": (pk.embedding_bag_backward_update,
                                                    (table, bad_ix, offs), update, IndexError),
    }


def _call(fn, args, kwargs, exc):
    if exc is None:
        fn(*args, **kwargs)
    else:
        try:
            fn(*args, **kwargs)
        except exc:
            pass
        else:
            raise AssertionError(f"{fn.__name__} did not raise {exc.__name__}")


def _refcounts(args, kwargs):
    objs = list(args) + list(kwargs.values())
    objs += [o for v in kwargs.values() if isinstance(v, tuple) for o in v]
    return [sys.getrefcount(o) for o in objs if isinstance(o, np.ndarray)]


def _measure(fn, args, kwargs, exc, repeats):
    """(refcounts before, after, bytes still traced, RSS growth) over `repeats` calls."""
    for _ in range(200):
        _call(fn, args, kwargs, exc)
    gc.collect()
    refs_before = _refcounts(args, kwargs)
    rss_before = _rss_bytes()
    tracemalloc.start()
    try:
        traced_before = tracemalloc.get_traced_memory()[0]
        for _ in range(repeats):
            _call(fn, args, kwargs, exc)
        gc.collect()
        traced_growth = tracemalloc.get_traced_memory()[0] - traced_before
    finally:
        tracemalloc.stop()
    return refs_before, _refcounts(args, kwargs), traced_growth, _rss_bytes() - rss_before


@pytest.mark.parametrize("size,repeats", [("small", 100_000), ("large", 1_000)])
@pytest.mark.parametrize("name", sorted(_case("small", np.random.default_rng(0))))
def test_repeated_calls_do_not_leak(name, size, repeats):
    fn, args, kwargs, exc = _case(size, np.random.default_rng(0))[name]
    refs_before, refs_after, traced_growth, rss_growth = _measure(fn, args, kwargs, exc, repeats)
    assert refs_after == refs_before
    assert traced_growth < 64 * 1024, f"{traced_growth} bytes still traced after {repeats} calls"
    assert rss_growth < 4 * 2 ** 20, f"RSS grew by {rss_growth / 2 ** 20:.1f} MiB over {repeats} calls"


def test_the_measurement_sees_leaks():
    """The checks above can fail: a function that keeps a reference to its argument, and one that
    keeps a small array per call, are caught."""
    kept = []
    x = np.zeros(3, np.float32)
    refs_before, refs_after, _, _ = _measure(lambda a: kept.append(a), (x,), {}, None, 1000)
    assert refs_after == [r + 1000 for r in refs_before]
    kept.clear()
    _, _, traced_growth, _ = _measure(lambda a: kept.append(a.copy()), (x,), {}, None, 1000)
    assert traced_growth > 64 * 1024
