"""Run perfkernels.cuda's kernels, built with AddressSanitizer + UBSan, through the simulator.

    LD_PRELOAD=$(g++ -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 \\
        python tests/cuda_sim/asan_driver.py kernels|overread

``kernels``: every table format with its narrowest and widest launch configuration (column
chunks included) on bags that read the table's last row, the bad-index paths, quantize /
dequantize, the conversions (odd sizes, misaligned) and the LSTM unit; prints "ok".
``overread``: a kernel that reads one float past an array: AddressSanitizer must stop it.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import cuda_sim  # noqa: E402
from cuda_sim import build  # noqa: E402


def configs():
    """For each format and load width: LANES 4 (or the smallest) and LANES 32 with VPL 4."""
    by_key = {}
    for fmt, w, lanes, vpl in cuda_sim.reachable_configs():
        by_key.setdefault((fmt, w), []).append((lanes, vpl))
    for (fmt, w), lv in sorted(by_key.items()):
        for lanes, vpl in (min(lv), max(lv)):
            yield fmt, w, lanes, vpl


def make_table(cp, rng, fmt, rows, d, off, parent):
    """A device table (a column slice of a wider array) and the CPU package's bag function on it."""
    import ml_dtypes
    import perfkernels
    x = rng.standard_normal((rows, d)).astype(np.float32)
    if fmt <= 2:
        host = x.astype([np.float32, np.float16, ml_dtypes.bfloat16][fmt])
        kw, cpu = {}, perfkernels.embedding_bag
    else:
        bits = {3: 8, 4: 4, 5: 2}[fmt]
        host = perfkernels.quantize_rowwise(x, bits=bits)
        kw, cpu = {"bits": bits, "dim": d}, perfkernels.embedding_bag_quantized
    big = np.zeros((rows, parent), host.dtype)
    big[:, off:off + host.shape[1]] = host
    return cp.asarray(big)[:, off:off + host.shape[1]], host, kw, cpu


def kernels():
    import perfkernels
    import perfkernels.cuda as pkc
    from perfkernels.families.embedding import _cuda as _bags
    wanted = {_bags.bag_kernel_name(f, w, it, l, v) for f, w, l, v in configs()
              for it in ("int32", "int64")}
    libs = cuda_sim.prebuild(sanitize=True, bag_kernels=wanted)
    rng = np.random.default_rng(0)
    with cuda_sim.installed(libs, seed=3, sanitize=True, bfloat16=True) as cp:
        for fmt, w, lanes, vpl in configs():
            d, off, parent = cuda_sim.layout_for(fmt, w, lanes, vpl, 2 if vpl == 4 else 1)
            rows = 7
            table, host, kw, cpu = make_table(cp, rng, fmt, rows, d, off, parent)
            run = pkc.embedding_bag if fmt <= 2 else pkc.embedding_bag_quantized
            for it in (np.int32, np.int64):
                idx = np.array([rows - 1, 0, rows - 1, 3, rows - 1], it)
                offsets = np.array([0, 2], it)
                got = run(table, cp.asarray(idx), cp.asarray(offsets), mode="mean", **kw).get()
                want = cpu(host, idx, offsets, mode="mean", **kw)
                assert np.allclose(got, want, rtol=1e-5, atol=1e-5), (fmt, w, lanes, vpl)
                idx[4] = rows
                try:
                    run(table, cp.asarray(idx), cp.asarray(offsets), **kw)
                    raise AssertionError("no IndexError")
                except IndexError:
                    pass
        for bits in (8, 4, 2):
            for d in (1, 7, 33):
                x = rng.standard_normal((5, d)).astype(np.float32)
                q = pkc.quantize_rowwise(cp.asarray(x), bits=bits)
                assert (q.get() == perfkernels.quantize_rowwise(x, bits=bits)).all()
                pkc.dequantize_rowwise(q, bits=bits, dim=d).get()
        for n in (1, 9, 1003):
            x = rng.standard_normal(n + 1).astype(np.float32)
            for off in (0, 1):
                xd = cp.asarray(x)[off:off + n]
                h = pkc.float_to_half(xd)
                pkc.half_to_float(h)
                pkc.bfloat16_to_float(pkc.float_to_bfloat16(xd))
        x = rng.standard_normal((5, 36)).astype(np.float32)
        h, c = pkc.lstm_unit(cp.asarray(x[:, :9]), cp.asarray(x[:, 9:18]), cp.asarray(x),
                             seq_lengths=cp.asarray(np.array([0, 1, 2, 3, 4])), t=2)
        pkc.lstm_unit_backward(cp.asarray(x[:, :9]), cp.asarray(x), c, h, c,
                               seq_lengths=cp.asarray(np.array([0, 1, 2, 3, 4])), t=2)
    print("ok")


def overread():
    text = (Path(__file__).resolve().parent / "selftest.cu").read_text()
    lib = build.Library(build.build(text, ["sim_read_past"], "selftest.cu", sanitize=True))
    with cuda_sim.installed({text: lib}, sanitize=True) as cp:
        p, out = cp.zeros(10, np.float32), cp.zeros(1, np.float32)
        cp.RawModule(code=text, name_expressions=["sim_read_past"]).get_function("sim_read_past")(
            (1,), (1,), (p, np.int32(10), out))
    print("not caught")


if __name__ == "__main__":
    {"kernels": kernels, "overread": overread}[sys.argv[1]]()
