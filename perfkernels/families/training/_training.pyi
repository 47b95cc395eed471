from typing import Literal

import numpy.typing as npt

from ._typing import Float32Array, IndexArray, Mode, TableArray

def embedding_bag_backward_update(
    weight: TableArray, indices: IndexArray, offsets: IndexArray | None = None, *,
    grad_output: Float32Array,
    optimizer: Literal["sgd", "adagrad", "rowwise_adagrad"] = "sgd",
    state: Float32Array | None = None, lr: float, eps: float = 1e-8, weight_decay: float = 0.0,
    lengths: IndexArray | None = None, per_sample_weights: npt.ArrayLike | None = None,
    mode: Mode = "sum", include_last_offset: bool = False, padding_idx: int | None = None,
    positional_weights: bool = False, num_threads: int | None = None,
    stochastic_rounding: bool = False, seed: int | None = None) -> None: ...
