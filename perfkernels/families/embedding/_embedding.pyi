import numpy.typing as npt

from ._typing import Float32Array, IndexArray, Mode, TableArray

def embedding_bag(weight: TableArray, indices: IndexArray, offsets: IndexArray | None = None, *,
                  lengths: IndexArray | None = None,
                  per_sample_weights: npt.ArrayLike | None = None, mode: Mode = "sum",
                  include_last_offset: bool = False, padding_idx: int | None = None,
                  positional_weights: bool = False,
                  out: Float32Array | None = None,
                  num_threads: int | None = None) -> Float32Array: ...
