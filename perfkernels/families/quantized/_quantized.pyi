import numpy as np
import numpy.typing as npt

from ._typing import Float32Array, IndexArray, Mode, TableArray

def quantize_rowwise(weight: TableArray, bits: int = 8, *,
                     num_threads: int | None = None) -> npt.NDArray[np.uint8]: ...
def dequantize_rowwise(packed: npt.NDArray[np.uint8], bits: int = 8,
                       dim: int | None = None, *, num_threads: int | None = None) -> Float32Array: ...
def embedding_bag_quantized(packed: npt.NDArray[np.uint8], indices: IndexArray,
                            offsets: IndexArray | None = None, *, bits: int = 8,
                            dim: int | None = None, lengths: IndexArray | None = None,
                            per_sample_weights: npt.ArrayLike | None = None, mode: Mode = "sum",
                            include_last_offset: bool = False, padding_idx: int | None = None,
                            positional_weights: bool = False,
                            out: Float32Array | None = None,
                            num_threads: int | None = None) -> Float32Array: ...
