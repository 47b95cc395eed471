"""fp16/bf16 conversion, 16 Mi elements (DRAM) and 64 Ki (L2), beside NumPy and PyTorch."""
from .common import isa_or_skip, torch_or_skip  # first: it settles PERFKERNELS_ISA

import numpy as np

from perfkernels._variants import CONVERSIONS, CONVERT_SIZES
from perfkernels.families.convert.bench import _to_torch, make_input

NAMES = [c.name for c in CONVERSIONS]
BY_NAME = {c.name: c for c in CONVERSIONS}
SIZES = sorted(CONVERT_SIZES.values())


class Convert:
    params = (NAMES, SIZES)
    param_names = ["conversion", "n"]

    def setup(self, name, n):
        pk = isa_or_skip()
        _, src, dst, _ = BY_NAME[name]
        self.fn = getattr(pk, name)
        self.x = make_input(src, n)
        self.out = np.empty(n, dtype=dst)
        self.dst_dtype = dst

    def time_perfkernels(self, name, n):
        self.fn(self.x)

    def time_perfkernels_out(self, name, n):
        self.fn(self.x, out=self.out)

    def time_numpy(self, name, n):
        self.x.astype(self.dst_dtype)

    def track_gbps(self, name, n):
        import time
        self.fn(self.x, out=self.out)
        t0 = time.perf_counter()
        for _ in range(5):
            self.fn(self.x, out=self.out)
        return n * (self.x.itemsize + self.out.itemsize) * 5 / (time.perf_counter() - t0) / 1e9
    track_gbps.unit = "GB/s"


class ConvertTorch:
    params = (NAMES, SIZES)
    param_names = ["conversion", "n"]

    def setup(self, name, n):
        torch = torch_or_skip()
        _, src, _, method = BY_NAME[name]
        self.t = _to_torch(torch, make_input(src, n))
        self.method = method

    def time_torch(self, name, n):
        getattr(self.t, self.method)()
