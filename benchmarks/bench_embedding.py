"""asv benchmarks: embedding_bag on float32 / float16 / bfloat16 tables, beside NumPy and PyTorch.

One build is timed under every ISA: the level comes from the PERFKERNELS_ISA environment variable
(asv.conf.json's matrix.env_nobuild), read by perfkernels at import, so nothing here loops over
ISAs.  Shapes (rows, D, bags, bag length) and dtypes are those of perfkernels._variants, shared
with the tests and ``python -m perfkernels bench``; inputs are seeded and built by
perfkernels.families.embedding.bench.  ``time_torch`` is skipped (NotImplementedError in setup) when
PyTorch is not installed.
"""
from .common import torch_or_skip  # first: it settles PERFKERNELS_ISA

import numpy as np

import perfkernels as pk
from perfkernels._variants import BAG_SHAPES, TABLE_DTYPES
from perfkernels.families.embedding.bench import make_inputs


class _Bags:
    params = ([tuple(s[1:]) for s in BAG_SHAPES], list(TABLE_DTYPES), ["uniform", "zipf"])
    param_names = ["shape", "dtype", "indices"]
    timeout = 300

    def setup(self, shape, dtype, dist):
        rows, dim, num_bags, bag_len = shape
        x = make_inputs(2026, rows, dim, num_bags, bag_len, TABLE_DTYPES[dtype], dist)
        self.weight, self.indices, self.offsets, self.out = (
            x["weight"], x["indices"], x["offsets"], x["out"])


class EmbeddingBag(_Bags):
    def time_perfkernels(self, shape, dtype, dist):
        pk.embedding_bag(self.weight, self.indices, self.offsets, out=self.out)

    def time_perfkernels_new_out(self, shape, dtype, dist):
        pk.embedding_bag(self.weight, self.indices, self.offsets)


class EmbeddingBagNumpy(_Bags):
    def setup(self, shape, dtype, dist):
        if shape[0] * shape[1] > 100_000_000 and dtype != "float32":
            raise NotImplementedError("NumPy baseline timed on float32 only for the 4M-row tables")
        super().setup(shape, dtype, dist)

    def time_numpy(self, shape, dtype, dist):
        np.add.reduceat(self.weight[self.indices], self.offsets, axis=0, dtype=np.float32)


class EmbeddingBagTorch(_Bags):
    def setup(self, shape, dtype, dist):
        torch = torch_or_skip()           # one thread
        super().setup(shape, dtype, dist)
        w = self.weight
        self.tw = (torch.from_numpy(w.view(np.int16)).view(torch.bfloat16) if dtype == "bfloat16"
                   else torch.from_numpy(w))
        self.ti, self.to = torch.from_numpy(self.indices), torch.from_numpy(self.offsets)
        self.bag = torch.nn.functional.embedding_bag

    def time_torch(self, shape, dtype, dist):
        self.bag(self.ti, self.tw, self.to, mode="sum")
