#!/usr/bin/env bash
# A trimmed tarball of llama.cpp's sources, small enough to carry to the lent GPU machine (issue 19): the llama.cpp
# that llama-cpp-python 0.3.36 vendors, with only what a CUDA build of llama-bench needs.
#
#   tools/llama_cuda_src.sh [OUT.tgz] [WORK_DIR]
#
# OUT.tgz: default scratch/dev/llama-cuda-src.tgz (scratch/ is git-ignored; carry it with the device tool's `carry`).
# WORK_DIR: where the sdist is downloaded and unpacked (default: a temporary folder, removed at the end).
# The tarball unpacks to llama.cpp/ (CMakeLists.txt, cmake/, include/, src/, common/, ggml/ without the other GPU
# backends, tools/ without the server's web UI, vendor/, app/, licenses/: ../shared/DEVICE.md), ~8 MB against the
# sdist's 76 MB (its models/, docs/, tests/ and the Metal / Vulkan / SYCL / ... backends stay behind).
# tools/gpu_check.sh LLAMA_SRC builds it with tools/llama_cuda_build.sh.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$ROOT/scratch/dev/llama-cuda-src.tgz}
VERSION=0.3.36
if [ -n "${2:-}" ]; then WORK=$2; mkdir -p "$WORK"; else WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT; fi
SDIST=$WORK/llama_cpp_python-$VERSION.tar.gz
if [ ! -f "$SDIST" ]; then
  # --no-binary for this one package only (not :all:, which would build its build requirements from source too)
  python3 -m pip download -q --no-deps --no-build-isolation --no-binary llama-cpp-python \
    "llama-cpp-python==$VERSION" -d "$WORK"
fi
[ -f "$SDIST" ] || { echo "llama_cuda_src: $SDIST was not downloaded" >&2; exit 1; }
rm -rf "$WORK/llama_cpp_python-$VERSION"
tar -xzf "$SDIST" -C "$WORK"
SRC=$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp
[ -f "$SRC/CMakeLists.txt" ] || { echo "llama_cuda_src: no vendor/llama.cpp/CMakeLists.txt in $SDIST" >&2; exit 1; }

STAGE=$WORK/stage
rm -rf "$STAGE"; mkdir -p "$STAGE/llama.cpp"
# what the top-level CMakeLists.txt adds with tests, examples, the server and the app off
for d in CMakeLists.txt LICENSE cmake include src common ggml tools vendor app licenses; do
  cp -a "$SRC/$d" "$STAGE/llama.cpp/"
done
# ggml's backends other than the CPU and CUDA ones (ggml_add_backend adds a backend's folder only when it is enabled)
for b in blas cann et hexagon hip metal musa opencl openvino rpc sycl virtgpu vulkan webgpu zdnn zendnn; do
  rm -rf "$STAGE/llama.cpp/ggml/src/ggml-$b"
done
# the web UI (8.5 MB, only with LLAMA_BUILD_SERVER), ggml's own tests and examples (only when ggml is the top project)
rm -rf "$STAGE/llama.cpp/tools/ui" "$STAGE/llama.cpp/ggml/tests" "$STAGE/llama.cpp/ggml/examples"
echo "llama-cpp-python $VERSION vendor/llama.cpp, trimmed by strata tools/llama_cuda_src.sh" >"$STAGE/llama.cpp/STRATA_SOURCE"

mkdir -p "$(dirname "$OUT")"
tar -czf "$OUT" -C "$STAGE" llama.cpp
echo "$OUT: $(du -h "$OUT" | cut -f1) ($(tar -tzf "$OUT" | wc -l) entries)"
