"""Two DLRM-v2 servers on the same table files: time to the first answer, and what the second
process adds to the host's memory (the numbers of docs/production-scale.md, "Serving").

    python examples/dlrm_v2.py --scale 1 --tables-dir /data/dlrm --samples 1   # build once
    python benchmarks/dlrm_v2_serve.py --scale 1 --tables-dir /data/dlrm

Each server is a fresh Python process that imports torch and perfkernels, maps the table files of
``examples/dlrm_v2.py`` (built there first, with the same ``--scale``, ``--bits`` and
``--seed``), builds the model and answers MLPerf-style samples.  The time to the first answer is
wall time from the process's start to the first sample's logits.  The second server starts while
the first still holds its mappings; ``/proc/self/smaps_rollup`` then says how much of each
process is private (its own pages: Python, torch, the dense weights, buffers) and how much is
shared with other processes (the tables' pages in the page cache).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")

_SERVER = textwrap.dedent("""
    import json, os, sys, time
    T0 = float(sys.argv[2])
    args = json.loads(sys.argv[1])
    sys.path.insert(0, args["examples"])
    import torch
    import dlrm_v2
    import perfkernels as pk
    from perfkernels import datasets

    def rollup():
        out = {}
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[2] == "kB":
                    out[parts[0].rstrip(":")] = int(parts[1]) * 1024
        return out

    ex = dlrm_v2.parse_args(["--scale", str(args["scale"]), "--bits", args["bits"],
                             "--seed", str(args["seed"]), "--tables-dir", args["dir"]])
    rows = datasets.dlrm_v2_rows(ex.scale)
    fmts = dlrm_v2.table_formats(ex.bits, datasets.DLRM_V2_ROWS)
    for i, (r, f) in enumerate(zip(rows, fmts)):
        path = dlrm_v2.table_path(ex.tables_dir, i, r, f, ex.seed)
        if not os.path.exists(path):
            sys.exit(f"error: {path} is missing: build the tables first with "
                     f"examples/dlrm_v2.py --scale {ex.scale:g} --bits {ex.bits} "
                     f"--seed {ex.seed} --tables-dir {ex.tables_dir}")
    if args["threads"]:
        pk.set_num_threads(args["threads"])
        torch.set_num_threads(args["threads"])
    t_import = time.time() - T0
    torch.manual_seed(ex.seed)
    gen = datasets.CriteoLike(rows, exponent=ex.exponent, seed=ex.seed)
    sparse = dlrm_v2.build_or_map_collection(rows, fmts, ex.seed, ex.tables_dir, gen.keys,
                                             progress=False)
    t_mapped = time.time() - T0
    model = dlrm_v2.DLRMv2(sparse).eval()
    tabs = model.tables
    lat = []
    with torch.inference_mode():
        for i, s in enumerate(gen.samples(args["samples"])):
            t = time.perf_counter()
            model(torch.from_numpy(s.dense), s.to_kjt(torchrec=False))
            lat.append(time.perf_counter() - t)
            if i == 0:
                t_first = time.time() - T0
    mem = rollup()
    print(json.dumps(dict(import_s=t_import, mapped_s=t_mapped, first_answer_s=t_first,
                          sample_ms=[1e3 * x for x in lat], table_bytes=sum(t.nbytes for t in tabs),
                          rss=mem["Rss"], pss=mem.get("Pss", 0),
                          shared=mem.get("Shared_Clean", 0) + mem.get("Shared_Dirty", 0),
                          private=mem.get("Private_Clean", 0) + mem.get("Private_Dirty", 0),
                          anonymous=mem.get("Anonymous", 0))), flush=True)
    sys.stdin.readline()          # hold the mappings until the parent has measured the other
""")


def start(args: argparse.Namespace) -> subprocess.Popen:
    payload = json.dumps(dict(scale=args.scale, bits=args.bits, seed=args.seed, dir=args.tables_dir,
                              samples=args.samples, threads=args.threads, examples=EXAMPLES))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), EXAMPLES) if p)
    return subprocess.Popen([sys.executable, "-c", _SERVER, payload, repr(time.time())],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


def read(proc: subprocess.Popen, timeout: float) -> dict:
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout)
        raise SystemExit(f"error: a server exited with status {proc.returncode}")
    return json.loads(line)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, default=64)
    p.add_argument("--bits", default="4:big,8:small")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tables-dir", required=True)
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--threads", type=int, default=0, help="0: perfkernels' and torch's default")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    first = start(args)
    servers = [first]
    try:
        a = read(first, 600)
        second = start(args)
        servers.append(second)
        b = read(second, 600)
    finally:
        for s in servers:
            try:
                s.communicate("\n", timeout=60)
            except Exception:
                s.kill()
    gib = 2 ** 30
    for name, r in (("first server", a), ("second server", b)):
        ms = sorted(r["sample_ms"][1:]) or r["sample_ms"]
        print(f"{name}: torch and perfkernels imported in {r['import_s']:.2f} s, tables mapped at "
              f"{r['mapped_s']:.2f} s, first answer at {r['first_answer_s']:.2f} s "
              f"(first sample {r['sample_ms'][0]:.0f} ms, then median {ms[len(ms) // 2]:.0f} ms); "
              f"RSS {r['rss'] / gib:.2f} GiB: shared {r['shared'] / gib:.2f} GiB, private "
              f"{r['private'] / gib:.2f} GiB (anonymous {r['anonymous'] / gib:.2f} GiB)")
    print(f"tables: {a['table_bytes'] / gib:.2f} GiB mapped by both; the second server adds "
          f"{b['private'] / gib:.2f} GiB of private memory")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"first": a, "second": b}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
