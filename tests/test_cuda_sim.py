"""perfkernels.cuda executed on the CPU by the warp simulator (tests/cuda_sim, docs/cuda-simulator.md).

Part 1 checks the simulator itself against CUDA's documented semantics (shuffles with every width,
masks, the rules it must enforce, barriers, atomics, the fp16 conversions, alignment, launch
checks).  Part 2 runs the public perfkernels.cuda functions end to end through the CuPy stand-in:
every launch configuration the runtime can choose, every table format over the awkward D list,
both index types, several fiber orders, the error paths and the array-interchange inputs, against
float64 references and the CPU package.  Part 3 runs the kernels under AddressSanitizer + UBSan.
(On a machine with a GPU, tests/test_cuda.py runs the same public tests on the device.)
"""
from __future__ import annotations

import os
import subprocess

import ml_dtypes
import numpy as np
import pytest

import perfkernels
import perfkernels.cuda as pkc
from conftest import AWKWARD_DIMS, PACKAGE_PARENT, run_python
from perfkernels.cuda import _runtime
from perfkernels.families.embedding import _cuda as _bags
from perfkernels.families.quantized import _cuda as _quantize

import cuda_sim
from cuda_sim import build, fake_cupy

SELFTEST = cuda_sim.build.HERE / "selftest.cu"
SELFTEST_KERNELS = ["sim_shuffle", "sim_shuffle_wide", "sim_shuffle_masked", "sim_ballot",
                    "sim_violation", "sim_shared_reverse", "sim_race", "sim_atomics", "sim_cvt",
                    "sim_align", "sim_read_past", "sim_bounded", "sim_geometry"]
BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture(scope="session")
def selftest_library(cuda_sim_libraries):
    text = SELFTEST.read_text()
    return text, build.Library(build.build(text, SELFTEST_KERNELS, "selftest.cu"))


@pytest.fixture
def sim(cuda_sim_libraries, selftest_library):
    """The CuPy stand-in, plus ``sim.kernel(name)`` for the self-test kernels."""
    text, lib = selftest_library
    with cuda_sim.installed({**cuda_sim_libraries, text: lib}) as cp:
        module = cp.RawModule(code=text, name_expressions=SELFTEST_KERNELS)
        cp.kernel = module.get_function
        yield cp


def i32(*v):
    return tuple(np.int32(x) for x in v)


# ---- part 1: the simulator ------------------------------------------------------------------------

def ref_shuffle(op, width, args, values):
    """CUDA's documented semantics (Programming Guide, warp shuffle functions), lane by lane."""
    out = np.empty_like(values)
    for t in range(values.size):
        warp, lane = divmod(t, 32)
        base = lane // width * width
        a = int(args[t])
        if op == 0:
            src = base + a % width
        elif op == 1:
            src = lane - a if lane - a >= base else lane
        elif op == 2:
            src = lane + a if lane + a < base + width else lane
        else:                           # earlier groups may be read, later ones give the own value
            src = lane ^ a if (lane ^ a) < base + width else lane
        out[t] = values[warp * 32 + src]
    return out


@pytest.mark.parametrize("seed", [0, 1, 5])
@pytest.mark.parametrize("width", [1, 2, 4, 8, 16, 32])
@pytest.mark.parametrize("op", [0, 1, 2, 3], ids=["idx", "up", "down", "xor"])
def test_shuffle_semantics(sim, rng, op, width, seed):
    sim.simulator.seed = seed
    n = 96                                                    # three warps
    if op == 0:
        args = rng.integers(-40, 70, n)                       # srcLane beyond width and negative
    else:
        args = rng.integers(0, 32, n)
    args = args.astype(np.int32)
    out = sim.zeros(n, np.int32)
    sim.kernel("sim_shuffle")((1,), (n,), (np.int32(op), np.int32(width), sim.asarray(args), out))
    np.testing.assert_array_equal(out.get(), ref_shuffle(op, width, args, 1000 * np.arange(n) + 7))


def test_shuffle_keeps_64_bit_and_float_values(sim, rng):
    a = rng.integers(-2**62, 2**62, 64, dtype=np.int64)
    f = rng.standard_normal(64).astype(np.float32)
    f[3] = np.float32(np.nan)
    ao, fo = sim.zeros(64, np.int64), sim.zeros(64, np.float32)
    sim.kernel("sim_shuffle_wide")((1,), (64,), (sim.asarray(a), sim.asarray(f), ao, fo))
    lanes = np.arange(64)
    np.testing.assert_array_equal(ao.get(), a[lanes // 32 * 32 + 31 - lanes % 32])
    np.testing.assert_array_equal(fo.get().view(np.uint32), f[lanes ^ 1].view(np.uint32))


def test_partial_masks(sim):
    """Two half-warp groups, each with its own mask and width 16, run independently."""
    args = np.array([(t + 3) % 16 for t in range(64)], np.int32)
    for mask in (0x0000FFFF, 0xFFFF0000):
        out = sim.full(64, -1, np.int32)
        sim.kernel("sim_shuffle_masked")((1,), (64,), (np.uint32(mask), np.int32(16),
                                                       sim.asarray(args), out))
        ref = ref_shuffle(0, 16, args, 1000 * np.arange(64) + 7)
        member = (mask >> (np.arange(64) % 32)) & 1 == 1
        np.testing.assert_array_equal(out.get()[member], ref[member])
        assert (out.get()[~member] == -1).all()


def test_ballot_any_all(sim, rng):
    pred = (rng.random(64) < 0.5).astype(np.int32)
    pred[32:] = 1
    ballot, any_, all_ = (sim.zeros(64, dt) for dt in (np.uint32, np.int32, np.int32))
    sim.kernel("sim_ballot")((1,), (64,), (sim.asarray(pred), ballot, any_, all_))
    for w in range(2):
        p = pred[32 * w:32 * w + 32]
        bits = int(sum(int(b) << k for k, b in enumerate(p)))
        assert (ballot.get()[32 * w:32 * w + 32] == bits).all()
        assert (any_.get()[32 * w:32 * w + 32] == int(p.any())).all()
        assert (all_.get()[32 * w:32 * w + 32] == int(p.all())).all()


@pytest.mark.parametrize("which,block,message", [
    (0, 32, r"mask 0xfffffffe, which leaves out the calling lane 0"),
    (1, 32, r"on lane 5, which has exited"),
    (2, 32, r"waits in __syncwarp \(mask 0xffffffff.*while lane 0 of that mask waits in __syncwarp "
            r"\(mask 0x0000ffff"),
    (3, 32, r"deadlock: no thread can run; \[warp 0 lane 0: __syncthreads\]"),
    (4, 64, r"__syncthreads reached by 32 threads while 32 threads of the block have exited"),
    (5, 32, r"width 12 is not a power of two"),
    (6, 32, r"__shfl_sync reads lane 16, outside the mask 0x0000ffff"),
])
def test_rule_violations_fail_loudly(sim, which, block, message):
    out = sim.zeros(block, np.int32)
    with pytest.raises(build.LaunchError, match=message):
        sim.kernel("sim_violation")((1,), (block,), (np.int32(which), out))


def test_shared_memory_and_barrier(sim, rng):
    x = rng.integers(0, 1 << 30, 3 * 256).astype(np.int32)
    out = sim.zeros(x.size, np.int32)
    for seed in (0, 3):
        sim.simulator.seed = seed
        sim.kernel("sim_shared_reverse")((3,), (256,), (sim.asarray(x), out))
        np.testing.assert_array_equal(out.get(), x.reshape(3, 256)[:, ::-1].reshape(-1))


def test_seed_permutes_thread_and_block_order(sim):
    """A racy kernel (every thread writes out[0]) ends differently under different seeds, which is
    how an order-dependent kernel shows up; seed 0 runs threads and blocks in order."""
    last = set()
    for seed in range(6):
        sim.simulator.seed = seed
        out = sim.zeros(1, np.int32)
        sim.kernel("sim_race")((4,), (128,), (out,))
        last.add(int(out.get()[0]))
        if seed == 0:
            assert int(out.get()[0]) == 4 * 128 - 1
    assert len(last) > 1


def test_atomics(sim):
    mn, count, total = sim.full(1, 2**64 - 1, np.uint64), sim.zeros(1, np.int32), sim.zeros(1, np.float32)
    sim.kernel("sim_atomics")((5,), (200,), (mn, count, total))
    t = np.arange(1000)
    assert int(mn.get()[0]) == int((1000 - t % 977).min())
    assert int(count.get()[0]) == 1000 and float(total.get()[0]) == 500.0


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")
def test_fp16_conversions_are_the_hardware_ones(sim, rng):
    """cvt.f32.f16 is exact (NaN -> canonical 0x7fffffff); cvt.rn.f16.f32 rounds to nearest even
    with subnormals (NaN -> canonical 0x7fff), i.e. NumPy's astype except for NaN payloads."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    bits = rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32)
    bits[:8] = [0x33000000, 0x33000001, 0x387fc000, 0x477fefff, 0x477ff000, 0x7f800001, 0x80000000, 1]
    x = bits.view(np.float32)
    f, hx = sim.zeros(h.size, np.float32), sim.zeros(h.size, np.uint16)
    sim.kernel("sim_cvt")((4,), (256,), (sim.asarray(h), f, sim.asarray(x), hx, np.int32(h.size)))
    want_f = h.view(np.float16).astype(np.float32).view(np.uint32)
    want_f = np.where(np.isnan(h.view(np.float16)), np.uint32(0x7FFFFFFF), want_f)
    np.testing.assert_array_equal(f.get().view(np.uint32), want_f)
    want_h = np.where(np.isnan(x), np.uint16(0x7FFF), x.astype(np.float16).view(np.uint16))
    np.testing.assert_array_equal(hx.get(), want_h)


def test_unknown_inline_asm_fails_the_build():
    with pytest.raises(build.BuildError, match="does not know the inline PTX"):
        build.substitute_asm('asm("mov.u32 %0, %%laneid;" : "=r"(x) : "r"(y));')
    with pytest.raises(build.BuildError, match="unrecognised inline assembly"):
        build.substitute_asm('asm volatile("membar.gl;");')
    text = build.substitute_asm(_runtime.source("convert.cu"))
    assert "asm" not in text and "pk_sim::cvt_rn_f16_f32((x))" in text


@pytest.mark.parametrize("which", [0, 1], ids=["ldg", "store"])
def test_vector_accesses_check_cuda_alignment(sim, which):
    p, q = sim.zeros(64, np.float32), sim.zeros(64, np.float32)
    sim.kernel("sim_align")((1,), (1,), (np.int32(which), p, q, np.int32(4)))       # 16 bytes: fine
    with pytest.raises(build.LaunchError, match="misaligned address .* 16-byte alignment"):
        sim.kernel("sim_align")((1,), (1,), (np.int32(which), p, q, np.int32(2)))


def test_launch_checks(sim):
    out = sim.zeros(2048, np.int32)
    sim.kernel("sim_bounded")((1,), (64,), (out,))
    with pytest.raises(build.LaunchError, match=r"exceed the kernel's __launch_bounds__\(64\)"):
        sim.kernel("sim_bounded")((1,), (128,), (out,))
    with pytest.raises(build.LaunchError, match="a grid or block dimension is 0"):
        sim.kernel("sim_geometry")((0,), (32,), (out,))
    with pytest.raises(build.LaunchError, match="1024 threads"):
        sim.kernel("sim_geometry")((1,), (2048,), (out,))
    with pytest.raises(build.LaunchError, match="takes 1 arguments; got 2"):
        sim.kernel("sim_geometry")((1,), (32,), (out, out))
    with pytest.raises(build.LaunchError, match="argument 1: the kernel takes a 4-byte integer; "
                                                "got a 8-byte scalar"):
        sim.kernel("sim_read_past")((1,), (1,), (out, np.int64(3), out))
    with pytest.raises(build.LaunchError, match="argument 0: the kernel takes a pointer"):
        sim.kernel("sim_geometry")((1,), (32,), (np.int32(0),))
    with pytest.raises(TypeError, match="host numpy.ndarray"):
        sim.kernel("sim_geometry")((1,), (32,), (np.zeros(4, np.int32),))
    g = sim.full(2 * 3 * 2 * 4 * 2 * 2, -1, np.int32)                   # 3-D grid and block
    sim.kernel("sim_geometry")((2, 3, 2), (4, 2, 2), (g,))
    b, t = np.divmod(np.arange(g.size), 16)
    np.testing.assert_array_equal(g.get(), b * 10000 + t)


# ---- part 2: perfkernels.cuda end to end -----------------------------------------------------------

from perfkernels import reference  # noqa: E402
from test_cuda import random_bags  # noqa: E402

FORMAT_NAMES = {_bags.F32: "f32", _bags.F16: "f16", _bags.BF16: "bf16", _bags.Q8: "q8",
                _bags.Q4: "q4", _bags.Q2: "q2"}
FLOAT_DTYPES = {_bags.F32: np.float32, _bags.F16: np.float16, _bags.BF16: BF16}
BITS = {_bags.Q8: 8, _bags.Q4: 4, _bags.Q2: 2}


@pytest.fixture
def simcp(request, cuda_sim_libraries):
    seed = getattr(request, "param", 1)
    with cuda_sim.installed(cuda_sim_libraries, seed=seed) as cp:
        yield cp


def make_table(cp, rng, fmt, rows, d, offset=0, parent=None):
    """(device table as the runtime will see it, its host copy, the float64 values it holds, call
    keywords).  The
    table is the column slice [:, offset:offset + row] of a device array of ``parent`` columns."""
    x = rng.standard_normal((rows, d)).astype(np.float32)
    if fmt in FLOAT_DTYPES:
        host = x.astype(FLOAT_DTYPES[fmt])
        values = host.astype(np.float64)
        kw = {}
    else:
        host = reference.quantize_rowwise(x, BITS[fmt])
        values = reference.dequantize_rowwise(host, BITS[fmt], d)
        kw = {"bits": BITS[fmt], "dim": d}
    row = host.shape[1]
    parent = parent or row + offset
    big = np.zeros((rows, parent), host.dtype)
    big[:, offset:offset + row] = host
    if host.dtype == BF16 and not cp.simulator.bfloat16:
        pytest.skip("needs bfloat16 device arrays")
    dev = cp.asarray(big)[:, offset:offset + row]
    return dev, host, values, kw


def run_bags(fmt, table, *args, **kw):
    fn = pkc.embedding_bag if fmt in FLOAT_DTYPES else pkc.embedding_bag_quantized
    return fn(table, *args, **kw)


def assert_bags_close(got, want, magnitude=None):
    reference.assert_close(got, want, magnitude, rtol=1e-5, atol=1e-6)


def cpu_bags(fmt, host, *args, **kw):
    if fmt in FLOAT_DTYPES:
        return perfkernels.embedding_bag(host, *args, **kw)
    return perfkernels.embedding_bag_quantized(host, *args, **kw)


def bag_launches(cp):
    return [l for l in cp.simulator.launches if l.name.startswith("pk_embedding_bag<")]


def test_compiled_names_are_the_compile_checked_ones():
    """Every kernel the runtime can launch is among the instantiations the nvcc / NVRTC compile
    checks build (else NVRTC would first see it on a user's GPU)."""
    from perfkernels.cuda import _compile_check
    for file in _runtime.SOURCES:
        full = set(_compile_check.instantiations(file, full=True))
        assert set(cuda_sim.kernel_names(file)) <= full, file


@pytest.mark.parametrize("config", cuda_sim.reachable_configs(),
                         ids=lambda c: f"{FORMAT_NAMES[c[0]]}-w{c[1]}-l{c[2]}-v{c[3]}")
def test_every_launch_configuration(simcp, rng, config):
    """Each (format, load width, LANES, VPL) the runtime can choose, on a table laid out so that it
    is chosen: the kernel launched is that one, and the bags equal the float64 reference and the
    CPU package (int32 and int64 indices; weights; mean; padding; empty bags)."""
    fmt, width, lanes, vpl = config
    min_chunks = 2 if vpl == _bags.MAX_VPL else 1
    try:
        d, offset, parent = cuda_sim.layout_for(fmt, width, lanes, vpl, min_chunks)
    except ValueError:
        d, offset, parent = cuda_sim.layout_for(fmt, width, lanes, vpl)
    simcp.simulator.bfloat16 = True
    rows = 61
    table, host, values, kw = make_table(simcp, rng, fmt, rows, d, offset, parent)
    for it, mode, weighted in ((np.int32, "sum", True), (np.int64, "mean", False)):
        indices, offsets, _ = random_bags(rng, rows, 9, 3, it)
        indices[-1:] = rows - 1                               # the table's last row is read
        psw = rng.standard_normal(indices.size).astype(np.float32) if weighted else None
        simcp.simulator.launches.clear()
        got = run_bags(fmt, table, simcp.asarray(indices), simcp.asarray(offsets), mode=mode,
                       padding_idx=3, per_sample_weights=None if psw is None else simcp.asarray(psw),
                       **kw).get()
        expected_name = _bags.bag_kernel_name(fmt, width, str(np.dtype(it)), lanes, vpl)
        assert [l.name for l in bag_launches(simcp)] == [expected_name]
        assert bag_launches(simcp)[0].grid[1] == _bags.launch_config(fmt, d, width)[3]
        want = reference.embedding_bag(values, indices, offsets, mode=mode, padding_idx=3,
                                       per_sample_weights=psw)
        assert_bags_close(got, want)
        cpu = cpu_bags(fmt, host, indices, offsets, mode=mode, padding_idx=3, per_sample_weights=psw,
                       **kw)
        assert_bags_close(got, cpu, want.magnitude)


@pytest.mark.parametrize("fmt", list(FORMAT_NAMES), ids=list(FORMAT_NAMES.values()))
@pytest.mark.parametrize("d", AWKWARD_DIMS)
def test_awkward_dims_every_format(simcp, rng, fmt, d):
    simcp.simulator.bfloat16 = True
    rows = 40
    table, host, values, kw = make_table(simcp, rng, fmt, rows, d)
    it = np.int32 if d % 2 else np.int64
    indices, offsets, lengths = random_bags(rng, rows, 11, 4, it)
    mode = "mean" if d % 3 else "sum"
    got = run_bags(fmt, table, simcp.asarray(indices), lengths=simcp.asarray(lengths), mode=mode,
                   **kw).get()
    want = reference.embedding_bag(values, indices, lengths=lengths, mode=mode)
    assert_bags_close(got, want)
    assert_bags_close(got, cpu_bags(fmt, host, indices, offsets, mode=mode, **kw), want.magnitude)


@pytest.mark.parametrize("simcp", [0, 2, 3, 7, 11], indirect=True)
@pytest.mark.parametrize("fmt,d", [(_bags.F32, 20), (_bags.F16, 1000), (_bags.Q4, 9), (_bags.Q8, 136)])
def test_results_do_not_depend_on_fiber_order(simcp, rng, fmt, d):
    """Several seeds: bit-identical to the in-order run (no kernel depends on thread order)."""
    rows = 50
    table, host, values, kw = make_table(simcp, rng, fmt, rows, d)
    indices, offsets, _ = random_bags(np.random.default_rng(d), rows, 30, 6, np.int64)
    got = run_bags(fmt, table, simcp.asarray(indices), simcp.asarray(offsets), **kw).get()
    seed = simcp.simulator.seed
    simcp.simulator.seed = 0
    again = run_bags(fmt, table, simcp.asarray(indices), simcp.asarray(offsets), **kw).get()
    simcp.simulator.seed = seed
    np.testing.assert_array_equal(got.view(np.uint32), again.view(np.uint32))
    assert_bags_close(got, reference.embedding_bag(values, indices, offsets))
    x = rng.standard_normal((37, d)).astype(np.float32)
    q = pkc.quantize_rowwise(simcp.asarray(x), bits=4).get()
    np.testing.assert_array_equal(q, reference.quantize_rowwise(x, 4))


@pytest.mark.parametrize("sm_count", [1, 132])
def test_grid_stride_loops(cuda_sim_libraries, rng, sm_count):
    """One SM (each thread loops many times) and many SMs (a thread per item) give the same."""
    with cuda_sim.installed(cuda_sim_libraries, seed=4, sm_count=sm_count) as cp:
        x = rng.standard_normal((300, 33)).astype(np.float32)
        np.testing.assert_array_equal(pkc.quantize_rowwise(cp.asarray(x), bits=8).get(),
                                      reference.quantize_rowwise(x, 8))
        np.testing.assert_array_equal(pkc.float_to_half(cp.asarray(x)).get(),
                                      reference.float_to_half(x))
        h, c = pkc.lstm_unit(cp.asarray(x[:, :8]), cp.asarray(x[:, 8:16]), cp.asarray(x[:, :32]))
        args = (x[:, :8], x[:, 8:16], np.ascontiguousarray(x[:, :32]))
        for want in (reference.lstm_unit(*args), perfkernels.lstm_unit(*args)):
            np.testing.assert_allclose(h.get(), want[0], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(c.get(), want[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fmt", list(FORMAT_NAMES), ids=list(FORMAT_NAMES.values()))
@pytest.mark.parametrize("it", [np.int32, np.int64])
def test_index_errors_leave_out_untouched(simcp, rng, fmt, it):
    simcp.simulator.bfloat16 = True
    rows, d = 30, 17
    table, host, values, kw = make_table(simcp, rng, fmt, rows, d)
    indices = rng.integers(0, rows, 20).astype(it)
    offsets = np.arange(0, 20, 4).astype(it)
    for bad in (rows, -1, np.iinfo(it).max, np.iinfo(it).min):
        b = indices.copy()
        b[13], b[17] = bad, bad
        out = simcp.full((5, d), 3.0, np.float32)
        with pytest.raises(IndexError, match=rf"indices\[13\] = {bad} is out of range for a table "
                                             rf"of {rows} rows"):
            run_bags(fmt, table, simcp.asarray(b), simcp.asarray(offsets), out=out, **kw)
        assert (out.get() == 3.0).all()
        with pytest.raises(IndexError):
            cpu_bags(fmt, host, b, offsets, **kw)


@pytest.mark.parametrize("fmt", [_bags.F32, _bags.Q2], ids=["f32", "q2"])
@pytest.mark.parametrize("it", [np.int32, np.int64])
def test_empty_bags_and_index_lists(simcp, rng, fmt, it):
    rows, d = 10, 9
    table, host, values, kw = make_table(simcp, rng, fmt, rows, d)
    empty = simcp.zeros(0, it)
    for mode in ("sum", "mean"):
        got = run_bags(fmt, table, empty, simcp.zeros(4, it), mode=mode, **kw)
        np.testing.assert_array_equal(got.get(), np.zeros((4, d), np.float32))
        got = run_bags(fmt, table, empty, simcp.zeros(5, it), include_last_offset=True, **kw)
        np.testing.assert_array_equal(got.get(), np.zeros((4, d), np.float32))
        got = run_bags(fmt, table, empty, lengths=simcp.zeros(3, it), mode=mode, **kw)
        np.testing.assert_array_equal(got.get(), np.zeros((3, d), np.float32))
        assert run_bags(fmt, table, empty, empty, **kw).shape == (0, d)
        assert run_bags(fmt, table, simcp.zeros((0, 3), it), **kw).shape == (0, d)
        got = run_bags(fmt, table, simcp.zeros((4, 0), it), mode=mode, **kw)
        np.testing.assert_array_equal(got.get(), np.zeros((4, d), np.float32))
    # a bag made only of padding entries is empty for mean: zeros, not NaN
    idx = np.array([2, 2, 5], it)
    got = run_bags(fmt, table, simcp.asarray(idx), simcp.asarray(np.array([0, 2], it)), mode="mean",
                   padding_idx=2, **kw).get()
    assert (got[0] == 0).all()
    np.testing.assert_allclose(got[1], values[5], rtol=1e-6, atol=1e-6)


class CudaArrayInterfaceOnly:
    """A foreign GPU array: nothing but __cuda_array_interface__ (as Numba / JAX expose)."""

    def __init__(self, a):
        self._a = a
        self.__cuda_array_interface__ = a.__cuda_array_interface__


class DLPackOnly:
    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


@pytest.mark.parametrize("wrap", [CudaArrayInterfaceOnly, DLPackOnly], ids=["cai", "dlpack"])
def test_interchange_inputs_without_copies(simcp, rng, wrap):
    w = rng.standard_normal((20, 12)).astype(np.float32)
    idx = rng.integers(0, 20, 15)
    off = np.array([0, 4, 4, 11])
    wd, idd, od = simcp.asarray(w), simcp.asarray(idx), simcp.asarray(off)
    want = pkc.embedding_bag(wd, idd, od).get()
    got = pkc.embedding_bag(wrap(wd), wrap(idd), wrap(od)).get()
    np.testing.assert_array_equal(got, want)
    table_launch = [l for l in simcp.simulator.launches if l.name.startswith("pk_embedding_bag<")]
    assert len(table_launch) == 2
    h = pkc.float_to_half(wrap(wd))
    np.testing.assert_array_equal(h.get(), w.astype(np.float16))
    assert wrap is DLPackOnly or simcp.asarray(wrap(wd)).data.ptr == wd.data.ptr   # no copy
    np.testing.assert_array_equal(pkc.half_to_float(wrap(h)).get(), w.astype(np.float16).astype(np.float32))


def test_host_and_cpu_tensors_are_refused(simcp):
    torch = pytest.importorskip("torch")
    x = np.ones((4, 4), np.float32)
    with pytest.raises(TypeError, match="x is a host ndarray"):
        pkc.float_to_half(x)
    with pytest.raises(TypeError, match="must be a GPU array"):
        pkc.float_to_half(torch.ones(4))                        # DLPack, but of CPU memory
    with pytest.raises(TypeError, match="PyTorch CPU tensor"):
        pkc.bfloat16_to_float(torch.ones(4, dtype=torch.bfloat16))


@pytest.mark.parametrize("bf16_arrays", [False, True], ids=["uint16-bits", "ml_dtypes"])
def test_bfloat16_with_and_without_cupy_support(cuda_sim_libraries, rng, bf16_arrays):
    with cuda_sim.installed(cuda_sim_libraries, seed=2, bfloat16=bf16_arrays) as cp:
        x = rng.standard_normal(1003).astype(np.float32)
        b = pkc.float_to_bfloat16(cp.asarray(x))
        assert b.dtype == (BF16 if bf16_arrays else np.uint16)
        np.testing.assert_array_equal(b.view(np.uint16).get(), x.astype(BF16).view(np.uint16))
        back = pkc.bfloat16_to_float(b).get()
        np.testing.assert_array_equal(back, x.astype(BF16).astype(np.float32))
        out = cp.zeros(1003, np.uint16)
        assert pkc.float_to_bfloat16(cp.asarray(x), out=out) is out
        np.testing.assert_array_equal(out.get(), x.astype(BF16).view(np.uint16))
        table = x[:1000].reshape(100, 10).astype(BF16)
        idx, off = rng.integers(0, 100, 30), np.arange(0, 30, 3)
        dev_table = cp.asarray(table) if bf16_arrays else pkc.float_to_bfloat16(cp.asarray(table.astype(np.float32)))
        if bf16_arrays:
            got = pkc.embedding_bag(dev_table, cp.asarray(idx), cp.asarray(off)).get()
            np.testing.assert_allclose(got, perfkernels.embedding_bag(table, idx, off), rtol=1e-5, atol=1e-5)


def test_kernels_run_on_the_current_stream(simcp, rng):
    x = simcp.asarray(rng.standard_normal(100).astype(np.float32))
    s = simcp.cuda.Stream(non_blocking=True)
    with s:
        pkc.half_to_float(pkc.float_to_half(x))
        pkc.embedding_bag(simcp.asarray(np.ones((3, 4), np.float32)), simcp.asarray(np.array([0, 2])),
                          simcp.asarray(np.array([0])))
    launches = simcp.simulator.launches
    assert len(launches) == 4 and all(l.stream == s.ptr for l in launches)
    pkc.float_to_half(x)
    assert launches[-1].stream == 0


_IDX = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3], np.int64)
BAD_BAG_CALLS = {
    "offsets-not-from-0": (_IDX, dict(offsets=np.array([1, 4, 7]))),
    "offsets-decreasing": (_IDX, dict(offsets=np.array([0, 6, 4, 8]))),
    "offsets-past-the-end": (_IDX, dict(offsets=np.array([0, 4, 11]))),
    "offsets-empty": (_IDX, dict(offsets=np.zeros(0, np.int64))),
    "last-offset-wrong": (_IDX, dict(offsets=np.array([0, 4, 9]), include_last_offset=True)),
    "last-offset-missing": (_IDX, dict(offsets=np.zeros(0, np.int32), include_last_offset=True)),
    "lengths-negative": (_IDX, dict(lengths=np.array([2, -1, 9]))),
    "lengths-too-long": (_IDX, dict(lengths=np.array([4, 7, -3]))),
    "lengths-too-short": (_IDX, dict(lengths=np.array([4, 3], np.int32))),
    "positional-short": (_IDX, dict(offsets=np.array([0, 2, 7]), positional_weights=True,
                                    per_sample_weights=np.ones(2, np.float32))),
    "positional-short-2d": (_IDX.reshape(2, 5), dict(positional_weights=True,
                                                     per_sample_weights=np.ones(4, np.float32))),
    "offsets-and-lengths": (_IDX, dict(offsets=np.array([0]), lengths=np.array([10]))),
    "no-bags-given": (_IDX, {}),
    "2d-with-offsets": (_IDX.reshape(2, 5), dict(offsets=np.array([0, 5]))),
    "bad-mode": (_IDX, dict(offsets=np.array([0]), mode="max")),
    "padding-out-of-range": (_IDX, dict(offsets=np.array([0]), padding_idx=-11)),
    "padding-not-int": (_IDX, dict(offsets=np.array([0]), padding_idx=2.0)),
    "index-too-large": (np.array([0, 10, 2, 10], np.int32), dict(offsets=np.array([0, 2], np.int32))),
    "index-negative": (np.array([0, 3, -2, 1]), dict(lengths=np.array([1, 3]))),
}


_X = np.ones((3, 8), np.float32)
_P8 = np.zeros((3, 12), np.uint8)
_G = np.ones((3, 32), np.float32)
BAD_CALLS = {f"embedding_bag-{k}": ("embedding_bag", (np.ones((10, 4), np.float32), i), kw)
             for k, (i, kw) in BAD_BAG_CALLS.items()}
BAD_CALLS.update({
    "quantized-bits": ("embedding_bag_quantized", (_P8, _IDX[:2], np.array([0])), dict(bits=3)),
    "quantized-bits-bool": ("embedding_bag_quantized", (_P8, _IDX[:2], np.array([0])), dict(bits=True)),
    "quantized-row-too-short": ("embedding_bag_quantized", (_P8[:, :8], _IDX[:2], np.array([0])), {}),
    "quantized-4bit-too-short": ("embedding_bag_quantized", (_P8[:, :4], _IDX[:2], np.array([0])),
                                 dict(bits=4)),
    "quantized-dim-mismatch": ("embedding_bag_quantized", (_P8, _IDX[:2], np.array([0])),
                               dict(bits=4, dim=5)),
    "quantized-dim-zero": ("embedding_bag_quantized", (_P8, _IDX[:2], np.array([0])), dict(dim=0)),
    "quantized-dim-bool": ("embedding_bag_quantized", (_P8, _IDX[:2], np.array([0])), dict(dim=True)),
    "quantized-index": ("embedding_bag_quantized", (_P8, np.array([0, 3]), np.array([0])), {}),
    "quantized-3d": ("embedding_bag_quantized", (_P8.reshape(3, 2, 6), _IDX[:2], np.array([0])), {}),
    "quantize-no-columns": ("quantize_rowwise", (np.zeros((3, 0), np.float32),), {}),
    "quantize-no-rows-no-columns": ("quantize_rowwise", (np.zeros((0, 0), np.float32),), {}),
    "quantize-1d": ("quantize_rowwise", (np.ones(4, np.float32),), {}),
    "quantize-bits": ("quantize_rowwise", (_X,), dict(bits=1)),
    "dequantize-too-short": ("dequantize_rowwise", (_P8[:, :8],), {}),
    "dequantize-dim": ("dequantize_rowwise", (_P8,), dict(bits=2, dim=40)),
    "lstm-t-negative": ("lstm_unit", (_X, _X, _G), dict(t=-1)),
    "lstm-t-bool": ("lstm_unit", (_X, _X, _G), dict(t=True)),
    "lstm-t-float": ("lstm_unit", (_X, _X, _G), dict(t=1.0)),
    "lstm-forget-bias": ("lstm_unit", (_X, _X, _G), dict(forget_bias="x")),
    "lstm-gate-order": ("lstm_unit", (_X, _X, _G), dict(gate_order="iofg")),
    "lstm-gates-shape": ("lstm_unit", (_X, _X, _G[:, :31]), {}),
    "lstm-c-shape": ("lstm_unit", (_X, _X[:2], _G), {}),
    "lstm-h-1d": ("lstm_unit", (_X[0], _X, _G), {}),
    "lstm-seq-shape": ("lstm_unit", (_X, _X, _G), dict(seq_lengths=np.zeros(4, np.int64))),
    "lstm-backward-dh-shape": ("lstm_unit_backward", (_X, _G, _X, _X[:, :4], _X), {}),
    "lstm-backward-t": ("lstm_unit_backward", (_X, _G, _X, _X, _X), dict(t=-2)),
    "half-out-shape": ("float_to_half", (_X,), dict(out=np.zeros((8, 3), np.float16))),
    "half-out-dtype": ("float_to_half", (_X,), dict(out=np.zeros((3, 8), np.float32))),
    "float-dtype": ("half_to_float", (_X,), {}),
})


def _to_device(cp, v):
    if isinstance(v, np.ndarray):
        return cp.asarray(v)
    if isinstance(v, dict):
        return {k: _to_device(cp, x) for k, x in v.items()}
    if isinstance(v, tuple):
        return tuple(_to_device(cp, x) for x in v)
    return v


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_errors_match_the_cpu_package(simcp, case):
    """Bad arguments raise the CPU package's exception type with its exact message."""
    name, args, kw = BAD_CALLS[case]
    with pytest.raises((ValueError, IndexError, TypeError)) as cpu_error:
        getattr(perfkernels, name)(*args, **kw)
    with pytest.raises(type(cpu_error.value)) as gpu_error:
        getattr(pkc, name)(*_to_device(simcp, args), **_to_device(simcp, kw))
    assert str(gpu_error.value) == str(cpu_error.value)


def test_lstm_time_step_beyond_int64(simcp, rng):
    """t is clamped as the CPU API does (every row is then past its length), not an OverflowError."""
    x = rng.standard_normal((4, 20)).astype(np.float32)
    seq = np.array([0, 3, 2**62, 9])
    args = (x[:, :5], x[:, 5:10], x)
    for t in (2**63, 2**70):
        want = perfkernels.lstm_unit(*args, seq_lengths=seq, t=t, drop_states=True)
        got = pkc.lstm_unit(*(simcp.asarray(a) for a in args), seq_lengths=simcp.asarray(seq), t=t,
                            drop_states=True)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.get(), w)


# ---- part 3: AddressSanitizer + UBSan ---------------------------------------------------------------

def _asan_env():
    lib = subprocess.run([build.compiler(), "-print-file-name=libasan.so"], capture_output=True,
                         text=True).stdout.strip()
    if not lib or not os.path.isabs(lib) or not os.path.exists(lib):
        pytest.skip("g++ has no AddressSanitizer runtime (libasan.so) here")
    env = dict(os.environ, LD_PRELOAD=lib, ASAN_OPTIONS="detect_leaks=0:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, str(cuda_sim.build.HERE.parent),
                                                    env.get("PYTHONPATH")) if p)
    return env


@pytest.fixture(scope="module")
def asan_env(cuda_sim_libraries):
    return _asan_env()


def test_sanitizers_catch_an_out_of_bounds_read(asan_env):
    """The sanitized build really reports a read one element past a device array."""
    proc = run_python([str(cuda_sim.build.HERE / "asan_driver.py"), "overread"], env=asan_env)
    assert proc.returncode != 0 and "not caught" not in proc.stdout
    assert "AddressSanitizer: heap-buffer-overflow" in proc.stderr
    assert "sim_read_past" in proc.stderr


def test_kernels_under_sanitizers(asan_env):
    """Every table format's narrowest and widest launch (bags reading the table's last row), the
    bad-index paths, quantize / dequantize, conversions and the LSTM unit: no out-of-bounds
    access, no undefined behaviour (misaligned accesses included)."""
    proc = run_python([str(cuda_sim.build.HERE / "asan_driver.py"), "kernels"], env=asan_env,
                      timeout=1200)
    report = proc.stderr
    assert proc.returncode == 0, report[:4000] + ("\n...\n" + report[-2000:] if len(report) > 6000 else "")
    assert proc.stdout.strip().endswith("ok")
    assert "AddressSanitizer" not in proc.stderr and "runtime error" not in proc.stderr


@pytest.mark.parametrize("simcp", [0, 1, 5], indirect=True)
def test_out_overlapping_an_input_goes_through_a_temporary(simcp, rng):
    """out= sharing memory with per_sample_weights: the kernel must not write bags while other
    bags still read the weights (the CPU package's answer, computed from a copy)."""
    d, b = 4, 16
    lengths = rng.integers(1, 12, b)
    lengths[0] = 1
    n = int(lengths.sum())
    buf = simcp.asarray(rng.standard_normal(max(n, b * d)).astype(np.float32))
    psw, out = buf[:n], buf[:b * d].reshape(b, d)
    w = rng.standard_normal((30, d)).astype(np.float32)
    idx = rng.integers(0, 30, n)
    weights = psw.get()                                        # before the call overwrites them
    want = reference.embedding_bag(w, idx, lengths=lengths, per_sample_weights=weights)
    got = pkc.embedding_bag(simcp.asarray(w), simcp.asarray(idx), lengths=simcp.asarray(lengths),
                            per_sample_weights=psw, out=out)
    assert got is out
    assert_bags_close(out.get(), want)
    assert_bags_close(out.get(), perfkernels.embedding_bag(w, idx, lengths=lengths,
                                                           per_sample_weights=weights), want.magnitude)


@pytest.mark.parametrize("shift", [1, 2, 3])
def test_misaligned_contiguous_out(simcp, rng, shift):
    """A C-contiguous out= whose data is not 16-byte aligned takes the scalar stores (a float4
    store there would fault on the GPU; the simulator checks it)."""
    w = rng.standard_normal((20, 16)).astype(np.float32)
    idx, off = rng.integers(0, 20, 12), np.array([0, 5, 9])
    out = simcp.zeros(3 * 16 + shift, np.float32)[shift:].reshape(3, 16)
    pkc.embedding_bag(simcp.asarray(w), simcp.asarray(idx), simcp.asarray(off), out=out)
    assert_bags_close(out.get(), perfkernels.embedding_bag(w, idx, off))


@pytest.mark.parametrize("d", AWKWARD_DIMS)
def test_quantize_dequantize_awkward_dims(simcp, rng, d):
    for bits in (8, 4, 2):
        for src in (np.float32, np.float16):
            x = (rng.standard_normal((9, d)) * rng.uniform(0.01, 100, (9, 1))).astype(src)
            x[0] = x[0, 0]                                               # a constant row
            got = pkc.quantize_rowwise(simcp.asarray(x), bits=bits).get()
            reference.assert_same_bits(got, reference.quantize_rowwise(x.astype(np.float32), bits))
            reference.assert_same_bits(got, perfkernels.quantize_rowwise(x, bits=bits))
            back = pkc.dequantize_rowwise(simcp.asarray(got), bits=bits, dim=d).get()
            reference.assert_close(back, reference.dequantize_rowwise(got, bits, d), rtol=1e-6, atol=1e-6)
            reference.assert_close(back, perfkernels.dequantize_rowwise(got, bits=bits, dim=d),
                                   rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("d", AWKWARD_DIMS)
def test_lstm_awkward_dims(simcp, rng, d):
    n = 5
    h_prev, c_prev, dh, dc = (rng.standard_normal((n, d)).astype(np.float32) for _ in range(4))
    gates = (rng.standard_normal((n, 4 * d)) * 4).astype(np.float32)
    seq = np.array([0, 1, 2, 3, 9], np.int32)
    kw = dict(seq_lengths=seq, t=2, forget_bias=0.25, drop_states=d % 2 == 1,
              gate_order="ifgo" if d % 3 else "ifog")
    dev = {**kw, "seq_lengths": simcp.asarray(seq)}
    h, c = pkc.lstm_unit(simcp.asarray(h_prev), simcp.asarray(c_prev), simcp.asarray(gates), **dev)
    for want in (reference.lstm_unit(h_prev, c_prev, gates, **kw),
                 perfkernels.lstm_unit(h_prev, c_prev, gates, **kw)):
        reference.assert_close(h.get(), want[0], rtol=1e-5, atol=1e-6)
        reference.assert_close(c.get(), want[1], rtol=1e-5, atol=1e-6)
    grads = pkc.lstm_unit_backward(simcp.asarray(c_prev), simcp.asarray(gates), c,
                                   simcp.asarray(dh), simcp.asarray(dc), **dev)
    cpu_c = c.get()
    for want in (reference.lstm_unit_backward(c_prev, gates, cpu_c, dh, dc, **kw),
                 perfkernels.lstm_unit_backward(c_prev, gates, cpu_c, dh, dc, **kw)):
        for g, w in zip(grads, want):
            reference.assert_close(g.get(), w, rtol=1e-4, atol=1e-5)
