"""TorchRec's quantized EmbeddingBagCollection, stock vs after perfkernels.torch.convert().

The DLRM-v2 embedding stage (26 multi-hot features, D 128, power-law IDs from
perfkernels.datasets.CriteoLike) at 1/SCALE of MLPerf's row counts, 4-bit rows (FBGEMM's
table-batched int-N kernel on TorchRec's side), KeyedJaggedTensors built beforehand.  The two
sides are timed in interleaved rounds in one process at each thread count, and their outputs
compared bit for bit.  The tables are made quantized directly (no float copy): at 1/16 size
about 1 GiB for TorchRec's rows and 0.9 GiB for ours.

    python benchmarks/torchrec_quant.py [--scale 16] [--batch 2048] [--rounds 7] [--loop]

``--loop`` adds a third side, the bound: the touch-only loop of ``benchmarks/ceiling/
gather_touch.c`` (one byte of every cache line of every packed row the batch names, at its best
prefetch setting, on the same threads; needs a C compiler) over the converted collection's own
tables, so no lookup of these rows can be much faster.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

import perfkernels as pk
import perfkernels.torch as pt
from perfkernels.datasets import CriteoLike, dlrm_v2_rows


def build(scale: int, dim: int = 128, seed: int = 0):
    """TorchRec's quantized collection over DLRM-v2's tables at 1/scale, 4-bit, with sane
    qparams (FBGEMM initialises the rows' bytes, scale and bias included, at random)."""
    warnings.filterwarnings("ignore")
    import torchrec
    from torchrec.modules.embedding_configs import DataType
    from torchrec.quant.embedding_modules import EmbeddingBagCollection as QuantEBC
    rows = dlrm_v2_rows(scale)
    tables = [torchrec.EmbeddingBagConfig(num_embeddings=r, embedding_dim=dim, name=f"t_cat_{i}",
                                          feature_names=[f"cat_{i}"], data_type=DataType.INT4)
              for i, r in enumerate(rows)]
    ebc = QuantEBC(tables, is_weighted=False, device=torch.device("cpu"))
    g = torch.Generator().manual_seed(seed)
    for tbe in ebc._emb_modules:
        for data, scale_shift in tbe.split_embedding_weights():
            qp = scale_shift.view(torch.float16)
            qp[:, 0] = (torch.rand(qp.shape[0], generator=g) * 0.01 + 0.005).half()
            qp[:, 1] = (torch.rand(qp.shape[0], generator=g) * -0.05).half()
    return ebc, rows


def timed(fn, kjts, reps: int) -> float:
    t0 = time.perf_counter()
    for i in range(reps):
        fn(kjts[i % len(kjts)])
    return (time.perf_counter() - t0) / reps


def touch_loop(converted, kjts, threads: int):
    """The touch-only loop over ``converted``'s packed tables for each KJT of ``kjts``: a
    function of a KJT, timed as the sides are (its prefetch setting the best of three quick
    tries of each)."""
    import pathlib
    import sys
    import tempfile
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "ceiling"))
    import gather_ceiling as gc
    dll = gc.build_library(pathlib.Path(tempfile.mkdtemp()))
    team = gc.torch_openmp_team()
    lookup = converted._pk_lookup            # the converted collection's tables, feature order
    tables, names = lookup.tables, converted._feature_names
    feature_rows = {}
    for kjt in kjts:
        per_key = kjt.to_dict()
        feature_rows[id(kjt)] = [per_key[k].values().to(torch.int64).contiguous() for k in names]

    def with_setting(setting):
        def fn(kjt):
            for t, ix in zip(tables, feature_rows[id(kjt)]):
                dll.gather_touch(t.data_ptr(), t.stride(0), ix.data_ptr(), ix.numel(), threads,
                                 *setting, *team)
        return fn
    best = min(gc.SETTINGS, key=lambda st: min(timed(with_setting(st), kjts, 2)
                                                 for _ in range(3)))
    return with_setting(best)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=16)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--loop", action="store_true",
                    help="also time the touch-only loop over the same rows (the bound)")
    args = ap.parse_args()
    stock, rows = build(args.scale)
    converted = pt.convert(stock)
    print(pt.last_report())
    data = CriteoLike(rows=rows)
    kjts = [data.batch(args.batch, i).to_kjt(torchrec=True) for i in range(4)]
    with torch.inference_mode():
        for kjt in kjts:
            a, b = stock(kjt), converted(kjt)
            assert a.keys() == b.keys() and torch.equal(a.values(), b.values()), "outputs differ"
    print(f"1/{args.scale} of DLRM-v2's rows ({sum(rows):,} rows, D 128, 4-bit), batch "
          f"{args.batch}: outputs equal bit for bit")
    for threads in args.threads:
        torch.set_num_threads(threads)
        pk.set_num_threads(threads)
        ours, theirs, loop = [], [], []
        touch = touch_loop(converted, kjts, threads) if args.loop else None
        with torch.inference_mode():
            for fn in (stock, converted):
                timed(fn, kjts, 2)                      # warm
            for _ in range(args.rounds):                # interleaved rounds
                theirs.append(timed(stock, kjts, args.reps))
                ours.append(timed(converted, kjts, args.reps))
                if touch is not None:
                    loop.append(timed(touch, kjts, args.reps))
        t, o = statistics.median(theirs), statistics.median(ours)
        ratios = sorted(a / b for a, b in zip(theirs, ours))
        line = (f"threads {threads}: TorchRec {t * 1e3:.1f} ms, converted {o * 1e3:.1f} ms, "
                f"speed-up {t / o:.2f}x (rounds {ratios[0]:.2f}-{ratios[-1]:.2f}x)")
        if loop:
            lo = statistics.median(loop)
            bound = statistics.median(a / b for a, b in zip(theirs, loop))
            line += (f"; touch loop {lo * 1e3:.1f} ms (TorchRec / loop {bound:.2f}x, "
                     f"converted / loop {statistics.median(b / c for b, c in zip(ours, loop)):.2f})")
        print(line)


if __name__ == "__main__":
    main()
