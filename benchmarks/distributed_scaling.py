"""Weak scaling of perfkernels.torch.distributed on one machine: gloo worlds on 127.0.0.1, one
thread per rank, RM2-class tables (64-dim, 120 lookups per sample and table, rows capped), a
training step of the sharded tables (forward, backward, fused row-wise Adagrad on the owners),
batch 2048 per rank.

    python benchmarks/distributed_scaling.py                   # 3 rounds, 8 tables per rank
    python benchmarks/distributed_scaling.py --rows 100000 --tables-per-rank 4 --rounds 5
    python benchmarks/distributed_scaling.py --json results.json

Each world times its steps back to back (wall and CPU seconds, after a warm-up step).
Three worlds run in turn, once per round (so machine noise hits all alike): 1 rank with T
tables, 1 rank with 2T tables, 2 ranks with 2T tables (T each, table-wise).  Reported, as the
median over rounds of per-round ratios:

* tables per rank constant (1 x T vs 2 x T per rank): the lookup throughput, samples/s x
  lookups per sample.  Each rank looks up its tables for every rank's samples, so its work grows
  with the world; samples/s of the bigger model stays near 1x, and the lookups served per second
  is what doubles when scaling is perfect;
* work per rank constant (the 2T model on 1 rank vs on 2 ranks): samples/s;
* the time in collectives per step, by exchange, and the bytes each rank sends per sample.

Worker mode (``--worker``) is what the launcher starts, one process per rank.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(args: argparse.Namespace) -> None:
    import datetime
    import torch
    import torch.distributed as dist
    from perfkernels.torch import EmbeddingBagConfig, KeyedJaggedTensor
    from perfkernels.torch import distributed as pkd
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    tables = [EmbeddingBagConfig(args.rows, args.dim, name=f"t{i}", feature_names=[f"f{i}"])
              for i in range(args.tables)]
    plan = pkd.plan(tables, world, batch_size=args.batch, replicate_below=0,
                    sharding_types={t.name: pkd.TABLE_WISE for t in tables},
                    pooling_factors={t.name: args.lookups for t in tables})
    ebc = pkd.ShardedEmbeddingBagCollection(tables, plan, fused_optimizer=(
        "rowwise_adagrad", {"lr": 0.01, "eps": 1e-8}))
    g = torch.Generator().manual_seed(rank)
    keys = [t.feature_names[0] for t in tables]

    def batch() -> KeyedJaggedTensor:
        n = args.batch * args.lookups
        values = torch.cat([torch.randint(0, args.rows, (n,), generator=g) for _ in tables])
        lengths = torch.full((args.tables * args.batch,), args.lookups, dtype=torch.int64)
        return KeyedJaggedTensor(keys, values, lengths=lengths)

    batches = [batch() for _ in range(2)]
    ebc(batches[1]).values().sum().backward()            # warm-up
    ebc.collective_seconds()
    ebc.collective_bytes()
    dist.barrier()
    # back to back, as training runs: the steps' wall and CPU seconds over the whole loop
    t0, c0 = time.perf_counter(), time.process_time()
    for step in range(args.steps):
        ebc(batches[step % 2]).values().sum().backward()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    comm = {k: v / args.steps for k, v in ebc.collective_seconds().items()}
    sent = {k: v / (args.steps * args.batch) for k, v in ebc.collective_bytes().items()}
    result = {"rank": rank, "world": world, "tables": args.tables,
              "step_s": wall / args.steps, "cpu_s": cpu / args.steps,
              "collectives_s": comm,
              "bytes_sent_per_sample": sent}
    gathered = [None] * world
    dist.all_gather_object(gathered, result)
    if rank == 0:
        print("RESULT " + json.dumps(gathered), flush=True)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(world: int, tables: int, args: argparse.Namespace) -> list:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(world), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               PERFKERNELS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, __file__, "--worker", "--tables", str(tables), "--rows",
           str(args.rows), "--dim", str(args.dim), "--lookups", str(args.lookups), "--batch",
           str(args.batch), "--steps", str(args.steps)]
    procs = [subprocess.Popen(cmd, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    outs = [p.communicate(timeout=1200) for p in procs]
    for p, (out, err) in zip(procs, outs):
        if p.returncode:
            raise SystemExit(f"a rank failed:\n{out}\n{err}")
    line = [x for x in outs[0][0].splitlines() if x.startswith("RESULT ")][0]
    return json.loads(line[len("RESULT "):])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tables", type=int, default=8, help=argparse.SUPPRESS)
    p.add_argument("--tables-per-rank", type=int, default=8)
    p.add_argument("--rows", type=int, default=200_000, help="rows per table (RM2: 500K)")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--lookups", type=int, default=120, help="lookups per sample and table")
    p.add_argument("--batch", type=int, default=2048, help="samples per rank")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    t = args.tables_per_rank
    worlds = {"1 rank x T": (1, t), "1 rank x 2T": (1, 2 * t), "2 ranks x T": (2, 2 * t)}
    rounds = []
    for r in range(args.rounds):
        got = {name: run_world(w, n, args) for name, (w, n) in worlds.items()}
        rounds.append(got)
        step = {n: max(x["step_s"] for x in res) for n, res in got.items()}
        print(f"round {r + 1}: " + ", ".join(f"{n} {s * 1e3:.0f} ms/step"
                                             for n, s in step.items()), flush=True)

    def samples_per_s(res: list, key: str = "step_s") -> float:
        return args.batch * len(res) / max(x[key] for x in res)

    ratio_lookups = [samples_per_s(g["2 ranks x T"]) * 2 * t / (samples_per_s(g["1 rank x T"]) * t)
                     for g in rounds]
    ratio_samples = [samples_per_s(g["2 ranks x T"]) / samples_per_s(g["1 rank x 2T"])
                     for g in rounds]
    # the same ratios from each rank's CPU seconds per step (what the step costs when every
    # rank has a core of its own; on a shared machine the wall clock also counts waiting for one)
    cpu_lookups = [samples_per_s(g["2 ranks x T"], "cpu_s") * 2
                   / samples_per_s(g["1 rank x T"], "cpu_s") for g in rounds]
    cpu_samples = [samples_per_s(g["2 ranks x T"], "cpu_s") / samples_per_s(g["1 rank x 2T"],
                                                                              "cpu_s")
                   for g in rounds]
    last = rounds[-1]["2 ranks x T"]
    comm = {k: statistics.median(x["collectives_s"][k] for x in last)
            for k in last[0]["collectives_s"]}
    step2 = max(x["step_s"] for x in last)
    print(f"\n{args.tables_per_rank} tables per rank of {args.rows:,} x {args.dim}, "
          f"{args.lookups} lookups per sample and table, batch {args.batch} per rank, 1 thread "
          f"per rank, gloo on 127.0.0.1; median of {args.rounds} rounds:")
    for name in worlds:
        sps = statistics.median(samples_per_s(g[name]) for g in rounds)
        print(f"  {name:<12} {sps:>9,.0f} samples/s")
    print(f"  tables per rank constant: 2 ranks / 1 rank lookup throughput "
          f"{statistics.median(ratio_lookups):.2f}x (samples/s x tables)")
    print(f"  work per rank constant (the 2T model): 2 ranks / 1 rank samples/s "
          f"{statistics.median(ratio_samples):.2f}x")
    print(f"  from CPU seconds per step instead of wall seconds: "
          f"{statistics.median(cpu_lookups):.2f}x (tables per rank constant), "
          f"{statistics.median(cpu_samples):.2f}x (work per rank constant)")
    print(f"  2 ranks, per step of {step2 * 1e3:.0f} ms, in collectives (median rank): " +
          ", ".join(f"{k}: {v * 1e3:.1f} ms" for k, v in comm.items()))
    print("  bytes sent to the other rank per sample (rank 0): " + ", ".join(
        f"{k}: {v:,.0f}" for k, v in last[0]["bytes_sent_per_sample"].items()))
    one = statistics.median(args.tables_per_rank * args.batch * args.lookups
                            / max(x["step_s"] for x in g["1 rank x T"]) for g in rounds)
    print(f"  1 rank x 1 thread: {one / 1e6:.2f} M lookups/s (forward, backward and update)")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
