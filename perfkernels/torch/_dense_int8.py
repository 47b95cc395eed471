"""The dense part in int8 through PyTorch's own path: torchao's PT2E flow with the x86 Inductor
quantizer, compiled by Inductor (with freezing) onto oneDNN's int8 kernels.

perfkernels writes no matrix kernels: the MLPs and cross layers of a recommender stay torch's.
:func:`quantize_dense` quantizes such a dense submodule (static int8 activations, per-channel int8
weights) while the lookups that feed it stay perfkernels'.  torchao is optional: it is imported
only here, when asked.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import torch
from torch import nn


def _torchao_pt2e():
    try:
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
            X86InductorQuantizer, get_default_x86_inductor_quantization_config)
    except ImportError as exc:
        raise ImportError(
            "quantize_dense needs torchao (its PT2E flow: torchao.quantization.pt2e, torchao >= "
            "0.14): pip install torchao") from exc
    return prepare_pt2e, convert_pt2e, X86InductorQuantizer, \
        get_default_x86_inductor_quantization_config


class _FrozenCompiled(nn.Module):
    """A module compiled by Inductor with ``freezing``, called under ``no_grad`` with the
    ``torch._inductor.config.freezing`` flag set for each call (the compilation happens at the
    first call of each new shape, and Inductor reads the flag then; ``torch.compile(options=)``
    does not reach the freezing pass)."""

    def __init__(self, module: nn.Module, dynamic: bool) -> None:
        super().__init__()
        # held outside the module tree: an exported (PT2E) module refuses train() / eval()
        self.__dict__["module"] = module
        self.__dict__["compiled"] = torch.compile(module, dynamic=dynamic)

    def forward(self, *args: Any) -> Any:
        import torch._inductor.config as inductor_config
        with torch.no_grad(), inductor_config.patch(freezing=True):
            return self.compiled(*args)


def compile_frozen(module: nn.Module, dynamic: bool = True) -> nn.Module:
    """``module`` compiled by Inductor with ``freezing`` (weights folded in as constants: the form
    in which Inductor picks oneDNN's prepacked float32 and int8 GEMMs), for inference: a module
    whose calls run under ``no_grad``.  ``dynamic``: one compilation for every batch size.
    Put a float module in ``eval()`` mode first.  Nothing is compiled until the first call, which
    raises what ``torch.compile`` raises (a C++ compiler is needed, as for any Inductor build).

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> mlp = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).eval()
    >>> frozen = pkt.compile_frozen(mlp)          # compiles at its first call
    >>> frozen(torch.randn(4, 16)).shape          # doctest: +SKIP
    torch.Size([4, 8])
    """
    return _FrozenCompiled(module, dynamic)


def quantize_dense(module: nn.Module, example_inputs: Sequence[torch.Tensor], *,
                   calibration: Optional[Iterable[Sequence[torch.Tensor]]] = None,
                   compile: bool = True, dynamic_batch: bool = True) -> Any:
    """``module`` (a dense submodule: MLPs, cross layers) quantized to int8 by torchao's PT2E flow.

    The module is captured by ``torch.export`` (dimension 0 of every input dynamic when
    ``dynamic_batch``), annotated by ``X86InductorQuantizer`` with
    ``get_default_x86_inductor_quantization_config()`` (static per-tensor uint8 activations,
    per-channel int8 weights), calibrated by running ``calibration`` (an iterable of input tuples;
    default: ``example_inputs`` once), and converted (``convert_pt2e``).  With ``compile`` (the
    default) the result is ``torch.compile``'d by Inductor with freezing, which is what turns the
    quantize / dequantize pairs into oneDNN's int8 GEMMs; without it, the converted
    ``GraphModule`` runs the reference (slow, float) arithmetic of the quantized model.

    Parameters
    ----------
    module : nn.Module
        Float32 inference module; put into ``eval()`` mode.  Its forward takes tensors only.
    example_inputs : sequence of Tensor
        One input tuple, for the capture (batch of at least 2 when ``dynamic_batch``).
    calibration : iterable of sequences of Tensor, optional
        Input tuples whose activation ranges set the quantization scales.
    compile : bool
        Compile with Inductor and freezing (first call compiles: seconds to a minute).
    dynamic_batch : bool
        Accept any batch size (dimension 0) after the capture.

    Returns
    -------
    The quantized module (a compiled callable, or the converted ``GraphModule``).

    Raises
    ------
    ImportError
        torchao (0.14 or newer, with ``torchao.quantization.pt2e``) is not installed.
    TypeError
        ``module`` is not an ``nn.Module`` or ``example_inputs`` holds a non-tensor.

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> mlp = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).eval()
    >>> x = torch.randn(32, 16)
    >>> int8 = pkt.quantize_dense(mlp, (x,))      # doctest: +SKIP
    >>> (int8(x) - mlp(x)).abs().max() < 0.1      # doctest: +SKIP
    tensor(True)
    >>> pkt.quantize_dense(lambda x: x, (x,))
    Traceback (most recent call last):
        ...
    TypeError: quantize_dense(): module must be an nn.Module, not function
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"quantize_dense(): module must be an nn.Module, not "
                        f"{type(module).__name__}")
    example_inputs = tuple(example_inputs)
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"quantize_dense(): example_inputs[{i}] must be a Tensor, not "
                            f"{type(x).__name__}")
    prepare_pt2e, convert_pt2e, Quantizer, default_config = _torchao_pt2e()
    module = module.eval()
    dynamic_shapes = None
    if dynamic_batch:
        batch = torch.export.Dim("batch")
        dynamic_shapes = tuple({0: batch} if x.dim() else None for x in example_inputs)
    with torch.no_grad():
        graph = torch.export.export(module, example_inputs, dynamic_shapes=dynamic_shapes).module()
        quantizer = Quantizer()
        quantizer.set_global(default_config())
        prepared = prepare_pt2e(graph, quantizer)
        for inputs in (calibration if calibration is not None else [example_inputs]):
            prepared(*inputs)
        converted = convert_pt2e(prepared)
    return compile_frozen(converted, dynamic=dynamic_batch) if compile else converted
