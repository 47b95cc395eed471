#!/usr/bin/env bash
# One build, several torch versions: after CI's `pip install ".[test]"` (torch 2.13), install an
# older torch that the stable ABI covers into the same environment, WITHOUT rebuilding
# perfkernels, and run the torch layer's tests and the C++ deployment test with it.  The native
# library (perfkernels/torch/_native*.so) links no torch library and declares the stable C
# functions it uses itself, so the same file must load and pass under both.
#
#   .ci/old_torch.sh [VERSION]        (default 2.10.0, the first torch with the stable ABI we use)
#
# Run it from the repository root inside the CI's virtual environment, after the test command.
# It puts torch 2.13.0 back at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=${1:-2.10.0}
NEW=$(python -c 'import torch; print(torch.__version__.split("+")[0])')
LIB=$(python -c 'import perfkernels.torch as pt; print(pt.native_library_path())')
SUM_BEFORE=$(sha256sum "$LIB" | cut -d' ' -f1)
TESTS="tests/test_torch_native.py tests/test_torch_native_fused.py tests/test_torch_native_training.py tests/test_torch_layer.py tests/test_torch_compat.py tests/test_torch_hardening.py tests/test_torch_fast_path.py tests/test_torch_fused.py tests/test_torch_embedding.py tests/test_torch_route.py tests/test_optimize.py"

echo "== torch $OLD (CPU wheel) beside the build made for torch $NEW"
# The package registry's wheel of an older torch is its CUDA build: it brings NVIDIA's libraries
# (about 4 GB, a minute from the registry) and runs on the CPU without a GPU.
# FBGEMM's compiled library (the TorchRec interop step's) is built for one torch release and
# fails to load under another; it leaves for this check and the TorchRec tests skip.
# torchao 0.18 loads its compiled ops only under torch >= 2.11; its interop test is not run here.
python -m pip uninstall -q -y torchrec fbgemm-gpu-cpu torchao 2>/dev/null || true
python -m pip install -q "torch==$OLD"
python -c "import torch; assert torch.__version__.startswith('$OLD'), torch.__version__"
python -m pytest -q -p no:cacheprovider $TESTS
SUM_AFTER=$(sha256sum "$LIB" | cut -d' ' -f1)
if [ "$SUM_BEFORE" != "$SUM_AFTER" ]; then
    echo "error: the native library was rebuilt; the check must run the build made for $NEW" >&2
    exit 1
fi
echo "== back to torch $NEW"
python -m pip install -q --no-deps --force-reinstall "torch==$NEW"
