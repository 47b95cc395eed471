"""Project the sharded collection's throughput and network volume to 8, 64 and 512 hosts, from
the bytes per sample each exchange carries (checked against the bytes
``benchmarks/distributed_scaling.py`` measures) and the measured lookup rate of one thread.

    python benchmarks/distributed_projection.py --rate 2.4e6      # lookups/s of 1 thread, D 64

The assumptions (printed with the table; docs/distributed.md discusses them): one rank per host
using all its cores; tables table-wise while there are at least as many tables as hosts, else
each table row-wise over hosts / tables hosts; indices spread evenly, so every host has the same
share of the lookups; int32 indices and lengths, float32 pooled rows and gradients, as the
implementation sends them (benchmarks/distributed_scaling.py measures exactly these bytes); no overlap of communication and computation (the two times
add); dense parameters all-reduced once per step by DDP (ring: 2 x their bytes per host).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass
class Model:
    name: str
    lookups: list          # per table, per sample
    dim: int
    row_bytes: int         # float32 rows
    dense_params: int


RM2 = Model("RM2-class (32 x 500K x 64, 120 lookups)", [120] * 32, 64, 256, 60_000)
# DLRMv2 (MLPerf DLRM-DCNv2, Criteo 1TB multi-hot): 26 tables, D 128, ~204M rows, the MLPerf
# multi-hot sizes; ~10M dense parameters (bottom MLP, DCNv2 cross layers, top MLP), rounded
DLRMV2 = Model("DLRMv2-class (26 tables, D 128, ~204M rows)",
               [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1,
                1], 128, 512, 10_000_000)


def bytes_per_sample(m: Model, shards: int, hosts: int, batch: int) -> dict:
    """Bytes one sample makes its host send to other hosts, per exchange."""
    off = (hosts - 1) / hosts          # the owner of a row block is another host
    t = len(m.lookups)
    return {
        "features": off * sum(4 * shards + 4 * n for n in m.lookups),
        "pooled rows": off * 4 * m.dim * t * shards,
        "gradients": off * 4 * m.dim * t * shards,
        "counts": 24 * hosts / batch,
        "dense all-reduce": 2 * 4 * m.dense_params / batch,
    }


def project(m: Model, hosts: int, args: argparse.Namespace) -> dict:
    t = len(m.lookups)
    shards = max(1, hosts // t)
    per_sample = bytes_per_sample(m, shards, hosts, args.batch)
    total = sum(per_sample.values())
    rate_thread = args.rate * 256 / m.row_bytes              # memory-bound: bytes per row
    rate_host = min(args.cores * rate_thread,
                    args.memory_bw / (args.row_transfers * m.row_bytes))
    lookups = sum(m.lookups)
    compute = hosts * rate_host / lookups                     # samples/s, all hosts
    network = hosts * args.link * args.link_efficiency / total
    both = 1 / (1 / compute + 1 / network)
    return {"hosts": hosts, "shards": shards, "bytes": total, "compute": compute,
            "network": network, "samples": both, "volume": both / hosts * total}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, required=True,
                   help="measured lookups/s of one thread, D 64 float32 (forward, backward, "
                        "row-wise Adagrad update): distributed_scaling.py prints it")
    p.add_argument("--cores", type=int, default=32, help="cores per host")
    p.add_argument("--memory-bw", type=float, default=100e9,
                   help="bytes/s a host's random row reads and writes reach")
    p.add_argument("--row-transfers", type=float, default=3,
                   help="row transfers per lookup (forward read, update read and write)")
    p.add_argument("--link", type=float, default=12.5e9, help="bytes/s per host and direction "
                   "(100 Gb/s Ethernet)")
    p.add_argument("--link-efficiency", type=float, default=0.7,
                   help="fraction of the link all_to_all reaches")
    p.add_argument("--batch", type=int, default=2048, help="samples per host and step")
    args = p.parse_args()
    print(f"assumptions: {args.cores} cores per host, one thread at {args.rate / 1e6:.2f} M "
          f"lookups/s (D 64; scaled by row bytes), host memory {args.memory_bw / 1e9:.0f} GB/s "
          f"over {args.row_transfers:g} row transfers per lookup, link "
          f"{args.link * 8 / 1e9:.0f} Gb/s at {args.link_efficiency:.0%}, batch {args.batch} per "
          f"host, no overlap of communication and computation")
    for m in (RM2, DLRMV2):
        print(f"\n{m.name}, {sum(m.lookups)} lookups per sample, dense parameters "
              f"{m.dense_params:,}")
        print(f"{'hosts':>6}{'shards/table':>14}{'bytes/sample':>14}{'compute-bound':>15}"
              f"{'network-bound':>15}{'samples/s':>13}{'GB/s per host':>15}")
        for hosts in (8, 64, 512):
            r = project(m, hosts, args)
            print(f"{hosts:>6}{r['shards']:>14}{r['bytes']:>14,.0f}{r['compute']:>15,.0f}"
                  f"{r['network']:>15,.0f}{r['samples']:>13,.0f}{r['volume'] / 1e9:>15.2f}")


if __name__ == "__main__":
    main()
