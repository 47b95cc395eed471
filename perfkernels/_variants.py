"""The variants every kernel family is tested and benchmarked over, declared once.

The tests (tests/conftest.py), the built-in benchmark (``perfkernels.benchsuite``) and the asv
suite (``benchmarks/``) all read these lists, so adding a table dtype, a bit width or a shape here
adds its tests and benchmarks.  The ISA levels are not here: they come from the ISA registry that
the build and the dispatcher read.  Imports nothing but NumPy and ml_dtypes.
"""
from __future__ import annotations

from typing import NamedTuple

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

#: Float table dtypes of ``embedding_bag``, by the name used in test ids and benchmark labels.
TABLE_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": BFLOAT16,
}
#: Index (and offsets / lengths) dtypes every bag kernel accepts.
INDEX_DTYPES: tuple[np.dtype, ...] = (np.dtype(np.int32), np.dtype(np.int64))
#: Pooling modes of the bag kernels.
MODES: tuple[str, ...] = ("sum", "mean")
#: Bit widths of the row-wise quantized tables.
BITS: tuple[int, ...] = (8, 4, 2)
#: Bit widths the quantized benchmarks time (2-bit is tested, not a benchmark headline).
BENCH_BITS: tuple[int, ...] = (8, 4)
#: Source dtypes ``quantize_rowwise`` accepts.
QUANTIZE_DTYPES: tuple[np.dtype, ...] = (np.dtype(np.float32), np.dtype(np.float16))
#: The embedding dimensions every kernel is tested on: around each vector width and each
#: compiled-in specialisation, plus one large odd value.
AWKWARD_DIMS: tuple[int, ...] = (1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000)
#: The dimensions the bag kernels compile in (held in registers).
SPECIALISED_DIMS: tuple[int, ...] = (16, 32, 64, 128, 256)
#: Gate orders of the LSTM unit: caffe2's and PyTorch LSTMCell's.
GATE_ORDERS: tuple[str, ...] = ("ifog", "ifgo")


class Conversion(NamedTuple):
    """One fp16/bf16 conversion: the function's name, its input and output dtypes, and the
    ``torch.Tensor`` method that does the same."""
    name: str
    src: np.dtype
    dst: np.dtype
    torch_method: str


CONVERSIONS: tuple[Conversion, ...] = (
    Conversion("float_to_half", np.dtype(np.float32), np.dtype(np.float16), "half"),
    Conversion("half_to_float", np.dtype(np.float16), np.dtype(np.float32), "float"),
    Conversion("float_to_bfloat16", np.dtype(np.float32), BFLOAT16, "bfloat16"),
    Conversion("bfloat16_to_float", BFLOAT16, np.dtype(np.float32), "float"),
)


class BagShape(NamedTuple):
    """An embedding-bag workload: table ``rows x dim``, ``bags`` bags of ``bag_len`` indices."""
    name: str
    rows: int
    dim: int
    bags: int
    bag_len: int


#: Benchmark shapes of every bag family (float and quantized tables); see docs/benchmarking.md.
BAG_SHAPES: tuple[BagShape, ...] = (
    BagShape("fbgemm 4M x 32", 4_000_000, 32, 10, 100),     # FBGEMM's own benchmark
    BagShape("fbgemm 4M x 64", 4_000_000, 64, 10, 100),
    BagShape("fbgemm 4M x 128", 4_000_000, 128, 10, 100),
    BagShape("fbgemm 4M x 256", 4_000_000, 256, 10, 100),
    BagShape("dlrm 1M x 64", 1_000_000, 64, 2048, 100),     # DLRM's random-data benchmark
    BagShape("cache 20k x 128", 20_000, 128, 512, 40),      # a cache-resident table
    BagShape("tiny 1k x 64", 1_000, 64, 1, 1),              # the fixed cost of one call
)
#: The bag shape Zipf-distributed indices are timed on (real traffic is power-law).
ZIPF_BAG_SHAPE: BagShape = BAG_SHAPES[4]
#: Small stand-ins for ``bench --quick`` (seconds, not minutes).
QUICK_BAG_SHAPES: tuple[BagShape, ...] = (
    BagShape("cache 20k x 128", 20_000, 128, 512, 40),
    BagShape("small 100k x 64", 100_000, 64, 256, 40),
    BagShape("tiny 1k x 64", 1_000, 64, 1, 1),
)
QUICK_ZIPF_BAG_SHAPE: BagShape = QUICK_BAG_SHAPES[1]

#: Criteo Kaggle's 26 sparse-feature cardinalities (the DLRM example's tables).
CRITEO_KAGGLE_ROWS: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
    5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)


class MultiShape(NamedTuple):
    """A multi-table lookup: one table per feature (rows capped at ``max_rows``), ``dim`` wide,
    ``batch`` samples, each bag's length drawn uniformly from ``[min_len, max_len]``."""
    name: str
    rows: tuple[int, ...]
    max_rows: int
    dim: int
    batch: int
    min_len: int
    max_len: int


#: The multi-table benchmark: the 26 DLRM tables in one call (docs/benchmarking.md).
MULTI_SHAPE: MultiShape = MultiShape("criteo 26 tables", CRITEO_KAGGLE_ROWS, 1_000_000, 64, 2048,
                                     1, 100)
QUICK_MULTI_SHAPE: MultiShape = MultiShape("criteo 26 tables small", CRITEO_KAGGLE_ROWS, 20_000, 64,
                                           256, 1, 20)

#: ``quantize_rowwise`` benchmark tables (rows, D): full and quick.
QUANTIZE_SHAPE: tuple[int, int] = (200_000, 128)
QUICK_QUANTIZE_SHAPE: tuple[int, int] = (20_000, 128)

#: Conversion benchmark sizes (elements): from DRAM and from L2.
CONVERT_SIZES: dict[str, int] = {"16Mi": 16 << 20, "64Ki": 64 << 10}
QUICK_CONVERT_SIZES: dict[str, int] = {"2Mi": 2 << 20, "64Ki": 64 << 10}

#: LSTM unit benchmark shapes (N, D).
LSTM_SHAPES: dict[str, tuple[int, int]] = {"N256 D1024": (256, 1024), "N64 D256": (64, 256)}
QUICK_LSTM_SHAPES: dict[str, tuple[int, int]] = {"N16 D64": (16, 64), "N64 D256": (64, 256)}

#: GPU bag shapes: one table as fbgemm_gpu's benchmark defaults, and a large one.
GPU_BAG_SHAPES: tuple[BagShape, ...] = (
    BagShape("fbgemm-table", 100_000, 128, 512, 20),
    BagShape("large", 10_000_000, 128, 65_536, 32),
)
QUICK_GPU_BAG_SHAPES: tuple[BagShape, ...] = (
    BagShape("fbgemm-table", 100_000, 128, 512, 20),
    BagShape("medium", 1_000_000, 128, 8192, 32),
)
#: GPU conversion benchmark size (elements).
GPU_CONVERT_ELEMENTS: int = 16 << 20
