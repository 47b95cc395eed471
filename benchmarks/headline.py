"""The headline benchmarks: the subset `python -m perfkernels history` times by default.

One module, so that ``asv run --bench "^headline\\."`` selects it.  Every class times our call at
the shape that matters to users (``time_perfkernels``) and tracks how many times faster than
PyTorch 2.13 CPU it is (PyTorch's embedding bags and quantized lookups are FBGEMM's kernels):

- ``track_speedup_vs_torch``: PyTorch at its default thread count (all cores) against ours at
  ours, as a user runs them;
- ``track_speedup_vs_torch_1thread``: one thread each, kernel against kernel.

Both are measured side by side in one process (``common.speedup``), so the published graphs show
the ratio over the project's history, not only our absolute time.  The embedding shapes are the
DLRM benchmark's table (1,000,000 x 64, 2048 bags of 100 indices).  Its tables are built once per
asv run in ``setup_cache`` and saved as .npy files that each benchmark process loads, instead of
being generated again for every benchmark and parameter.

The history runs this suite against older builds too, so it reads the declared variants (shapes,
conversions) through names that every recent commit's ``perfkernels.benchsuite`` has.
"""
from .common import isa_or_skip, speedup, torch_or_skip  # first: it settles PERFKERNELS_ISA

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

SPEEDUP_UNIT = "x faster than PyTorch"


class _Ratios:
    """time_perfkernels and the two speed-ups, from ``ours()`` and ``theirs()`` of a subclass."""
    timeout = 300

    def ours(self):
        raise NotImplementedError

    def theirs(self):
        raise NotImplementedError

    def time_perfkernels(self, *params):
        self.ours()

    def track_speedup_vs_torch(self, *params):
        return speedup(self.ours, self.theirs, one_thread=False)
    track_speedup_vs_torch.unit = SPEEDUP_UNIT

    def track_speedup_vs_torch_1thread(self, *params):
        return speedup(self.ours, self.theirs, one_thread=True)
    track_speedup_vs_torch_1thread.unit = SPEEDUP_UNIT


class _DLRMTables(_Ratios):
    """Shares one ``setup_cache`` (one key) among the DLRM classes: tables and indices as files."""

    def setup_cache(self):
        rng = np.random.default_rng(2026)
        table = random_table(rng, ROWS, DIM, np.float32)
        np.save("table_float32.npy", table)
        np.save("table_float16.npy", table.astype(np.float16))
        for bits in BITS:
            np.save(f"table_{bits}bit.npy", packed_table(rng, ROWS, DIM, bits))
        np.save("indices_uniform.npy", rng.integers(0, ROWS, BAGS * BAG_LEN, dtype=np.int64))
        np.save("indices_zipf.npy", zipf_indices(rng, ROWS, BAGS * BAG_LEN))

    def load(self, table: str, indices: str):
        torch = torch_or_skip()
        self.weight = np.load(f"table_{table}.npy")
        self.indices = np.load(f"indices_{indices}.npy")
        self.offsets = np.arange(BAGS, dtype=np.int64) * BAG_LEN
        self.out = np.empty((BAGS, DIM), np.float32)
        return torch, [torch.from_numpy(a) for a in (self.weight, self.indices, self.offsets)]


class DLRMEmbeddingBag(_DLRMTables):
    """embedding_bag (sum) on the DLRM table; PyTorch: ``torch.nn.functional.embedding_bag``."""
    params = (TABLE_DTYPES, INDICES)
    param_names = ["table", "indices"]

    def setup(self, table, indices):
        self.pk = isa_or_skip()
        torch, (self.tw, self.ti, self.to) = self.load(table, indices)
        self.bag = torch.nn.functional.embedding_bag

    def ours(self):
        self.pk.embedding_bag(self.weight, self.indices, self.offsets, out=self.out)

    def theirs(self):
        self.bag(self.ti, self.tw, self.to, mode="sum")


class DLRMQuantizedBag(_DLRMTables):
    """embedding_bag_quantized on the DLRM table packed row-wise (uniform indices); PyTorch:
    ``torch.ops.quantized.embedding_bag_{byte,4bit}_rowwise_offsets``."""
    params = (BITS,)
    param_names = ["bits"]

    def setup(self, bits):
        self.pk = isa_or_skip()
        torch, (self.tw, self.ti, self.to) = self.load(f"{bits}bit", "uniform")
        self.bits = bits
        self.op = getattr(torch.ops.quantized, {8: "embedding_bag_byte_rowwise_offsets",
                                                4: "embedding_bag_4bit_rowwise_offsets"}[bits])

    def ours(self):
        self.pk.embedding_bag_quantized(self.weight, self.indices, self.offsets, bits=self.bits,
                                        out=self.out)

    def theirs(self):
        self.op(self.tw, self.ti, self.to, mode=0, include_last_offset=False)


class Conversion(_Ratios):
    """fp16/bf16 conversion of 16 Mi elements (streams from DRAM); PyTorch: ``Tensor.half()`` etc."""
    params = ([c[0] for c in CONVERSIONS],)
    param_names = ["conversion"]

    def setup(self, name):
        self.pk = isa_or_skip()
        torch = torch_or_skip()
        _, src, dst, method = next(c for c in CONVERSIONS if c[0] == name)
        self.fn = getattr(self.pk, name)
        self.x = make_input(src, 16 << 20)
        self.out = np.empty(self.x.size, dtype=dst)
        self.t = _to_torch(torch, self.x)
        self.method = method

    def ours(self):
        self.fn(self.x, out=self.out)

    def theirs(self):
        getattr(self.t, self.method)()


class LSTMUnit(_Ratios):
    """The LSTM unit forward, N 256 x D 1024; PyTorch: the same pointwise math in eager ops."""

    def setup(self):
        self.pk = isa_or_skip()
        self.torch = torch_or_skip()
        self.x = lstm_inputs(*LSTM_SHAPE)
        self.t = {k: self.torch.from_numpy(v) for k, v in self.x.items()}
        self.out = (np.empty_like(self.x["h_prev"]), np.empty_like(self.x["c_prev"]))

    def ours(self):
        x = self.x
        self.pk.lstm_unit(x["h_prev"], x["c_prev"], x["gates"], out=self.out)

    def theirs(self):
        torch_forward(self.torch, self.t["c_prev"], self.t["gates"])

