"""``python -m perfkernels bench --family dlrm [--model criteo|rm1|rm2|rm3]``: the DLRM example
end to end, stock PyTorch against the model after ``perfkernels.torch.convert`` (training step,
and inference with float32, float16 and 8-bit tables), both at PyTorch's default thread count.
``--latency [--threads 1,2]``: serving latency of the reference DLRM instead (p50 / p99 per
batch size; ``examples/dlrm.py --latency``).

It is not a per-kernel case (the generic runner times kernels per ISA level against
single-threaded baselines), so :func:`cases` is empty and :func:`run` does the work.  The model
lives in ``examples/dlrm.py`` of a source checkout; an installed package without it says so.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from . import Case

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dlrm.py"


def cases(quick: bool) -> list[Case]:
    return []


def run(quick: bool, plot: str | None = None, model: str = "criteo", latency: bool = False,
        threads: list[int] | None = None) -> dict | None:
    """Run the comparison (``quick``: small tables and batches, seconds instead of minutes) for
    one of the example's model classes (``criteo``, ``rm1``, ``rm2``, ``rm3``); with ``latency``,
    the serving latency of the reference DLRM instead (``examples/dlrm.py --latency``: p50 and
    p99 per batch size, stock eager and compiled, ``convert()``, ``optimize()``), once per count
    in ``threads`` (default: torch's thread count)."""
    if not EXAMPLE.exists():
        print(f"dlrm: {EXAMPLE} not found (the example ships with the source checkout)")
        return None
    spec = importlib.util.spec_from_file_location("perfkernels_dlrm_example", EXAMPLE)
    dlrm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dlrm)
    if latency:
        argv = ["--latency"] + (["--max-rows", "20000", "--batches", "1,16,128", "--rounds", "50",
                                 "--no-compile"] if quick else [])
        results = {}
        for n in threads or [None]:
            extra = [] if n is None else ["--threads", str(n)]
            if plot:
                extra += ["--plot", plot if n is None or len(threads) == 1 else
                          str(Path(plot).with_suffix("")) + f"-{n}t" + Path(plot).suffix]
            results[n] = dlrm.run(dlrm.parse_args(argv + extra))
        return results
    argv = ["--model", model] + (
        ["--max-rows", "20000", "--batch", "512", "--train-steps", "10",
         "--infer-batches", "2", "--repeat", "2"] if quick else
        ["--train-steps", "20", "--infer-batches", "4", "--repeat", "3"])
    if plot:
        argv += ["--plot", plot]
    return dlrm.run(dlrm.parse_args(argv))
