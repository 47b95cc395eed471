"""GPU benchmark cases for ``python -m perfkernels bench --gpu`` (and asv's benchmarks/bench_cuda.py).

``cases(quick)`` returns [] when no GPU is usable, so the CPU suite is unaffected.  Each case's
callables run ``REPS`` calls back to back and synchronise the device once, and ``nbytes`` counts
all of them, so a wall-clock timer gives device throughput with the launch and sync cost spread.
``report(quick)`` times with CUDA events instead and prints GB/s beside the measured device-to-
device copy bandwidth, the ratio to PyTorch CUDA and the speed targets
(``python -m perfkernels.benchsuite.cuda [--quick]``; docs/gpu-verification.md).

Shapes (``perfkernels._variants``, docs/benchmarking.md): per-table like fbgemm_gpu's defaults
(100,000 rows, D 128, B 512, L 20), a large one (10,000,000 rows, D 128, B 65,536, L 32),
conversions of 16 Mi elements, the LSTM unit shapes.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from .._variants import (GPU_BAG_SHAPES, GPU_CONVERT_ELEMENTS, LSTM_SHAPES,
                         QUICK_GPU_BAG_SHAPES)
from . import Case

REPS = 10
BAG_SHAPES, QUICK_BAG_SHAPES = GPU_BAG_SHAPES, QUICK_GPU_BAG_SHAPES
CONVERT_ELEMENTS = GPU_CONVERT_ELEMENTS
COPY_BYTES = 1 << 30


def _cupy():
    from .. import cuda
    if not cuda.is_available():
        return None
    import cupy
    return cupy


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


@dataclass
class GpuWork:
    """One measured piece of GPU work: ours, the PyTorch CUDA equivalent (or None), bytes."""
    name: str
    nbytes: int
    ours: object
    torch: object = None
    target_copy_fraction: float | None = None
    target_torch_speedup: float | None = None


def _repeat(fn, sync):
    def run():
        for _ in range(REPS):
            fn()
        sync()
    return run


def copy_bandwidth_gpu(cp, nbytes: int = COPY_BYTES) -> float:
    """Device-to-device copy GB/s (bytes read + written), median of CUDA-event-timed copies."""
    src = cp.ones(nbytes // 4, dtype=cp.float32)
    dst = cp.empty_like(src)
    t = event_time(cp, lambda: cp.copyto(dst, src))
    return 2 * nbytes / t / 1e9


def event_time(cp, fn, repeat: int = 7, number: int = 5) -> float:
    """Median seconds per call of ``fn``, timed with CUDA events on the current stream (which
    PyTorch's default stream shares: both are the legacy default stream)."""
    fn()
    cp.cuda.get_current_stream().synchronize()
    samples = []
    for _ in range(repeat):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(number):
            fn()
        end.record()
        end.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, end) / 1e3 / number)
    return float(np.median(samples))


def work(quick: bool) -> list[GpuWork]:
    """Every GPU benchmark as ours / torch callables on shared inputs (empty without a GPU)."""
    cp = _cupy()
    if cp is None:
        return []
    from .. import cuda as pkc
    torch = _torch_cuda()
    rng = cp.random.default_rng(1234)
    items: list[GpuWork] = []

    n = CONVERT_ELEMENTS
    x = rng.standard_normal(n, dtype=cp.float32)
    h = x.astype(cp.float16)
    b = pkc.float_to_bfloat16(x)
    out_h, out_f, out_b = cp.empty_like(h), cp.empty_like(x), cp.empty_like(b)
    items += [
        GpuWork("float_to_half 16Mi", 6 * n, lambda: pkc.float_to_half(x, out=out_h),
                (lambda: tx.half()) if torch else None, target_copy_fraction=0.8),
        GpuWork("half_to_float 16Mi", 6 * n, lambda: pkc.half_to_float(h, out=out_f),
                (lambda: th.float()) if torch else None, target_copy_fraction=0.8),
        GpuWork("float_to_bfloat16 16Mi", 6 * n, lambda: pkc.float_to_bfloat16(x, out=out_b),
                (lambda: tx.bfloat16()) if torch else None, target_copy_fraction=0.8),
        GpuWork("bfloat16_to_float 16Mi", 6 * n, lambda: pkc.bfloat16_to_float(b, out=out_f),
                (lambda: tb.float()) if torch else None, target_copy_fraction=0.8),
    ]
    if torch:
        tx, th = torch.from_dlpack(x), torch.from_dlpack(h)
        tb = tx.bfloat16()

    for shape_name, rows, d, nbags, l in (QUICK_BAG_SHAPES if quick else BAG_SHAPES):
        large = shape_name == "large"
        idx = rng.integers(0, rows, size=nbags * l, dtype=cp.int64)
        offsets = cp.arange(0, nbags * l, l, dtype=cp.int64)
        idx_bytes = idx.nbytes + offsets.nbytes
        from . import zipf_indices
        zipf = cp.asarray(zipf_indices(np.random.default_rng(7), rows, nbags * l))
        for dtype, tname, ix in ((cp.float32, "float32", idx), (cp.float16, "float16", idx),
                                 (cp.float32, "float32 zipf", zipf)):
            table = rng.standard_normal((rows, d), dtype=cp.float32).astype(dtype, copy=False)
            out = cp.empty((nbags, d), cp.float32)
            nbytes = idx.size * d * table.itemsize + idx_bytes + out.nbytes
            tfn = None
            if torch:
                tt, ti, to = (torch.from_dlpack(a) for a in (table, ix, offsets))
                tfn = (lambda tt=tt, ti=ti, to=to:
                       torch.nn.functional.embedding_bag(ti, tt, to, mode="sum"))
            items.append(GpuWork(
                f"embedding_bag {tname} {shape_name} ({rows}x{d}, B {nbags}, L {l})", nbytes,
                lambda table=table, out=out, ix=ix: pkc.embedding_bag(table, ix, offsets, out=out), tfn,
                target_copy_fraction=0.6 if large else None,
                target_torch_speedup=1.5 if large else None))
            del table
        for bits in (8, 4):
            src = rng.standard_normal((rows, d), dtype=cp.float32)
            packed = pkc.quantize_rowwise(src, bits=bits)
            del src
            out = cp.empty((nbags, d), cp.float32)
            nbytes = idx.size * packed.shape[1] + idx_bytes + out.nbytes
            items.append(GpuWork(
                f"embedding_bag_quantized {bits}-bit {shape_name} ({rows}x{d}, B {nbags}, L {l})",
                nbytes, lambda packed=packed, out=out, bits=bits: pkc.embedding_bag_quantized(
                    packed, idx, offsets, bits=bits, out=out)))

    for nn, dd in LSTM_SHAPES.values():
        hp, cprev = rng.standard_normal((nn, dd), dtype=cp.float32), rng.standard_normal((nn, dd), dtype=cp.float32)
        gates = rng.standard_normal((nn, 4 * dd), dtype=cp.float32)
        items.append(GpuWork(f"lstm_unit N {nn} D {dd}", 4 * nn * dd * 8,
                             lambda hp=hp, cprev=cprev, gates=gates: pkc.lstm_unit(hp, cprev, gates)))
    return items


def cases(quick: bool) -> list[Case]:
    """The GPU cases for the generic runner (``ours_gpu=True``); [] without a GPU."""
    cp = _cupy()
    if cp is None:
        return []
    sync = cp.cuda.get_current_stream().synchronize
    torch = _torch_cuda()
    out = []
    for w in work(quick):
        baselines = {}
        if w.torch is not None and torch is not None:
            baselines["torch-cuda"] = _repeat(w.torch, torch.cuda.synchronize)
        out.append(Case("cuda", w.name, w.nbytes * REPS, _repeat(w.ours, sync), baselines,
                        ours_gpu=True))
    return out


def report(quick: bool = False, file=sys.stdout) -> list[dict]:
    """Time every GPU case with CUDA events; print and return GB/s, the fraction of copy
    bandwidth, the ratio to PyTorch CUDA and whether the targets are met (the large bag shape at
    least 1.5x PyTorch CUDA and 60% of copy bandwidth, conversions at least 80% of it)."""
    cp = _cupy()
    if cp is None:
        from .. import cuda
        print(f"no GPU benchmarks: {cuda.unavailable_reason()}", file=file)
        return []
    dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())
    copy = copy_bandwidth_gpu(cp)
    print(f"device: {dev['name'].decode() if isinstance(dev['name'], bytes) else dev['name']}; "
          f"device-to-device copy {copy:.0f} GB/s (read + write)", file=file)
    rows = []
    header = f"{'case':<70} {'ours ms':>9} {'GB/s':>7} {'copy%':>6} {'torch ms':>9} {'vs torch':>8}  target"
    print(header, file=file)
    for w in work(quick):
        t = event_time(cp, w.ours)
        gbs = w.nbytes / t / 1e9
        tt = event_time(cp, w.torch) if w.torch is not None else None
        verdict = []
        if w.target_copy_fraction is not None:
            verdict.append(("ok" if gbs >= w.target_copy_fraction * copy else "MISS")
                           + f" >= {w.target_copy_fraction:.0%} copy")
        if w.target_torch_speedup is not None and tt is not None:
            verdict.append(("ok" if tt / t >= w.target_torch_speedup else "MISS")
                           + f" >= {w.target_torch_speedup}x torch")
        row = dict(case=w.name, ours_s=t, gbps=gbs, copy_fraction=gbs / copy, torch_s=tt,
                   speedup_vs_torch=(tt / t) if tt else None, verdict="; ".join(verdict))
        rows.append(row)
        print(f"{w.name:<70} {t * 1e3:9.3f} {gbs:7.0f} {gbs / copy:6.0%} "
              f"{'' if tt is None else f'{tt * 1e3:9.3f}':>9} "
              f"{'' if tt is None else f'{tt / t:7.2f}x':>8}  {row['verdict']}", file=file)
    return rows


if __name__ == "__main__":
    report(quick="--quick" in sys.argv)
