#!/usr/bin/env bash
# A fuzzing campaign of a given length over one harness (docs/FUZZING.md).
#
#   tools/fuzz.sh HARNESS SECONDS [libFuzzer flags...]     HARNESS: gguf | checkpoint | python
#   tools/fuzz.sh merge HARNESS                            minimise the campaign corpus into build/fuzz/merged/
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

usage() { sed -n '4,6p' "$0" >&2; exit 2; }
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
    checkpoint) $B/fuzz_checkpoint -merge=1 $B/merged/$h $B/corpus/$h -ignore_remaining_args=1 -model=$B/seeds/micro.gguf ;;
    python) $PY fuzz/fuzz_python.py -model=$B/seeds/micro.gguf -merge=1 $B/merged/$h $B/corpus/$h ;;
    *) usage ;;
  esac
  exit 0
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
    exec nice -n 19 $B/fuzz_checkpoint "${flags[@]}" "${dirs[@]}" -ignore_remaining_args=1 -model=$B/seeds/micro.gguf ;;
  python)
    exec nice -n 19 $PY fuzz/fuzz_python.py -model=$B/seeds/micro.gguf "${flags[@]}" "${dirs[@]}" ;;
  *) usage ;;
esac
