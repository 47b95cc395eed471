"""Kernel-level A/B of the bag kernels of two builds: the exported C kernels of each called through
ctypes on the same tables, A and B alternating within every round (B first in odd rounds).

    python benchmarks/ceiling/kernel_ab.py OLD_TREE NEW_TREE [--isa avx2] [--rounds 7] [--only a,b]

A tree is a directory holding a built ``perfkernels/`` (a checkout built in place, or the
site-packages of an install), or a shared library holding the kernels themselves.  Each row: the
median time per call of A and of B, B/A (below 1: B is faster) and the range of the per-round
ratios.  Both builds must give the same sums (checked before timing).  What it answers is whether a
change to the loops moved their speed, free of the Python frontend and of PyTorch's time, which
moves by tens of percent between processes on a shared VM."""
import argparse, ctypes, glob, os, sys, time
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_rounds import time_ab  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("a"); ap.add_argument("b")
ap.add_argument("--isa", default=None, help="the level to time (default: the active one)")
ap.add_argument("--rounds", type=int, default=7)
ap.add_argument("--only", default="")
ap.add_argument("--reps", type=int, default=0)
args = ap.parse_args()

import perfkernels  # placed tables, quantize and bfloat16 conversion for both sides
from perfkernels import as_table

if args.isa is None:
    args.isa = perfkernels.active_isa()


class Bags(ctypes.Structure):
    _fields_ = [("indices", ctypes.c_void_p), ("n_indices", ctypes.c_int64), ("index_64", ctypes.c_int),
                ("offsets", ctypes.c_void_p), ("num_bags", ctypes.c_int64), ("weights", ctypes.c_void_p),
                ("positional", ctypes.c_int), ("mean", ctypes.c_int), ("padding_idx", ctypes.c_int64),
                ("out", ctypes.c_void_p), ("out_stride", ctypes.c_int64)]


def load(tree):
    if tree.endswith(".so"):
        e = q = ctypes.CDLL(tree, mode=os.RTLD_LOCAL)
    else:
        e = ctypes.CDLL(glob.glob(f"{tree}/perfkernels/families/embedding/_embedding*.so")[0], mode=os.RTLD_LOCAL)
        q = ctypes.CDLL(glob.glob(f"{tree}/perfkernels/families/quantized/_quantized*.so")[0], mode=os.RTLD_LOCAL)
    fns = {}
    for t in ("f32", "f16", "bf16"):
        f = getattr(e, f"pk_embedding_bag_{t}_{args.isa}")
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.POINTER(Bags), ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                      ctypes.POINTER(ctypes.c_int64)]
        fns[t] = f
    f = getattr(q, f"pk_embedding_bag_quantized_{args.isa}")
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_int, ctypes.POINTER(Bags), ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                  ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]
    fns["q"] = f
    return fns


A, B = load(args.a), load(args.b)
rng = np.random.default_rng(0)
tables = {}


def table(fmt, rows, dim):
    key = (fmt, rows, dim)
    if key not in tables:
        w = rng.standard_normal((rows, dim), dtype=np.float32)
        if fmt == "f32":
            t = as_table(w)
        elif fmt == "f16":
            t = as_table(w.astype(np.float16))
        elif fmt == "bf16":
            t = as_table(perfkernels.float_to_bfloat16(w))
        else:
            t = as_table(perfkernels.quantize_rowwise(w, bits=int(fmt[1:])))
        tables[key] = t
    return tables[key]


def case(fmt, rows, dim, B_, L, weighted=False, padded=False, idx64=True, zipf=False):
    t = table(fmt, rows, dim)
    n = B_ * L
    if zipf:
        idx = (rng.zipf(1.1, n) - 1) % rows
    else:
        idx = rng.integers(0, rows, n)
    idx = idx.astype(np.int64 if idx64 else np.int32)
    offs = np.arange(0, n + 1, L, dtype=np.int64)
    w = rng.random(n, dtype=np.float32) if weighted else None
    out = np.empty((B_, dim), np.float32)
    bags = Bags(idx.ctypes.data, n, int(idx64), offs.ctypes.data, B_, w.ctypes.data if w is not None else None,
                0, 0, 0 if padded else -1, out.ctypes.data, dim)
    bad = ctypes.c_int64(0)
    keep = (idx, offs, w, out)
    if fmt[0] == "q":
        bits = int(fmt[1:])
        def call(fns):
            return fns["q"](bits, ctypes.byref(bags), t.ctypes.data, rows, t.shape[1], dim, ctypes.byref(bad))
    else:
        def call(fns):
            return fns[fmt](ctypes.byref(bags), t.ctypes.data, rows, dim, t.strides[0] // t.itemsize, ctypes.byref(bad))
    return call, keep, out


cases = []
for fmt in ("f32", "f16", "bf16"):
    for dim in (64, 128, 100, 256):
        cases.append((f"{fmt} cache 20k x {dim} B512 L40", (fmt, 20000, dim, 512, 40)))
    cases.append((f"{fmt} dlrm 1M x 64 B2048 L20", (fmt, 1000000, 64, 2048, 20)))
    cases.append((f"{fmt} dlrm 1M x 64 B2048 L100", (fmt, 1000000, 64, 2048, 100)))
    cases.append((f"{fmt} tiny 1k x 64 B1 L1", (fmt, 1000, 64, 1, 1)))
cases.append(("f32 fbgemm 4M x 256 B10 L100", ("f32", 4000000, 256, 10, 100)))
cases.append(("f32 cache 20k x 64 weighted", ("f32", 20000, 64, 512, 40, True)))
cases.append(("f32 cache 20k x 64 padded i32", ("f32", 20000, 64, 512, 40, False, True, False)))
for bits in (8, 4, 2):
    for dim in ((32, 64, 128, 256, 100, 129) if bits != 2 else (64, 128, 100)):
        cases.append((f"q{bits} cache 20k x {dim} B512 L40", (f"q{bits}", 20000, dim, 512, 40)))
    cases.append((f"q{bits} dlrm 1M x 64 B2048 L20", (f"q{bits}", 1000000, 64, 2048, 20)))
    cases.append((f"q{bits} dlrm 1M x 64 B2048 L100", (f"q{bits}", 1000000, 64, 2048, 100)))
    cases.append((f"q{bits} fbgemm 4M x 128 B10 L100", (f"q{bits}", 4000000, 128, 10, 100)))
    cases.append((f"q{bits} tiny 1k x 64 B1 L1", (f"q{bits}", 1000, 64, 1, 1)))
cases.append(("q8 cache 20k x 64 weighted", ("q8", 20000, 64, 512, 40, True)))
cases.append(("q4 cache 20k x 128 weighted", ("q4", 20000, 128, 512, 40, True)))
if args.only:
    cases = [c for c in cases if any(o in c[0] for o in args.only.split(","))]

print(f"{'case':40s} {'A us':>9s} {'B us':>9s} {'B/A':>6s}  (rounds: per-round ratio min-max)")
for name, spec in cases:
    call, keep, out = case(*spec)
    assert call(A) == 0
    ref = out.copy()
    assert call(B) == 0
    assert np.allclose(ref, out, rtol=1e-5, atol=1e-4), name
    t0 = time.perf_counter(); call(A); dt = time.perf_counter() - t0
    reps = args.reps or max(3, min(2000, int(0.02 / max(dt, 1e-7))))
    ma, mb, ratios = time_ab(call, A, B, args.rounds, reps)
    print(f"{name:40s} {ma:9.1f} {mb:9.1f} {mb / ma:6.3f}  ({min(ratios):.3f}-{max(ratios):.3f})", flush=True)
