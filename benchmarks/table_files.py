"""Build, save and load one production-size table, with its time and memory: the numbers of
docs/production-scale.md.

    python benchmarks/table_files.py --rows 4000000 --dim 128 --bits 4 --dir /tmp/tables

Each step runs in a fresh process (so peak RSS is the step's own): the build from the seeded
initialiser into memory (peak RSS over the process's RSS before it), the save, the build straight
into a file, and the load by mmap in a new process (time to the mapped array, then a pass that
touches every page; what /proc/self/smaps says about the mapping: shared, private and huge-page
bytes) while another process holds the same file mapped.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

_STEP = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    import perfkernels
    from perfkernels import tables as T

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))

    def mapping(a):
        lo = a.__array_interface__["data"][0]
        hi = lo + a.nbytes
        fields, inside = {}, False
        with open("/proc/self/smaps") as f:
            for line in f:
                first = line.split(None, 1)[0]
                if "-" in first and not first.endswith(":"):
                    s, e = (int(x, 16) for x in first.split("-"))
                    inside = s < hi and lo < e
                elif inside and first.endswith(":") and line.split()[-1] == "kB":
                    fields[first[:-1]] = fields.get(first[:-1], 0) + int(line.split()[1]) * 1024
        return fields

    args = json.loads(sys.argv[1])
    step, path = args["step"], args["path"]
    src = T.SeededInit(args["rows"], args["dim"], seed=0)
    fmt = T.table_format(args["fmt"])
    out = {"step": step, "threads": perfkernels.get_num_threads()}
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    t = time.perf_counter()
    if step == "build":
        table = T.build_table(src, fmt, block_rows=args["block_rows"])
        out["build_s"] = time.perf_counter() - t
        out["table_bytes"] = table.nbytes
        t = time.perf_counter()
        T.save_table(path, table, bits=fmt if isinstance(fmt, int) else None,
                     dim=args["dim"] if isinstance(fmt, int) else None)
        out["save_s"] = time.perf_counter() - t
    elif step == "build_file":
        T.build_table_file(path + ".direct", src, fmt, block_rows=args["block_rows"])
        out["build_s"] = time.perf_counter() - t
        os.unlink(path + ".direct")
    elif step == "load":
        a = T.load_table(path)
        out["load_s"] = time.perf_counter() - t
        t = time.perf_counter()
        out["touch_checksum"] = int(a.view(np.uint8).reshape(-1)[::4096].sum(dtype=np.int64))
        out["touch_s"] = time.perf_counter() - t
        m = mapping(a)
        out["shared"] = m.get("Shared_Clean", 0) + m.get("Shared_Dirty", 0)
        out["private"] = m.get("Private_Clean", 0) + m.get("Private_Dirty", 0)
        out["file_pmd_mapped"] = m.get("FilePmdMapped", 0)
        out["table_bytes"] = a.nbytes
        if args.get("hold"):
            print(json.dumps(out), flush=True)
            sys.stdin.read()
            sys.exit(0)
    out["peak_rss_over_start"] = status("VmHWM") - before
    print(json.dumps(out), flush=True)
""")


def _run(args: dict, hold: bool = False):
    cmd = [sys.executable, "-c", _STEP, json.dumps(dict(args, hold=hold))]
    if hold:
        return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=4_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--bits", default="4", help="8, 4, 2, float32, float16 or bfloat16")
    p.add_argument("--block-rows", type=int, default=65536)
    p.add_argument("--dir", default="/tmp")
    a = p.parse_args()
    fmt = int(a.bits) if a.bits.isdigit() else a.bits
    path = os.path.join(a.dir, f"table_{a.rows}x{a.dim}_{a.bits}.pkt")
    args = dict(rows=a.rows, dim=a.dim, fmt=fmt, block_rows=a.block_rows, path=path)
    results = [_run(dict(args, step="build")), _run(dict(args, step="build_file"))]
    holder = _run(dict(args, step="load"), hold=True)
    results.append(json.loads(holder.stdout.readline()))
    results.append(_run(dict(args, step="load")))      # a second process, the first still mapped
    holder.stdin.close()
    holder.wait()
    os.unlink(path)
    for r in results:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
