"""perfkernels.cuda: the CUDA variant.

Without a GPU (or without CuPy) only these run: the import, ``is_available()`` being False, a kernel
call raising RuntimeError, and the compile checks (every .cu file through nvcc with its template
instantiations, and through NVRTC exactly as CuPy will compile it), each skipped with a reason when
its compiler is absent.  Everything else needs a device and skips with the reason otherwise.

On a GPU every function is compared with the float64 references of perfkernels.reference (which
tests/test_reference.py checks against PyTorch on the CPU), with the CPU package, and with PyTorch
CUDA where PyTorch has the op.
"""

import numpy as np
import pytest

import perfkernels
import perfkernels.cuda as pkc
from perfkernels import _variants, reference
from conftest import run_python
from perfkernels.cuda import _compile_check, _runtime

GPU = pkc.is_available()
needs_gpu = pytest.mark.skipif(not GPU, reason=f"no GPU: {pkc.unavailable_reason()}")
BF16 = _variants.BFLOAT16


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def needs_torch_cuda():
    torch = _torch_cuda()
    if torch is None:
        pytest.skip("PyTorch with CUDA is not installed")
    return torch


def cpu_function(name):
    fn = getattr(perfkernels, name, None)
    if fn is None:
        pytest.skip(f"perfkernels.{name} (the CPU family) is not in this build yet")
    return fn


# ---- without a GPU --------------------------------------------------------------------------------

def test_import_does_not_import_cupy():
    code = "import perfkernels.cuda, sys; print('cupy' in sys.modules)"
    out = run_python(["-c", code], check=True)
    assert out.stdout.strip() == "False"


def test_public_api():
    for name in ("is_available", "embedding_bag", "embedding_bag_quantized", "quantize_rowwise",
                 "dequantize_rowwise", "float_to_half", "half_to_float", "float_to_bfloat16",
                 "bfloat16_to_float", "lstm_unit", "lstm_unit_backward"):
        assert callable(getattr(pkc, name)), name
        assert getattr(pkc, name).__doc__, name
    assert isinstance(pkc.is_available(), bool)


@pytest.mark.skipif(GPU, reason="a GPU is present: the no-GPU behaviour is not observable here")
def test_without_gpu_is_unavailable_and_kernels_raise():
    assert pkc.is_available() is False
    reason = pkc.unavailable_reason()
    assert reason
    x = np.ones(4, np.float32)
    calls = [
        lambda: pkc.float_to_half(x), lambda: pkc.half_to_float(x.astype(np.float16)),
        lambda: pkc.float_to_bfloat16(x), lambda: pkc.bfloat16_to_float(x.astype(BF16)),
        lambda: pkc.embedding_bag(np.ones((4, 4), np.float32), np.zeros(2, np.int64),
                                  np.zeros(1, np.int64)),
        lambda: pkc.embedding_bag_quantized(np.zeros((4, 12), np.uint8), np.zeros(2, np.int64),
                                            np.zeros(1, np.int64)),
        lambda: pkc.quantize_rowwise(np.ones((4, 4), np.float32)),
        lambda: pkc.dequantize_rowwise(np.zeros((4, 12), np.uint8)),
        lambda: pkc.lstm_unit(x.reshape(1, 4), x.reshape(1, 4), np.ones((1, 16), np.float32)),
        lambda: pkc.lstm_unit_backward(*(x.reshape(1, 4),) * 1, np.ones((1, 16), np.float32),
                                       *(x.reshape(1, 4),) * 3),
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match="perfkernels.cuda cannot run"):
            call()


FAKE_CUPY = {
    "import-error": "raise ImportError('libcudart.so.13: cannot open shared object file')",
    "no-driver": ("class CUDARuntimeError(RuntimeError): pass\n"
                  "class _R:\n"
                  "    @staticmethod\n"
                  "    def getDeviceCount():\n"
                  "        raise CUDARuntimeError('cudaErrorInsufficientDriver')\n"
                  "class cuda:\n    runtime = _R\n"),
    "zero-devices": ("class _R:\n    @staticmethod\n    def getDeviceCount():\n        return 0\n"
                     "class cuda:\n    runtime = _R\n"),
}


@pytest.mark.parametrize("kind,expected", [("import-error", "CuPy is not usable (ImportError"),
                                           ("no-driver", "CuPy sees no CUDA device (CUDARuntimeError"),
                                           ("zero-devices", "device count is 0")])
def test_unavailable_reasons(tmp_path, kind, expected):
    """A broken CuPy, a missing driver and zero devices all give is_available() False (never an
    exception) and a RuntimeError naming the reason when a kernel is called."""
    (tmp_path / "cupy").mkdir()
    (tmp_path / "cupy" / "__init__.py").write_text(FAKE_CUPY[kind])
    code = ("import numpy as np, perfkernels.cuda as c\n"
            "assert c.is_available() is False\n"
            "print(c.unavailable_reason())\n"
            "try:\n    c.float_to_half(np.ones(2, np.float32))\n"
            "except RuntimeError as e:\n    print('RuntimeError:', e)\n")
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(perfkernels.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), root]))
    out = run_python(["-c", code], env=env)
    assert out.returncode == 0, out.stderr
    assert expected in out.stdout
    assert "RuntimeError: perfkernels.cuda cannot run" in out.stdout


@pytest.mark.parametrize("file", _runtime.SOURCES)
def test_nvcc_compiles(file):
    """Every .cu file, with the template instantiations the runtime uses, compiles with nvcc for
    Hopper with warnings as errors (catches device-code errors on machines without a GPU)."""
    if _compile_check.nvcc_path() is None:
        pytest.skip("nvcc is not on this machine")
    ok, log = _compile_check.nvcc_compile(file, arch="sm_90")
    assert ok, log


@pytest.mark.parametrize("file", _runtime.SOURCES)
def test_nvrtc_compiles(file):
    """The same sources through NVRTC as CuPy compiles them (headers pasted in, no host headers,
    the runtime's name expressions), for compute_90."""
    if _compile_check.nvrtc_library() is None:
        pytest.skip("libnvrtc is not on this machine (pip install nvidia-cuda-nvrtc, or CUDA)")
    ok, log = _compile_check.nvrtc_compile(file, arch="compute_90")
    assert ok, log


def test_every_kernel_has_a_compile_check():
    """Each __global__ template in the sources appears among the instantiations compiled above."""
    import re
    for file in _runtime.SOURCES:
        text = _runtime.path(file).read_text()
        kernels = set(re.findall(r"__global__ void(?: __launch_bounds__\(\d+\))?\s+(\w+)\(", text))
        kernels |= set(re.findall(r"__global__ void __launch_bounds__\(\d+\)\n(\w+)\(", text))
        names = " ".join(_compile_check.instantiations(file))
        for k in kernels:
            assert k in names, f"{file}: {k} is never instantiated by the compile checks"


def test_launch_config():
    from perfkernels.families.embedding import _cuda as _bags
    assert _bags.launch_config(_bags.F32, 128, 16) == (16, 32, 1, 1)   # a warp per bag, float4
    assert _bags.launch_config(_bags.F16, 128, 16) == (16, 16, 1, 1)   # half a warp, 8 halves
    assert _bags.launch_config(_bags.F32, 64, 16) == (16, 16, 1, 1)
    assert _bags.launch_config(_bags.F32, 7, 4) == (4, 8, 1, 1)        # scalar loads
    assert _bags.launch_config(_bags.F32, 1000, 16) == (16, 32, 4, 2)  # two column chunks
    assert _bags.launch_config(_bags.Q8, 128, 8) == (8, 16, 1, 1)      # rows of 136 bytes
    assert _bags.launch_config(_bags.Q4, 128, 4) == (4, 16, 1, 1)      # rows of 68 bytes


def assert_bags_close(got, expected, magnitude=None):
    """A float32 bag sum against the float64 reference (an ``Expected``, or an array with the
    reference's ``magnitude``), within a multiple of the sum of |terms|."""
    reference.assert_close(got, expected, magnitude, rtol=1e-5, atol=1e-6)


# ---- on a GPU -------------------------------------------------------------------------------------

@pytest.fixture
def cp(request):
    """CuPy on a GPU; without one, the NumPy-backed stand-in whose kernels run in the warp
    simulator (tests/cuda_sim, docs/cuda-simulator.md), with a fiber order seeded per test."""
    if GPU:
        import cupy
        yield cupy
        return
    import zlib
    import cuda_sim
    libraries = request.getfixturevalue("cuda_sim_libraries")
    with cuda_sim.installed(libraries, seed=zlib.crc32(request.node.nodeid.encode()) % 8) as fake:
        yield fake


def special_floats(rng, n):
    """Random float32 bit patterns plus every awkward class: zeros, subnormals, fp16 rounding
    edges, overflow edges, infinities and NaNs with payloads."""
    bits = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    edges = np.array([0, 0x80000000, 1, 0x00800000, 0x33000000, 0x33000001, 0x387fc000, 0x38800000,
                      0x477fe000, 0x477fefff, 0x477ff000, 0x7f7fffff, 0x7f800000, 0xff800000,
                      0x7fc00000, 0x7f800001, 0x7fa00000, 0xffffffff, 0x7f802000, 0x3f808000,
                      0x3f818000, 0x3f7fffff], np.uint32)
    halfway = (rng.integers(0x33000000, 0x47800000, size=n // 4, dtype=np.uint64)
               .astype(np.uint32) & ~np.uint32(0xfff)) | np.uint32(0x1000)
    return np.concatenate([edges, bits, halfway]).view(np.float32)


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")
@pytest.mark.parametrize("offset", [0, 1])          # 1: misaligned, the scalar path
@pytest.mark.parametrize("clip", [False, True])
def test_float_to_half_bit_exact(cp, rng, offset, clip):
    x = special_floats(rng, 100_003)
    ref = (np.clip(x, -65504, 65504) if clip else x).astype(np.float16)
    ref = np.where(np.isnan(x), x.astype(np.float16), ref)
    xd = cp.asarray(np.concatenate([np.zeros(offset, np.float32), x]))[offset:]
    got = pkc.float_to_half(xd, clip=clip)
    assert isinstance(got, cp.ndarray) and got.dtype == np.float16
    np.testing.assert_array_equal(got.get().view(np.uint16), ref.view(np.uint16))
    if "float_to_half" in dir(perfkernels):
        np.testing.assert_array_equal(got.get().view(np.uint16),
                                      perfkernels.float_to_half(x, clip=clip).view(np.uint16))


@pytest.mark.parametrize("offset", [0, 1])
def test_half_to_float_all_patterns(cp, offset):
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    hd = cp.asarray(np.concatenate([np.zeros(offset, np.float16), h]))[offset:]
    got = pkc.half_to_float(hd).get()
    np.testing.assert_array_equal(got.view(np.uint32), h.astype(np.float32).view(np.uint32))
    np.testing.assert_array_equal(got.view(np.uint32), perfkernels.half_to_float(h).view(np.uint32))


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")
@pytest.mark.parametrize("offset", [0, 1])
def test_bfloat16_bit_exact(cp, rng, offset):
    x = special_floats(rng, 100_003)
    ref = x.astype(BF16).view(np.uint16)
    xd = cp.asarray(np.concatenate([np.zeros(offset, np.float32), x]))[offset:]
    got = pkc.float_to_bfloat16(xd)
    np.testing.assert_array_equal(got.view(cp.uint16).get(), ref)
    np.testing.assert_array_equal(ref, perfkernels.float_to_bfloat16(x).view(np.uint16))
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    back = pkc.bfloat16_to_float(cp.asarray(every)).get()      # uint16 bits are accepted
    np.testing.assert_array_equal(back.view(np.uint32), every.view(BF16).astype(np.float32).view(np.uint32))


def test_conversion_out_and_errors(cp, rng):
    x = cp.asarray(rng.standard_normal((33, 7), dtype=np.float32))
    out = cp.full((33, 7), 7, dtype=cp.float16)
    assert pkc.float_to_half(x, out=out) is out
    np.testing.assert_array_equal(out.get(), x.get().astype(np.float16))
    strided = cp.zeros((33, 14), dtype=cp.float32)[:, ::2]                  # non-contiguous out
    pkc.half_to_float(out, out=strided)
    np.testing.assert_array_equal(strided.get(), out.get().astype(np.float32))
    with pytest.raises(TypeError, match="float32"):
        pkc.float_to_half(out)
    with pytest.raises(TypeError, match="host"):
        pkc.float_to_half(np.ones(3, np.float32))
    with pytest.raises(ValueError, match="shape"):
        pkc.float_to_half(x, out=cp.empty((7, 33), cp.float16))
    assert pkc.half_to_float(cp.empty(0, cp.float16)).shape == (0,)


def test_conversions_accept_torch_tensors(cp, rng):
    torch = needs_torch_cuda()
    x = torch.randn(1000, device="cuda")
    np.testing.assert_array_equal(pkc.float_to_half(x).get(), x.cpu().numpy().astype(np.float16))
    b = x.to(torch.bfloat16)                                                # no CAI / DLPack in CuPy
    np.testing.assert_array_equal(pkc.bfloat16_to_float(b).get(), b.float().cpu().numpy())
    np.testing.assert_array_equal(pkc.float_to_bfloat16(x).view(cp.uint16).get(),
                                  b.view(torch.int16).cpu().numpy().view(np.uint16))
    h = x.half()

    class DLPackOnly:                       # neither CuPy nor __cuda_array_interface__
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, **kw):
            return self.t.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    got = pkc.half_to_float(DLPackOnly(h))
    np.testing.assert_array_equal(got.get(), h.float().cpu().numpy())
    assert h.data_ptr() == cp.from_dlpack(DLPackOnly(h)).data.ptr          # no copy


def test_honours_current_stream(cp, rng):
    x = rng.standard_normal(1 << 20, dtype=np.float32)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        xd = cp.asarray(x)
        got = pkc.float_to_half(xd)
        back = pkc.half_to_float(got)
    s.synchronize()
    np.testing.assert_array_equal(back.get(), x.astype(np.float16).astype(np.float32))


# -- embedding bags

TABLE_DTYPES = list(_variants.TABLE_DTYPES.values())
DIMS = _variants.AWKWARD_DIMS + (256,)


def random_bags(rng, rows, b, mean_len, index_dtype, zipf=False):
    lengths = rng.integers(0, 2 * mean_len + 1, size=b)
    lengths[rng.random(b) < 0.1] = 0                                        # empty bags
    n = int(lengths.sum())
    if zipf:
        from perfkernels.benchsuite import zipf_indices
        indices = zipf_indices(rng, rows, n, dtype=index_dtype)
    else:
        indices = rng.integers(0, rows, size=n).astype(index_dtype)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(index_dtype)
    return indices, offsets, lengths.astype(index_dtype)


def to_table(rng, rows, d, dtype):
    w = rng.standard_normal((rows, d), dtype=np.float32)
    return w.astype(dtype)


@pytest.mark.parametrize("dtype", TABLE_DTYPES, ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("index_dtype", _variants.INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("mode", _variants.MODES)
@pytest.mark.parametrize("weighted", [False, True])
def test_embedding_bag_vs_reference(cp, rng, dtype, index_dtype, d, mode, weighted):
    rows, b = 300, 37
    w = to_table(rng, rows, d, dtype)
    indices, offsets, _ = random_bags(rng, rows, b, 5, index_dtype, zipf=d % 2 == 0)
    psw = rng.standard_normal(indices.size, dtype=np.float32) if weighted else None
    got = pkc.embedding_bag(cp.asarray(w), cp.asarray(indices), cp.asarray(offsets),
                            per_sample_weights=None if psw is None else cp.asarray(psw), mode=mode)
    assert isinstance(got, cp.ndarray) and got.dtype == np.float32 and got.shape == (b, d)
    want = reference.embedding_bag(w, indices, offsets, per_sample_weights=psw, mode=mode)
    assert_bags_close(got.get(), want)
    cpu = getattr(perfkernels, "embedding_bag", None)
    if cpu is not None:
        assert_bags_close(got.get(), cpu(w, indices, offsets, per_sample_weights=psw, mode=mode),
                          want.magnitude)


def test_embedding_bag_conventions(cp, rng):
    rows, d = 100, 24
    w = to_table(rng, rows, d, np.float32)
    indices, offsets, lengths = random_bags(rng, rows, 20, 4, np.int64)
    wd, idd = cp.asarray(w), cp.asarray(indices)
    a = pkc.embedding_bag(wd, idd, cp.asarray(offsets)).get()
    with_last = np.concatenate([offsets, [indices.size]])
    b_ = pkc.embedding_bag(wd, idd, cp.asarray(with_last), include_last_offset=True).get()
    c_ = pkc.embedding_bag(wd, idd, lengths=cp.asarray(lengths.astype(np.int32))).get()
    np.testing.assert_array_equal(a, b_)
    np.testing.assert_array_equal(a, c_)
    two_d = rng.integers(0, rows, size=(9, 5))
    got = pkc.embedding_bag(wd, cp.asarray(two_d)).get()
    np.testing.assert_allclose(got, w[two_d].sum(axis=1), rtol=1e-5, atol=1e-5)
    # padding_idx: skipped and not counted by mean; negative counts from the end
    pad = int(indices[0]) if indices.size else 0
    got = pkc.embedding_bag(wd, idd, cp.asarray(offsets), mode="mean", padding_idx=pad - rows).get()
    assert_bags_close(got, reference.embedding_bag(w, indices, offsets, mode="mean", padding_idx=pad))
    # positional weights: indexed by the position inside the bag
    pos = rng.standard_normal(int(lengths.max()), dtype=np.float32)
    got = pkc.embedding_bag(wd, idd, cp.asarray(offsets), per_sample_weights=cp.asarray(pos),
                            positional_weights=True).get()
    assert_bags_close(got, reference.embedding_bag(w, indices, offsets, per_sample_weights=pos,
                                                   positional_weights=True))
    # out= written in place; a non-contiguous out goes through a temporary
    out = cp.full((20, d), np.nan, dtype=cp.float32)
    assert pkc.embedding_bag(wd, idd, cp.asarray(offsets), out=out) is out
    np.testing.assert_array_equal(out.get(), a)
    out2 = cp.zeros((20, 2 * d), cp.float32)[:, ::2]
    pkc.embedding_bag(wd, idd, cp.asarray(offsets), out=out2)
    np.testing.assert_array_equal(out2.get(), a)
    # a strided table view (rows not 16-byte aligned) takes the narrow-load path
    wide = cp.asarray(to_table(rng, rows, d + 1, np.float32))
    view = wide[:, 1:]
    got = pkc.embedding_bag(view, idd, cp.asarray(offsets)).get()
    assert_bags_close(got, reference.embedding_bag(view.get(), indices, offsets))


def test_embedding_bag_empty_and_degenerate(cp, rng):
    w = cp.asarray(to_table(rng, 10, 8, np.float32))
    got = pkc.embedding_bag(w, cp.zeros(0, cp.int64), cp.zeros(3, cp.int64), mode="mean")
    np.testing.assert_array_equal(got.get(), np.zeros((3, 8), np.float32))
    assert pkc.embedding_bag(w, cp.zeros(0, cp.int64), cp.zeros(0, cp.int64)).shape == (0, 8)


def test_embedding_bag_errors(cp, rng):
    rows, d = 1000, 16
    w = cp.asarray(to_table(rng, rows, d, np.float32))
    indices = rng.integers(0, rows, size=40)
    offsets = np.arange(0, 40, 4)
    for bad_value in (1_000_000, rows, -1):
        bad = indices.copy()
        bad[17] = bad_value
        bad[23] = bad_value
        out = cp.full((10, d), 3.0, cp.float32)
        with pytest.raises(IndexError, match=rf"indices\[17\] = {bad_value} is out of range "
                                             rf"for a table of {rows} rows"):
            pkc.embedding_bag(w, cp.asarray(bad), cp.asarray(offsets), out=out)
        assert bool((out == 3.0).all()), "out= was written although the call failed"
    with pytest.raises(ValueError, match="offsets"):
        pkc.embedding_bag(w, cp.asarray(indices), cp.asarray(offsets + 1))
    decreasing = offsets.copy()
    decreasing[[2, 3]] = decreasing[[3, 2]]
    with pytest.raises(ValueError, match="non-decreasing"):
        pkc.embedding_bag(w, cp.asarray(indices), cp.asarray(decreasing))
    with pytest.raises(ValueError, match="exceed"):
        pkc.embedding_bag(w, cp.asarray(indices), cp.asarray(np.array([0, 50])))
    with pytest.raises(ValueError, match="include_last_offset"):
        pkc.embedding_bag(w, cp.asarray(indices), cp.asarray(offsets), include_last_offset=True)
    with pytest.raises(ValueError, match="lengths"):
        pkc.embedding_bag(w, cp.asarray(indices), lengths=cp.asarray(np.full(10, 3)))
    with pytest.raises(ValueError, match="negative"):
        pkc.embedding_bag(w, cp.asarray(indices), lengths=cp.asarray(np.array([-1, 41])))
    with pytest.raises(ValueError, match="positional"):
        pkc.embedding_bag(w, cp.asarray(indices), cp.asarray(offsets),
                          per_sample_weights=cp.ones(3, cp.float32), positional_weights=True)
    with pytest.raises(TypeError, match="weight must have dtype"):
        pkc.embedding_bag(w.astype(cp.float64), cp.asarray(indices), cp.asarray(offsets))
    with pytest.raises(TypeError, match="indices must have dtype"):
        pkc.embedding_bag(w, cp.asarray(indices.astype(np.float32)), cp.asarray(offsets))
    with pytest.raises(TypeError, match="host"):
        pkc.embedding_bag(w, indices, cp.asarray(offsets))
    with pytest.raises(ValueError, match="mode"):
        pkc.embedding_bag(w, cp.asarray(indices), cp.asarray(offsets), mode="max")
    with pytest.raises(ValueError, match="per_sample_weights"):
        pkc.embedding_bag(w, cp.asarray(indices), cp.asarray(offsets),
                          per_sample_weights=cp.ones(3, cp.float32))
    cpu = getattr(perfkernels, "embedding_bag", None)
    if cpu is not None:                     # the same exception types as the CPU package
        bad = indices.copy()
        bad[5] = -3
        with pytest.raises(IndexError):
            cpu(w.get(), bad, offsets)
        with pytest.raises(ValueError):
            cpu(w.get(), indices, offsets + 1)


@pytest.mark.parametrize("dtype", TABLE_DTYPES, ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape", [(1000, 64, 64, 20), (100_000, 128, 512, 20)])
@pytest.mark.parametrize("mode", _variants.MODES)
def test_embedding_bag_vs_torch_cuda(cp, rng, dtype, shape, mode):
    torch = needs_torch_cuda()
    rows, d, b, l = shape
    w = to_table(rng, rows, d, np.float32)
    indices, offsets, _ = random_bags(rng, rows, b, l, np.int64, zipf=True)
    tw = torch.from_numpy(w).cuda().to({np.float32: torch.float32, np.float16: torch.float16,
                                        BF16: torch.bfloat16}[np.dtype(dtype)])
    ti, to = torch.from_numpy(indices).cuda(), torch.from_numpy(offsets).cuda()
    ref = torch.nn.functional.embedding_bag(ti, tw.float(), to, mode=mode)
    got = pkc.embedding_bag(tw, ti, to, mode=mode)                          # tensors, no copies
    g64 = w.astype(dtype).astype(np.float64)
    want = reference.embedding_bag(g64, indices, offsets, mode=mode)
    assert_bags_close(got.get(), want)
    assert_bags_close(ref.cpu().numpy(), want)
    psw = torch.rand(indices.size, device="cuda")
    if mode == "sum":
        ref = torch.nn.functional.embedding_bag(ti, tw.float(), to, mode="sum", per_sample_weights=psw)
        got = pkc.embedding_bag(tw, ti, to, per_sample_weights=psw)
        np.testing.assert_allclose(got.get(), ref.cpu().numpy(), rtol=1e-4, atol=1e-4)


# -- quantized tables

@pytest.mark.parametrize("bits", _variants.BITS)
@pytest.mark.parametrize("d", (1, 7, 8, 9, 16, 17, 63, 64, 65, 128, 129, 1000))
@pytest.mark.parametrize("src_dtype", [np.float32, np.float16])
def test_quantize_rowwise_bit_exact(cp, rng, bits, d, src_dtype):
    x = (rng.standard_normal((65, d), dtype=np.float32) * rng.uniform(0.01, 100, (65, 1))).astype(
        np.float32).astype(src_dtype)
    x[0] = x[0, 0]                                                          # a constant row
    got = pkc.quantize_rowwise(cp.asarray(x), bits=bits).get()
    np.testing.assert_array_equal(got, reference.quantize_rowwise(x, bits))
    cpu = getattr(perfkernels, "quantize_rowwise", None)
    if cpu is not None:
        np.testing.assert_array_equal(got, cpu(x, bits=bits))
    deq = pkc.dequantize_rowwise(cp.asarray(got), bits=bits, dim=d).get()
    np.testing.assert_allclose(deq, reference.dequantize_rowwise(got, bits, d), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bits", _variants.BITS)
def test_quantize_matches_torch_prepack(cp, rng, bits):
    try:
        import torch
    except ImportError:
        pytest.skip("PyTorch is not installed")
    d = 64
    x = rng.standard_normal((200, d), dtype=np.float32)
    prepack = {8: torch.ops.quantized.embedding_bag_byte_prepack,
               4: torch.ops.quantized.embedding_bag_4bit_prepack,
               2: torch.ops.quantized.embedding_bag_2bit_prepack}[bits]
    np.testing.assert_array_equal(pkc.quantize_rowwise(cp.asarray(x), bits=bits).get(),
                                  prepack(torch.from_numpy(x)).numpy())


@pytest.mark.parametrize("bits", _variants.BITS)
@pytest.mark.parametrize("d", (8, 16, 17, 64, 128, 129, 256))
@pytest.mark.parametrize("mode", _variants.MODES)
@pytest.mark.parametrize("weighted", [False, True])
def test_embedding_bag_quantized(cp, rng, bits, d, mode, weighted):
    rows, b = 500, 41
    x = rng.standard_normal((rows, d), dtype=np.float32)
    packed = reference.quantize_rowwise(x, bits)
    indices, offsets, _ = random_bags(rng, rows, b, 6, np.int64, zipf=True)
    psw = rng.standard_normal(indices.size, dtype=np.float32) if weighted else None
    got = pkc.embedding_bag_quantized(
        cp.asarray(packed), cp.asarray(indices), cp.asarray(offsets), bits=bits, dim=d, mode=mode,
        per_sample_weights=None if psw is None else cp.asarray(psw)).get()
    want = reference.embedding_bag_quantized(packed, indices, offsets, bits=bits, dim=d,
                                             per_sample_weights=psw, mode=mode)
    assert_bags_close(got, want)
    cpu = getattr(perfkernels, "embedding_bag_quantized", None)
    if cpu is not None:
        assert_bags_close(got, cpu(packed, indices, offsets, bits=bits, dim=d, mode=mode,
                                   per_sample_weights=psw), want.magnitude)
    bad = indices.copy()
    if bad.size:
        bad[-1] = rows
        with pytest.raises(IndexError, match=rf"indices\[{bad.size - 1}\] = {rows}"):
            pkc.embedding_bag_quantized(cp.asarray(packed), cp.asarray(bad), cp.asarray(offsets),
                                        bits=bits, dim=d)


def test_embedding_bag_quantized_vs_torch(cp, rng):
    torch = needs_torch_cuda()
    rows, d, b, l = 5000, 128, 256, 20
    x = rng.standard_normal((rows, d), dtype=np.float32)
    packed = pkc.quantize_rowwise(cp.asarray(x), bits=8)
    indices, offsets, _ = random_bags(rng, rows, b, l, np.int64)
    deq = torch.from_dlpack(pkc.dequantize_rowwise(packed))
    ref = torch.nn.functional.embedding_bag(torch.from_numpy(indices).cuda(), deq,
                                            torch.from_numpy(offsets).cuda(), mode="sum")
    got = pkc.embedding_bag_quantized(packed, cp.asarray(indices), cp.asarray(offsets))
    np.testing.assert_allclose(got.get(), ref.cpu().numpy(), rtol=1e-4, atol=1e-4)


# -- LSTM unit

@pytest.mark.parametrize("gate_order", _variants.GATE_ORDERS)
@pytest.mark.parametrize("seq", [False, True])
@pytest.mark.parametrize("drop_states", [False, True])
@pytest.mark.parametrize("nd", [(1, 1), (7, 17), (64, 256), (256, 1024)])
def test_lstm_unit(cp, rng, gate_order, seq, drop_states, nd):
    n, d = nd
    h_prev, c_prev = (rng.standard_normal((n, d), dtype=np.float32) for _ in range(2))
    gates = (rng.standard_normal((n, 4 * d), dtype=np.float32) * 4)
    gates.flat[::97] = 100.0                                                # saturation
    gates.flat[1::97] = -100.0
    seq_lengths = rng.integers(0, 4, size=n).astype(np.int32) if seq else None
    kw = dict(t=2, forget_bias=0.5, drop_states=drop_states, gate_order=gate_order)
    h, c = pkc.lstm_unit(cp.asarray(h_prev), cp.asarray(c_prev), cp.asarray(gates),
                         seq_lengths=None if seq_lengths is None else cp.asarray(seq_lengths), **kw)
    rh, rc = reference.lstm_unit(h_prev, c_prev, gates, seq_lengths=seq_lengths, **kw)
    np.testing.assert_allclose(h.get(), rh, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c.get(), rc, rtol=1e-5, atol=1e-6)
    dh, dc = (rng.standard_normal((n, d), dtype=np.float32) for _ in range(2))
    grads = pkc.lstm_unit_backward(cp.asarray(c_prev), cp.asarray(gates), c, cp.asarray(dh),
                                   cp.asarray(dc),
                                   seq_lengths=None if seq_lengths is None else cp.asarray(seq_lengths),
                                   **kw)
    refs = reference.lstm_unit_backward(c_prev, gates, c.get(), dh, dc, seq_lengths=seq_lengths,
                                        **kw)
    for got, ref in zip(grads, refs):
        assert np.isfinite(got.get()).all()
        np.testing.assert_allclose(got.get(), ref, rtol=1e-4, atol=1e-5)
    cpu = getattr(perfkernels, "lstm_unit", None)
    if cpu is not None:
        ch, cc = cpu(h_prev, c_prev, gates, seq_lengths=seq_lengths, **kw)
        np.testing.assert_allclose(h.get(), ch, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(c.get(), cc, rtol=1e-5, atol=1e-6)


def test_lstm_unit_vs_torch_lstmcell_pointwise(cp, rng):
    torch = needs_torch_cuda()
    n, d = 64, 256
    h_prev = torch.randn(n, d, device="cuda")
    c_prev = torch.randn(n, d, device="cuda", requires_grad=True)
    gates = (torch.randn(n, 4 * d, device="cuda") * 3).requires_grad_()
    i, f, g, o = gates.chunk(4, dim=1)                                      # LSTMCell's order
    c = torch.sigmoid(f) * c_prev + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    ph, pc_ = pkc.lstm_unit(h_prev, c_prev.detach(), gates.detach(), gate_order="ifgo")
    np.testing.assert_allclose(ph.get(), h.detach().cpu().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pc_.get(), c.detach().cpu().numpy(), rtol=1e-5, atol=1e-6)
    dh, dc = torch.randn(n, d, device="cuda"), torch.randn(n, d, device="cuda")
    torch.autograd.backward([h, c], [dh, dc])
    _, dc_prev, dgates = pkc.lstm_unit_backward(c_prev.detach(), gates.detach(), pc_, dh, dc,
                                                gate_order="ifgo")
    np.testing.assert_allclose(dc_prev.get(), c_prev.grad.cpu().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dgates.get(), gates.grad.cpu().numpy(), rtol=1e-4, atol=1e-5)


def test_lstm_errors(cp):
    x = cp.ones((2, 3), cp.float32)
    with pytest.raises(ValueError, match="gates"):
        pkc.lstm_unit(x, x, cp.ones((2, 5), cp.float32))
    with pytest.raises(ValueError, match="gate_order"):
        pkc.lstm_unit(x, x, cp.ones((2, 12), cp.float32), gate_order="iofg")
    with pytest.raises(TypeError, match="float32"):
        pkc.lstm_unit(x.astype(cp.float64), x, cp.ones((2, 12), cp.float32))
