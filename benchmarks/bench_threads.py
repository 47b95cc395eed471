"""asv benchmarks: the thread-scaling view, with the thread count as a parameter.

The cases are those of ``python -m perfkernels bench --scaling`` (the benchsuite cases marked
``scaling``: DLRM's 1M x 64 float32 and 8-bit lookups with uniform and Zipf indices, the 26-table
multi-table lookup, a 16 Mi-element conversion, ...), built by the families' benchmark parts.  Ours runs
with ``set_num_threads(threads)``, PyTorch with ``torch.set_num_threads(threads)``; every other asv
module times one thread each (asv.conf.json sets PERFKERNELS_NUM_THREADS=1 and OMP_NUM_THREADS=1).
"""
try:
    import torch
except ImportError:
    torch = None

import perfkernels as pk

from perfkernels._variants import MULTI_SHAPE, ZIPF_BAG_SHAPE
from perfkernels.families.convert import bench as convert
from perfkernels.families.embedding import bench as embedding
from perfkernels.families.lstm import bench as lstm
from perfkernels.families.multi import bench as multi
from perfkernels.families.quantized import bench as quantized

_, ROWS, DIM, BAGS, LEN = ZIPF_BAG_SHAPE   # DLRM's 1M x 64, B 2048, L 100


def _lookup_8bit(dist):
    import numpy as np
    return quantized.lookup_case(np.random.default_rng(0), "dlrm 1M x 64", ROWS, DIM, BAGS, LEN, 8,
                                 dist)


#: The scaling cases by name, each built (by perfkernels.benchsuite) when a benchmark needs it.
CASES = {
    "float32 dlrm uniform": lambda: embedding.bag_case(0, "dlrm", ROWS, DIM, BAGS, LEN, "float32"),
    "float32 dlrm zipf": lambda: embedding.bag_case(0, "dlrm", ROWS, DIM, BAGS, LEN, "float32",
                                                    "zipf"),
    "8-bit dlrm uniform": lambda: _lookup_8bit("uniform"),
    "8-bit dlrm zipf": lambda: _lookup_8bit("zipf"),
    "multi criteo 26 tables": lambda: multi.multi_case(7, MULTI_SHAPE),
    "float_to_half 16Mi": lambda: next(c for c in convert.cases(False)
                                       if c.name == "float_to_half 16Mi out="),
    "lstm_unit N256 D1024": lambda: next(c for c in lstm.cases(False)
                                         if c.name == "lstm_unit N256 D1024"),
}
_built: dict = {}


def _case(key):
    if key not in _built:
        _built.clear()   # one case's inputs alive at a time (the tables are large)
        _built[key] = CASES[key]()
    return _built[key]


class _Scaling:
    params = (list(CASES), [1, 2, 4])
    param_names = ["case", "threads"]
    timeout = 600

    def setup(self, case, threads):
        self.case = _case(case)
        pk.set_num_threads(threads)


class ThreadScaling(_Scaling):
    def time_perfkernels(self, case, threads):
        self.case.ours()


class ThreadScalingTorch(_Scaling):
    def setup(self, case, threads):
        if torch is None:
            raise NotImplementedError("PyTorch is not installed")
        super().setup(case, threads)
        torch.set_num_threads(threads)
        self.torch_fn = self.case.baselines.get("torch") or self.case.baselines["torch loop"]

    def time_torch(self, case, threads):
        self.torch_fn()
