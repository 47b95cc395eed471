"""Kernel-level A/B of the unpooled lookups (``perfkernels.embedding`` and
``embedding_quantized``) of two builds: each build's exported C kernels called through ctypes on
the same placed tables and indices, A and B alternating within every round (B first in odd rounds).

    python benchmarks/ceiling/lookup_ab.py OLD_TREE NEW_TREE [--isa avx2] [--rounds 9] [--fresh]

A tree is a directory holding a built ``perfkernels/`` (a checkout built in place, or the
site-packages of an install).  One thread: the kernels themselves, free of the Python frontend,
the thread pool and PyTorch.  Each call writes a new output array (as the NumPy API and the torch
layer return one), unless ``--same-out``.  By default every call looks up the same 12,800 indices
(256 sequences of 50), so the rows come from L2 and L3 after the first call; with ``--fresh`` the
calls cycle through 64 index sets, so most rows come from DRAM.  Each row: the median time per
call of A and of B, B/A (below 1: B is faster) and the range of the per-round ratios.  Both builds
must write the same output (checked before timing)."""
import argparse
import ctypes
import glob
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_rounds import time_ab  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("a", help="tree of build A (a checkout built in place, or site-packages)")
ap.add_argument("b", help="tree of build B")
ap.add_argument("--isa", default=None, help="the level to time (default: the active one)")
ap.add_argument("--rounds", type=int, default=9)
ap.add_argument("--ids", type=int, default=12800)
ap.add_argument("--fresh", action="store_true", help="cycle through 64 index sets (rows from DRAM)")
ap.add_argument("--same-out", action="store_true", help="write one output array every call")
ap.add_argument("--only", default="", help="comma-separated substrings of the case names to run")
args = ap.parse_args()

import perfkernels  # noqa: E402  (placed tables, quantize and bfloat16 conversion for both sides)
from perfkernels import as_table  # noqa: E402

if args.isa is None:
    args.isa = perfkernels.active_isa()

i64 = ctypes.c_int64
vp = ctypes.c_void_p


def load(tree):
    paths = glob.glob(f"{tree}/perfkernels/families/sequence/_sequence*.so")
    if not paths:
        raise SystemExit(f"no built sequence family under {tree}/perfkernels/families/sequence")
    lib = ctypes.CDLL(paths[0], mode=os.RTLD_LOCAL)
    rows = getattr(lib, f"pk_embedding_rows_{args.isa}")
    rows.restype = ctypes.c_int
    rows.argtypes = [vp, i64, i64, i64, vp, ctypes.c_int, i64, vp, ctypes.POINTER(i64)]
    quant = getattr(lib, f"pk_embedding_rows_quantized_{args.isa}")
    quant.restype = ctypes.c_int
    quant.argtypes = [ctypes.c_int, vp, i64, i64, i64, vp, ctypes.c_int, i64, vp, ctypes.POINTER(i64)]
    return rows, quant


A, B = load(args.a), load(args.b)
rng = np.random.default_rng(0)


def make_table(fmt, rows, dim):
    w = rng.standard_normal((rows, dim), dtype=np.float32)
    if fmt == "f32":
        return as_table(w)
    if fmt == "f16":
        return as_table(w.astype(np.float16))
    if fmt == "bf16":
        return as_table(perfkernels.float_to_bfloat16(w))
    return as_table(perfkernels.quantize_rowwise(w, bits=int(fmt[1:])))


def case(fmt, rows, dim):
    t = make_table(fmt, rows, dim)
    sets = [rng.integers(0, rows, args.ids).astype(np.int64) for _ in range(64 if args.fresh else 1)]
    bad = i64(0)
    quantized = fmt[0] == "q"
    out_dtype = np.float32 if quantized else t.dtype
    fixed = np.empty((args.ids, dim), out_dtype)
    state = {"k": 0}

    def run(fns, idx):
        out = fixed if args.same_out else np.empty((args.ids, dim), out_dtype)
        if quantized:
            rc = fns[1](int(fmt[1:]), t.ctypes.data, rows, t.shape[1], dim, idx.ctypes.data, 1,
                        args.ids, out.ctypes.data, ctypes.byref(bad))
        else:
            rc = fns[0](t.ctypes.data, rows, t.strides[0], dim * t.itemsize, idx.ctypes.data, 1,
                        args.ids, out.ctypes.data, ctypes.byref(bad))
        assert rc == 0, rc
        return out

    def call(fns):
        state["k"] += 1
        return run(fns, sets[state["k"] % len(sets)])

    def check():
        a = run(A, sets[0]).copy()
        b = run(B, sets[0])
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), f"{fmt}: A and B differ"

    return t, call, check


cases = [(f"{fmt} {rows // 1000}K x {dim}", fmt, rows, dim)
         for rows, dim in ((1_000_000, 64), (100_000, 128))
         for fmt in ("f32", "f16", "bf16", "q8")]
if args.only:
    cases = [c for c in cases if any(o in c[0] for o in args.only.split(","))]

print(f"level {args.isa}, {args.ids} IDs, {'fresh rows' if args.fresh else 'the same rows'} every call")
print(f"{'case':18s} {'A us':>8s} {'B us':>8s} {'B/A':>6s}  (per-round ratio min-max)")
for name, fmt, rows, dim in cases:
    table, call, check = case(fmt, rows, dim)
    check()
    t0 = time.perf_counter()
    call(A)
    dt = time.perf_counter() - t0
    reps = max(5, min(400, int(0.03 / max(dt, 1e-7))))
    ma, mb, ratios = time_ab(call, A, B, args.rounds, reps)
    print(f"{name:18s} {ma:8.1f} {mb:8.1f} {mb / ma:6.3f}  ({min(ratios):.3f}-{max(ratios):.3f})",
          flush=True)
    del table
