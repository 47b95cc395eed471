"""How close PyTorch and perfkernels are to the memory ceiling of an embedding-bag lookup.

The ceiling is ``gather_touch.c``: it reads every cache line of every row the bags name and does
nothing else, on the same arrays and threads.  A lookup kernel cannot beat it, so
``torch time / ceiling time`` is about the most any implementation could gain over PyTorch on that
shape.  All three are timed in turn, one sample each per round, in one process (medians of
per-round ratios), all three on PyTorch's OpenMP threads: perfkernels through ``import
perfkernels.torch`` (as in a model), the probe through libgomp's ``GOMP_parallel`` (threads of its
own would wait for the cores PyTorch's threads keep spinning on after each call).

    python benchmarks/ceiling/gather_ceiling.py [--threads 1 2] [--rounds 15]

Needs a C compiler (``cc``), PyTorch and an installed perfkernels.  Not an asv benchmark: asv
imports this module and finds nothing to time.
"""
from __future__ import annotations

import argparse
import ctypes
import pathlib
import statistics
import subprocess
import tempfile
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
SETTINGS = [(d, l2) for d in (8, 16, 32, 64, 128) for l2 in (0, 1)]  # prefetch distance, hint


def build_library(workdir: pathlib.Path) -> ctypes.CDLL:
    """Compile gather_touch.c (baseline flags) into a shared library and load it."""
    lib = workdir / "gather_touch.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-pthread", str(HERE / "gather_touch.c"),
                    "-o", str(lib)], check=True)
    dll = ctypes.CDLL(str(lib))
    dll.gather_touch.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                                 ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                 ctypes.c_void_p]
    dll.gather_touch.restype = ctypes.c_int
    return dll


def torch_openmp_team() -> tuple:
    """(GOMP_parallel, omp_get_thread_num) of the libgomp PyTorch loaded, or (None, None)."""
    import os

    from perfkernels.torch._threads import _torch_libgomp
    path = _torch_libgomp()
    if path is None:
        return None, None
    lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0))   # the loaded copy, never a new one
    return (ctypes.cast(lib.GOMP_parallel, ctypes.c_void_p).value,
            ctypes.cast(lib.omp_get_thread_num, ctypes.c_void_p).value)


def shapes(rng: np.random.Generator):
    """(name, table as rows of bytes, NumPy/torch lookups): the DLRM shape, float32 and 8-bit."""
    import perfkernels as pk
    import torch
    from perfkernels.benchsuite import zipf_indices

    rows, dim, num_bags, bag_len = 1_000_000, 64, 2048, 100
    n = num_bags * bag_len
    table = np.empty((rows, dim), np.float32)
    for start in range(0, rows, 250_000):
        table[start:start + 250_000] = rng.standard_normal((min(250_000, rows - start), dim),
                                                           dtype=np.float32)
    packed = pk.quantize_rowwise(table, bits=8)
    offsets = np.arange(num_bags, dtype=np.int64) * bag_len
    t_table, t_packed, t_offsets = (torch.from_numpy(a) for a in (table, packed, offsets))
    for dist in ("uniform", "zipf"):
        idx = zipf_indices(rng, rows, n) if dist == "zipf" else rng.integers(0, rows, n)
        idx = np.ascontiguousarray(idx, dtype=np.int64)
        t_idx = torch.from_numpy(idx)
        yield (f"float32 1M x 64 B=2048 L=100 {dist}", table, idx,
               lambda i=t_idx: torch.nn.functional.embedding_bag(i, t_table, t_offsets, mode="sum"),
               lambda i=idx: pk.embedding_bag(table, i, offsets))
        yield (f"8-bit   1M x 64 B=2048 L=100 {dist}", packed, idx,
               lambda i=t_idx: torch.ops.quantized.embedding_bag_byte_rowwise_offsets(
                   t_packed, i, t_offsets, mode=0),
               lambda i=idx: pk.embedding_bag_quantized(packed, i, offsets, bits=8))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)

    import perfkernels as pk
    import perfkernels.torch  # noqa: F401  (our jobs on PyTorch's OpenMP threads, as in a model)
    import torch

    team = torch_openmp_team()
    with tempfile.TemporaryDirectory() as tmp:
        dll = build_library(pathlib.Path(tmp))
        print(f"{'shape':38s} {'thr':>3s} {'ceiling':>9s} {'torch':>9s} {'ours':>9s}"
              f" {'ceil/torch':>10s} {'ceil/ours':>9s} {'torch/ours':>10s}  (ms; ratios of times)")
        for name, table, idx, torch_fn, ours_fn in shapes(np.random.default_rng(7)):
            row_bytes = table.strides[0]
            for threads in args.threads:
                torch.set_num_threads(threads)
                pk.set_num_threads(threads)

                def touch(setting):
                    return lambda: dll.gather_touch(table.ctypes.data, row_bytes, idx.ctypes.data,
                                                    idx.size, threads, *setting, *team)
                # the best prefetch setting for this shape and thread count
                best = min(SETTINGS, key=lambda s: statistics.median(
                    _timed(touch(s)) for _ in range(3)))
                fns = {"ceiling": touch(best), "torch": torch_fn, "ours": ours_fn}
                for fn in fns.values():
                    fn()
                samples = {k: [] for k in fns}
                for _ in range(args.rounds):
                    for key, fn in fns.items():
                        samples[key].append(_timed(fn))
                med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}

                def ratio(a, b):
                    return statistics.median(x / y for x, y in zip(samples[a], samples[b]))
                print(f"{name:38s} {threads:3d} {med['ceiling']:9.3f} {med['torch']:9.3f}"
                      f" {med['ours']:9.3f} {ratio('ceiling', 'torch'):10.2f}"
                      f" {ratio('ceiling', 'ours'):9.2f} {ratio('torch', 'ours'):10.2f}")


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
