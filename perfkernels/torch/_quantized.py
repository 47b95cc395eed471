"""perfkernels.torch.QuantizedEmbeddingBag (for torch.ao.nn.quantized.EmbeddingBag) and aliases of
``torch.ops.quantized.embedding_bag_{byte,4bit,2bit}_rowwise_offsets``."""
from __future__ import annotations

import warnings
from typing import Optional

import numpy as np
import torch
from torch import Tensor

import perfkernels as pk

from . import _bags, _compat, _graph, _placement
from ._bridge import TableViewCache, as_numpy, index_error
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


# --------------------------------------------------------------------------- the conversions

def quantize_rowwise(weight: Tensor, bits: int = 8) -> Tensor:
    """Pack a float32 or float16 CPU table row by row at 8, 4 or 2 bits: uint8 rows of codes and
    their scale and bias, bit for bit ``torch.ops.quantized.embedding_bag_{byte,4bit,2bit}_prepack``
    (any ``D >= 1``; see :func:`perfkernels.quantize_rowwise`).  The native op
    ``perfkernels::quantize_rowwise``: it traces, exports and runs from C++.  A row holding NaN or
    inf raises RuntimeError naming it.

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> w = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    >>> packed = pkt.quantize_rowwise(w)          # 4 codes, then float32 scale and bias
    >>> packed.shape, packed.dtype
    (torch.Size([1, 12]), torch.uint8)
    >>> pkt.dequantize_rowwise(packed)
    tensor([[0., 1., 2., 3.]])
    """
    return torch.ops.perfkernels.quantize_rowwise(weight, bits)


def dequantize_rowwise(packed: Tensor, bits: int = 8, dim: Optional[int] = None) -> Tensor:
    """The float32 rows ``q * scale + bias`` of a packed table (``dim``: its columns, default the
    largest the row holds, as torch's ops infer it).  The native op
    ``perfkernels::dequantize_rowwise``.

    Raises
    ------
    RuntimeError
        ``packed`` not a 2-D uint8 tensor, ``bits`` not 8, 4 or 2, or ``dim`` that does not fit
        the row (the message starts with ``perfkernels:``).

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> w = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    >>> packed = pkt.quantize_rowwise(w)          # 4 codes, then float32 scale and bias
    >>> packed.shape, packed.dtype
    (torch.Size([1, 12]), torch.uint8)
    >>> pkt.dequantize_rowwise(packed)
    tensor([[0., 1., 2., 3.]])
    """
    if dim is None:
        dim = packed_dim(packed.shape[-1], bits)
    return torch.ops.perfkernels.dequantize_rowwise(packed, bits, dim)


@torch.library.register_fake("perfkernels::quantize_rowwise")
def _quantize_rowwise_fake(weight, bits):
    return weight.new_empty((weight.shape[0], packed_row_bytes(weight.shape[1], bits)),
                            dtype=torch.uint8)


@torch.library.register_fake("perfkernels::dequantize_rowwise")
def _dequantize_rowwise_fake(packed, bits, dim):
    return packed.new_empty((packed.shape[0], dim), dtype=torch.float32)


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


def _packed_float(mod: torch.nn.Module, bits: int) -> Tensor:
    """A float module's table packed row-wise at ``bits`` bits by our quantizer (CPU); for a
    table on the ``meta`` device, an uninitialised meta tensor of the packed shape (as a meta
    model's conversion has no values either)."""
    weight = mod.weight
    if weight.device.type == "meta":
        return torch.empty((weight.shape[0], packed_row_bytes(weight.shape[1], bits)),
                           dtype=torch.uint8, device="meta")
    return torch.from_numpy(pk.quantize_rowwise(as_numpy(_float_weight(mod).cpu().contiguous()),
                                                bits))


def _float_weight(mod: torch.nn.Module) -> Tensor:
    """A float module's weight as the row-wise quantizer takes it: detached, float32 or float16
    (any other dtype as float32)."""
    weight = mod.weight.detach()
    if weight.dtype not in (torch.float32, torch.float16):
        weight = weight.float()
    return weight


class _PackedRows:
    """What :class:`QuantizedEmbeddingBag` and :class:`~perfkernels.torch.QuantizedEmbedding`
    share (a mixin before ``torch.nn.Module``): the table as the buffer ``packed_weight`` (uint8
    rows in the ``embedding_bag_*_prepack`` layout), its checks, :meth:`dequantize` and the
    loading of a torch.ao module's ``state_dict``."""

    #: made from a float module by our quantizer (``convert(model, bits=...)``, ``from_float(...,
    #: bits=...)``): the module answers as that float module did: torch's exceptions for bad
    #: input, and outputs that follow the model's dtype (``.half()``, ``.double()``, ``.to()``)
    float_reference: bool = False
    #: the output's dtype when it is not float32 (a converted model turned ``.half()`` ...)
    output_dtype: Optional[torch.dtype] = None
    #: read by torch.jit.script as constants (the output's dtype selects the scripted call)
    __constants__ = ["float_reference", "output_dtype"]

    def _apply(self, fn, recurse: bool = True):
        # ``.half()`` / ``.double()`` / ``.to(dtype)`` leave the packed rows (uint8) as they are;
        # a table made from a float module then answers in the dtype the float one would have
        out = super()._apply(fn, recurse)
        if self.float_reference:
            try:
                dtype = fn(torch.empty(0, dtype=self.output_dtype or torch.float32)).dtype
            except Exception:     # a function for other tensors than float ones: no dtype change
                return out
            if dtype.is_floating_point:
                self.output_dtype = None if dtype is torch.float32 else dtype
        return out

    def _init_packed(self, num_embeddings: int, embedding_dim: int, max_norm: Optional[float],
                     norm_type: float, scale_grad_by_freq: bool, sparse: bool, dtype,
                     _weight: Optional[Tensor], placement: str) -> None:
        """Set torch's attributes and the buffer ``packed_weight``: zero rows, ``_weight``'s packed
        rows (uint8) or its torch.ao quantized tensor converted; placed as ``placement`` says."""
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.sparse = sparse
        self.bits = _bits_of(dtype)
        self.dtype = dtype
        if _weight is None:
            packed = torch.from_numpy(pk.quantize_rowwise(
                np.zeros((num_embeddings, embedding_dim), np.float32), self.bits))
        elif _weight.dtype == torch.uint8:
            packed = _weight
        else:
            packed = _from_quantized_tensor(_weight, self.bits)
        self.register_buffer("packed_weight", self._check_packed(packed))
        _placement.place_tensor_attr(self, "packed_weight", placement)

    def _check_packed(self, packed: Tensor) -> Tensor:
        want = (self.num_embeddings, packed_row_bytes(self.embedding_dim, self.bits))
        if packed.dtype != torch.uint8 or tuple(packed.shape) != want:
            raise ValueError(f"packed weight must be uint8 of shape {want} for "
                             f"{self.num_embeddings} x {self.embedding_dim} {self.bits}-bit rows; "
                             f"got {packed.dtype} {tuple(packed.shape)}")
        return packed

    def dequantize(self) -> Tensor:
        """The table as float32 ``[num_embeddings, embedding_dim]``."""
        return torch.from_numpy(pk.dequantize_rowwise(as_numpy(self.packed_weight), self.bits,
                                                      dim=self.embedding_dim))

    def _torch_weight_error(self, key: str, qweight: Tensor) -> Optional[str]:
        """Why torch.ao's quantized weight ``qweight`` (at ``key``) cannot load here, or None."""
        return None

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # A checkpoint of torch.ao's module: convert its quantized weight.
        torch_key = prefix + "_packed_params._packed_weight"
        if torch_key in state_dict:
            state_dict = dict(state_dict)
            qweight = state_dict.pop(torch_key)
            error = self._torch_weight_error(torch_key, qweight)
            if error is not None:
                error_msgs.append(error)
                return
            state_dict.pop(prefix + "_packed_params.dtype", None)
            state_dict[prefix + "packed_weight"] = _from_quantized_tensor(qweight, self.bits)
        key = prefix + "packed_weight"
        if key in state_dict:
            self._check_packed(state_dict[key])
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)


@_placement.register_table_module
class QuantizedEmbeddingBag(_PackedRows, TableViewCache, torch.nn.Module):
    """Drop-in replacement for :class:`torch.ao.nn.quantized.EmbeddingBag`: row-wise quantized
    tables (8-bit with float32 scale/bias, 4-bit and 2-bit with float16 scale/bias).

    The constructor and :meth:`forward` have torch's signatures (``dtype`` is ``torch.quint8``,
    ``torch.quint4x2``, ``torch.quint2x4`` or simply 8/4/2).  The table is the buffer
    ``packed_weight``: uint8 rows in the layout of ``torch.ops.quantized.embedding_bag_*_prepack``
    (codes then scale and bias), not a quantized tensor (torch is deprecating those).  A
    ``state_dict`` saved by torch's module loads into this one (its quantized weight is converted
    bit for bit); ours saves ``packed_weight``.

    Like torch's module and ops, it sums whatever ``mode`` says (torch.ao's module calls its
    op with mode 0).  Our opt-in ``average_mean=True`` makes ``mode="mean"`` divide by the
    count of non-padding entries; :func:`~perfkernels.torch.convert` with ``bits=`` and
    :meth:`from_float` with ``bits=`` set it for a float module in mode "mean", so the quantized
    module computes what the float one did.  ``padding_idx`` (None by default; torch's module has
    none) is ours too.  Lookups only: no gradient.

    ``placement=`` (``"auto"``, ``"hugepage"``, ``"keep"``; the constructors below take it too)
    moves the packed rows into memory perfkernels places for gathers: 2 MiB-aligned, huge pages
    requested before the first touch (``"auto"``: tables of 2 MiB and more).

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> stock = torch.nn.EmbeddingBag(10, 4, mode="sum")
    >>> q = pkt.QuantizedEmbeddingBag.from_float(stock, bits=8)
    >>> out = q(torch.tensor([1, 2, 3]), torch.tensor([0, 1]))
    >>> torch.testing.assert_close(out, stock(torch.tensor([1, 2, 3]), torch.tensor([0, 1])),
    ...                            atol=0.05, rtol=0)        # 8-bit rows: within a quantization step
    >>> out.shape
    torch.Size([2, 4])
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, max_norm: Optional[float] = None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False, mode: str = "sum",
                 sparse: bool = False, _weight: Optional[Tensor] = None,
                 include_last_offset: bool = False, dtype=torch.quint8, *,
                 average_mean: bool = False, placement: str = "auto") -> None:
        super().__init__()
        if mode not in ("sum", "mean"):
            raise ValueError(f"mode must be 'sum' or 'mean' for a quantized table; got {mode!r}")
        self.mode = mode
        self.include_last_offset = include_last_offset
        self.padding_idx: Optional[int] = None
        self.average_mean = average_mean
        self._init_packed(num_embeddings, embedding_dim, max_norm, norm_type, scale_grad_by_freq,
                          sparse, dtype, _weight, placement)

    def _script_forward(self, indices: Tensor, offsets: Optional[Tensor] = None,
                        per_sample_weights: Optional[Tensor] = None,
                        compressed_indices_mapping: Optional[Tensor] = None) -> Tensor:
        # What torch.jit.script compiles for forward (see _graph.script_as): the registered op.
        mode = self.mode if self.average_mean else "sum"
        out = torch.ops.perfkernels.embedding_bag_quantized(
            self.packed_weight, indices, offsets, per_sample_weights, mode,
            self.include_last_offset, self.padding_idx, self.bits, self.embedding_dim)
        if self.output_dtype is not None:
            out = out.to(self.output_dtype)
        return out

    @_graph.script_as(_script_forward)
    def forward(self, indices: Tensor, offsets: Optional[Tensor] = None,
                per_sample_weights: Optional[Tensor] = None,
                compressed_indices_mapping: Optional[Tensor] = None) -> Tensor:
        """Float32 bags ``[num_bags, embedding_dim]`` (``compressed_indices_mapping`` is ignored,
        as torch's module ignores it for unpruned tables)."""
        packed = self.packed_weight
        mode = self.mode if self.average_mean else "sum"
        args = (packed, indices, offsets, per_sample_weights, mode,
                self.include_last_offset, self.padding_idx, self.bits, self.embedding_dim)
        if _bags.capturing() or _graph.transforming():
            # (torch.func / forward AD too: the registered op, which vmap runs per sample)
            if self.float_reference and per_sample_weights is not None and self.mode != "sum":
                # the float module refuses these weights (torch's words); nothing to capture
                raise NotImplementedError(
                    "embedding_bag: per_sample_weights was not None. per_sample_weights is only "
                    f"supported for mode='sum' (got mode='{self.mode}'). Please open a feature "
                    "request on GitHub.")
            return torch.ops.perfkernels.embedding_bag_quantized(*args)
        if type(indices) is not Tensor and _graph.is_proxy(indices):     # torch.fx
            return _graph.fx_call(self, torch.ops.perfkernels.embedding_bag_quantized.default,
                                  args, indices)
        if not self.float_reference:
            check_weights_dtype(per_sample_weights, self.bits)
        elif ((per_sample_weights is not None and _compat.weights_refused(
                indices, per_sample_weights, self.mode, self.output_dtype or torch.float32, False))
                or _compat.input_refused(indices)):
            return self._float_answer(indices, offsets, per_sample_weights)   # (it raises)
        if packed.device.type != "cpu":
            if packed.device.type == "meta":
                return torch.ops.perfkernels.embedding_bag_quantized(*args)
            return _bags.lookup(*args)
        if _bags._profiler_enabled():   # through the op, which the profiler records by name
            out = _bags._profiled_lookup(
                packed, indices, offsets,
                None if per_sample_weights is None else per_sample_weights.float(), mode,
                self.include_last_offset, self.padding_idx, self.bits, self.embedding_dim)
            if out is not None:
                return out
        psw = None if per_sample_weights is None else as_numpy(per_sample_weights.float())
        try:
            out = pk.embedding_bag_quantized(
                self._table_array(packed), indices.numpy(),
                None if offsets is None else offsets.numpy(), bits=self.bits,
                dim=self.embedding_dim, per_sample_weights=psw, mode=mode,
                include_last_offset=self.include_last_offset, padding_idx=self.padding_idx)
        except IndexError as exc:
            if self.float_reference and psw is not None and self.mode != "sum":
                # torch refuses these weights before it reads an index
                return self._float_answer(indices, offsets, per_sample_weights)
            raise index_error(exc, quantized=True) from None
        except (ValueError, TypeError) as exc:
            if self.float_reference:
                return self._float_answer(indices, offsets, per_sample_weights)
            raise RuntimeError(str(exc)) from None    # torch's ops raise RuntimeError
        out = torch.from_numpy(out)
        return out if self.output_dtype is None else out.to(self.output_dtype)

    def _float_answer(self, indices: Tensor, offsets: Optional[Tensor],
                      per_sample_weights: Optional[Tensor]) -> Tensor:
        """What the float ``nn.EmbeddingBag`` this module was made from answers where our
        kernel refused or torch refuses: torch's exception, raised as torch raises it, or (input
        torch takes, such as int16 indices or ``include_last_offset=True`` offsets that end
        short of the input) torch's function on the rows the input uses, dequantized."""
        dtype = self.output_dtype or torch.float32
        rows, dim = self.num_embeddings, self.embedding_dim
        stand_in = torch.zeros((), dtype=dtype).expand(rows, dim)    # no memory: the checks
        _compat.torch_verdict(indices, stand_in, offsets, per_sample_weights, self.mode, False,
                              self.include_last_offset, self.padding_idx, dtype)
        uniq, inv = torch.unique(indices.reshape(-1).long(), return_inverse=True)
        table = dequantize_rowwise(self.packed_weight[uniq].contiguous(), self.bits, dim)
        pad = None
        if self.padding_idx is not None:
            hit = (uniq == self.padding_idx % rows).nonzero()
            pad = int(hit[0]) if hit.numel() else None
        out = _compat.TORCH_EMBEDDING_BAG(
            inv.reshape(indices.shape), table.to(dtype),
            None if offsets is None else offsets.long(), None, 2.0, False, self.mode, False,
            per_sample_weights, self.include_last_offset, pad)
        return out

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}, bits={self.bits}, mode={self.mode!r}"
        if self.average_mean:
            s += ", average_mean=True"
        if self.include_last_offset:
            s += ", include_last_offset=True"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        return s

    # ---------------------------------------------------------------- constructors

    @classmethod
    def from_packed(cls, packed: Tensor, *, bits: int = 8, dim: Optional[int] = None,
                    mode: str = "sum", include_last_offset: bool = False,
                    padding_idx: Optional[int] = None, placement: str = "auto"
                    ) -> "QuantizedEmbeddingBag":
        """From packed rows as ``torch.ops.quantized.embedding_bag_{byte,4bit,2bit}_prepack``
        return them (what DLRM's ``--quantize-emb-with-bit`` builds); the tensor is used in place
        unless ``placement`` moves it (``"auto"``: tables of 2 MiB and more; ``"keep"``: never).
        ``dim`` defaults to what torch's ops infer from the row size."""
        bits = _bits_of(bits)
        if packed.dim() != 2:
            raise ValueError(f"packed must be 2-D [rows, bytes per row]; got shape "
                             f"{tuple(packed.shape)}")
        dim = packed_dim(packed.shape[1], bits) if dim is None else dim
        new = cls(packed.shape[0], dim, mode=mode, include_last_offset=include_last_offset,
                  dtype=bits, _weight=packed, average_mean=True, placement=placement)
        new.padding_idx = padding_idx
        return new

    @classmethod
    def from_file(cls, path, *, bits: Optional[int] = None, dim: Optional[int] = None,
                  rows: Optional[int] = None, mode: str = "sum",
                  include_last_offset: bool = False, padding_idx: Optional[int] = None
                  ) -> "QuantizedEmbeddingBag":
        """Over a quantized table file of :mod:`perfkernels.tables` (``save_table``,
        ``build_table_file``), mapped copy-on-write and shared with every process that maps it:
        nothing is read or copied now.  ``bits``/``dim``/``rows``: what the file must hold
        (:class:`~perfkernels.tables.TableFileError` naming the file otherwise).  ``mode="mean"``
        averages (``average_mean``).  The module's ``table_file`` names the file."""
        from ._table_files import quantized_bag_from_file
        return quantized_bag_from_file(cls, path, bits=bits, dim=dim, rows=rows, mode=mode,
                                       include_last_offset=include_last_offset,
                                       padding_idx=padding_idx)

    @classmethod
    def from_float(cls, mod: torch.nn.Module, use_precomputed_fake_quant: bool = False, *,
                   bits: Optional[int] = None, placement: str = "auto"
                   ) -> "QuantizedEmbeddingBag":
        """Quantize a float ``torch.nn.EmbeddingBag`` row-wise.

        * ``bits`` given (8, 4 or 2): our quantizer, bit-exact with torch's
          ``embedding_bag_*_prepack``; ``mode="mean"`` keeps averaging (``average_mean``).
        * otherwise, as ``torch.ao.nn.quantized.EmbeddingBag.from_float``: the module's torch.ao
          observer (``weight_fake_quant``, else ``qconfig.weight()``, else
          ``float_qparams_weight_only_qconfig``'s) and torch.ao's own quantization, so the codes,
          scales and biases (and the sums whatever the mode) are torch.ao's, bit for bit.

        A module whose weight torchao quantized is read by :meth:`from_torchao` (``bits``
        passed on; 8-bit rows by default).
        """
        from ._torchao import is_torchao_weight
        if is_torchao_weight(getattr(mod, "weight", None)):
            return cls.from_torchao(mod, bits=bits, placement=placement)
        if bits is not None:
            bits = _bits_of(bits)
            packed = _packed_float(mod, bits)
            new = cls(mod.num_embeddings, mod.embedding_dim, max_norm=mod.max_norm,
                      norm_type=mod.norm_type, scale_grad_by_freq=mod.scale_grad_by_freq,
                      mode=mod.mode, sparse=mod.sparse, _weight=packed.to(mod.weight.device),
                      include_last_offset=mod.include_last_offset, dtype=bits,
                      average_mean=True, placement=placement)
            new.padding_idx = getattr(mod, "padding_idx", None)
            new.float_reference = True
            if mod.weight.dtype not in (torch.float32,) and mod.weight.dtype.is_floating_point:
                new.output_dtype = mod.weight.dtype
        else:
            qweight, bits = _torch_ao_quantized_weight(mod)
            new = cls(mod.num_embeddings, mod.embedding_dim, max_norm=mod.max_norm,
                      norm_type=mod.norm_type, scale_grad_by_freq=mod.scale_grad_by_freq,
                      mode=mod.mode, sparse=mod.sparse,
                      _weight=_from_quantized_tensor(qweight, bits),
                      include_last_offset=mod.include_last_offset, dtype=bits,
                      placement=placement)
        new.train(mod.training)
        return new

    @classmethod
    def from_torch_ao(cls, mod: torch.nn.Module, *, placement: str = "auto"
                      ) -> "QuantizedEmbeddingBag":
        """From a ``torch.ao.nn.quantized.EmbeddingBag``: its packed rows, bit for bit, and its
        sums (torch.ao's module sums whatever its mode)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # torch's deprecation notice for quantized tensors
            qweight = mod.weight()
        bits = _bits_of(mod.dtype)
        new = cls(mod.num_embeddings, mod.embedding_dim, mode=mod.mode,
                  include_last_offset=mod.include_last_offset, dtype=bits,
                  _weight=_from_quantized_tensor(qweight, bits), placement=placement)
        new.train(mod.training)
        return new

    @classmethod
    def from_torchao(cls, mod: torch.nn.EmbeddingBag, *, bits: Optional[int] = None,
                     placement: str = "auto") -> "QuantizedEmbeddingBag":
        """From a ``torch.nn.EmbeddingBag`` whose weight torchao quantized (torchao quantizes
        it but cannot run its forward): the rows as
        :meth:`QuantizedEmbedding.from_torchao <perfkernels.torch.QuantizedEmbedding.from_torchao>`
        reads them, summed to float32 rounding (the bag kernels round ``code * scale`` before
        adding the bias), and the module's ``mode`` (``"mean"`` averages, as the float module
        did), ``include_last_offset`` and ``padding_idx``."""
        from ._torchao import check_module, packed_from_torchao
        check_module(mod)
        packed, bits = packed_from_torchao(mod.weight, bits)
        new = cls(mod.num_embeddings, mod.embedding_dim, mode=mod.mode,
                  include_last_offset=mod.include_last_offset, dtype=bits, _weight=packed,
                  average_mean=True, placement=placement)
        new.padding_idx = getattr(mod, "padding_idx", None)
        new.train(mod.training)
        return new


def _torch_ao_quantized_weight(mod: torch.nn.Module) -> tuple[Tensor, int]:
    """The float module's weight quantized as ``torch.ao.nn.quantized.EmbeddingBag.from_float``
    quantizes it (its observer, its ``_quantize_weight``), and the bit width."""
    from torch.ao.nn.quantized.modules.utils import _quantize_weight
    from torch.ao.quantization.qconfig import float_qparams_weight_only_qconfig
    observer = getattr(mod, "weight_fake_quant", None)
    if observer is None:
        qconfig = getattr(mod, "qconfig", None)
        if qconfig is not None and qconfig.weight is not None:
            observer = qconfig.weight()
        else:
            observer = float_qparams_weight_only_qconfig.weight()
    if observer.qscheme != torch.per_channel_affine_float_qparams:
        raise ValueError("EmbeddingBag quantization is only supported with "
                         "float_qparams_weight_only_qconfig (per_channel_affine_float_qparams); "
                         f"got {observer.qscheme}")
    if observer.dtype not in (torch.quint8, torch.quint4x2):
        raise ValueError(f"torch.ao quantizes embedding bags to torch.quint8 or torch.quint4x2; "
                         f"the qconfig asks for {observer.dtype} (give bits= for our quantizer)")
    weight = mod.weight.detach().float().cpu()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # torch's deprecation notice for quantized tensors
        observer(weight)
        return _quantize_weight(weight, observer), _bits_of(observer.dtype)


# --------------------------------------------------------------------------- torch.ops aliases

#: torch's own ops, kept so that routing (and our fallbacks) never call ourselves
TORCH_OPS = {name: getattr(torch.ops.quantized, name) for name in (
    "embedding_bag_byte_rowwise_offsets", "embedding_bag_4bit_rowwise_offsets",
    "embedding_bag_2bit_rowwise_offsets")}


_TORCH_TYPE_NAMES = {torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
                     torch.int64: "Long", torch.int32: "Int"}


def check_weights_dtype(per_sample_weights: Optional[Tensor], bits: int) -> None:
    """torch's quantized ops take float32 ``per_sample_weights`` (4/2-bit: float16 too)."""
    if per_sample_weights is not None and per_sample_weights.dtype is not torch.float32 and (
            bits == 8 or per_sample_weights.dtype is not torch.float16):
        found = _TORCH_TYPE_NAMES.get(per_sample_weights.dtype, str(per_sample_weights.dtype))
        raise RuntimeError(f"expected scalar type Float but found {found}" if bits == 8 else
                           f"Expect fp32 or fp16 weights, but found{found} instead")


def _rowwise_offsets(bits: int, torch_name: str):
    torch_op = TORCH_OPS[torch_name]

    def op(weight: Tensor, indices: Tensor, offsets: Optional[Tensor] = None,
           scale_grad_by_freq: bool = False, mode: int = 0, pruned_weights: bool = False,
           per_sample_weights: Optional[Tensor] = None,
           compressed_indices_mapping: Optional[Tensor] = None,
           include_last_offset: bool = False) -> Tensor:
        if pruned_weights or weight.device.type not in ("cpu", "cuda"):
            return torch_op(weight, indices, offsets, scale_grad_by_freq, mode, pruned_weights,
                            per_sample_weights, compressed_indices_mapping, include_last_offset)
        check_weights_dtype(per_sample_weights, bits)
        if offsets is None and indices.dim() == 1:
            raise RuntimeError(f"{torch_name} expects offsets to be set for 1D indices.")
        dim = packed_dim(weight.shape[1], bits)
        args = (weight, indices, offsets, per_sample_weights, "sum", include_last_offset, None,
                bits, dim)
        if _bags.capturing():
            return torch.ops.perfkernels.embedding_bag_quantized(*args)
        try:
            return _bags.lookup(*args)
        except IndexError as exc:
            raise index_error(exc, quantized=True) from None
        except (ValueError, TypeError) as exc:
            raise RuntimeError(str(exc)) from None    # torch's ops raise RuntimeError
    op.__name__ = op.__qualname__ = torch_name
    op.__doc__ = (f"``torch.ops.quantized.{torch_name}`` with the same signature, on perfkernels' "
                  f"{bits}-bit kernels.  Like torch's op it sums whatever ``mode`` says; "
                  "``pruned_weights=True`` runs torch's op.  Bad input raises ``RuntimeError`` "
                  "(an index out of range: :class:`IndexOutOfRangeError`, with torch's "
                  "message) where torch's op may read past its arrays.\n\n"
                  "Examples\n--------\n"
                  ">>> import torch, perfkernels.torch as pkt\n"
                  f">>> packed = pkt.quantize_rowwise(torch.randn(10, 8), bits={bits})\n"
                  f">>> out = pkt.{torch_name}(packed, torch.tensor([1, 2, 3]),\n"
                  "...                          torch.tensor([0, 1]))\n"
                  ">>> out.shape, out.dtype\n"
                  "(torch.Size([2, 8]), torch.float32)\n")
    return op


embedding_bag_byte_rowwise_offsets = _rowwise_offsets(8, "embedding_bag_byte_rowwise_offsets")
embedding_bag_4bit_rowwise_offsets = _rowwise_offsets(4, "embedding_bag_4bit_rowwise_offsets")
embedding_bag_2bit_rowwise_offsets = _rowwise_offsets(2, "embedding_bag_2bit_rowwise_offsets")

#: what :func:`~perfkernels.torch.route_functional` puts in ``torch.ops.quantized``
OP_ALIASES = {"embedding_bag_byte_rowwise_offsets": embedding_bag_byte_rowwise_offsets,
              "embedding_bag_4bit_rowwise_offsets": embedding_bag_4bit_rowwise_offsets,
              "embedding_bag_2bit_rowwise_offsets": embedding_bag_2bit_rowwise_offsets}
