"""asv benchmarks: row-wise quantized lookups and quantization, beside PyTorch's quantized ops.

One build is timed under every ISA: the level comes from the PERFKERNELS_ISA environment variable
(asv.conf.json's matrix.env_nobuild), read by perfkernels at import.  The ``*Torch`` classes time
PyTorch on the same inputs; their setup raises NotImplementedError (asv: skipped) without PyTorch.
"""
from .common import torch_or_skip  # first: it settles PERFKERNELS_ISA

import numpy as np

import perfkernels as pk
from perfkernels._variants import BAG_SHAPES, BENCH_BITS, BITS, QUANTIZE_SHAPE
from perfkernels.families.quantized.bench import packed_table

_TORCH_LOOKUP = {8: "embedding_bag_byte_rowwise_offsets", 4: "embedding_bag_4bit_rowwise_offsets"}


class _Lookup:
    # (rows, D, bags, bag length): the bag shapes of every bag family
    params = ([tuple(s[1:]) for s in BAG_SHAPES], list(BENCH_BITS))
    param_names = ["shape", "bits"]
    timeout = 300

    def setup(self, shape, bits):
        rows, dim, num_bags, bag_len = shape
        rng = np.random.default_rng(0)
        self.packed = packed_table(rng, rows, dim, bits)
        self.indices = rng.integers(0, rows, num_bags * bag_len, dtype=np.int64)
        self.offsets = np.arange(num_bags, dtype=np.int64) * bag_len
        self.out = np.empty((num_bags, dim), np.float32)


class QuantizedLookup(_Lookup):
    def time_perfkernels(self, shape, bits):
        pk.embedding_bag_quantized(self.packed, self.indices, self.offsets, bits=bits, out=self.out)


class QuantizedLookupTorch(_Lookup):
    def setup(self, shape, bits):
        torch = torch_or_skip()           # one thread
        super().setup(shape, bits)
        self.op = getattr(torch.ops.quantized, _TORCH_LOOKUP[bits])
        self.t = [torch.from_numpy(a) for a in (self.packed, self.indices, self.offsets)]

    def time_torch(self, shape, bits):
        self.op(*self.t, mode=0, include_last_offset=False)


class _Quantize:
    params = list(BITS)
    param_names = ["bits"]

    def setup(self, bits):
        self.weight = np.random.default_rng(0).standard_normal(QUANTIZE_SHAPE, dtype=np.float32)


class Quantize(_Quantize):
    def time_perfkernels(self, bits):
        pk.quantize_rowwise(self.weight, bits=bits)


class QuantizeTorch(_Quantize):
    def setup(self, bits):
        torch = torch_or_skip()           # one thread
        super().setup(bits)
        self.tw = torch.from_numpy(self.weight)
        self.prepack = {8: torch.ops.quantized.embedding_bag_byte_prepack,
                        4: torch.ops.quantized.embedding_bag_4bit_prepack,
                        2: torch.ops.quantized.embedding_bag_2bit_prepack}[bits]

    def time_torch(self, bits):
        self.prepack(self.tw)


class Dequantize:
    params = list(BITS)
    param_names = ["bits"]

    def setup(self, bits):
        w = np.random.default_rng(0).standard_normal(QUANTIZE_SHAPE, dtype=np.float32)
        self.packed = pk.quantize_rowwise(w, bits=bits)

    def time_perfkernels(self, bits):
        pk.dequantize_rowwise(self.packed, bits=bits)
