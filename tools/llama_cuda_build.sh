#!/usr/bin/env bash
# Build llama.cpp's llama-bench with CUDA for the H200 (sm_90a) from the tarball of tools/llama_cuda_src.sh, for
# side-by-side runs in the same device call (tools/gpu_check.sh starts it in the background: issue 19).
#
#   tools/llama_cuda_build.sh SRC.tgz DIR [JOBS] [CUDA_ARCH]
#
# DIR gets llama.cpp/ (the sources), build.log and, when the build ends, status ("RC SECONDS": the build's exit
# status and wall seconds, unpack and configure included); the binary is DIR/llama.cpp/build-cuda/bin/llama-bench.
# DIR/pid holds this script's pid, its process group's id when started with setsid (gpu_check.sh pauses the build
# with SIGSTOP to that group while strata's timed benches run, and ends it if it is still running at the end).
# JOBS: parallel compile jobs (default 10). CUDA_ARCH: CMAKE_CUDA_ARCHITECTURES (default 90a, the H200).
# Flags (../shared/DEVICE.md): GGML_NATIVE=ON (the host's ISA for the CPU backend), no curl, no tests, examples,
# server or unified app binary; everything else is llama.cpp's default (flash attention kernels, CUDA graphs).
# The compiler is /usr/bin/g++ where it exists, as for strata (the lent machine's first g++ is a static-libstdc++
# wrapper).
set -uo pipefail
SRC=${1:?usage: tools/llama_cuda_build.sh SRC.tgz DIR [JOBS] [CUDA_ARCH]}
DIR=${2:?usage: tools/llama_cuda_build.sh SRC.tgz DIR [JOBS] [CUDA_ARCH]}
JOBS=${3:-10}
ARCH=${4:-90a}
SRC=$(cd "$(dirname "$SRC")" && pwd)/$(basename "$SRC")
mkdir -p "$DIR" && cd "$DIR" || exit 1
rm -f status
echo $$ >pid
t0=$(date +%s)
finish() { echo "$1 $(( $(date +%s) - t0 ))" >status; exit "$1"; }
if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++; fi
{
  echo "llama_cuda_build: $SRC -> $DIR, -j $JOBS, sm_$ARCH, CXX=${CXX:-}, nvcc: $(command -v nvcc || echo none)"
  rm -rf llama.cpp && tar -xzf "$SRC" || finish 2
  cmake -S llama.cpp -B llama.cpp/build-cuda -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF || finish 3
  cmake --build llama.cpp/build-cuda --target llama-bench -j "$JOBS" || finish 4
} >build.log 2>&1
[ -x llama.cpp/build-cuda/bin/llama-bench ] || finish 5
finish 0
