"""examples/deploy: a converted DLRM exported with torch.export, packaged by AOTInductor (and
traced to TorchScript), run by a C++ program that loads only libtorch, perfkernels' native
library and the model; its output must equal the Python model's within 1e-5, and a bad index
or index dtype must raise an exception carrying our message, not crash: a c10::Error from the op
called through torch's dispatcher, and from the model runtimes the exception they turn every
failed op into.  Minutes: AOTInductor compiles the model's C++ and the program is built against
torch's headers."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import PACKAGE_PARENT  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "examples" / "deploy"
TORCH_INCLUDE = Path(torch.__file__).parent / "include"
TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


def _skip_reason():
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        return "no C++ compiler (g++) to build examples/deploy/deploy.cpp"
    if not (TORCH_INCLUDE / "torch" / "csrc" / "inductor" / "aoti_package"
            / "model_package_loader.h").exists():
        return f"this torch wheel has no C++ headers ({TORCH_INCLUDE})"
    return None


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("deploy")
    env = dict(os.environ, PYTHONPATH=PACKAGE_PARENT)
    subprocess.run([sys.executable, str(DEPLOY / "export.py"), str(out), "--max-rows", "200",
                    "--script", "--optimize"], check=True, env=env, timeout=1800, cwd=out)
    subprocess.run(["sh", str(DEPLOY / "build.sh"), str(out / "deploy")], check=True, env=env,
                   timeout=1800)
    return out


def _run(deployed, model, *extra):
    library = (deployed / "native_library.txt").read_text().strip()
    return subprocess.run([str(deployed / "deploy"), library, str(deployed / model),
                           str(deployed / "inputs.bin"), *extra], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("model", ["converted.pt2", "converted.ts", "optimized.pt2"])
def test_cpp_output_equals_python(deployed, model):
    r = _run(deployed, model, "--expected", str(deployed / "expected.bin"))
    assert r.returncode == 0, r.stdout + r.stderr
    diff = float(r.stdout.split("max_abs_diff")[1].split()[0])
    assert diff <= 1e-5, r.stdout


BAD_INPUTS = {
    "--bad-index": "Index 0 of input takes value 1000000000 which is not in the valid range [0, ",
    "--bad-dtype": "perfkernels: indices must be int32 or int64; got torch.float32",
}


def _line(stdout, label):
    lines = [line for line in stdout.splitlines() if line.startswith(label + ": ")]
    assert lines, stdout
    return lines[0]


@pytest.mark.parametrize("flag", sorted(BAD_INPUTS))
@pytest.mark.parametrize("model", ["converted.pt2", "converted.ts"])
def test_cpp_bad_input_raises_c10_error(deployed, model, flag):
    """deploy.cpp catches `const c10::Error &` before `const std::exception &`."""
    message = BAD_INPUTS[flag]
    r = _run(deployed, model, flag)
    assert r.returncode == 0, r.stdout + r.stderr
    # the op, called from C++ through torch's dispatcher: a c10::Error whose
    # what_without_backtrace() is our message (deploy.cpp's table has 1000 rows)
    op = _line(r.stdout, "op")
    assert op.startswith("op: c10::Error: " + message), r.stdout + r.stderr
    if flag == "--bad-index":
        assert op == "op: c10::Error: " + message + "1000)", op
    # the model: AOTInductor's runner and the TorchScript interpreter catch what an op throws
    # and throw a std::runtime_error of their own (they do so for torch's own ops too).
    # TorchScript's carries the model's call stack, then "RuntimeError: " and our message.
    # AOTInductor logs the c10::Error's what() (our message, then "Exception raised from" our
    # source) on stderr; torch 2.13's runner also throws it, torch 2.10's throws "run_func_(...)
    # API call failed".
    run = r.stdout[:r.stdout.rindex("\nop: ")]
    assert run.startswith("model: std::exception: "), r.stdout + r.stderr
    if model.endswith(".pt2"):
        raised = message + ("\n" if flag == "--bad-dtype" else "200)\n") + "Exception raised from "
        assert raised in run + r.stderr, r.stdout + r.stderr
        assert "perfkernels/torch/native/ops.cpp:" in run + r.stderr, r.stdout + r.stderr
        if TORCH_VERSION >= (2, 13):
            assert run.startswith("model: std::exception: " + message), run
    else:
        assert "\nRuntimeError: " + message in run, run


def test_package_without_perfkernels_fails_to_load(deployed):
    """Without our library the package cannot run: the failure the library exists to fix."""
    code = ("import torch, sys\n"
            "from torch._inductor.package import load_package\n"
            f"m = load_package({str(deployed / 'converted.pt2')!r})\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=600, cwd="/")
    assert r.returncode != 0
    assert "perfkernels::embedding_bag" in r.stderr


def test_optimized_package_runs_the_fused_op_and_reports_a_bad_index(deployed):
    """optimize()'s package: its 26 lookups and the interaction are one native fused op (the
    package's generated code calls it by name), and a bad index reaches the C++ caller with our
    message."""
    wrapper = subprocess.run(["unzip", "-p", str(deployed / "optimized.pt2")],
                             capture_output=True, timeout=120) if shutil.which("unzip") else None
    if wrapper is not None and wrapper.returncode == 0:
        text = wrapper.stdout.decode("latin-1")
        assert "perfkernels::embedding_bags_interaction_inference" in text
        assert "perfkernels::embedding_bag_inference" not in text
    r = _run(deployed, "optimized.pt2", "--bad-index")
    assert r.returncode == 0, r.stdout + r.stderr
    message = "Index 0 of input takes value 1000000000 which is not in the valid range [0, 200)"
    assert message in r.stdout + r.stderr, r.stdout + r.stderr


def _read_tensors(path):
    """The raw format of export.py's write_tensors."""
    import struct
    data = path.read_bytes()
    (count,), pos, out = struct.unpack_from("<i", data), 4, []
    for _ in range(count):
        code, ndim = struct.unpack_from("<ii", data, pos)
        shape = struct.unpack_from(f"<{ndim}q", data, pos + 8)
        pos += 8 + 8 * ndim
        dtype = torch.float32 if code == 0 else torch.int64
        n = int(torch.Size(shape).numel()) * (4 if code == 0 else 8)
        out.append(torch.frombuffer(bytearray(data[pos:pos + n]), dtype=dtype).reshape(shape))
        pos += n
    return out


def test_cpp_runs_a_scripted_training_step(deployed):
    """The fused optimizer step is a native op too: a TorchScript training step (row-wise Adagrad
    on the first table) runs from C++ and updates the table as Python does, which is the float64
    reference's update."""
    import numpy as np
    from perfkernels import reference
    r = subprocess.run([str(deployed / "deploy"), (deployed / "native_library.txt").read_text()
                        .strip(), str(deployed / "train_step.ts"),
                        str(deployed / "train_inputs.bin"), "--expected",
                        str(deployed / "train_expected.bin")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    diff = float(r.stdout.split("max_abs_diff")[1].split()[0])
    assert diff <= 1e-5, r.stdout
    weight, state, indices, offsets, grad = _read_tensors(deployed / "train_inputs.bin")
    (after,) = _read_tensors(deployed / "train_expected.bin")
    want = reference.embedding_bag_backward_update(
        weight.numpy(), indices.numpy(), offsets.numpy(), grad_output=grad.numpy(),
        optimizer="rowwise_adagrad", state=state.numpy(), lr=0.05)
    assert want.touched.any()
    np.testing.assert_allclose(after.numpy(), want.weight, rtol=1e-5, atol=1e-6)
