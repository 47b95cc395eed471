#!/bin/sh
# Build deploy.cpp against the torch wheel of the current Python: ./build.sh [OUTPUT]
set -e
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/deploy}
T=$(python -c 'import os, torch; print(os.path.dirname(torch.__file__))')
${CXX:-g++} -std=c++17 -O2 -D_GLIBCXX_USE_CXX11_ABI=1 "$here/deploy.cpp" -o "$out" \
    -I"$T/include" -I"$T/include/torch/csrc/api/include" -L"$T/lib" -Wl,-rpath,"$T/lib" \
    -ltorch -ltorch_cpu -lc10 -ldl
echo "$out"
