"""An embedding-bag lookup beside a touch-only loop on the same table placement and threads.

``gather_touch.c`` reads every cache line of every row the bags name and does nothing else (no
conversion, no sums, no output), with the best of several prefetch settings.  It is a reference
loop, not a physical bound: a lookup kernel has been measured beating it at 2 threads, so
``torch time / touch time`` says how far a kernel is from this simple loop, not the most any
implementation could gain.  All three are timed in turn, one sample each per round, in one process
(medians of per-round ratios), all three on PyTorch's OpenMP threads: perfkernels through ``import
perfkernels.torch`` (as in a model), the probe through libgomp's ``GOMP_parallel`` (threads of its
own would wait for the cores PyTorch's threads keep spinning on after each call).

Placement is part of the measurement (``--placement``; all three read the same memory):
``torch`` a table torch allocated (64-byte aligned, 4 KiB pages unless ``THP_MEM_ALLOC_ENABLE=1``),
``numpy`` one NumPy allocated (16 bytes past a line, huge pages advised from 4 MiB),
``hugepage`` one perfkernels placed (``perfkernels.as_table``: 2 MiB-aligned, ``MADV_HUGEPAGE``
before the first touch); ``default`` is each side's default instead (what a user gets): PyTorch
reads a table torch allocated, perfkernels and the touch loop one perfkernels placed.  The
AnonHugePages each table got is printed with it.

    python benchmarks/ceiling/gather_ceiling.py [--threads 1 2] [--rounds 15]
        [--placement torch hugepage]

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


PLACEMENTS = ("torch", "numpy", "hugepage", "default")


def placed(table: np.ndarray, placement: str) -> np.ndarray:
    """``table``'s values in memory allocated as ``placement`` says (see the module docstring)."""
    import perfkernels as pk
    import torch
    if placement == "hugepage":
        return pk.as_table(table, placement="hugepage")
    if placement == "torch":
        out = torch.empty(table.shape, dtype=torch.from_numpy(table[:0]).dtype).numpy()
    else:
        out = np.empty_like(table)
    np.copyto(out, table)
    return out


def shapes(rng: np.random.Generator, placement: str = "torch"):
    """(name, table, torch's table, indices, torch lookup, perfkernels lookup): the DLRM shape,
    float32 and 8-bit, its tables placed as ``placement`` says (two copies for ``"default"``)."""
    import perfkernels as pk
    import torch
    from perfkernels.benchsuite import zipf_indices

    rows, dim, num_bags, bag_len = 1_000_000, 64, 2048, 100
    n = num_bags * bag_len
    table = np.empty((rows, dim), np.float32)
    for start in range(0, rows, 250_000):
        table[start:start + 250_000] = rng.standard_normal((min(250_000, rows - start), dim),
                                                           dtype=np.float32)
    ours, theirs = ("hugepage", "torch") if placement == "default" else (placement, placement)
    packed_ref = pk.quantize_rowwise(table, bits=8)
    packed = placed(packed_ref, ours)
    t_packed = torch.from_numpy(packed if ours == theirs else placed(packed_ref, theirs))
    table_ref, table = table, placed(table, ours)
    t_table = torch.from_numpy(table if ours == theirs else placed(table_ref, theirs))
    del packed_ref, table_ref
    offsets = np.arange(num_bags, dtype=np.int64) * bag_len
    t_offsets = torch.from_numpy(offsets)
    for dist in ("uniform", "zipf"):
        idx = zipf_indices(rng, rows, n) if dist == "zipf" else rng.integers(0, rows, n)
        idx = np.ascontiguousarray(idx, dtype=np.int64)
        t_idx = torch.from_numpy(idx)
        yield (f"float32 1M x 64 B=2048 L=100 {dist}", table, t_table, idx,
               lambda i=t_idx: torch.nn.functional.embedding_bag(i, t_table, t_offsets, mode="sum"),
               lambda i=idx: pk.embedding_bag(table, i, offsets))
        yield (f"8-bit   1M x 64 B=2048 L=100 {dist}", packed, t_packed, idx,
               lambda i=t_idx: torch.ops.quantized.embedding_bag_byte_rowwise_offsets(
                   t_packed, i, t_offsets, mode=0),
               lambda i=idx: pk.embedding_bag_quantized(packed, i, offsets, bits=8))


def huge_pages(table: np.ndarray) -> str:
    """``"AnonHugePages / size"`` of the table, in MiB, and where its first row starts."""
    from perfkernels import _placement
    address = table.__array_interface__["data"][0]
    huge = _placement.anon_huge_bytes(address, table.nbytes)
    return (f"AnonHugePages {huge >> 20}/{table.nbytes >> 20} MiB, first row at "
            f"{address % 64} bytes past a line, {address % _placement.HUGE_PAGE} past 2 MiB")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--placement", nargs="+", choices=PLACEMENTS,
                        default=["torch", "hugepage"])
    args = parser.parse_args(argv)

    import perfkernels.torch  # noqa: F401  (our jobs on PyTorch's OpenMP threads, as in a model)

    team = torch_openmp_team()
    with tempfile.TemporaryDirectory() as tmp:
        dll = build_library(pathlib.Path(tmp))
        for placement in args.placement:
            run_placement(dll, team, placement, args.threads, args.rounds)


def run_placement(dll, team, placement: str, threads_list: list, rounds: int) -> None:
    """The three timed in turn on every shape, at every thread count, tables placed as asked."""
    import perfkernels as pk
    import torch
    print(f"\nplacement {placement}: {'shape':38s} {'thr':>3s} {'touch':>9s} {'torch':>9s}"
          f" {'ours':>9s} {'touch/torch':>11s} {'touch/ours':>10s} {'torch/ours':>10s}"
          f"  (ms; ratios of times)")
    seen = set()
    for name, table, t_table, idx, torch_fn, ours_fn in shapes(np.random.default_rng(7),
                                                                placement):
        if id(table) not in seen:
            seen.add(id(table))
            print(f"  {name.split()[0]} table: {huge_pages(table)}")
            if t_table.data_ptr() != table.ctypes.data:
                print(f"  {name.split()[0]} torch's table: {huge_pages(t_table.numpy())}")
        row_bytes = table.strides[0]
        for threads in threads_list:
            torch.set_num_threads(threads)
            pk.set_num_threads(threads)

            def touch(setting):
                return lambda: dll.gather_touch(table.ctypes.data, row_bytes, idx.ctypes.data,
                                                idx.size, threads, *setting, *team)
            # the best prefetch setting for this shape and thread count
            best = min(SETTINGS, key=lambda s: statistics.median(
                _timed(touch(s)) for _ in range(3)))
            fns = {"touch": touch(best), "torch": torch_fn, "ours": ours_fn}
            for fn in fns.values():
                fn()
            samples = {k: [] for k in fns}
            for _ in range(rounds):
                for key, fn in fns.items():
                    samples[key].append(_timed(fn))
            med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}

            def ratio(a, b):
                return statistics.median(x / y for x, y in zip(samples[a], samples[b]))
            print(f"  {name:38s} {threads:3d} {med['touch']:9.3f} {med['torch']:9.3f}"
                  f" {med['ours']:9.3f} {ratio('touch', 'torch'):11.2f}"
                  f" {ratio('touch', 'ours'):10.2f} {ratio('torch', 'ours'):10.2f}"
                  f"  (loop: distance {best[0]}, {'L2' if best[1] else 'L1'})")


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
