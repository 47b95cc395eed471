"""The native torch ops (perfkernels/torch/native/, loaded by perfkernels.torch._native_ops):
their schemas, results against float64 NumPy references and torch's own ops, errors, threads, the
profiler, and that they run with no perfkernels Python loaded."""
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import perfkernels  # noqa: E402
import perfkernels.torch as pt  # noqa: E402
from perfkernels.torch import _native_ops  # noqa: E402

ops = torch.ops.perfkernels

SCHEMAS = {
    "embedding_bag": "perfkernels::embedding_bag(Tensor weight, Tensor indices, Tensor? offsets, "
                     "Tensor? per_sample_weights, str mode, bool include_last_offset, "
                     "SymInt? padding_idx) -> Tensor",
    "embedding_bag_quantized": "perfkernels::embedding_bag_quantized(Tensor packed, "
                               "Tensor indices, Tensor? offsets, Tensor? per_sample_weights, "
                               "str mode, bool include_last_offset, SymInt? padding_idx, "
                               "SymInt bits, SymInt dim) -> Tensor",
    "embedding_bag_collection": "perfkernels::embedding_bag_collection(Tensor[] weights, "
                                "Tensor values, Tensor offsets, Tensor? per_sample_weights, "
                                "SymInt num_keys, SymInt[] features, SymInt[] tables, "
                                "SymInt[] mean, SymInt[] padding_idx) -> Tensor",
}


def reference(table, indices, offsets, psw, mode, include_last_offset, padding_idx):
    """float64 bags from the formula (docs/semantics.md), independent of every kernel."""
    t = np.asarray(table.float().numpy(), dtype=np.float64)
    ix = indices.numpy().astype(np.int64)
    if ix.ndim == 2:
        bounds = [(b * ix.shape[1], (b + 1) * ix.shape[1]) for b in range(ix.shape[0])]
        ix = ix.reshape(-1)
    else:
        off = list(offsets.numpy().astype(np.int64))
        if not include_last_offset:
            off.append(len(ix))
        bounds = list(zip(off[:-1], off[1:]))
    w = None if psw is None else psw.numpy().reshape(-1).astype(np.float64)
    pad = None if padding_idx is None else padding_idx % t.shape[0]
    out = np.zeros((len(bounds), t.shape[1]))
    for b, (lo, hi) in enumerate(bounds):
        count = 0
        for j in range(lo, hi):
            if ix[j] == pad:
                continue
            out[b] += (1.0 if w is None else w[j]) * t[ix[j]]
            count += 1
        if mode == "mean" and count:
            out[b] /= count
    return out


def test_library_path_and_schemas():
    path = pt.native_library_path()
    assert os.path.isfile(path) and os.path.basename(path).startswith("_native")
    for name, schema in SCHEMAS.items():
        assert str(getattr(ops, name).default._schema) == schema


def test_library_links_no_torch_and_no_python():
    readelf = subprocess.run(["readelf", "-d", pt.native_library_path()], capture_output=True,
                             text=True) if _has("readelf") else None
    if readelf is None or readelf.returncode != 0:
        pytest.skip("readelf is not available")
    needed = [line for line in readelf.stdout.splitlines() if "(NEEDED)" in line]
    assert needed, readelf.stdout
    assert not any("python" in n or "torch" in n or "c10" in n for n in needed), needed


def _has(tool):
    from shutil import which
    return which(tool) is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dim", [1, 7, 16, 17, 129])
def test_embedding_bag_matches_reference(isa, rng, dtype, dim):
    rows = 50
    table = torch.from_numpy(rng.standard_normal((rows, dim)).astype(np.float32)).to(dtype)
    for index_dtype in (torch.int32, torch.int64):
        ix = torch.from_numpy(rng.integers(0, rows, 40)).to(index_dtype)
        off = torch.tensor([0, 0, 3, 10, 10, 25], dtype=index_dtype)      # empty bags too
        psw = torch.from_numpy(rng.random(40).astype(np.float32))
        for mode, weights, pad, ilo in [("sum", None, None, False), ("mean", None, 3, False),
                                        ("sum", psw, -2, False), ("mean", psw, None, True)]:
            o = torch.cat([off, torch.tensor([40], dtype=index_dtype)]) if ilo else off
            got = ops.embedding_bag(table, ix, o, weights, mode, ilo, pad)
            want = reference(table, ix, o, weights, mode, ilo, pad)
            assert got.dtype == torch.float32 and got.shape == want.shape
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_embedding_bag_2d_strided_and_empty(isa, rng):
    base = torch.from_numpy(rng.standard_normal((30, 20)).astype(np.float32))
    table = base[:, ::2]                               # rows of non-unit stride: copied
    ix = torch.from_numpy(rng.integers(0, 30, (6, 4)))
    got = ops.embedding_bag(table, ix, None, None, "sum", False, None)
    np.testing.assert_allclose(got.numpy(), reference(table, ix, None, None, "sum", False, None),
                               rtol=1e-5, atol=1e-5)
    sliced = base[:, 3:11]                             # unit-stride rows, row stride 20: read in place
    got = ops.embedding_bag(sliced, ix.t().contiguous().t(), None, None, "mean", False, None)
    np.testing.assert_allclose(got.numpy(), reference(sliced, ix, None, None, "mean", False, None),
                               rtol=1e-5, atol=1e-5)
    empty = ops.embedding_bag(base, torch.zeros(0, dtype=torch.int64),
                              torch.zeros(0, dtype=torch.int64), None, "sum", False, None)
    assert empty.shape == (0, 20)


def test_embedding_bag_threads_bit_identical(rng):
    table = torch.from_numpy(rng.standard_normal((5000, 64)).astype(np.float32))
    ix = torch.from_numpy(rng.integers(0, 5000, 200_000))
    off = torch.arange(0, 200_000, 20)
    before = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            results.append(ops.embedding_bag(table, ix, off, None, "sum", False, None))
    finally:
        torch.set_num_threads(before)
    for r in results[1:]:
        assert torch.equal(r, results[0])


@pytest.mark.parametrize("call, message", [
    (lambda w: ops.embedding_bag(w, torch.tensor([1, 10]), torch.tensor([0]), None, "sum",
                                 False, None),
     r"Index 1 of input takes value 10 which is not in the valid range \[0, 10\)"),
    (lambda w: ops.embedding_bag(w, torch.tensor([-1]), torch.tensor([0]), None, "sum",
                                 False, None),
     r"Index 0 of input takes value -1 which is not in the valid range"),
    (lambda w: ops.embedding_bag(w, torch.tensor([1, 2]), torch.tensor([1]), None, "sum",
                                 False, None), r"offsets\[0\] = 1: the first offset must be 0"),
    (lambda w: ops.embedding_bag(w, torch.tensor([1, 2]), torch.tensor([0, 2, 1]), None, "sum",
                                 False, None), r"offsets\[2\] = 1 < offsets\[1\] = 2"),
    (lambda w: ops.embedding_bag(w, torch.tensor([1, 2]), torch.tensor([0]), None, "max",
                                 False, None), r"mode must be 'sum' or 'mean'; got 'max'"),
    (lambda w: ops.embedding_bag(w, torch.tensor([1.0]), torch.tensor([0]), None, "sum",
                                 False, None), r"indices must be int32 or int64; got torch.float32"),
    (lambda w: ops.embedding_bag(w.double(), torch.tensor([1]), torch.tensor([0]), None, "sum",
                                 False, None), r"weight must be float32, float16 or bfloat16"),
    (lambda w: ops.embedding_bag(w, torch.tensor([1]), torch.tensor([0]), None, "sum",
                                 False, 10), r"padding_idx = 10 is out of range"),
    (lambda w: ops.embedding_bag(w, torch.tensor([1, 2]), None, None, "sum", False, None),
     r"1-D indices need offsets"),
    (lambda w: ops.embedding_bag(w, torch.tensor([1, 2]), torch.tensor([0]), torch.ones(3),
                                 "sum", False, None), r"per_sample_weights must have the shape"),
])
def test_embedding_bag_errors(call, message):
    w = torch.randn(10, 4)
    with pytest.raises(RuntimeError, match=message):
        call(w)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dim", [8, 16, 24])
def test_quantized_matches_torch(isa, rng, bits, dim):
    weight = torch.from_numpy(rng.standard_normal((40, dim)).astype(np.float32))
    if bits == 8:
        packed = torch.ops.quantized.embedding_bag_byte_prepack(weight)
        torch_op = torch.ops.quantized.embedding_bag_byte_rowwise_offsets
    else:
        packed = torch.ops.quantized.embedding_bag_4bit_prepack(weight)
        torch_op = torch.ops.quantized.embedding_bag_4bit_rowwise_offsets
    ix = torch.from_numpy(rng.integers(0, 40, 30))
    off = torch.tensor([0, 4, 4, 17])
    psw = torch.from_numpy(rng.random(30).astype(np.float32))
    got = ops.embedding_bag_quantized(packed, ix, off, psw, "sum", False, None, bits, dim)
    want = torch_op(packed, ix, off, False, 0, False, psw, None, False)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="not in the valid range"):
        ops.embedding_bag_quantized(packed, torch.tensor([40]), torch.tensor([0]), None, "sum",
                                    False, None, bits, dim)
    with pytest.raises(RuntimeError, match="do not hold dim"):
        ops.embedding_bag_quantized(packed, ix, off, None, "sum", False, None, bits, dim + 8)


def test_collection_matches_reference(isa, rng):
    tables = [torch.from_numpy(rng.standard_normal((r, d)).astype(np.float32))
              for r, d in [(20, 8), (7, 3), (30, 16)]]
    keys, batch = 4, 5
    lengths = rng.integers(0, 4, keys * batch)
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]))
    rows_of_feature = [20, 7, 30, 20]
    values = torch.from_numpy(np.concatenate([
        rng.integers(0, rows_of_feature[k], lengths[k * batch:(k + 1) * batch].sum())
        for k in range(keys)]).astype(np.int64))
    psw = torch.from_numpy(rng.random(values.numel()).astype(np.float32))
    features, table_of = [0, 1, 2, 3], [0, 1, 2, 0]
    mean, padding = [0, 1, 0], [-1, 2, -1]
    for weights in (None, psw):
        got = ops.embedding_bag_collection(tables, values, offsets, weights, keys, features,
                                           table_of, mean, padding)
        cols = []
        for f, t in zip(features, table_of):
            o = offsets[f * batch:(f + 1) * batch + 1]
            lo, hi = int(o[0]), int(o[-1])
            cols.append(reference(tables[t], values[lo:hi], o - lo,
                                  None if weights is None else weights[lo:hi],
                                  "mean" if mean[t] else "sum", True,
                                  None if padding[t] < 0 else padding[t]))
        np.testing.assert_allclose(got.numpy(), np.concatenate(cols, axis=1), rtol=1e-5,
                                   atol=1e-5)
    bad = values.clone()
    bad[-1] = 20
    with pytest.raises(RuntimeError, match="not in the valid range"):
        ops.embedding_bag_collection(tables, bad, offsets, None, keys, features, table_of, mean,
                                     padding)
    with pytest.raises(RuntimeError, match="num_keys \\* batch \\+ 1"):
        ops.embedding_bag_collection(tables, values, offsets[:-1], None, keys, features,
                                     table_of, mean, padding)


def test_native_isa_follows_use_isa():
    with perfkernels.use_isa("scalar"):
        assert _native_ops.active_level() == 0
    assert _native_ops.active_level() == perfkernels._registry.NAMES.index(perfkernels.active_isa())


def _profiled_names(fn):
    with torch.profiler.profile(record_shapes=True) as prof:
        fn()
    return {e.name: e.input_shapes for e in prof.events()}


def test_profiler_sees_eager_calls():
    m = pt.EmbeddingBag(10, 4)
    ix, off = torch.tensor([1, 2, 3]), torch.tensor([0, 1])
    with torch.no_grad():
        want = torch.nn.functional.embedding_bag(ix, m.weight, off)
        events = _profiled_names(lambda: m(ix, off))
        assert torch.allclose(m(ix, off), want)
    assert events["perfkernels::embedding_bag"][:3] == [[10, 4], [3], [2]]
    q = pt.QuantizedEmbeddingBag(10, 8)
    events = _profiled_names(lambda: q(ix, off))
    assert events["perfkernels::embedding_bag_quantized"][:3] == [[10, 16], [3], [2]]
    # not profiling: the fast path answers, and errors keep their type
    with pytest.raises(IndexError):
        m(torch.tensor([10]), torch.tensor([0]))
    with torch.profiler.profile():
        with pytest.raises(IndexError):
            m(torch.tensor([10]), torch.tensor([0]))


def test_ops_run_without_perfkernels_python():
    """Only torch and the library: no fake kernels, no autograd, no perfkernels module."""
    code = (
        "import sys, torch\n"
        f"torch.ops.load_library({pt.native_library_path()!r})\n"
        "w = torch.arange(12.).reshape(4, 3)\n"
        "out = torch.ops.perfkernels.embedding_bag(w, torch.tensor([0, 3, 1]), torch.tensor([0, 2]),"
        " None, 'sum', False, None)\n"
        "assert out.tolist() == [[9., 11., 13.], [3., 4., 5.]], out\n"
        "try:\n"
        "    torch.ops.perfkernels.embedding_bag(w, torch.tensor([4]), torch.tensor([0]), None,"
        " 'sum', False, None)\n"
        "except RuntimeError as e:\n"
        "    print('error:', e)\n"
        "assert not any(m.startswith('perfkernels') for m in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd="/")
    assert r.returncode == 0, r.stderr
    assert "Index 0 of input takes value 4 which is not in the valid range [0, 4)" in r.stdout


def test_library_without_torch_loaded_reports_why():
    """dlopen in a process without libtorch: nothing registered, a reason, no crash."""
    code = (
        "import ctypes\n"
        f"lib = ctypes.CDLL({pt.native_library_path()!r})\n"
        "lib.pk_native_status.restype = ctypes.c_char_p\n"
        "lib.pk_native_error_kind.restype = ctypes.c_char_p\n"
        "print(lib.pk_native_status().decode())\n"
        "print('error kind:', lib.pk_native_error_kind().decode())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd="/")
    assert r.returncode == 0, r.stderr
    assert "libtorch_cpu.so is not loaded" in r.stdout
    assert "error kind: std::runtime_error" in r.stdout    # no libc10 in the process


def test_bad_input_throws_c10_error():
    """A failed check throws torch's c10::Error (found in the libc10 of the process), with our
    message as its what_without_backtrace(): Python shows exactly our message, and with
    TORCH_SHOW_CPP_STACKTRACES=1 the "Exception raised from FUNCTION at FILE:LINE" that only a
    c10::Error carries (a std::runtime_error would show our message alone)."""
    lib = ctypes.CDLL(pt.native_library_path())
    lib.pk_native_error_kind.restype = ctypes.c_char_p
    assert lib.pk_native_error_kind().decode() == "c10::Error"
    code = (
        "import torch\n"
        f"torch.ops.load_library({pt.native_library_path()!r})\n"
        "w = torch.zeros(4, 3)\n"
        "for ix in (torch.tensor([0, 7]), torch.tensor([0.5])):\n"
        "    try:\n"
        "        torch.ops.perfkernels.embedding_bag(w, ix, torch.tensor([0]), None, 'sum', False,"
        " None)\n"
        "    except RuntimeError as e:\n"
        "        print(type(e).__name__, '|', str(e).replace(chr(10), ' ')[:400])\n"
    )
    expected = ["Index 1 of input takes value 7 which is not in the valid range [0, 4)",
                "perfkernels: indices must be int32 or int64; got torch.float32"]
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120, cwd="/")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines() == [f"RuntimeError | {m}" for m in expected], plain.stdout
    env = dict(os.environ, TORCH_SHOW_CPP_STACKTRACES="1", TORCH_DISABLE_ADDR2LINE="1")
    traced = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, cwd="/", env=env)
    assert traced.returncode == 0, traced.stderr
    lines = traced.stdout.splitlines()
    assert len(lines) == 2, traced.stdout
    for line, message in zip(lines, expected):
        assert line.startswith(f"RuntimeError | {message} Exception raised from "), line
        assert "perfkernels/torch/native/ops.cpp:" in line, line


FAIL_PROGRAM = r"""
#include <cstdio>
#include <cstring>
#include "torch_api.h"
#ifdef WITH_C10
#include <c10/util/Exception.h>
#endif
int main()
{
    pk_torch::load_api();   /* no libtorch_cpu: the stable ABI is missing, libc10 may be there */
    std::printf("kind %s\n", pk_torch::error_kind());
    try {
        pk_torch::raise_error("perfkernels: x = 3 is bad");
    }
#ifdef WITH_C10
    catch (const c10::Error &e) {
        std::printf("c10::Error|%s|%d\n", e.what_without_backtrace(),
                    std::strstr(e.what(), "Exception raised from main at ") != nullptr);
        return 0;
    }
#endif
    catch (const std::runtime_error &e) {
        std::printf("std::runtime_error|%s\n", e.what());
        return 0;
    }
    return 1;
}
"""


@pytest.mark.parametrize("with_c10", [True, False])
def test_fail_throws_c10_error_else_runtime_error(tmp_path, with_c10):
    """raise_error() (torch_api.cpp) in a program of its own: a c10::Error carrying exactly the
    message and raise_error()'s caller as source location when libc10 is in the process, std::runtime_error
    with the message when it is not (the fallback)."""
    from shutil import which
    torch_dir = os.path.dirname(torch.__file__)
    if which("g++") is None or not os.path.exists(
            os.path.join(torch_dir, "include", "c10", "util", "Exception.h")):
        pytest.skip("needs g++ and torch's C++ headers")
    native = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "perfkernels", "torch", "native")
    (tmp_path / "main.cpp").write_text(FAIL_PROGRAM)
    cmd = ["g++", "-std=c++17", "-O1", f"-I{native}", str(tmp_path / "main.cpp"),
           os.path.join(native, "torch_api.cpp"), "-o", str(tmp_path / "main"), "-ldl"]
    if with_c10:
        lib = os.path.join(torch_dir, "lib")
        cmd[3:3] = ["-DWITH_C10", f"-I{os.path.join(torch_dir, 'include')}"]
        cmd += [f"-L{lib}", f"-Wl,-rpath,{lib}", "-Wl,--no-as-needed", "-lc10"]
    subprocess.run(cmd, check=True, timeout=300)
    r = subprocess.run([str(tmp_path / "main")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    if with_c10:
        assert r.stdout.splitlines() == ["kind c10::Error",
                                         "c10::Error|perfkernels: x = 3 is bad|1"], r.stdout
    else:
        assert r.stdout.splitlines() == ["kind std::runtime_error",
                                         "std::runtime_error|perfkernels: x = 3 is bad"], r.stdout


@pytest.mark.parametrize("d", [1, 7, 16, 17, 65])
def test_lstm_unit_and_backward_match_float64(isa, rng, d):
    n, fb = 5, 0.5
    c_prev = torch.from_numpy(rng.standard_normal((n, d)).astype(np.float32))
    gates = torch.from_numpy(rng.standard_normal((n, 4 * d)).astype(np.float32))
    dh = torch.from_numpy(rng.standard_normal((n, d)).astype(np.float32))
    dc = torch.from_numpy(rng.standard_normal((n, d)).astype(np.float32))
    h, c = ops.lstm_unit(c_prev, gates, fb)
    c64 = c_prev.double().requires_grad_()
    g64 = gates.double().requires_grad_()
    i, f, g, o = g64.chunk(4, 1)
    rc = torch.sigmoid(f + fb) * c64 + torch.sigmoid(i) * torch.tanh(g)
    rh = torch.sigmoid(o) * torch.tanh(rc)
    torch.testing.assert_close(h.double(), rh.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c.double(), rc.detach(), rtol=1e-5, atol=1e-5)
    want_dc_prev, want_dgates = torch.autograd.grad((rh, rc), (c64, g64), (dh.double(), dc.double()))
    dc_prev, dgates = ops.lstm_unit_backward(c_prev, gates, c, dh, dc, fb)
    torch.testing.assert_close(dc_prev.double(), want_dc_prev, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dgates.double(), want_dgates, rtol=1e-4, atol=1e-5)
    # autograd through the op (registered from Python) calls the native backward
    cp, gp = c_prev.clone().requires_grad_(), gates.clone().requires_grad_()
    hh, cc = pt.lstm_unit(cp, gp, fb)
    torch.autograd.backward((hh, cc), (dh, dc))
    torch.testing.assert_close(gp.grad.double(), want_dgates, rtol=1e-4, atol=1e-5)
    with pytest.raises(RuntimeError, match=r"gates has shape \[5, 3\]; expected \[5, "):
        ops.lstm_unit(c_prev, gates[:, :3], fb)
    with pytest.raises(RuntimeError, match="c_prev must be float32; got torch.float64"):
        ops.lstm_unit(c_prev.double(), gates, fb)
