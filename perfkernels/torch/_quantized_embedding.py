"""perfkernels.torch.QuantizedEmbedding: unpooled lookups of row-wise quantized tables, in place of
torch.ao.nn.quantized.Embedding (whose quantized tensors torch is deprecating)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

import perfkernels as pk

from . import _bags, _graph, _placement
from ._bridge import TableViewCache, as_numpy, index_error
from ._quantized import _bits_of, _from_quantized_tensor, packed_dim
from ._quantized import _PackedRows, _packed_float


#: float32 rows of a packed table, shape indices.shape + (dim,): defined, with its CPU kernel, by
#: perfkernels' native library (native/ops.cpp, loaded by _bags), so compiled and exported graphs
#: call it without Python
embedding_quantized_op = torch.ops.perfkernels.embedding_quantized.default


@torch.library.register_fake("perfkernels::embedding_quantized")
def _embedding_quantized_fake(packed, indices, bits, dim):
    return packed.new_empty((*indices.shape, dim), dtype=torch.float32)


@_placement.register_table_module
class QuantizedEmbedding(_PackedRows, TableViewCache, torch.nn.Module):
    """Drop-in replacement for :class:`torch.ao.nn.quantized.Embedding`: one float32 row per index
    from a row-wise quantized table (8-bit rows with float32 scale / bias, 4-bit and 2-bit with
    float16 scale / bias), shape ``indices.shape + (embedding_dim,)``.

    The constructor and :meth:`forward` have torch's signatures (``dtype`` is ``torch.quint8``,
    ``torch.quint4x2``, ``torch.quint2x4`` or 8/4/2).  The table is the buffer ``packed_weight``:
    uint8 rows in the layout of ``torch.ops.quantized.embedding_bag_*_prepack``, not a quantized
    tensor.  :meth:`from_torch_ao` reads torch.ao's module bit for bit (same codes, scales and
    biases: the same outputs as its ``embedding_byte`` / ``embedding_4bit`` ops, to float
    rounding); :meth:`from_float` quantizes a float ``nn.Embedding`` (``bits=8, 4, 2``);
    :meth:`from_torchao` reads one quantized by torchao's weight-only configs.  A
    ``state_dict`` of torch.ao's module loads into this one.  An index out of range raises
    :class:`~perfkernels.torch.IndexOutOfRangeError` with torch's quantized ops' message.
    Lookups only: no gradient.  ``placement=`` as for :class:`~perfkernels.torch.Embedding`.

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> q = pkt.QuantizedEmbedding.from_float(torch.nn.Embedding(10, 4), bits=8)
    >>> q(torch.tensor([[1, 2]])).shape, q(torch.tensor([1])).dtype
    (torch.Size([1, 2, 4]), torch.float32)
    """

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 padding_idx: Optional[int] = None, max_norm: Optional[float] = None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False,
                 _weight: Optional[Tensor] = None, dtype=torch.quint8, *,
                 placement: str = "auto") -> None:
        super().__init__()
        self.padding_idx = padding_idx
        self._init_packed(num_embeddings, embedding_dim, max_norm, norm_type, scale_grad_by_freq,
                          sparse, dtype, _weight, placement)

    def _script_forward(self, indices: Tensor) -> Tensor:
        # What torch.jit.script compiles for forward (see _graph.script_as): the registered op.
        out = torch.ops.perfkernels.embedding_quantized(self.packed_weight, indices, self.bits,
                                                        self.embedding_dim)
        if self.output_dtype is not None:
            out = out.to(self.output_dtype)
        return out

    @_graph.script_as(_script_forward)
    def forward(self, indices: Tensor) -> Tensor:
        """Float32 rows ``indices.shape + (embedding_dim,)``."""
        packed = self.packed_weight
        if _bags.capturing() or packed.device.type != "cpu" or _graph.transforming():
            # (torch.func / forward AD: the registered op, which vmap runs per sample)
            out = embedding_quantized_op(packed, indices, self.bits, self.embedding_dim)
            return out if self.output_dtype is None else out.to(self.output_dtype)
        if type(indices) is not Tensor and _graph.is_proxy(indices):     # torch.fx
            return _graph.fx_call(self, embedding_quantized_op,
                                  (packed, indices, self.bits, self.embedding_dim), indices)
        if not isinstance(indices, Tensor) or indices.dtype not in (torch.int64, torch.int32):
            # torch's exception for these indices (TypeError for a list, RuntimeError naming the
            # dtype), from its lookup on a stand-in table (no memory)
            torch.embedding(torch.zeros(()).expand(self.num_embeddings, self.embedding_dim),
                            indices)
            raise RuntimeError(f"indices must be an int32 or int64 tensor; got "
                               f"{getattr(indices, 'dtype', type(indices).__name__)}")
        try:
            out = pk.embedding_quantized(self._table_array(packed), indices.numpy(),
                                         bits=self.bits, dim=self.embedding_dim)
        except IndexError as exc:
            raise index_error(exc, quantized=True) from None
        out = torch.from_numpy(out)
        return out if self.output_dtype is None else out.to(self.output_dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, bits={self.bits}"

    def _torch_weight_error(self, key: str, qweight: Tensor) -> Optional[str]:
        # torch.ao.nn.quantized.Embedding's checkpoint: its rows must have this module's width
        if _bits_of(qweight.dtype) != self.bits:
            return f"{key} holds {qweight.dtype} rows; this module has {self.bits}-bit rows"
        return None

    @classmethod
    def from_torch_ao(cls, mod: torch.nn.Module, *, placement: str = "auto"
                      ) -> "QuantizedEmbedding":
        """From a :class:`torch.ao.nn.quantized.Embedding`: its quantized rows bit for bit."""
        qweight = mod.weight()
        bits = _bits_of(qweight.dtype)     # (its _packed_params.dtype says quint8 for 4-bit too)
        new = cls(mod.num_embeddings, mod.embedding_dim, dtype=bits,
                  _weight=_from_quantized_tensor(qweight, bits), placement=placement)
        return new

    @classmethod
    def from_float(cls, mod: torch.nn.Embedding, *, bits: int = 8, placement: str = "auto"
                   ) -> "QuantizedEmbedding":
        """Quantize a float ``torch.nn.Embedding`` row-wise to ``bits`` (8, 4, 2): bit-exact with
        torch's ``embedding_bag_*_prepack`` (and with torch.ao's float_qparams weight-only
        quantization of the module, which packs the same rows).  A module whose weight torchao
        quantized is read by :meth:`from_torchao` (its codes, not quantized again)."""
        from ._torchao import is_torchao_weight
        if is_torchao_weight(mod.weight):
            return cls.from_torchao(mod, bits=bits, placement=placement)
        bits = _bits_of(bits)
        packed = _packed_float(mod, bits)
        new = cls(mod.num_embeddings, mod.embedding_dim, dtype=bits, _weight=packed,
                  placement=placement)
        new.padding_idx = mod.padding_idx
        new.float_reference = True
        if mod.weight.dtype is not torch.float32 and mod.weight.dtype.is_floating_point:
            new.output_dtype = mod.weight.dtype
        return new

    @classmethod
    def from_torchao(cls, mod: torch.nn.Embedding, *, bits: Optional[int] = None,
                     placement: str = "auto") -> "QuantizedEmbedding":
        """From a ``torch.nn.Embedding`` whose weight torchao quantized (``quantize_`` with
        ``IntxWeightOnlyConfig`` at ``PerAxis(0)``, any ``torch.int1`` ... ``torch.int8``, or
        ``Int8WeightOnlyConfig`` at ``PerRow()`` / ``PerTensor()``; torchao 0.17 and older's
        ``AffineQuantizedTensor`` in its plain layout too): its codes, scales and zero points,
        read without importing torchao.

        ``bits=None`` or 8: 8-bit rows with float32 scale and bias; the lookups are torchao's
        dequantized rows ``(q - zero_point) * scale`` bit for bit on the FMA (AVX2, AVX-512)
        levels, except 8-bit codes quantized asymmetrically, whose bias is rounded to float32
        (the portable level rounds the product too; see docs/pytorch.md for the bounds).  ``bits=4`` or
        ``2``: the compact rows (codes of at most that many bits), scale and bias rounded to
        float16.  A per-group quantized weight (``PerGroup``: several scales per row) raises
        ValueError naming the granularity."""
        from ._torchao import check_module, packed_from_torchao
        check_module(mod)
        packed, bits = packed_from_torchao(mod.weight, bits)
        new = cls(mod.num_embeddings, mod.embedding_dim, dtype=bits, _weight=packed,
                  placement=placement)
        new.padding_idx = mod.padding_idx
        return new

    @classmethod
    def from_packed(cls, packed: Tensor, *, bits: int = 8, dim: Optional[int] = None,
                    placement: str = "auto") -> "QuantizedEmbedding":
        """From packed rows as ``torch.ops.quantized.embedding_bag_*_prepack`` return them."""
        bits = _bits_of(bits)
        dim = packed_dim(packed.shape[1], bits) if dim is None else dim
        return cls(packed.shape[0], dim, dtype=bits, _weight=packed, placement=placement)
