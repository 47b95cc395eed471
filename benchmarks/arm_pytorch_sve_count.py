"""Instructions per row of PyTorch's SVE embedding-bag kernel and of ours, counted under QEMU.

PyTorch's vector-length-agnostic SVE kernel (caffe2/perfkernels/embedding_lookup_idx_sve.cc in
a PyTorch checkout, or the file its sve_emblookup_codegen.py writes) is compiled out of tree the
way PyTorch compiles it (aarch64-linux-gnu-g++ -O3 -march=armv8-a+sve), linked statically with
benchmarks/arm/pytorch_sve_driver.cc, and counted exactly as docs/arm.md counts ours with
tests/emulated/arm_driver.c's bench mode: one bag of ROWS random rows of a 4096-row table,
`qemu-aarch64 -cpu CPU -singlestep -d exec,nochain` counting the executed instructions, and

    per row = ((count at 400 rows) - (count at 200 rows)) / 200
              - the same for the setup-only run (LEVEL none)

Ours comes from build/arm-emulated/arm_driver (built by tests/test_emulated_arm.py).  Each
PyTorch configuration is first run once with random tables and compared with a float64 sum, so
the counted call is a real one.

    python benchmarks/arm_pytorch_sve_count.py --pytorch-source PATH/embedding_lookup_idx_sve.cc \
        --torch-include PATH/torch/include

Needs aarch64-linux-gnu-g++ (with static libstdc++ and libc) and qemu-aarch64.  Nothing of
PyTorch's is written into this repository: the object and the driver go to --work (a temporary
folder unless given).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRIVER_SRC = ROOT / "benchmarks" / "arm" / "pytorch_sve_driver.cc"
OUR_DRIVER = ROOT / "build" / "arm-emulated" / "arm_driver"
SVE_CPUS = {128: "max,sve128=on", 256: "max,sve256=on", 512: "max,sve512=on"}
NO_SVE = "max,sve=off"
KIND_NAMES = {"f32": "float32", "q8": "8-bit rows"}
ROWS = (200, 400)


def count(qemu, cpu, exe, *args):
    """Instructions executed by one run (one per traced block, blocks of one instruction)."""
    proc = subprocess.run([qemu, "-cpu", cpu, "-singlestep", "-d", "exec,nochain", str(exe), *args],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=1200)
    if proc.returncode != 0:
        sys.exit(f"{exe} {' '.join(args)} at -cpu {cpu} failed (exit {proc.returncode}):\n"
                 f"{proc.stdout.decode()[-2000:]}")
    return sum(1 for line in proc.stderr.splitlines() if line.startswith(b"Trace"))


def per_row(qemu, cpu, exe, level, kind, dim, baseline=None):
    """(count(400) - count(200)) / 200 for LEVEL, less the same for LEVEL none (or BASELINE,
    that slope already counted at the same CPU); returns (per row, the baseline's slope)."""
    prefix = [] if exe.name == "pytorch_sve_driver" else ["bench"]   # arm_driver's bench mode

    def slope(lvl):
        lo, hi = (count(qemu, cpu, exe, *prefix, lvl, kind, str(dim), str(n)) for n in ROWS)
        return (hi - lo) / (ROWS[1] - ROWS[0])
    base = slope("none") if baseline is None else baseline
    return slope(level) - base, base


def torch_include_default():
    try:
        from torch.utils.cpp_extension import include_paths
        return include_paths()[0]
    except Exception:   # noqa: BLE001 - no torch here: the flag is then required
        return None


def build(args, work):
    cxx = shutil.which(args.cxx)
    if cxx is None:
        sys.exit(f"{args.cxx} not found (Debian: g++-aarch64-linux-gnu)")
    obj, exe = work / "pytorch_sve.o", work / "pytorch_sve_driver"
    flags = ["-O3", "-march=armv8-a+sve", "-std=c++17"]
    subprocess.run([cxx, *flags, "-I", str(args.torch_include), "-c", str(args.pytorch_source),
                    "-o", str(obj)], check=True)
    subprocess.run([cxx, "-O2", "-std=c++17", "-static", str(DRIVER_SRC), str(obj), "-o", str(exe)],
                   check=True)
    return exe


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pytorch-source", required=True, type=Path,
                    help="PyTorch's caffe2/perfkernels/embedding_lookup_idx_sve.cc")
    ap.add_argument("--torch-include", type=Path, default=torch_include_default(),
                    help="a torch include folder (c10/util/Half.h, BFloat16.h); default: the "
                         "installed torch's")
    ap.add_argument("--our-driver", type=Path, default=OUR_DRIVER,
                    help="arm_driver built by tests/test_emulated_arm.py (default %(default)s)")
    ap.add_argument("--work", type=Path, help="where PyTorch's object and the driver go "
                                              "(default: a temporary folder)")
    ap.add_argument("--cxx", default="aarch64-linux-gnu-g++")
    ap.add_argument("--qemu", default="qemu-aarch64")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--kinds", default="f32,q8")
    ap.add_argument("--vls", default="128,256,512", help="SVE vector lengths, bits")
    ap.add_argument("--no-ours", action="store_true", help="count PyTorch's kernel only")
    args = ap.parse_args()
    if args.torch_include is None:
        sys.exit("--torch-include is needed (no torch installed here)")
    qemu = shutil.which(args.qemu)
    if qemu is None:
        sys.exit(f"{args.qemu} not found (Debian: qemu-user)")
    if not args.no_ours and not args.our_driver.exists():
        sys.exit(f"{args.our_driver} missing: run python -m pytest tests/test_emulated_arm.py first")
    dims = [int(d) for d in args.dims.split(",")]
    kinds = args.kinds.split(",")
    vls = [int(v) for v in args.vls.split(",")]

    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        exe = build(args, work)
        columns, rows = [], {}
        if not args.no_ours:
            columns += ["scalar", "neon"]
        for vl in vls:
            columns += ([] if args.no_ours else [f"ours sve{vl}"]) + [f"PyTorch sve{vl}"]
        for kind in kinds:
            for dim in dims:
                row = rows[(kind, dim)] = {}
                for vl in vls:
                    cpu = SVE_CPUS[vl]
                    proc = subprocess.run([qemu, "-cpu", cpu, str(exe), "check", kind, str(dim), "400"],
                                          capture_output=True, text=True, timeout=600)
                    print(f"# sve{vl} {proc.stdout.splitlines()[0] if proc.stdout else proc.stderr}",
                          flush=True)
                    if proc.returncode != 0:
                        sys.exit(f"PyTorch's kernel does not match the float64 sum at {cpu}")
                    row[f"PyTorch sve{vl}"], _ = per_row(qemu, cpu, exe, "sve", kind, dim)
                    if not args.no_ours:
                        row[f"ours sve{vl}"], _ = per_row(qemu, cpu, args.our_driver, "sve", kind, dim)
                if not args.no_ours:
                    base = None
                    for level in ("scalar", "neon"):
                        row[level], base = per_row(qemu, NO_SVE, args.our_driver, level, kind, dim, base)
                print(f"# {KIND_NAMES.get(kind, kind)} D={dim}: " +
                      ", ".join(f"{c} {row[c]:.1f}" for c in columns), flush=True)

    print("\nInstructions per row (QEMU -singlestep -d exec,nochain; (400 rows - 200 rows) / 200, "
          "less the setup-only run's)\n")
    print("| table | D | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for (kind, dim), row in rows.items():
        print(f"| {KIND_NAMES.get(kind, kind)} | {dim} | " +
              " | ".join(f"{row[c]:.0f}" for c in columns) + " |")


if __name__ == "__main__":
    main()
