"""The graph form of a converted ``torchrec.quant`` EmbeddingBagCollection: what
``torchrec.fx.symbolic_trace`` / ``torch.fx``, ``torch.export`` and ``torch.compile`` record for it.

Every feature is looked up by one registered op, ``perfkernels::embedding_bag_collection_packed``,
over the converted collection's rows (ours, read from FBGEMM's without going through float), so a
traced model runs our kernel as the eager module does, with TorchRec's output bit for bit.  Under
``torchrec.fx.symbolic_trace`` the lookup is one leaf call of :func:`quant_ebc_lookup`, written in
TorchScript's subset of Python, so that ``torch.jit.script`` of the traced graph (TorchRec's
packaging for C++ serving) compiles it; the tables become attributes of the graph module.

Imported only where TorchRec is (it names TorchRec's classes in its annotations).
"""
from typing import List, Optional

import torch
from torch import Tensor
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from . import _native_ops  # noqa: F401 (the op)


def quant_ebc_lookup(features: KeyedJaggedTensor, tables: List[Tensor], names: List[str],
                     bits: List[int], dims: List[int], mean: List[int],
                     embedding_names: List[str], length_per_key: List[int],
                     output_dtype: torch.dtype) -> KeyedTensor:
    """The pooled rows of the features ``names`` (the collection's order; ``tables[i]`` read by
    feature ``names[i]``, ``bits[i]`` 8/4/2 with ``dims[i]`` values a row, or 0 for a float
    table; ``mean[i]`` 1 to average) as TorchRec's KeyedTensor."""
    keys = features.keys()
    if keys != names:
        features = features.permute([keys.index(k) for k in names])
    n = len(names)
    slots = list(range(n))
    weights: Optional[Tensor] = None
    out = torch.ops.perfkernels.embedding_bag_collection_packed(
        tables, bits, dims, features.values(), features.offsets(), weights, n, slots, slots,
        mean, [-1] * n)
    if output_dtype != torch.float32:
        out = out.to(output_dtype)
    return KeyedTensor(keys=embedding_names, length_per_key=length_per_key, values=out)


torch.fx.wrap("quant_ebc_lookup")


def graph_forward(module: torch.nn.Module, features: KeyedJaggedTensor) -> KeyedTensor:
    """The converted collection's forward as graph tools record it (see the module's text)."""
    lookup = module._pk_lookup
    return quant_ebc_lookup(features, list(lookup.tables), list(module._feature_names),
                            [b or 0 for b in lookup.all_bits], list(lookup.dims),
                            [int(m == "mean") for m in lookup.modes],
                            list(module._embedding_names), list(module._length_per_key),
                            module._output_dtype)
