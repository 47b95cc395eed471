from typing import Sequence

import numpy.typing as npt

from ._typing import Float32Array, IndexArray, Mode, TableArray

def embedding_bags_multi(tables: Sequence[TableArray], indices: IndexArray, *,
                         lengths: IndexArray | None = None, offsets: IndexArray | None = None,
                         per_sample_weights: npt.ArrayLike | None = None,
                         modes: Mode | Sequence[Mode] = "sum",
                         padding_idx: int | None | Sequence[int | None] = None,
                         bits: Sequence[int | None] | None = None,
                         dims: Sequence[int | None] | None = None,
                         out: Float32Array | None = None,
                         num_threads: int | None = None) -> Float32Array: ...
