#!/usr/bin/env bash
# A fuzzing campaign of a given length over one harness (docs/FUZZING.md).
#
#   tools/fuzz.sh HARNESS SECONDS [libFuzzer flags...]     HARNESS: gguf | checkpoint | python
#   tools/fuzz.sh merge HARNESS                            minimise the campaign corpus into build/fuzz/merged/
#   tools/fuzz.sh coverage HARNESS                         line coverage of the campaign corpus (llvm-cov)
#
# gguf / checkpoint: libFuzzer harnesses fuzz/fuzz_{gguf,checkpoint}.cpp built with clang
# (-fsanitize=fuzzer,address,undefined) into build/fuzz; python: the atheris harness fuzz/fuzz_python.py
# over the normal build. Seeds come from real files (fuzz/make_seeds.py); the campaign corpus grows in
# build/fuzz/corpus/HARNESS, crashes land in build/fuzz/artifacts/HARNESS/. Copy a crash (and a few
# small corpus inputs) into tests/fuzz_corpus/HARNESS/: tests/test_fuzz_corpus.py runs every file there
# against the normal build. Runs at nice 19, one job: the machine is shared.
#
# Environment (of this script, not of strata): CXX (default clang++-19, else clang++), PYTHON (default
# python).
set -euo pipefail
cd "$(dirname "$0")/.."
B=build/fuzz
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python)}
CXX=${CXX:-$(command -v clang++-19 || command -v clang++ || true)}

usage() { sed -n '4,7p' "$0" >&2; exit 2; }
# the models checkpoints are read for (their fingerprints pick one per input): tests/fuzz_corpus/*-base.gguf
models=(-model=tests/fuzz_corpus/micro-base.gguf -model=tests/fuzz_corpus/qwen4exp-micro-base.gguf)
[ $# -ge 2 ] || usage

build() {
  [ -n "$CXX" ] || { echo "fuzz.sh: clang++ not found (Debian: apt-get install clang-19 libclang-rt-19-dev)" >&2; exit 1; }
  CXX=$CXX cmake -S fuzz -B $B -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  nice -n 10 cmake --build $B -j2 --target "fuzz_$1"
}

if [ "$1" = merge ]; then
  h=$2
  mkdir -p $B/merged/$h
  case $h in
    gguf) $B/fuzz_gguf -merge=1 $B/merged/$h $B/corpus/$h ;;
    checkpoint) $B/fuzz_checkpoint -merge=1 $B/merged/$h $B/corpus/$h -ignore_remaining_args=1 "${models[@]}" ;;
    python) $PY fuzz/fuzz_python.py "${models[@]}" -merge=1 $B/merged/$h $B/corpus/$h ;;
    *) usage ;;
  esac
  exit 0
fi

if [ "$1" = coverage ]; then  # the C++ harnesses: replay the corpus once through an llvm-cov build
  h=$2 C=build/fuzz-cov
  CXX=$CXX cmake -S fuzz -B $C -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_FUZZ_COVERAGE=ON >/dev/null
  nice -n 10 cmake --build $C -j2 --target "fuzz_$h"
  rm -f $C/$h.profraw
  extra=(); [ "$h" = checkpoint ] && extra=(-ignore_remaining_args=1 "${models[@]}")
  LLVM_PROFILE_FILE=$C/$h.profraw nice -n 19 $C/fuzz_$h -runs=0 -max_len=262144 -rss_limit_mb=3072 \
    $B/corpus/$h $B/seeds/$h tests/fuzz_corpus/$h "${extra[@]}" >/dev/null 2>&1
  V=${CXX##*clang++}
  llvm-profdata$V merge -o $C/$h.profdata $C/$h.profraw
  exec llvm-cov$V report $C/fuzz_$h -instr-profile=$C/$h.profdata "$(pwd)/csrc" -ignore-filename-regex='kernels/'
fi

h=$1 secs=$2
shift 2
$PY fuzz/make_seeds.py $B/seeds
mkdir -p $B/corpus/$h $B/artifacts/$h tests/fuzz_corpus/$h
# -malloc_limit_mb: the bar is no allocation over 1 GiB beyond the file size (inputs are at most 256 KiB)
flags=(-max_total_time="$secs" -timeout=5 -rss_limit_mb=3072 -malloc_limit_mb=1100 -max_len=262144
       -artifact_prefix=$B/artifacts/$h/ -print_final_stats=1 "$@")
dirs=($B/corpus/$h $B/seeds/$h tests/fuzz_corpus/$h)
case $h in
  gguf)
    build gguf
    exec nice -n 19 $B/fuzz_gguf "${flags[@]}" "${dirs[@]}" ;;
  checkpoint)
    build checkpoint
    exec nice -n 19 $B/fuzz_checkpoint "${flags[@]}" "${dirs[@]}" -ignore_remaining_args=1 "${models[@]}" ;;
  python)
    exec nice -n 19 $PY fuzz/fuzz_python.py "${models[@]}" "${flags[@]}" "${dirs[@]}" ;;
  *) usage ;;
esac
