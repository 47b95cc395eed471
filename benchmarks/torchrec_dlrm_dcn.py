"""TorchRec's DLRM_DCN with a quantized EmbeddingBagCollection, stock vs after
perfkernels.torch.convert(), end to end, at each batch size, grad mode on and off.

The DLRM-v2 model of TorchRec (``torchrec.models.dlrm.DLRM_DCN``: bottom MLP 13-512-256-128, a
low-rank cross network of 3 layers at rank 512 over the 27 x 128 concatenation, top MLP
1024-1024-512-256-1) over TorchRec's quantized collection of DLRM-v2's 26 tables at 1/SCALE of
MLPerf's rows, 4-bit rows (the one benchmarks/torchrec_quant.py builds, never in float32).  The
converted model is ``convert(model)``: the collection swapped for ours (the same rows, our
multi-table kernel), the dense part TorchRec's as it was.  Inputs: CriteoLike batches (power-law
IDs, MLPerf's multi-hot bags), KeyedJaggedTensors and dense features made beforehand.  Stock and
converted take turns in interleaved rounds in one process; the outputs are compared first.

    python benchmarks/torchrec_dlrm_dcn.py [--scale 16] [--batches 1,16,128,1024] [--threads 1,2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torchrec_quant import build  # noqa: E402

import perfkernels as pk  # noqa: E402
import perfkernels.torch as pt  # noqa: E402
from perfkernels.datasets import CriteoLike  # noqa: E402


def model_over(ebc):
    from torchrec.models.dlrm import DLRM_DCN
    torch.manual_seed(0)
    return DLRM_DCN(ebc, dense_in_features=13, dense_arch_layer_sizes=[512, 256, 128],
                    over_arch_layer_sizes=[1024, 1024, 512, 256, 1], dcn_num_layers=3,
                    dcn_low_rank_dim=512).eval()


def timed(model, inputs, reps: int, grad: bool) -> float:
    with torch.set_grad_enabled(grad):
        t0 = time.perf_counter()
        for i in range(reps):
            dense, kjt = inputs[i % len(inputs)]
            model(dense, kjt)
        return (time.perf_counter() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=16)
    ap.add_argument("--batches", default="1,16,128,1024")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=0.3, help="per side and round, about")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    ebc, rows = build(args.scale)
    stock = model_over(ebc)
    converted = pt.convert(stock)
    print(pt.last_report())
    data = CriteoLike(rows=rows)
    print(f"TorchRec DLRM_DCN over 1/{args.scale} of DLRM-v2's rows ({sum(rows):,} rows, 4-bit), "
          f"torch {torch.__version__}")
    print("| threads | batch | grad | stock ms | converted ms | speed-up (rounds) |")
    print("|---|---|---|---|---|---|")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        pk.set_num_threads(threads)
        for batch in (int(b) for b in args.batches.split(",")):
            inputs = []
            for i in range(4):
                b = data.batch(batch, i)
                inputs.append((torch.from_numpy(b.dense), b.to_kjt(torchrec=True)))
            with torch.no_grad():
                for dense, kjt in inputs:
                    a, c = stock(dense, kjt), converted(dense, kjt)
                    assert torch.allclose(a, c, rtol=1e-4, atol=1e-5), (a - c).abs().max()
            once = timed(stock, inputs, 2, False)
            reps = max(2, int(args.seconds / max(once, 1e-6)))
            for grad in (False, True):
                theirs, ours = [], []
                timed(stock, inputs, 2, grad), timed(converted, inputs, 2, grad)
                for r in range(args.rounds):
                    pair = ((stock, theirs), (converted, ours))
                    for model, out in (pair if r % 2 else pair[::-1]):
                        out.append(timed(model, inputs, reps, grad))
                t, o = statistics.median(theirs), statistics.median(ours)
                ratios = sorted(a / b for a, b in zip(theirs, ours))
                print(f"| {threads} | {batch} | {'on' if grad else 'off'} | {t * 1e3:.2f} | "
                      f"{o * 1e3:.2f} | {t / o:.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f}) |",
                      flush=True)


if __name__ == "__main__":
    main()
