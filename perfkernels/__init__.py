"""perfkernels: hand-vectorised CPU (scalar / AVX2 / AVX-512) and CUDA kernels for recommender and
sequence models: embedding bags on float and row-wise quantized tables, fp16/bf16 conversion and the
LSTM unit.  NumPy arrays in, NumPy arrays out; the best ISA level is chosen once at import.

``perfkernels.show_runtime()`` says what was chosen; ``PERFKERNELS_ISA`` forces a level.
Large calls run on several threads (``set_num_threads``, ``PERFKERNELS_NUM_THREADS``, or a call's
``num_threads=``), with the same results for any thread count.
"""
__version__ = "0.1.0"

import os as _os

from . import _source_tree

# Run from a checkout's root after `pip install .`, Python finds this uncompiled source folder
# first: continue from the installed, compiled copy (or raise a clear ImportError).
__path__[:] = [_source_tree.package_dir(__path__[0])]
__file__ = _os.path.join(__path__[0], "__init__.py")

from . import _dispatch, _parallel  # noqa: E402

_dispatch._init_from_environment()
_parallel._init_from_environment()

from ._dispatch import active_isa, available_isas, cpu_features, show_runtime, use_isa  # noqa: E402
from ._parallel import get_num_threads, set_num_threads  # noqa: E402
# kernel families (the rows of _registry.FAMILIES): one import line each
from .families.convert._convert import (  # noqa: E402
    bfloat16_to_float, float_to_bfloat16, float_to_half, half_to_float)
from .families.embedding._embedding import embedding_bag  # noqa: E402
from .families.quantized._quantized import (  # noqa: E402
    dequantize_rowwise, embedding_bag_quantized, quantize_rowwise)
from .families.lstm._lstm import lstm_unit, lstm_unit_backward  # noqa: E402
from .families.interaction._interaction import dot_interaction, dot_interaction_backward  # noqa: E402
from .families.multi._multi import embedding_bags_interaction, embedding_bags_multi  # noqa: E402
from .families.training._training import embedding_bag_backward_update  # noqa: E402
from .families.sequence._sequence import embedding, embedding_quantized  # noqa: E402
from ._placement import as_table, empty_table, placement_of  # noqa: E402
from ._memory import get_pool_limit, pool_stats, release_memory, set_pool_limit  # noqa: E402

__all__ = [
    "active_isa", "available_isas", "cpu_features", "show_runtime", "use_isa",
    "get_num_threads", "set_num_threads",
    "float_to_half", "half_to_float", "float_to_bfloat16", "bfloat16_to_float",
    "embedding_bag", "embedding_bags_multi", "embedding_bags_interaction", "dot_interaction",
    "dot_interaction_backward",
    "quantize_rowwise", "dequantize_rowwise", "embedding_bag_quantized",
    "lstm_unit", "lstm_unit_backward",
    "embedding_bag_backward_update",
    "embedding", "embedding_quantized",
    "empty_table", "as_table", "placement_of",
    "release_memory", "set_pool_limit", "get_pool_limit", "pool_stats",
]
