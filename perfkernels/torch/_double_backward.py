"""The gradient of ``per_sample_weights`` is differentiable once, as in torch.

torch's ``per_sample_weights`` gradient (``aten::_embedding_bag_per_sample_weights_backward``)
has no derivative: differentiating it again (a gradient penalty, ``create_graph=True``) raises
``RuntimeError: derivative for aten::_embedding_bag_per_sample_weights_backward is not
implemented``.  Ours is written with torch ops on a detached table, so a second backward through
it would silently miss the table's part; it raises the same error instead.
"""
from __future__ import annotations

import torch
from torch import Tensor

MESSAGE = "derivative for aten::_embedding_bag_per_sample_weights_backward is not implemented"


class _PerSampleWeightsGrad(torch.autograd.Function):
    """Passes the gradient through in forward; its backward refuses, as torch's does."""

    @staticmethod
    def forward(ctx, grad: Tensor, weight: Tensor) -> Tensor:
        return grad.clone()

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(MESSAGE)


def refuse_double_backward(grad: Tensor, weight: Tensor) -> Tensor:
    """``grad`` (of ``per_sample_weights``), made to raise torch's error if it is differentiated
    again: only when it is being recorded (``create_graph=True``), at no cost otherwise."""
    if not torch.is_grad_enabled() or torch.compiler.is_compiling():
        return grad
    if not (grad.requires_grad or weight.requires_grad):
        return grad
    return _PerSampleWeightsGrad.apply(grad, weight)
