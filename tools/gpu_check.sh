#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (the lent H200), in one call: build strata with the CUDA backend, run the GPU
# tests and the GPU benchmark, and write a short table and a JSON (issue 19).
#
#   tools/gpu_check.sh OUT [COMMIT] [GGUF_WHEEL] [BENCH_ARGS] [BENCH_CAP_S] [FORWARD] [LLAMA_SRC] [TESTS_CAP_S]
#
# OUT gets build.log, tests.log, junit.xml, bench_cuda.json, bench_forward.json, bench_spec.json, bench_mtp.json, nvidia-smi.txt,
# gpu_check.txt (the table) and gpu-h200.json (the issue's keys, null for what is not measured yet; commit it as
# docs/results/gpu-h200.json); with LLAMA_SRC also bench_llama.json and llama_build.log.
# COMMIT: the source's commit, for the JSON (default: git rev-parse HEAD, where the tree is a checkout).
# GGUF_WHEEL: wheels to install (the lent machine has no gguf, no llguidance and no network).
# BENCH_ARGS: more arguments for bench/bench_cuda.py (e.g. "--types Q4_K,IQ2_XXS" to fit a short call).
# BENCH_CAP_S: stop the bench after this many seconds (it saves its JSON after every row, so the table and JSON
# still come out with what it measured: the ops first, then the products). The GPU tests run under a 5-minute cap
# (a hung kernel must not eat the whole call).
# FORWARD: the model files for bench/bench_gpu_forward.py (the whole forward on the GPU: decode tok/s, C(T)), a comma
# list of "default" (the shipped model), "bench" (`synth bench --type q4_k`, written here), "80b" (`synth 80b --type
# iq2_xxs`, 19.3 GiB, written here alongside the build; also run with a GPU expert budget of 25 %: stream25),
# "80bq4km" (`synth 80b --type q4_k_m`, the issue's Q4_K_M-like mix, ~45 GiB, written alongside the build, also run at
# a 25 % expert budget: not with "80b", the two do not fit the lent machine's 64 GiB disk together; the *_80b_q4km
# keys); "" skips the step.
# Default: "default,bench". Then the edit workload of
# bench/bench_spec.py on the GPU (the shipped model, suffix-drafted vs plain: edit_speedup) and its free-form code
# workload MTP-drafted vs plain (mtp_speedup).
# LLAMA_SRC: the llama.cpp source tarball of tools/llama_cuda_src.sh (e.g. scratch/dev/llama-cuda-src.tgz; "" or
# absent: none). At the start of the call tools/llama_cuda_build.sh builds llama-bench with CUDA for sm_90a in the
# background (its own session, nice 10, 14 jobs: strata's build and tests keep the priority) while strata builds
# and tests; it is paused (SIGSTOP) while strata's timed benches run, so that they do not share the CPU with the
# compiler. After them the call waits for the build until LLAMA_WAIT_S after its start; then
# bench/bench_llama_cuda.py runs llama-bench -ngl 99 pp512 and tg128 (-r 3) on the FORWARD files and -ot exps=CPU
# tg64 on the 80B file, stopping at LLAMA_END_S. The JSON's llama.cpp ratios use those same-call figures (issue
# 19's earlier figures only as a labelled fallback: llamacpp_sources). A build not done in time is stopped; every
# other output is written as without LLAMA_SRC.
# LLAMA_SRC may also be the folder of a finished tools/llama_cuda_build.sh run (its status "0 SECONDS" and the binary:
# an earlier call's build on the same warm machine, /tmp/llama-cuda): then nothing is built and llama-bench runs
# after strata's benches as above. The 80B file is written only where it is not there yet (synth writes it under
# a temporary name and renames it when complete, so an existing file is a whole one).
# TESTS_CAP_S: the GPU tests' time cap (default 300; 0 runs none). tests/test_cuda_forward.py runs first (the
# windows_bit_identical key; its session tests run first: --run-first), so a short cap still answers it.
# The compiler is /usr/bin/g++ unless CXX says otherwise: the g++ first on the lent machine's PATH links libstdc++
# statically and the extension then crashes at its first std::ostringstream (../shared/DEVICE.md).
set -uo pipefail
OUT=$(mkdir -p "${1:?usage: tools/gpu_check.sh OUT [COMMIT] [GGUF_WHEEL]}" && cd "$1" && pwd)
LLAMA_SRC=${7:-}
[ -z "$LLAMA_SRC" ] || LLAMA_SRC=$(cd "$(dirname "$LLAMA_SRC")" && pwd)/$(basename "$LLAMA_SRC") || exit 1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
COMMIT=${2:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
T0=$(date +%s)
# the call's plan in seconds after its start (the device tool's limit is 600 s a command): llama's runs start by
# LLAMA_WAIT_S and end by LLAMA_END_S, which leaves time for the JSON and the caller's packing under a 560 s limit
LLAMA_WAIT_S=470 LLAMA_END_S=545
LLAMA_DIR=/tmp/llama-cuda
LLAMA_PGID=
TESTS_CAP_S=${8:-300}
LLAMA_PREBUILT=0
if [ -n "$LLAMA_SRC" ] && [ -d "$LLAMA_SRC" ]; then
  [ "$(cut -d' ' -f1 "$LLAMA_SRC/status" 2>/dev/null)" = 0 ] && [ -x "$LLAMA_SRC/llama.cpp/build-cuda/bin/llama-bench" ] ||
    { echo "LLAMA_SRC: $LLAMA_SRC holds no finished llama-bench build (status, llama.cpp/build-cuda/bin/llama-bench)"; exit 1; }
  LLAMA_DIR=$LLAMA_SRC LLAMA_PREBUILT=1
  echo "llama.cpp: the build in $LLAMA_DIR ($(cat "$LLAMA_DIR/status"): rc, seconds), not rebuilt"
elif [ -n "$LLAMA_SRC" ]; then
  [ -f "$LLAMA_SRC" ] || { echo "LLAMA_SRC: no such file: $LLAMA_SRC"; exit 1; }
  rm -rf "$LLAMA_DIR"; mkdir -p "$LLAMA_DIR"
  setsid nice -n 10 bash tools/llama_cuda_build.sh "$LLAMA_SRC" "$LLAMA_DIR" 14 90a </dev/null >/dev/null 2>&1 &
  # under setsid the build script is its session's and process group's leader: its pid is the group's id
  for _ in $(seq 50); do [ -s "$LLAMA_DIR/pid" ] && break; sleep 0.1; done
  LLAMA_PGID=$(cat "$LLAMA_DIR/pid" 2>/dev/null)
  echo "llama.cpp build started in the background (process group ${LLAMA_PGID:-?}, log: llama_build.log)"
fi
llama_building() { [ -n "$LLAMA_SRC" ] && [ ! -f "$LLAMA_DIR/status" ]; }
llama_signal() { [ -n "$LLAMA_PGID" ] && kill "-$1" -- "-$LLAMA_PGID" 2>/dev/null; }
LLAMA_PAUSED=0
llama_pause() { llama_building && llama_signal STOP && LLAMA_PAUSED=1 && echo "llama.cpp build paused"; true; }
llama_resume() { llama_signal CONT; true; }
# a call that ends early (a failed strata build, say) leaves no compiler running on the lent machine
trap 'if llama_building; then llama_resume; llama_signal TERM; fi' EXIT
PY=${PYTHON:-python3}
SITE=/tmp/strata-gpu-site
# Not ${CXX:-...}: the lent machine's environment may name its wrapper already.
if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++; fi
export CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
echo "compilers: CXX=${CXX:-} CC=${CC:-} CUDAHOSTCXX=${CUDAHOSTCXX:-} ($(${CXX:-g++} --version | head -1))"
mkdir -p "$SITE"
# GGUF_WHEEL: one wheel or several (space-separated: gguf, and llguidance for the decode tests), installed into SITE
if [ -n "${3:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --target "$SITE" $3 || exit 1
elif ! $PY -c "import gguf" 2>/dev/null; then
  echo "gguf is missing: pass a gguf wheel"; exit 1
fi
# the 80B file (pure Python: no strata build needed) is written while strata builds and tests
FORWARD=${6-default,bench}
SYNTH80=/tmp/synth-80b-iq2_xxs.gguf
SYNTHQ=/tmp/synth-80b-q4_k_m.gguf
if [[ ",$FORWARD," == *",80b,"* && ",$FORWARD," == *",80bq4km,"* ]]; then
  echo "FORWARD: 80b and 80bq4km together (19.3 + ~45 GiB) do not fit the lent machine's disk: one a call"; exit 1
fi
# synth_80b FILE TYPE LOG: the 80B file written in the background (SYNTH_PID) while strata builds and tests, unless an
# earlier call on this machine left it (synth writes under a temporary name and renames the complete file)
synth_80b() {
  if [ -f "$1" ]; then
    echo "synth 80b $2: $1 is there already (an earlier call on this machine), not written again" >"$OUT/$3"
    return
  fi
  ( t=$(date +%s); PYTHONPATH="$SITE:$ROOT/python" nice -n 5 $PY -m strata_py.synth 80b "$1" --type "$2" \
      >"$OUT/$3" 2>&1 && echo "synth 80b $2: $(( $(date +%s) - t )) s (alongside the build)" >>"$OUT/$3" ) &
  SYNTH_PID=$!
}
SYNTH_PID=
if [[ ",$FORWARD," == *",80b,"* ]]; then
  synth_80b $SYNTH80 iq2_xxs synth80b.log
elif [[ ",$FORWARD," == *",80bq4km,"* ]]; then
  rm -f $SYNTH80  # an earlier call's IQ2_XXS file: the disk holds one of the two
  synth_80b $SYNTHQ q4_k_m synth80bq.log
fi

t0=$(date +%s)
$PY -m pip install -v --no-build-isolation --no-deps --target "$SITE" --upgrade -Ccmake.define.STRATA_CUDA=ON \
  -Cbuild-dir=/tmp/strata-gpu-build . >"$OUT/build.log" 2>&1
build_rc=$?
build_s=$(( $(date +%s) - t0 ))
echo "build: rc $build_rc in ${build_s} s (log: build.log)"
[ $build_rc -eq 0 ] || { tail -40 "$OUT/build.log"; exit 1; }
export PYTHONPATH=$SITE
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
grep -E "strata: CUDA|Linking|static-libstdc" "$OUT/build.log" | cut -c1-300 | tail -4
if ! $PY -c "from strata_py import _core; print(_core.cuda_info())"; then  # a crash here: show where
  command -v cuda-gdb >/dev/null && cuda-gdb -batch -ex run -ex bt --args $PY -c \
    "from strata_py import _core; print(_core.cuda_info())" 2>&1 | tail -25
  exit 1
fi

t0=$(date +%s)
# SIGINT at the cap: pytest stops as on ^C and still writes junit.xml and the slowest tests for what ran (rc 124).
# Not the test that compiles every CUDA source again one by one (CI runs it; the build above compiled them all, and
# here it took 148 s of the 300, with llama.cpp's build beside it).
TESTS=(tests/test_cuda_forward.py tests/test_cuda_*.py tests/test_backend.py tests/test_backend_forward.py
       tests/test_backend_mtp.py tests/test_backend_session_reuse.py
       tests/test_backend_experts.py --deselect tests/test_cuda_build.py::test_every_cuda_source_compiles)
if [ "$TESTS_CAP_S" -gt 0 ]; then
  # the test ids first: a key whose tests all ran and passed before the cap still reads true
  $PY -m pytest -q -p no:cacheprovider --collect-only "${TESTS[@]}" 2>/dev/null | grep '::' >"$OUT/collected.txt"
  # the tests of the JSON's session keys first (windows_bit_identical, gpu_decode_equals_cpu), then the layer ops'
  # (layer_ops_equal_cpu), then the rest in file order: a capped run still answers those keys
  FIRST=test_gpu_session_windows,test_gpu_session_long_prompt,test_gpu_speculative_equals_plain,test_gpu_decode
  FIRST+=,test_add_silu_mul_mul_sigmoid_equal_cpu,test_conv_silu_equals_cpu_and_rows,test_dn_gates_equal_cpu_and_rows
  FIRST+=,test_dn_heads_equal_cpu_and_rows,test_gated_norm_and_norm_rope_equal_cpu_and_rows
  FIRST+=,test_moe_combine_equals_cpu_and_rows,test_dn_untile_retile_equal_cpu,test_matmul_sel_equals_cpu_and_one_row_products
  timeout -s INT -k 30 "$TESTS_CAP_S" $PY -m pytest -q -p no:cacheprovider "${TESTS[@]}" --durations=15 \
    --run-first "$FIRST" --junitxml="$OUT/junit.xml" >"$OUT/tests.log" 2>&1
  tests_rc=$?
  tail -15 "$OUT/tests.log"
else
  tests_rc=125; echo "GPU tests: not run (TESTS_CAP_S 0)"  # 125: the JSON's tests keys say "not run"
fi
tests_s=$(( $(date +%s) - t0 ))

models=()
streams=()  # the 80B file also with its experts streamed into a GPU budget of 25 % (prefetch on), from pinned host
            # memory and from the file
for f in ${FORWARD//,/ }; do
  case $f in
    default) models+=("$ROOT/python/strata_py/data/strata-default-q8_0.gguf") ;;
    bench) $PY -m strata_py.synth bench /tmp/synth-bench-q4_k.gguf --type q4_k >/dev/null && models+=(/tmp/synth-bench-q4_k.gguf) ;;
    80b) { [ -z "$SYNTH_PID" ] || wait $SYNTH_PID; } && models+=($SYNTH80) && streams+=(--stream $SYNTH80:0.25:on:host --stream $SYNTH80:0.25:on:file); tail -1 "$OUT/synth80b.log" ;;
    80bq4km) { [ -z "$SYNTH_PID" ] || wait $SYNTH_PID; } && models+=($SYNTHQ) && streams+=(--stream $SYNTHQ:0.25:on:host --stream $SYNTHQ:0.25:on:file)
             tail -1 "$OUT/synth80bq.log" ;;
  esac
done

# strata's timed benches, with llama's build paused (the forward's host side is part of what is timed)
paused_at=$(date +%s)
llama_pause
PYTHONUNBUFFERED=1 timeout ${5:-100000} $PY bench/bench_cuda.py --json "$OUT/bench_cuda.json" ${4:-}
bench_rc=$?
if [ ${#models[@]} -gt 0 ]; then
  PYTHONUNBUFFERED=1 $PY bench/bench_gpu_forward.py "${models[@]}" ${streams[@]+"${streams[@]}"} \
    --json "$OUT/bench_forward.json" || bench_rc=1
fi
# edit_speedup: the shipped model on the GPU, suffix drafts vs plain (the same output, else rc 1). --repeat 9: a
# round of 128 tokens takes well under a second here, and session 17's rounds of --repeat 2 spread 1.71-2.07x
PYTHONUNBUFFERED=1 timeout 120 $PY bench/bench_spec.py --backend cuda --workloads edit --drafts suffix --repeat 9 \
  --json "$OUT/bench_spec.json" 2>&1 | tail -8 || bench_rc=1
# mtp_speedup: the same, MTP drafts on the free-form code workload
PYTHONUNBUFFERED=1 timeout 120 $PY bench/bench_spec.py --backend cuda --workloads free --drafts mtp --repeat 9 \
  --json "$OUT/bench_mtp.json" 2>&1 | tail -8 || bench_rc=1
llama_resume
paused_s=$(( LLAMA_PAUSED * ($(date +%s) - paused_at) ))  # 0 when the build was done before the benches

if [ -n "$LLAMA_SRC" ]; then
  while llama_building && [ $(( $(date +%s) - T0 )) -lt $LLAMA_WAIT_S ]; do sleep 2; done
  if llama_building; then
    echo "llama.cpp build not done $(( $(date +%s) - T0 )) s into the call: stopped"
    llama_signal TERM
    echo "-1 $(( $(date +%s) - T0 ))" >"$LLAMA_DIR/status"  # -1: stopped unfinished
  fi
  cp "$LLAMA_DIR/build.log" "$OUT/llama_build.log" 2>/dev/null
  [ -f "$LLAMA_DIR/status" ] && echo "llama.cpp build: rc $(cut -d' ' -f1 "$LLAMA_DIR/status") in $(cut -d' ' -f2 "$LLAMA_DIR/status") s"
  lm=(); ot=()  # the 80B file first (the issue's main figures), then the others; its experts-on-CPU run last
  for m in "${models[@]}"; do
    if [[ $m == *synth-80b* ]]; then lm=("$m" "${lm[@]}"); ot=(--experts-on-cpu "$m"); else lm+=("$m"); fi
  done
  PYTHONUNBUFFERED=1 $PY bench/bench_llama_cuda.py --bin "$LLAMA_DIR/llama.cpp/build-cuda/bin/llama-bench" \
    --build-status "$LLAMA_DIR/status" --build-paused-s "$paused_s" --deadline-s $(( LLAMA_END_S - ($(date +%s) - T0) )) \
    --json "$OUT/bench_llama.json" "${lm[@]}" "${ot[@]}" || bench_rc=1
fi

$PY - "$OUT" "$COMMIT" "$build_s" "$tests_rc" "$tests_s" "$TESTS_CAP_S" <<'PYEOF'
"""gpu-h200.json (issue 19's keys) and gpu_check.txt from junit.xml and the benches' JSON."""
import json, sys, time
import xml.etree.ElementTree as ET
from pathlib import Path
out, commit, build_s, tests_rc, tests_s = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
tests_cap = int(sys.argv[6])
if tests_rc == 125:  # not run (TESTS_CAP_S 0): the tests' keys are null
    n, fail, err, skip, cases = 0, 0, 0, 0, {}
elif (out / "junit.xml").exists():
    suite = ET.parse(out / "junit.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    n, fail, err, skip = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    # a test cut off by the cap is written without a name
    cases = {c.get("name"): c for c in suite.iter("testcase") if c.get("name")}
else:  # pytest killed without its report: nothing passed
    n, fail, err, skip, cases = 0, 0, 1, 0, {}
capped = tests_rc == 124  # stopped at the cap (TESTS_CAP_S): the tests after it did not run
collected = ({line.split("::", 1)[1].strip() for line in (out / "collected.txt").read_text().splitlines()}
             if (out / "collected.txt").exists() else set())
def passed(prefix):
    """Whether the tests named prefix* passed: False on a failure; where the cap cut the run, True only if every
    collected test of that name ran (and passed), else None."""
    sel = [c for name, c in cases.items() if name and name.startswith(prefix)]
    if any(len(c) for c in sel):
        return False
    if capped:
        want = {n for n in collected if n.startswith(prefix)}
        return True if want and want <= set(cases) else None
    return bool(sel)
def every(results):
    """passed() over several prefixes: False if one failed, else None if one is unknown, else True."""
    results = list(results)
    return False if False in results else None if None in results else True
bench = json.loads((out / "bench_cuda.json").read_text()) if (out / "bench_cuda.json").exists() else {}
def load(name):
    return json.loads((out / name).read_text()) if (out / name).exists() else {}
fwd, spec, lb = load("bench_forward.json"), load("bench_spec.json"), load("bench_llama.json")
mtpb = {r["draft"]: r for r in load("bench_mtp.json").get("results", []) if r["workload"] == "free"}
fm = {r["model"]: r for r in fwd.get("models", []) if "error" not in r}  # every expert resident
# the experts streamed from pinned host memory into a GPU budget of 25 % of their bytes (bench_gpu_forward.py
# --stream FILE:0.25 rows; prefetch on, the default, where both ways ran)
stream25, stream25_file = {}, {}  # (the experts read from the GGUF through the staging ring: a row of its own)
for r in sorted(fwd.get("streamed", []), key=lambda r: r.get("prefetch") is True):
    if r.get("cache_frac") == 0.25 and "decode_tok_s" in r:
        (stream25_file if r.get("source") == "file" else stream25)[r["model"]] = r
def fwd_key(model, key, t=None):
    r = fm.get(model)
    if r is None or key not in r:
        return None
    return r[key] if t is None else r[key][str(t)]
R80, RB, RD = "synth-80b-iq2_xxs.gguf", "synth-bench-q4_k.gguf", "strata-default-q8_0.gguf"
RQ = "synth-80b-q4_k_m.gguf"  # FORWARD 80bq4km: the issue's Q4_K_M-like mix of the 80B
# llama.cpp CUDA on the same files: this call's llama-bench (bench/bench_llama_cuda.py) where it ran; else, labelled,
# issue 19's figures from an earlier run on this machine kind (2026-12-01)
# the fallback where this call ran no llama.cpp: its figures from the 345e6b1 call (2026-12-02 05:48 UTC, the same
# machine kind, llama-cpp-python 0.3.36's llama.cpp built there with CUDA for sm_90a)
ANCHOR = {R80: {"tg128": 181.5, "pp512": 2857.0, "tg64_experts_on_cpu": 31.3}, RB: {"tg128": 543.5, "pp512": 21596.0},
          RD: {"tg128": 1901.5, "pp512": 81060.0}}
ANCHOR_LABEL = "llama.cpp measured in the 345e6b1 call (2026-12-02, the same machine kind), not this call"
same = {}
for r in lb.get("runs", []):
    f = same.setdefault(r["model"], {})
    if "-ot exps=CPU" in r["args"]:
        f["tg64_experts_on_cpu"] = r.get("tg64_tok_s")
    else:
        f["tg128"], f["pp512"] = r.get("tg128_tok_s"), r.get("pp512_tok_s")
def llama(model, key):
    """(llama.cpp's tok/s, where it comes from)"""
    v = same.get(model, {}).get(key)
    if v:
        return v, "this call"
    v = ANCHOR.get(model, {}).get(key)
    return (v, ANCHOR_LABEL) if v else (None, None)
sources = {}
def ratio(name, strata, model, key):
    """strata's tok/s over llama.cpp's on the same file (None where either is missing); notes the source"""
    v, src = llama(model, key)
    if strata is None or v is None:
        return None
    sources[name] = f"llama.cpp {key} on {model}: {src}"
    return strata / v
s25 = stream25.get(R80, {}).get("decode_tok_s")
s25q = stream25.get(RQ, {}).get("decode_tok_s")
edit = {r["draft"]: r for r in spec.get("results", []) if r["workload"] == "edit"}
prods = bench.get("products", [])
def c_ratio(shape, typ, t):
    for p in prods:
        if p["shape"] == shape and p["type"] == typ:
            return p["c_over_c1"][p["T"].index(t)]
    return None
res = {
    "date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": commit, "device": bench.get("device"),
    # the issue's keys (bench/bench_gpu_forward.py; null: not measured in this call). decode_ratio_vs_llamacpp: the
    # 80B IQ2_XXS file's decode tok/s over llama.cpp's tg128 on it (llamacpp_sources: this call's or the anchor)
    "decode_ratio_vs_llamacpp": ratio("decode_ratio_vs_llamacpp", fwd_key(R80, "decode_tok_s"), R80, "tg128"),
    "decode_ratio_vs_llamacpp_bench_q4k": ratio("decode_ratio_vs_llamacpp_bench_q4k", fwd_key(RB, "decode_tok_s"),
                                                RB, "tg128"),
    "decode_ratio_vs_llamacpp_default": ratio("decode_ratio_vs_llamacpp_default", fwd_key(RD, "decode_tok_s"),
                                              RD, "tg128"),
    # strata's 512-token prompt (one prompt window) over llama-bench's pp512, on the 80B file
    "prefill_ratio_vs_llamacpp": ratio("prefill_ratio_vs_llamacpp", fwd_key(R80, "prefill_tok_s"), R80, "pp512"),
    "hbm_floor_fraction": fwd_key(R80, "hbm_floor_fraction"), "c4_over_c1_real80b": fwd_key(R80, "c_over_c1", 4),
    # the same for the Q4_K_M-like 80B file (FORWARD 80bq4km; null where it did not run)
    "decode_ratio_vs_llamacpp_80b_q4km": ratio("decode_ratio_vs_llamacpp_80b_q4km", fwd_key(RQ, "decode_tok_s"), RQ,
                                               "tg128"),
    "prefill_ratio_vs_llamacpp_80b_q4km": ratio("prefill_ratio_vs_llamacpp_80b_q4km", fwd_key(RQ, "prefill_tok_s"), RQ,
                                                "pp512"),
    "hbm_floor_fraction_80b_q4km": fwd_key(RQ, "hbm_floor_fraction"),
    "c4_over_c1_80b_q4km": fwd_key(RQ, "c_over_c1", 4),
    "c4_over_c1_default": fwd_key(RD, "c_over_c1", 4), "c16_over_c1_default": fwd_key(RD, "c_over_c1", 16),
    # the shipped model on the GPU, bench_spec.py's edit workload: suffix-drafted over plain tok/s (the same output:
    # edit_identical); MTP does not run on the GPU backend yet
    "edit_speedup": edit["suffix"]["speedup"] if "suffix" in edit else None,
    "edit_identical": edit["suffix"]["identical"] if "suffix" in edit else None,
    # the same model and backend, bench_spec.py's free-form code workload: MTP-drafted over plain tok/s
    "mtp_speedup": mtpb["mtp"]["speedup"] if "mtp" in mtpb else None,
    "mtp_identical": mtpb["mtp"]["identical"] if "mtp" in mtpb else None,
    # the 80B file with a GPU expert budget of 25 % (experts streamed from host memory) over llama.cpp -ot exps=CPU
    "stream25_ratio_vs_llamacpp": ratio("stream25_ratio_vs_llamacpp", s25, R80, "tg64_experts_on_cpu"),
    # the same for the Q4_K_M-like 80B file (FORWARD 80bq4km)
    "stream25_ratio_vs_llamacpp_80b_q4km": ratio("stream25_ratio_vs_llamacpp_80b_q4km", s25q, RQ,
                                                 "tg64_experts_on_cpu"),
    # the GPU session's logits == the CPU session's bit for bit (T = 1, prompt and verify windows with random keeps,
    # 5 models), and suffix-drafted == plain decoding on the GPU (tests/test_cuda_forward.py)
    "windows_bit_identical": every(passed(p) for p in ("test_gpu_session_windows", "test_gpu_session_long_prompt",
                                                        "test_gpu_speculative_equals_plain")) if cases else None,
    "gpu_decode_equals_cpu": passed("test_gpu_decode") if cases else None,
    "layer_ops_equal_cpu": every(passed(p) for p in ("test_add_silu_mul", "test_conv_silu", "test_dn_gates",
                                                     "test_dn_heads", "test_gated_norm", "test_moe_combine",
                                                     "test_dn_untile", "test_matmul_sel")) if cases else None,
    "forward": {r["model"]: {k: r[k] for k in ("decode_tok_s", "step_s", "c_over_c1", "step_bytes",
                                                "hbm_floor_fraction", "file_gib", "load_and_prompt_s",
                                                "prefill_tokens", "prefill_tok_s") if k in r} for r in fm.values()},
    "stream25_decode_tok_s": s25,
    "stream25_decode_tok_s_80b_q4km": s25q,
    # the same budget with the experts read from the GGUF per copy (expert_source='file': no pinned copy of them all)
    "stream25_file_decode_tok_s": stream25_file.get(R80, {}).get("decode_tok_s"),
    "stream25_file_decode_tok_s_80b_q4km": stream25_file.get(RQ, {}).get("decode_tok_s"),
    "edit": {d: {k: r[k] for k in ("decode_tok_s", "speedup", "acceptance", "e_keep", "identical")}
             for d, r in edit.items()},
    # llama.cpp's figures: this call's llama-bench (runs) or, where it did not run, nothing here (the anchors above)
    "llamacpp": {"build_rc": lb.get("build_rc"), "build_seconds": lb.get("build_seconds"),
                 "build_paused_s": lb.get("build_paused_s"),
                 "figures": same, "not_run": lb.get("not_run", []),
                 "runs": [{k: v for k, v in r.items() if not k.endswith("_samples")} for r in lb.get("runs", [])]},
    # what exists now: every backend operation (tests/test_cuda_matmul.py, tests/test_cuda_ops.py)
    "products_equal_cpu_ref": passed("test_product_equals_cpu_ref"),
    "products_t_rows_equal_one_row": passed("test_t_rows_equal_one_row"),
    "rmsnorm_equals_cpu": passed("test_rmsnorm_equals_cpu"),
    "dn_rows_equal_cpu": passed("test_dn_rows_equals_cpu"),
    "attend_equals_attend_ref": every([passed("test_attend_"), passed("test_attend_equals_attend_ref")]),
    "moe_route_equals_cpu": passed("test_moe_route_equals_cpu"),
    "sample_rows_equal_cpu": passed("test_sample_rows_"),
    "ops_t_rows_equal_one_row": every(passed(f"test_{op}_window_equals_one_row_calls")
                                      for op in ("dn_rows", "attend", "moe_route", "sample_rows")),
    "tests": {"total": n, "failed": fail + err, "skipped": skip, "seconds": tests_s, "rc": tests_rc,
              "capped": capped},
    "build_seconds": build_s, "copy_gbs": bench.get("copy_gbs"), "launch_us": bench.get("launch_us"),
    "product_c4_over_c1_expert_iq2_xxs": c_ratio("expert_gate", "IQ2_XXS", 4),
    "product_c16_over_c1_expert_iq2_xxs": c_ratio("expert_gate", "IQ2_XXS", 16),
    "product_gbs": {f"{p['type']}/{p['shape']}": dict(zip(map(str, p["T"]), (round(g, 1) for g in p["gbs"])))
                    for p in prods},
    "ops_us": {f"{o['op']}/{o['model']}/{o['note']}/T={o['T']}": round(o["us"], 2) for o in bench.get("ops", [])},
    "ops_copy_fraction": {f"{o['op']}/{o['model']}/{o['note']}/T={o['T']}": round(o["copy_fraction"], 4)
                          for o in bench.get("ops", []) if o.get("copy_fraction") is not None},
}
res["llamacpp_sources"] = sources  # where each ratio's llama.cpp figure comes from
(out / "gpu-h200.json").write_text(json.dumps(res, indent=1) + "\n")
lines = [f"strata gpu_check {res['date']} commit {commit[:12]}", str(res["device"]),
         f"build {build_s} s; tests: {n} run, {fail + err} failed, {skip} skipped ({tests_s} s"
         + (f", stopped at the {tests_cap} s cap: the rest did not run)" if capped else
            ", not run)" if tests_rc == 125 else ")"),
         f"products == CPU _ref bit for bit: {res['products_equal_cpu_ref']}; T rows == 1 row: "
         f"{res['products_t_rows_equal_one_row']}; rmsnorm == CPU: {res['rmsnorm_equals_cpu']}",
         f"dn_rows == CPU: {res['dn_rows_equal_cpu']}; attend == attend_ref: {res['attend_equals_attend_ref']}; "
         f"moe_route == CPU: {res['moe_route_equals_cpu']}; sample_rows == CPU tokens: {res['sample_rows_equal_cpu']}; "
         f"op windows == one-row calls: {res['ops_t_rows_equal_one_row']}"]
if bench:
    lines.append(f"copy {bench['copy_gbs']:.0f} GB/s, launch {bench['launch_us']:.2f} us")
    if prods:
        lines.append(f"{'type':8} {'shape':14} " + " ".join(f"{'T=' + str(t):>7}" for t in prods[0]["T"]) + "  GB/s")
    lines += [f"{p['type']:8} {p['shape']:14} " + " ".join(f"{g:7.0f}" for g in p["gbs"]) for p in prods]
    lines += [f"{o['op']:10} {o['model']:8} T={o['T']:<3} {o['us']:9.1f} us " +
              (f"{100 * o['copy_fraction']:5.1f} % of copy " if o.get("copy_fraction") is not None else "") + o["note"]
              for o in bench.get("ops", [])]
tail = [f"forward {r['model']}: {r['decode_tok_s']:.1f} tok/s, {100 * r['hbm_floor_fraction']:.1f} % of the floor, C(T)/C(1) " +
         " ".join(f"{t}:{c:.2f}" for t, c in r["c_over_c1"].items()) +
         (f", prefill {r['prefill_tokens']} tokens {r['prefill_tok_s']:.0f} tok/s" if "prefill_tok_s" in r else "")
         for r in fm.values()]
if edit:
    tail.append("edit workload, shipped model: " + ", ".join(f"{d} {r['decode_tok_s']:.0f} tok/s" for d, r in edit.items())
                + (f"; suffix / plain {res['edit_speedup']:.2f}x, same output: {res['edit_identical']}"
                   if res["edit_speedup"] is not None else ""))
if mtpb:
    tail.append("free workload, shipped model: " + ", ".join(f"{d} {r['decode_tok_s']:.0f} tok/s" for d, r in mtpb.items())
                + (f"; mtp / plain {res['mtp_speedup']:.2f}x, same output: {res['mtp_identical']}"
                   if res["mtp_speedup"] is not None else ""))
for r in fwd.get("streamed", []):
    if "error" not in r:
        tail.append(f"streamed {r['model']} at {100 * r['cache_frac']:.0f} % from {r.get('source', 'host')} "
                    f"(prefetch {'on' if r['prefetch'] else 'off'}): "
                    f"{r['decode_tok_s']:.1f} tok/s, {r['copied_bytes_per_row'] / 1e6:.0f} MB copied a row, hit rate "
                    f"{r['hit_rate']:.2f}")
if lb:
    parts = [f"{m}: " + ", ".join(f"{k} {v:.1f}" for k, v in f.items() if v) for m, f in same.items()]
    if lb.get("not_run"):
        parts.append(f"{len(lb['not_run'])} runs not run ({'; '.join(sorted({x['why'] for x in lb['not_run']}))})")
    tail.append(f"llama.cpp CUDA build: rc {lb.get('build_rc')} in {lb.get('build_seconds')} s "
                f"({lb.get('build_paused_s')} s of it paused); " + "; ".join(parts))
tail += [f"{k} {res[k]:.3f} ({sources[k]})" for k in sources]
(out / "gpu_check.txt").write_text("\n".join(lines + tail) + "\n")
print("\n".join(lines[:6] + tail))
PYEOF
{ [ $tests_rc -eq 0 ] || [ $tests_rc -eq 125 ]; } && [ $bench_rc -eq 0 ]
