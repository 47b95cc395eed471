"""The LSTM unit (the pointwise part of an LSTM step) as a registered op with autograd, and an
``LSTMCell`` that uses it (the two matrix products stay torch's)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

import perfkernels as pk

from . import _native_ops  # noqa: F401 (the ops)
from ._bridge import as_numpy, cuda_call
from ._fallback import warn_once


def _unit(name: str, *tensors: Tensor, forget_bias: float):
    """Run perfkernels.<name> (lstm_unit / lstm_unit_backward) in PyTorch's gate order."""
    if tensors[0].device.type != "cpu":
        return cuda_call(name, *tensors, forget_bias=forget_bias, gate_order="ifgo")
    arrays = [as_numpy(t.contiguous()) for t in tensors]
    return tuple(torch.from_numpy(a) for a in getattr(pk, name)(
        *arrays, forget_bias=forget_bias, gate_order="ifgo"))


# ``perfkernels::lstm_unit(Tensor c_prev, Tensor gates, float forget_bias=0.) -> (Tensor, Tensor)``
# and ``perfkernels::lstm_unit_backward(Tensor c_prev, Tensor gates, Tensor c, Tensor dh,
# Tensor dc, float forget_bias=0.) -> (Tensor, Tensor)`` are defined, with their CPU kernels, by
# the native library (``_native_ops``); here their fake kernels, the forward's autograd (which
# calls the backward op) and CUDA kernels (perfkernels.cuda).

def lstm_unit(c_prev: Tensor, gates: Tensor, forget_bias: float = 0.0) -> tuple[Tensor, Tensor]:
    """``(h, c)`` of one LSTM step from the pre-activation ``gates`` ``[N, 4D]`` (PyTorch's
    i, f, g, o order, as ``LSTMCell`` computes them) and ``c_prev`` ``[N, D]``, float32:
    ``c = sigmoid(f + forget_bias) * c_prev + sigmoid(i) * tanh(g)``, ``h = sigmoid(o) * tanh(c)``.
    Differentiable in ``c_prev`` and ``gates`` (the registered op
    ``torch.ops.perfkernels.lstm_unit``).

    Raises
    ------
    RuntimeError
        ``c_prev`` or ``gates`` not float32, or shapes that disagree (``gates`` not ``[N, 4D]``).

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> h, c = pkt.lstm_unit(torch.zeros(1, 2), torch.zeros(1, 8))   # every gate at 0
    >>> h, c                      # c = 0.5 * 0 + 0.5 * tanh(0), h = 0.5 * tanh(c)
    (tensor([[0., 0.]]), tensor([[0., 0.]]))
    """
    return torch.ops.perfkernels.lstm_unit(c_prev, gates, forget_bias)


def lstm_unit_backward(c_prev: Tensor, gates: Tensor, c: Tensor, dh: Tensor, dc: Tensor,
                       forget_bias: float = 0.0) -> tuple[Tensor, Tensor]:
    """``(dc_prev, dgates)`` of :func:`lstm_unit` given the output gradients ``dh``, ``dc``."""
    return torch.ops.perfkernels.lstm_unit_backward(c_prev, gates, c, dh, dc, forget_bias)


def _lstm_unit_cuda(c_prev, gates, forget_bias=0.0):
    # the kernel's h_prev only matters for rows past a sequence's end (seq_lengths): unused here
    return _unit("lstm_unit", c_prev, c_prev, gates, forget_bias=forget_bias)


def _lstm_unit_backward_cuda(c_prev, gates, c, dh, dc, forget_bias=0.0):
    _, dc_prev, dgates = _unit("lstm_unit_backward", c_prev, gates, c, dh, dc,
                               forget_bias=forget_bias)
    return dc_prev, dgates


def _lstm_unit_fake(c_prev, gates, forget_bias=0.0):
    return torch.empty_like(c_prev), torch.empty_like(c_prev)


def _lstm_unit_backward_fake(c_prev, gates, c, dh, dc, forget_bias=0.0):
    return torch.empty_like(c_prev), torch.empty_like(gates)


def _setup(ctx, inputs, output):
    c_prev, gates, forget_bias = inputs
    ctx.save_for_backward(c_prev, gates, output[1])
    ctx.forget_bias = forget_bias


def _backward(ctx, dh, dc):
    c_prev, gates, c = ctx.saved_tensors
    dh = torch.zeros_like(c) if dh is None else dh
    dc = torch.zeros_like(c) if dc is None else dc
    dc_prev, dgates = torch.ops.perfkernels.lstm_unit_backward(c_prev, gates, c, dh, dc,
                                                               ctx.forget_bias)
    return dc_prev, dgates, None


torch.library.register_fake("perfkernels::lstm_unit")(_lstm_unit_fake)
torch.library.register_fake("perfkernels::lstm_unit_backward")(_lstm_unit_backward_fake)
torch.library.register_autograd("perfkernels::lstm_unit", _backward, setup_context=_setup)
torch.library.register_kernel("perfkernels::lstm_unit", "cuda")(_lstm_unit_cuda)
torch.library.register_kernel("perfkernels::lstm_unit_backward", "cuda")(_lstm_unit_backward_cuda)


class LSTMCell(torch.nn.LSTMCell):
    """Drop-in :class:`torch.nn.LSTMCell` (a subclass: same constructor, parameters,
    ``state_dict`` and ``forward``) whose pointwise part is perfkernels' LSTM unit; the two
    matrix products stay torch's.  Float32 only: other dtypes run torch's cell (warned once).

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> cell = pkt.LSTMCell(4, 8)
    >>> h, c = cell(torch.randn(2, 4))
    >>> h.shape, isinstance(cell, torch.nn.LSTMCell)
    (torch.Size([2, 8]), True)
    """

    def forward(self, input: Tensor, hx: Optional[tuple[Tensor, Tensor]] = None
                ) -> tuple[Tensor, Tensor]:
        if input.dtype is not torch.float32 or self.weight_ih.dtype is not torch.float32:
            warn_once(f"LSTMCell in {self.weight_ih.dtype} (the LSTM unit is float32 only)")
            return super().forward(input, hx)
        batched = input.dim() == 2
        if not batched:
            input = input.unsqueeze(0)
        if hx is None:
            zeros = input.new_zeros(input.shape[0], self.hidden_size)
            hx = (zeros, zeros)
        elif not batched:
            hx = (hx[0].unsqueeze(0), hx[1].unsqueeze(0))
        gates = F.linear(input, self.weight_ih, self.bias_ih) + F.linear(hx[0], self.weight_hh,
                                                                        self.bias_hh)
        h, c = torch.ops.perfkernels.lstm_unit(hx[1], gates, 0.0)
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))
