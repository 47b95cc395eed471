"""The headline benchmarks: the subset `python -m perfkernels history` times by default.

One module, so that ``asv run --bench "^headline\\."`` selects it.  Every class compares our call
with PyTorch 2.13 CPU's at the shape that matters to users (PyTorch's embedding bags and quantized
lookups are FBGEMM's kernels).  Every number reads the way asv reads all numbers, lower is better:

- ``track_time_ratio_vs_torch``: our time / PyTorch's, PyTorch at its default thread count (all
  cores) and ours at ours, as a user runs them; below 1 we are faster (0.5: twice as fast);
- ``track_time_ratio_vs_torch_1thread``: the same with one thread each, kernel against kernel;
- ``track_seconds_perfkernels`` / ``track_seconds_torch``: the two times per call behind the first
  ratio (medians of the same rounds);
- ``track_ratio_spread`` / ``track_ratio_spread_1thread``: how far the per-round ratios spread,
  (q75 - q25) / median: the measurement's own quality (asv.conf.json excludes them from the
  regression list).

A point is one measurement (``common.measure``): interleaved rounds in one process, the median of
the per-round ratios; one whose rounds spread more than ``common.SPREAD_LIMIT``, or whose PyTorch
did not get the cores it asked for, is measured again and, failing that, refused (the benchmark
fails, asv records no value).  Every point is measured once, in the classes' shared
``setup_cache`` (one process, once per asv run and environment); the ``track_`` methods report
from it.  The embedding shapes are the DLRM benchmark's table (1,000,000 x 64, 2048 bags of 100).

asv runs this suite (the checkout's) against the build of each commit it times, so it reads the
declared variants (shapes, conversions) from each family's ``bench`` module: commits from before
the family folders need the suite of their own time.
"""
import itertools

from .common import (Unreliable, isa_or_skip, measure,  # first: it settles PERFKERNELS_ISA
                     torch_or_skip)

import numpy as np

from perfkernels.benchsuite import zipf_indices
from perfkernels.families.convert.bench import CONVERSIONS, _to_torch, make_input
from perfkernels.families.embedding.bench import BAG_SHAPES, random_table
from perfkernels.families.lstm.bench import make_inputs as lstm_inputs
from perfkernels.families.lstm.bench import torch_forward
from perfkernels.families.quantized.bench import packed_table

#: DLRM's random-data benchmark (1M x 64, 2048 bags of 100): rows, D, bags, bag length
ROWS, DIM, BAGS, BAG_LEN = next(s[1:] for s in BAG_SHAPES if s[0].startswith("dlrm"))
TABLE_DTYPES = ["float32", "float16"]        # the float tables DLRM-style models serve
INDICES = ["uniform", "zipf"]
BITS = [8, 4]                                # the quantized formats PyTorch has lookups for
LSTM_SHAPE = (256, 1024)                     # N, D: the larger LSTM shape

#: The unit of the ratio graphs: the y axis label on the published pages.
RATIO_UNIT = "x PyTorch's time (lower is better)"
SPREAD_UNIT = "spread of the per-round ratios (lower is better)"
MODES = {"": False, "_1thread": True}       # benchmark name suffix: one_thread


class _Headline:
    """The measurement of every headline point (``setup_cache``) and the ``track_`` methods
    reporting a class's points from it.  A subclass builds its inputs in ``inputs()`` and returns
    the two calls of one parameter combination from ``calls(pk, torch, inputs, *params)``.

    asv keys a setup_cache by where its code is, so the classes share this one: it measures the
    points of every class (``CLASSES``) in one process, once per run and environment."""
    timeout = 1800
    params = ()

    def inputs(self):
        return None

    def calls(self, pk, torch, inputs, *params):
        raise NotImplementedError

    def setup_cache(self):
        pk, torch = isa_or_skip(), torch_or_skip()
        points = {}
        for cls in CLASSES:
            bench = cls()
            inputs = bench.inputs()
            for combo in itertools.product(*cls.params):
                ours, theirs = bench.calls(pk, torch, inputs, *combo)
                for suffix, one_thread in MODES.items():
                    try:
                        points[cls.__name__, combo, suffix] = measure(ours, theirs,
                                                                       one_thread=one_thread)
                    except Unreliable as exc:
                        points[cls.__name__, combo, suffix] = str(exc)
            del inputs, ours, theirs
        return points

    def _point(self, points, params, suffix):
        point = points[type(self).__name__, tuple(params), suffix]
        if isinstance(point, str):
            raise Unreliable(point)
        return point

    def track_time_ratio_vs_torch(self, points, *params):
        return self._point(points, params, "").ratio
    track_time_ratio_vs_torch.unit = RATIO_UNIT

    def track_time_ratio_vs_torch_1thread(self, points, *params):
        return self._point(points, params, "_1thread").ratio
    track_time_ratio_vs_torch_1thread.unit = RATIO_UNIT

    def track_seconds_perfkernels(self, points, *params):
        return self._point(points, params, "").ours
    track_seconds_perfkernels.unit = "seconds"

    def track_seconds_torch(self, points, *params):
        return self._point(points, params, "").theirs
    track_seconds_torch.unit = "seconds"

    def track_ratio_spread(self, points, *params):
        return self._point(points, params, "").spread
    track_ratio_spread.unit = SPREAD_UNIT

    def track_ratio_spread_1thread(self, points, *params):
        return self._point(points, params, "_1thread").spread
    track_ratio_spread_1thread.unit = SPREAD_UNIT


def _dlrm_inputs(*tables):
    """The DLRM table in the formats asked for (float32, float16, 8bit, 4bit) and both index
    streams, as NumPy arrays and their PyTorch views."""
    torch = torch_or_skip()
    rng = np.random.default_rng(2026)
    weight = random_table(rng, ROWS, DIM, np.float32)
    formats = {"float32": weight, "float16": weight.astype(np.float16)}
    formats.update({f"{bits}bit": packed_table(rng, ROWS, DIM, bits) for bits in BITS})
    indices = {"uniform": rng.integers(0, ROWS, BAGS * BAG_LEN, dtype=np.int64),
               "zipf": zipf_indices(rng, ROWS, BAGS * BAG_LEN)}
    arrays = {**{t: formats[t] for t in tables}, **indices,
              "offsets": np.arange(BAGS, dtype=np.int64) * BAG_LEN}
    return {k: (v, torch.from_numpy(v)) for k, v in arrays.items()}


class DLRMEmbeddingBag(_Headline):
    """embedding_bag (sum) on the DLRM table; PyTorch: ``torch.nn.functional.embedding_bag``."""
    params = (TABLE_DTYPES, INDICES)
    param_names = ["table", "indices"]

    def inputs(self):
        return _dlrm_inputs(*TABLE_DTYPES)

    def calls(self, pk, torch, x, table, indices):
        (w, tw), (i, ti), (o, to) = x[table], x[indices], x["offsets"]
        out = np.empty((BAGS, DIM), np.float32)
        bag = torch.nn.functional.embedding_bag
        return (lambda: pk.embedding_bag(w, i, o, out=out),
                lambda: bag(ti, tw, to, mode="sum"))


class DLRMQuantizedBag(_Headline):
    """embedding_bag_quantized on the DLRM table packed row-wise (uniform indices); PyTorch:
    ``torch.ops.quantized.embedding_bag_{byte,4bit}_rowwise_offsets``."""
    params = (BITS,)
    param_names = ["bits"]

    def inputs(self):
        return _dlrm_inputs(*(f"{bits}bit" for bits in BITS))

    def calls(self, pk, torch, x, bits):
        (w, tw), (i, ti), (o, to) = x[f"{bits}bit"], x["uniform"], x["offsets"]
        out = np.empty((BAGS, DIM), np.float32)
        op = getattr(torch.ops.quantized, {8: "embedding_bag_byte_rowwise_offsets",
                                           4: "embedding_bag_4bit_rowwise_offsets"}[bits])
        return (lambda: pk.embedding_bag_quantized(w, i, o, bits=bits, out=out),
                lambda: op(tw, ti, to, mode=0, include_last_offset=False))


class Conversion(_Headline):
    """fp16/bf16 conversion of 16 Mi elements (streams from DRAM); PyTorch: ``Tensor.half()`` etc."""
    params = ([c[0] for c in CONVERSIONS],)
    param_names = ["conversion"]

    def calls(self, pk, torch, _, name):
        _, src, dst, method = next(c for c in CONVERSIONS if c[0] == name)
        fn = getattr(pk, name)
        x = make_input(src, 16 << 20)
        out = np.empty(x.size, dtype=dst)
        t = getattr(_to_torch(torch, x), method)
        return lambda: fn(x, out=out), t


class LSTMUnit(_Headline):
    """The LSTM unit forward, N 256 x D 1024; PyTorch: the same pointwise math in eager ops."""

    def calls(self, pk, torch, _):
        x = lstm_inputs(*LSTM_SHAPE)
        t = {k: torch.from_numpy(v) for k, v in x.items()}
        out = (np.empty_like(x["h_prev"]), np.empty_like(x["c_prev"]))
        return (lambda: pk.lstm_unit(x["h_prev"], x["c_prev"], x["gates"], out=out),
                lambda: torch_forward(torch, t["c_prev"], t["gates"]))


#: Every headline class, in the order setup_cache measures them.
CLASSES = (DLRMEmbeddingBag, DLRMQuantizedBag, Conversion, LSTMUnit)
