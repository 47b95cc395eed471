"""perfkernels.torch: perfkernels' kernels as drop-in PyTorch modules (``pip install
perfkernels[torch]``).

    import perfkernels.torch
    model = perfkernels.torch.convert(model)      # every nn.EmbeddingBag now runs on perfkernels

* :class:`EmbeddingBag`, :class:`QuantizedEmbeddingBag`, :class:`EmbeddingBagCollection`:
  modules with the constructor, ``forward`` and ``state_dict`` of the ones they replace;
* :func:`optimize` converts a whole model and fuses its lookups with the interaction they feed
  (DLRM's dot / cat, TorchRec's InteractionArch) on torch.export's graph;
* :func:`convert` swaps them into an existing model, their tables placed for gathers (2 MiB
  huge pages; :func:`place`, :func:`placement_report`); :func:`route_functional` routes
  ``torch.nn.functional.embedding_bag`` to :func:`embedding_bag`;
* :func:`quantize_dense` puts a dense submodule (MLPs, cross layers) into int8 through torchao's
  PT2E flow compiled by Inductor (torchao optional), :func:`compile_frozen` compiles one in
  float32 with freezing; the lookups stay perfkernels';
* every kernel is also a ``torch.library`` custom op (``torch.ops.perfkernels.*``) with a fake
  implementation, so ``torch.compile(fullgraph=True)`` and ``torch.export`` see it; eager calls
  take a cheaper direct route.  The bag ops are registered from a native library on PyTorch's
  stable ABI (:func:`native_library_path`), so exported models run from C++ without Python
  (docs/deployment.md).

CPU tensors reach the C kernels without a copy; CUDA tensors go to ``perfkernels.cuda``.
Once imported, perfkernels' parallel jobs run on PyTorch's OpenMP threads
(:func:`use_torch_threads`), so the two libraries do not compete for the cores.
An out-of-range index raises :class:`IndexOutOfRangeError`, both an ``IndexError`` and a
``RuntimeError``.
"""
try:
    import torch  # noqa: F401
except ImportError as exc:   # pragma: no cover - exercised only without torch
    raise ImportError("perfkernels.torch needs PyTorch: pip install 'perfkernels[torch]'") from exc

from ._bridge import IndexOutOfRangeError
from ._bags import BagBackward
from ._embedding_bag import EmbeddingBag
from ._embedding import Embedding, embedding
from ._quantized_embedding import QuantizedEmbedding
from ._embedding_collection import EmbeddingCollection, EmbeddingConfig, JaggedTensor
from ._fused import FusedOptimizer
from ._quantized import (QuantizedEmbeddingBag, dequantize_rowwise,
                         embedding_bag_2bit_rowwise_offsets, embedding_bag_4bit_rowwise_offsets,
                         embedding_bag_byte_rowwise_offsets, quantize_rowwise)
from ._collection import (EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor,
                          KeyedTensor)
from ._lstm import LSTMCell, lstm_unit
from ._convert import ConversionReport, convert, embedding_bag, last_report, route_functional
from ._threads import torch_threads_in_use, use_torch_threads
from ._optimize import OptimizationReport, last_optimize_report, optimize
from ._placement import place, placement_report
from ._native_ops import native_library_path
from ._dense_int8 import compile_frozen, quantize_dense

__all__ = [
    "IndexOutOfRangeError", "BagBackward",
    "EmbeddingBag", "FusedOptimizer", "Embedding", "embedding", "QuantizedEmbedding",
    "EmbeddingCollection", "EmbeddingConfig", "JaggedTensor", "QuantizedEmbeddingBag",
    "embedding_bag_byte_rowwise_offsets", "embedding_bag_4bit_rowwise_offsets",
    "embedding_bag_2bit_rowwise_offsets", "quantize_rowwise", "dequantize_rowwise",
    "EmbeddingBagCollection", "EmbeddingBagConfig", "KeyedJaggedTensor", "KeyedTensor",
    "LSTMCell", "lstm_unit",
    "convert", "ConversionReport", "last_report", "embedding_bag", "route_functional",
    "use_torch_threads", "torch_threads_in_use",
    "place", "placement_report",
    "optimize", "OptimizationReport", "last_optimize_report",
    "native_library_path",
    "quantize_dense", "compile_frozen",
]

_threads._init_from_environment()
