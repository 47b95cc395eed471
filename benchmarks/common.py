"""Helpers shared by the asv benchmark modules.  Import this before perfkernels.

asv runs one build under every PERFKERNELS_ISA in the matrix.  On a CPU that lacks a level,
`import perfkernels` refuses it (by design); here that refusal becomes a skip of the perfkernels
benchmarks instead of a broken benchmark module, so one asv.conf.json serves every machine.
"""
import os

try:
    import perfkernels
    UNAVAILABLE = None
except RuntimeError as exc:           # a forced level this CPU or build cannot run
    UNAVAILABLE = str(exc)
    os.environ.pop("PERFKERNELS_ISA", None)
    import perfkernels  # noqa: F811  (the default level; only the baselines will run)


def isa_or_skip():
    """perfkernels, or NotImplementedError (asv's skip) when this run's ISA level cannot run here."""
    if UNAVAILABLE:
        raise NotImplementedError(UNAVAILABLE)
    return perfkernels


def torch_or_skip():
    """PyTorch on one thread; NotImplementedError (asv's skip) when it is not installed."""
    try:
        import torch
    except ImportError:
        raise NotImplementedError("PyTorch is not installed")
    torch.set_num_threads(1)
    return torch
