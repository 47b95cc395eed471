"""perfkernels.torch.QuantizedEmbeddingBag (for torch.ao.nn.quantized.EmbeddingBag) and aliases of
``torch.ops.quantized.embedding_bag_{byte,4bit,2bit}_rowwise_offsets``."""
from __future__ import annotations

import warnings
from typing import Optional

import numpy as np
import torch
from torch import Tensor

import perfkernels as pk

from . import _bags
from ._bridge import IndexOutOfRangeError, TableViewCache, as_numpy
from ._fallback import warn_once
from ..families.quantized.layout import packed_row_bytes

#: torch's quantized dtypes for each bit width (2-bit has no torch.ao module, only the ops)
_TORCH_QDTYPES = {8: "quint8", 4: "quint4x2", 2: "quint2x4"}


def _bits_of(dtype) -> int:
    if dtype in (8, 4, 2):
        return int(dtype)
    for bits, name in _TORCH_QDTYPES.items():
        if dtype is getattr(torch, name, None):
            return bits
    raise ValueError(f"dtype must be torch.quint8 (8-bit), torch.quint4x2 (4-bit), "
                     f"torch.quint2x4 (2-bit) or 8/4/2; got {dtype!r}")


def packed_dim(row_bytes: int, bits: int) -> int:
    """The embedding dimension torch's ops infer from a packed row (D a multiple of 8/bits)."""
    return row_bytes - 8 if bits == 8 else (row_bytes - 4) * (8 // bits)


def _from_quantized_tensor(qweight: Tensor, bits: int) -> Tensor:
    """torch.ao's per-row quantized weight (per_channel_affine_float_qparams) as packed uint8 rows
    in the ``embedding_bag_*_prepack`` layout, bit for bit what torch's own packing stores
    (bias = -zero_point * scale, in float32; fp16 scale and bias for 4/2-bit)."""
    rows = qweight.shape[0]
    codes = qweight.int_repr().reshape(rows, -1).numpy()
    scale = qweight.q_per_channel_scales().numpy().astype(np.float32)
    bias = qweight.q_per_channel_zero_points().numpy().astype(np.float32) * scale * np.float32(-1)
    tail_dtype = np.float32 if bits == 8 else np.float16
    tail = np.stack([scale.astype(tail_dtype), bias.astype(tail_dtype)], axis=1)
    packed = np.concatenate([codes.astype(np.uint8), tail.view(np.uint8)], axis=1)
    return torch.from_numpy(np.ascontiguousarray(packed))


class QuantizedEmbeddingBag(TableViewCache, torch.nn.Module):
    """Drop-in replacement for :class:`torch.ao.nn.quantized.EmbeddingBag`: row-wise quantized
    tables (8-bit with float32 scale/bias, 4-bit and 2-bit with float16 scale/bias).

    The constructor and :meth:`forward` have torch's signatures (``dtype`` is ``torch.quint8``,
    ``torch.quint4x2``, ``torch.quint2x4`` or simply 8/4/2).  The table is the buffer
    ``packed_weight``: uint8 rows in the layout of ``torch.ops.quantized.embedding_bag_*_prepack``
    (codes then scale and bias), not a quantized tensor (torch is deprecating those).  A
    ``state_dict`` saved by torch's module loads into this one (its quantized weight is converted
    bit for bit); ours saves ``packed_weight``.

    Differences from torch's module, on purpose: ``mode="mean"`` averages (torch's module and
    ops sum whatever the mode), and ``padding_idx`` is supported.  Lookups only: no gradient.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, max_norm: Optional[float] = None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False, mode: str = "sum",
                 sparse: bool = False, _weight: Optional[Tensor] = None,
                 include_last_offset: bool = False, dtype=torch.quint8) -> None:
        super().__init__()
        if mode not in ("sum", "mean"):
            raise ValueError(f"mode must be 'sum' or 'mean' for a quantized table; got {mode!r}")
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.mode = mode
        self.sparse = sparse
        self.include_last_offset = include_last_offset
        self.bits = _bits_of(dtype)
        self.dtype = dtype
        self.padding_idx: Optional[int] = None
        if _weight is None:
            packed = torch.from_numpy(pk.quantize_rowwise(
                np.zeros((num_embeddings, embedding_dim), np.float32), self.bits))
        elif _weight.dtype == torch.uint8:
            packed = _weight
        else:
            packed = _from_quantized_tensor(_weight, self.bits)
        self.register_buffer("packed_weight", self._check_packed(packed))

    def _check_packed(self, packed: Tensor) -> Tensor:
        want = (self.num_embeddings, packed_row_bytes(self.embedding_dim, self.bits))
        if packed.dtype != torch.uint8 or tuple(packed.shape) != want:
            raise ValueError(f"packed weight must be uint8 of shape {want} for "
                             f"{self.num_embeddings} x {self.embedding_dim} {self.bits}-bit rows; "
                             f"got {packed.dtype} {tuple(packed.shape)}")
        return packed

    def forward(self, indices: Tensor, offsets: Optional[Tensor] = None,
                per_sample_weights: Optional[Tensor] = None,
                compressed_indices_mapping: Optional[Tensor] = None) -> Tensor:
        """Float32 bags ``[num_bags, embedding_dim]`` (``compressed_indices_mapping`` is ignored,
        as torch's module ignores it for unpruned tables)."""
        packed = self.packed_weight
        args = (packed, indices, offsets, per_sample_weights, self.mode,
                self.include_last_offset, self.padding_idx, self.bits, self.embedding_dim)
        if torch.compiler.is_compiling():
            return torch.ops.perfkernels.embedding_bag_quantized(*args)
        if packed.device.type != "cpu":
            return _bags.lookup(*args)
        if per_sample_weights is not None:
            per_sample_weights = as_numpy(per_sample_weights.float())
        try:
            out = pk.embedding_bag_quantized(
                self._table_array(packed), indices.numpy(),
                None if offsets is None else offsets.numpy(), bits=self.bits,
                dim=self.embedding_dim, per_sample_weights=per_sample_weights, mode=self.mode,
                include_last_offset=self.include_last_offset, padding_idx=self.padding_idx)
        except IndexError as exc:
            raise IndexOutOfRangeError(str(exc)) from None
        return torch.from_numpy(out)

    def dequantize(self) -> Tensor:
        """The table as float32 ``[num_embeddings, embedding_dim]``."""
        return torch.from_numpy(pk.dequantize_rowwise(as_numpy(self.packed_weight), self.bits,
                                                      dim=self.embedding_dim))

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}, bits={self.bits}, mode={self.mode!r}"
        if self.include_last_offset:
            s += ", include_last_offset=True"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        return s

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # A checkpoint of torch.ao.nn.quantized.EmbeddingBag: convert its quantized weight.
        torch_key = prefix + "_packed_params._packed_weight"
        if torch_key in state_dict:
            state_dict = dict(state_dict)
            qweight = state_dict.pop(torch_key)
            state_dict.pop(prefix + "_packed_params.dtype", None)
            state_dict[prefix + "packed_weight"] = _from_quantized_tensor(qweight, self.bits)
        key = prefix + "packed_weight"
        if key in state_dict:
            self._check_packed(state_dict[key])
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    # ---------------------------------------------------------------- constructors

    @classmethod
    def from_packed(cls, packed: Tensor, *, bits: int = 8, dim: Optional[int] = None,
                    mode: str = "sum", include_last_offset: bool = False,
                    padding_idx: Optional[int] = None) -> "QuantizedEmbeddingBag":
        """From packed rows as ``torch.ops.quantized.embedding_bag_{byte,4bit,2bit}_prepack``
        return them (what DLRM's ``--quantize-emb-with-bit`` builds); the tensor is used in place.
        ``dim`` defaults to what torch's ops infer from the row size."""
        bits = _bits_of(bits)
        if packed.dim() != 2:
            raise ValueError(f"packed must be 2-D [rows, bytes per row]; got shape "
                             f"{tuple(packed.shape)}")
        dim = packed_dim(packed.shape[1], bits) if dim is None else dim
        new = cls(packed.shape[0], dim, mode=mode, include_last_offset=include_last_offset,
                  dtype=bits, _weight=packed)
        new.padding_idx = padding_idx
        return new

    @classmethod
    def from_float(cls, mod: torch.nn.Module, use_precomputed_fake_quant: bool = False, *,
                   bits: Optional[int] = None) -> "QuantizedEmbeddingBag":
        """Quantize a float ``torch.nn.EmbeddingBag`` row-wise (bit-exact with torch's
        ``embedding_bag_*_prepack``).  ``bits`` defaults to the module's ``qconfig`` weight
        dtype when it has one, else 8."""
        if bits is None:
            qconfig = getattr(mod, "qconfig", None)
            bits = _bits_of(qconfig.weight().dtype) if qconfig is not None else 8
        bits = _bits_of(bits)
        weight = mod.weight.detach()
        if weight.dtype not in (torch.float32, torch.float16):
            weight = weight.float()
        packed = torch.from_numpy(pk.quantize_rowwise(as_numpy(weight.cpu()), bits))
        new = cls(mod.num_embeddings, mod.embedding_dim, max_norm=mod.max_norm,
                  norm_type=mod.norm_type, scale_grad_by_freq=mod.scale_grad_by_freq,
                  mode=mod.mode, sparse=mod.sparse, _weight=packed.to(mod.weight.device),
                  include_last_offset=mod.include_last_offset, dtype=bits)
        new.padding_idx = getattr(mod, "padding_idx", None)
        new.train(mod.training)
        return new

    @classmethod
    def from_torch_ao(cls, mod: torch.nn.Module) -> "QuantizedEmbeddingBag":
        """From a ``torch.ao.nn.quantized.EmbeddingBag``: its packed rows, bit for bit."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # torch's deprecation notice for quantized tensors
            qweight = mod.weight()
        bits = _bits_of(mod.dtype)
        new = cls(mod.num_embeddings, mod.embedding_dim, mode=mod.mode,
                  include_last_offset=mod.include_last_offset, dtype=bits,
                  _weight=_from_quantized_tensor(qweight, bits))
        new.train(mod.training)
        return new


# --------------------------------------------------------------------------- torch.ops aliases

def _rowwise_offsets(bits: int, torch_name: str):
    def op(weight: Tensor, indices: Tensor, offsets: Optional[Tensor] = None,
           scale_grad_by_freq: bool = False, mode: int = 0, pruned_weights: bool = False,
           per_sample_weights: Optional[Tensor] = None,
           compressed_indices_mapping: Optional[Tensor] = None,
           include_last_offset: bool = False) -> Tensor:
        if pruned_weights or mode not in (0, 1):
            warn_once("pruned_weights=True" if pruned_weights else f"mode={mode}"
                      f" in quantized.{torch_name}")
            return getattr(torch.ops.quantized, torch_name)(
                weight, indices, offsets, scale_grad_by_freq, mode, pruned_weights,
                per_sample_weights, compressed_indices_mapping, include_last_offset)
        dim = packed_dim(weight.shape[1], bits)
        args = (weight, indices, offsets, per_sample_weights, ("sum", "mean")[mode],
                include_last_offset, None, bits, dim)
        if torch.compiler.is_compiling():
            return torch.ops.perfkernels.embedding_bag_quantized(*args)
        return _bags.lookup(*args)
    op.__name__ = op.__qualname__ = torch_name
    op.__doc__ = (f"``torch.ops.quantized.{torch_name}`` with the same signature, on perfkernels' "
                  f"{bits}-bit kernels.  ``mode`` 0 sums and 1 averages (torch's op sums for "
                  "both); ``pruned_weights=True`` runs torch's op.")
    return op


embedding_bag_byte_rowwise_offsets = _rowwise_offsets(8, "embedding_bag_byte_rowwise_offsets")
embedding_bag_4bit_rowwise_offsets = _rowwise_offsets(4, "embedding_bag_4bit_rowwise_offsets")
embedding_bag_2bit_rowwise_offsets = _rowwise_offsets(2, "embedding_bag_2bit_rowwise_offsets")
