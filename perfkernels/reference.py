"""Reference implementations of every perfkernels kernel, in plain NumPy.

These are the oracles the tests (CPU and CUDA) and ``python -m perfkernels check`` compare the
kernels with.  They are written from the kernels' documented semantics (docs/semantics.md), not
from the kernels, and import nothing but NumPy, ml_dtypes and the pure-Python packed-row layout
(``perfkernels/families/quantized/layout.py``), so they can be read, and trusted, on their own:

- sums are taken in float64 and returned with the sum of the absolute values of their terms
  (:class:`Expected`), because a float32 kernel's rounding error is bounded by a multiple of that
  magnitude, not of the result (a sum of large terms that cancel is only known to that precision);
- where a format is shared with PyTorch bit for bit (row-wise quantization, fp16/bf16 conversion)
  the reference reproduces those bits, computing in float32 exactly where the format rounds in
  float32.

Inputs are assumed valid (the kernels' argument checks are tested separately), except that an
out-of-range index raises the kernels' ``IndexError`` instead of wrapping around as NumPy's
indexing would.

Each family's references live in its folder, ``perfkernels/families/<family>/reference.py``; this
module gathers them (and the comparisons of ``perfkernels/_reference_base.py``) under one name.
Adding a reference for a new kernel: one function in its family's ``reference.py``, named like the
public function, taking the same arguments (minus ``out=`` and thread options), returning float64
arrays (or :class:`Expected` for sums) or exact arrays for bit-exact formats, with a docstring
stating the semantics, listed in that module's ``__all__``; reuse :func:`bag_bounds` /
:func:`embedding_bag` for anything bag-shaped, and compare with :func:`assert_close` /
:func:`assert_same_bits`.  Then one import line below.
"""

from __future__ import annotations

from ._reference_base import (BFLOAT16, Expected, assert_close, assert_same_bits, max_excess,
                              tolerance)
from .families.convert.reference import (bfloat16_to_float, float_to_bfloat16, float_to_half,
                                         half_to_float)
from .families.embedding.reference import bag_bounds, embedding_bag
from .families.lstm.reference import GATE_ORDERS, lstm_unit, lstm_unit_backward
from .families.interaction.reference import (dot_interaction, dot_interaction_backward,
                                            interaction_pairs)
from .families.multi.reference import embedding_bags_interaction, embedding_bags_multi
from .families.quantized.reference import (dequantize_rowwise, embedding_bag_quantized,
                                           packed_row_bytes, quantize_rowwise)
from .families.sequence.reference import embedding, embedding_quantized
from .families.training.reference import (AdamUpdate, TableUpdate, assert_update_close,
                                          embedding_bag_backward_adam,
                                          embedding_bag_backward_update,
                                          embedding_bag_table_gradient)

__all__ = [
    "Expected", "bag_bounds", "embedding_bag",
    "quantize_rowwise", "dequantize_rowwise", "embedding_bag_quantized", "packed_row_bytes",
    "embedding_bags_multi", "embedding_bags_interaction", "dot_interaction",
    "dot_interaction_backward", "interaction_pairs",
    "float_to_half", "half_to_float", "float_to_bfloat16", "bfloat16_to_float",
    "lstm_unit", "lstm_unit_backward",
    "TableUpdate", "embedding_bag_table_gradient", "embedding_bag_backward_update",
    "assert_update_close", "AdamUpdate", "embedding_bag_backward_adam", "embedding",
    "embedding_quantized", "BFLOAT16", "GATE_ORDERS",
    "tolerance", "max_excess", "assert_close", "assert_same_bits",
]
