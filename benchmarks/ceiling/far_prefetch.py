"""The far-prefetch policy, both ways: rows of tables of 16 MiB and more into L1 or into L2.

The kernels read ``PERFKERNELS_FAR_PREFETCH`` once per process, so each setting runs in processes
of its own, alternated (l1, l2, l1, l2, ...), each process timing every case once (the median of
``--reps`` calls, after one warm-up call).  Cases, one thread, placed tables (2 MiB-aligned, huge
pages), uniform indices:

- bags of 100 over one 1M x 64 table, 2048 bags: float32, float16, 8-bit and 4-bit rows
  (``embedding_bag`` / ``embedding_bag_quantized``);
- unpooled lookups of 12,800 IDs (``embedding`` / ``embedding_quantized``): 1M x 64 float32,
  bfloat16 and 8-bit, 100K x 128 float32.

Prints per case the median over ``--runs`` processes of each setting, in ms, and ``l2 / l1``.

    python benchmarks/ceiling/far_prefetch.py [--runs 3] [--reps 40]

Needs an installed perfkernels.  Not an asv benchmark; ``benchmarks/ceiling/many_tables.py``
times a model's worth of tables (run it once with each setting).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, statistics, sys, time
import numpy as np
import perfkernels as pk
from perfkernels._variants import BFLOAT16
pk.set_num_threads(1)
reps = int(sys.argv[1])
rng = np.random.default_rng(0)
out = {"mode": pk._cpu.far_prefetch()}

def timed(name, fn):
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    out[name] = statistics.median(ts)

def table(rows, dim, kind):
    base = rng.standard_normal((rows, dim), dtype=np.float32)
    if kind in (8, 4):
        return pk.as_table(pk.quantize_rowwise(base, bits=kind), placement="hugepage")
    return pk.as_table(base.astype(kind), placement="hugepage")

ix = rng.integers(0, 1_000_000, 2048 * 100)
offsets = np.arange(2048) * 100
for kind, label in ((np.float32, "float32"), (np.float16, "float16"), (8, "8-bit"), (4, "4-bit")):
    t = table(1_000_000, 64, kind)
    if kind in (8, 4):
        timed(f"bags 1M x 64 {label}", lambda: pk.embedding_bag_quantized(t, ix, offsets, bits=kind))
    else:
        timed(f"bags 1M x 64 {label}", lambda: pk.embedding_bag(t, ix, offsets))
    del t
for rows, dim, kind, label in ((1_000_000, 64, np.float32, "float32"),
                               (1_000_000, 64, BFLOAT16, "bfloat16"),
                               (1_000_000, 64, 8, "8-bit"), (100_000, 128, np.float32, "float32")):
    t = table(rows, dim, kind)
    ids = rng.integers(0, rows, 12_800)
    name = f"lookup {rows // 1000}K x {dim} {label}".replace("1000K", "1M")
    if kind == 8:
        timed(name, lambda: pk.embedding_quantized(t, ids, bits=8))
    else:
        timed(name, lambda: pk.embedding(t, ids))
    del t
print(json.dumps(out))
"""


def run_child(setting: str, reps: int) -> dict:
    env = dict(os.environ, PERFKERNELS_FAR_PREFETCH=setting)
    r = subprocess.run([sys.executable, "-c", CHILD, str(reps)], env=env, capture_output=True,
                       text=True, timeout=900, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="processes per setting (alternated)")
    ap.add_argument("--reps", type=int, default=40, help="calls per case and process")
    args = ap.parse_args(argv)
    samples: dict[str, list[dict]] = {"l1": [], "l2": []}
    for _ in range(args.runs):
        for setting in samples:
            got = run_child(setting, args.reps)
            assert got.pop("mode") == setting
            samples[setting].append(got)
    print(f"far-table cases, 1 thread, ms: median of {args.runs} processes per setting")
    for name in samples["l1"][0]:
        l1 = statistics.median(s[name] for s in samples["l1"]) * 1e3
        l2 = statistics.median(s[name] for s in samples["l2"]) * 1e3
        print(f"  {name:28s} into L1 {l1:7.3f}   into L2 {l2:7.3f}   l2 / l1 {l2 / l1:5.2f}",
              flush=True)


if __name__ == "__main__":
    main()
