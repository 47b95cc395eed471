"""The embedding stage of DLRM-v2 alone: one ``perfkernels.embedding_bags_multi`` call for the
26 tables against torch's own bag op table by table, on the same tables (docs/production-scale.md),
and the example's ``perfkernels.torch.EmbeddingBagCollection`` over the same tables called on a
KeyedJaggedTensor (made per sample, as a server makes it) as a torch model calls it (the
``module`` route).

    python examples/dlrm_v2.py --scale 1 --tables-dir /data/dlrm --samples 1    # build once
    python benchmarks/dlrm_v2_lookups.py --scale 1 --tables-dir /data/dlrm --threads 1,2

MLPerf-style samples (100-700 pairs, 214 lookups a pair, power-law IDs) of
:class:`perfkernels.datasets.CriteoLike`; the two routes take turns on every sample (each first
on every other one) and each starts with caches that hold none of the sample's rows, as a
server's next sample finds them.  The tables are mapped with every page populated, so no route
pays a page fault.  Both write the pooled rows into the same ``[B, 27 * 128]`` buffer: ours
straight into its columns, torch's by a copy of each table's result (as a torch model does).  The
module returns them side by side, ``[B, 26 * 128]`` (its ``KeyedTensor.values()``, what TorchRec's
collection returns); a model concatenates them with the dense features, a copy that
``perfkernels.torch.optimize`` fuses away (the pooled rows written straight into the cross
network's input).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))
import dlrm_v2  # noqa: E402

import perfkernels as pk  # noqa: E402
from perfkernels import datasets  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, default=64)
    p.add_argument("--bits", default="4:big,8:small")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tables-dir", default=None, help="table files (else built in memory)")
    p.add_argument("--samples", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3, help="passes over the samples")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--module", action="store_true",
                   help="(kept for old command lines: the module route always runs)")
    args = p.parse_args(argv)
    import perfkernels.torch as pkt
    rows = datasets.dlrm_v2_rows(args.scale)
    fmts = dlrm_v2.table_formats(args.bits, datasets.DLRM_V2_ROWS)
    gen = datasets.CriteoLike(rows, exponent=1.05, seed=args.seed)
    model = dlrm_v2.DLRMv2(dlrm_v2.build_or_map_collection(rows, fmts, args.seed, args.tables_dir,
                                                           gen.keys))
    tabs, ebc, keys = model.tables, model.sparse, model.keys
    samples = list(gen.samples(args.samples))
    routes = ["ours", "torch", "module"]
    pairs = sum(s.batch_size for s in samples)
    print(f"DLRM-v2 at 1/{args.scale:g} size, tables {args.bits}: {sum(rows):,} rows, "
          f"{sum(t.nbytes for t in tabs) / 2**30:.2f} GiB; {args.samples} samples, {pairs} pairs "
          f"(mean {pairs / len(samples):.0f}), {args.rounds} rounds")
    for n in (int(x) for x in args.threads.split(",")):
        pk.set_num_threads(n)
        torch.set_num_threads(n)
        times: dict = {r: [] for r in routes}
        for _ in range(args.rounds):
            for i, s in enumerate(samples):
                values, lengths = torch.from_numpy(s.values), torch.from_numpy(s.lengths)
                x = torch.empty(s.batch_size, (len(tabs) + 1) * dlrm_v2.DIM)
                k = i % len(routes)                # each route first in turn
                for route in routes[k:] + routes[:k]:
                    dlrm_v2._evict_caches()
                    t = time.perf_counter()
                    if route == "ours":
                        pk.embedding_bags_multi(model.tables, s.values, lengths=s.lengths,
                                                bits=model.bits, dims=model.dims,
                                                out=x[:, dlrm_v2.DIM:].numpy())
                    elif route == "module":
                        with torch.inference_mode():
                            kjt = pkt.KeyedJaggedTensor(keys, values, lengths=lengths)
                            ebc(kjt).values()
                    else:
                        torch.cat(model.torch_lookups(values, lengths), 1, out=x[:, dlrm_v2.DIM:])
                    times[route].append(time.perf_counter() - t)
        med = {k: float(np.median(v)) for k, v in times.items()}
        tot = {k: float(np.sum(v)) for k, v in times.items()}
        print(f"{n} thread(s): ours median {1e3 * med['ours']:.2f} ms a sample "
              f"({pairs * args.rounds / tot['ours']:,.0f} pairs/s), torch's bags "
              f"{1e3 * med['torch']:.2f} ms ({pairs * args.rounds / tot['torch']:,.0f} pairs/s): "
              f"{med['torch'] / med['ours']:.2f}x by the median, "
              f"{tot['torch'] / tot['ours']:.2f}x in total")
        if "module" in med:
            print(f"   the module (EmbeddingBagCollection on a KeyedJaggedTensor): "
                  f"median {1e3 * med['module']:.2f} ms ({pairs * args.rounds / tot['module']:,.0f}"
                  f" pairs/s): {med['torch'] / med['module']:.2f}x torch's bags by the median, "
                  f"{tot['torch'] / tot['module']:.2f}x in total; "
                  f"{med['module'] / med['ours']:.2f}x the NumPy call's time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
