#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (the lent H200), in one call: build strata with the CUDA backend, run the GPU
# tests and the GPU benchmark, and write a short table and a JSON (issue 19).
#
#   tools/gpu_check.sh OUT [COMMIT] [GGUF_WHEEL] [BENCH_ARGS] [BENCH_CAP_S] [FORWARD]
#
# OUT gets build.log, tests.log, junit.xml, bench_cuda.json, nvidia-smi.txt, gpu_check.txt (the table) and
# gpu-h200.json (the issue's keys, null for what is not measured yet; commit it as docs/results/gpu-h200.json).
# COMMIT: the source's commit, for the JSON (default: git rev-parse HEAD, where the tree is a checkout).
# GGUF_WHEEL: wheels to install (the lent machine has no gguf, no llguidance and no network).
# BENCH_ARGS: more arguments for bench/bench_cuda.py (e.g. "--types Q4_K,IQ2_XXS" to fit a short call).
# BENCH_CAP_S: stop the bench after this many seconds (it saves its JSON after every row, so the table and JSON
# still come out with what it measured: the ops first, then the products). The GPU tests run under a 6-minute cap
# (a hung kernel must not eat the whole call).
# FORWARD: the model files for bench/bench_gpu_forward.py (the whole forward on the GPU: decode tok/s, C(T)), a comma
# list of "default" (the shipped model), "bench" (`synth bench --type q4_k`, written here), "80b" (`synth 80b --type
# iq2_xxs`, 19.3 GiB, written here in ~41 s); "" skips the step. Default: "default,bench".
# The compiler is /usr/bin/g++ unless CXX says otherwise: the g++ first on the lent machine's PATH links libstdc++
# statically and the extension then crashes at its first std::ostringstream (../shared/DEVICE.md).
set -uo pipefail
OUT=$(mkdir -p "${1:?usage: tools/gpu_check.sh OUT [COMMIT] [GGUF_WHEEL]}" && cd "$1" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
COMMIT=${2:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
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
timeout 360 $PY -m pytest -q -p no:cacheprovider tests/test_cuda_*.py tests/test_backend.py tests/test_backend_forward.py \
  --junitxml="$OUT/junit.xml" >"$OUT/tests.log" 2>&1
tests_rc=$?
tests_s=$(( $(date +%s) - t0 ))
tail -15 "$OUT/tests.log"

PYTHONUNBUFFERED=1 timeout ${5:-100000} $PY bench/bench_cuda.py --json "$OUT/bench_cuda.json" ${4:-}
bench_rc=$?

FORWARD=${6-default,bench}
models=()
for f in ${FORWARD//,/ }; do
  case $f in
    default) models+=("python/strata_py/data/strata-default-q8_0.gguf") ;;
    bench) $PY -m strata_py.synth bench /tmp/synth-bench-q4_k.gguf --type q4_k >/dev/null && models+=(/tmp/synth-bench-q4_k.gguf) ;;
    80b) t0=$(date +%s); $PY -m strata_py.synth 80b /tmp/synth-80b-iq2_xxs.gguf --type iq2_xxs >/dev/null && \
           models+=(/tmp/synth-80b-iq2_xxs.gguf); echo "synth 80b: $(( $(date +%s) - t0 )) s" ;;
  esac
done
if [ ${#models[@]} -gt 0 ]; then
  PYTHONUNBUFFERED=1 $PY bench/bench_gpu_forward.py "${models[@]}" --json "$OUT/bench_forward.json" || bench_rc=1
fi

$PY - "$OUT" "$COMMIT" "$build_s" "$tests_rc" "$tests_s" <<'PYEOF'
"""gpu-h200.json (issue 19's keys) and gpu_check.txt from junit.xml and bench_cuda.json."""
import json, sys, time
import xml.etree.ElementTree as ET
from pathlib import Path
out, commit, build_s, tests_rc, tests_s = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
if (out / "junit.xml").exists():
    suite = ET.parse(out / "junit.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    n, fail, err, skip = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    cases = {c.get("name"): c for c in suite.iter("testcase")}
else:  # pytest cut off by its cap: nothing passed
    n, fail, err, skip, cases = 0, 0, 1, 0, {}
def passed(prefix):
    sel = [c for name, c in cases.items() if name.startswith(prefix)]
    return bool(sel) and all(len(c) == 0 for c in sel)
bench = json.loads((out / "bench_cuda.json").read_text()) if (out / "bench_cuda.json").exists() else {}
fwd = json.loads((out / "bench_forward.json").read_text()) if (out / "bench_forward.json").exists() else {}
fm = {r["model"]: r for r in fwd.get("models", []) if "error" not in r}
def fwd_key(model, key, t=None):
    r = fm.get(model)
    return None if r is None else (r[key] if t is None else r[key][str(t)])
R80, RB, RD = "synth-80b-iq2_xxs.gguf", "synth-bench-q4_k.gguf", "strata-default-q8_0.gguf"
LLAMA = {R80: 189.0, RB: 560.0}  # issue 19's llama.cpp CUDA anchors (its run, 2026-12-01: not this call)
prods = bench.get("products", [])
def c_ratio(shape, typ, t):
    for p in prods:
        if p["shape"] == shape and p["type"] == typ:
            return p["c_over_c1"][p["T"].index(t)]
    return None
res = {
    "date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": commit, "device": bench.get("device"),
    # the issue's keys (bench/bench_gpu_forward.py; null: not measured in this call). decode_ratio_vs_llamacpp: the
    # 80B IQ2_XXS file's decode tok/s over llama.cpp's 189 tok/s from issue 19's run (not this call)
    "decode_ratio_vs_llamacpp": (fwd_key(R80, "decode_tok_s") / LLAMA[R80]) if R80 in fm else None,
    "decode_ratio_vs_llamacpp_bench_q4k": (fwd_key(RB, "decode_tok_s") / LLAMA[RB]) if RB in fm else None,
    "llamacpp_anchor": "issue 19's run on this machine kind (2026-12-01), not this call",
    "hbm_floor_fraction": fwd_key(R80, "hbm_floor_fraction"), "c4_over_c1_real80b": fwd_key(R80, "c_over_c1", 4),
    "c4_over_c1_default": fwd_key(RD, "c_over_c1", 4), "c16_over_c1_default": fwd_key(RD, "c_over_c1", 16),
    "edit_speedup": None, "mtp_speedup": None, "stream25_ratio_vs_llamacpp": None,
    # the GPU session's logits == the CPU session's bit for bit (T = 1, prompt and verify windows with random keeps,
    # 5 models), and suffix-drafted == plain decoding on the GPU (tests/test_cuda_forward.py)
    "windows_bit_identical": (passed("test_gpu_session_windows") and passed("test_gpu_session_long_prompt")
                              and passed("test_gpu_speculative_equals_plain")) if cases else None,
    "gpu_decode_equals_cpu": passed("test_gpu_decode") if cases else None,
    "layer_ops_equal_cpu": all(passed(p) for p in ("test_add_silu_mul", "test_conv_silu", "test_dn_gates",
                                                   "test_dn_heads", "test_gated_norm", "test_moe_combine",
                                                   "test_dn_untile", "test_matmul_sel")) if cases else None,
    "forward": {r["model"]: {k: r[k] for k in ("decode_tok_s", "step_s", "c_over_c1", "step_bytes",
                                                "hbm_floor_fraction", "file_gib", "load_and_prompt_s")} for r in fm.values()},
    # what exists now: every backend operation (tests/test_cuda_matmul.py, tests/test_cuda_ops.py)
    "products_equal_cpu_ref": passed("test_product_equals_cpu_ref"),
    "products_t_rows_equal_one_row": passed("test_t_rows_equal_one_row"),
    "rmsnorm_equals_cpu": passed("test_rmsnorm_equals_cpu"),
    "dn_rows_equal_cpu": passed("test_dn_rows_equals_cpu"),
    "attend_equals_attend_ref": passed("test_attend_") and passed("test_attend_equals_attend_ref"),
    "moe_route_equals_cpu": passed("test_moe_route_equals_cpu"),
    "sample_rows_equal_cpu": passed("test_sample_rows_"),
    "ops_t_rows_equal_one_row": all(passed(f"test_{op}_window_equals_one_row_calls")
                                    for op in ("dn_rows", "attend", "moe_route", "sample_rows")),
    "tests": {"total": n, "failed": fail + err, "skipped": skip, "seconds": tests_s, "rc": tests_rc},
    "build_seconds": build_s, "copy_gbs": bench.get("copy_gbs"), "launch_us": bench.get("launch_us"),
    "product_c4_over_c1_expert_iq2_xxs": c_ratio("expert_gate", "IQ2_XXS", 4),
    "product_c16_over_c1_expert_iq2_xxs": c_ratio("expert_gate", "IQ2_XXS", 16),
    "product_gbs": {f"{p['type']}/{p['shape']}": dict(zip(map(str, p["T"]), (round(g, 1) for g in p["gbs"])))
                    for p in prods},
    "ops_us": {f"{o['op']}/{o['model']}/{o['note']}/T={o['T']}": round(o["us"], 2) for o in bench.get("ops", [])},
    "ops_copy_fraction": {f"{o['op']}/{o['model']}/{o['note']}/T={o['T']}": round(o["copy_fraction"], 4)
                          for o in bench.get("ops", []) if o.get("copy_fraction") is not None},
}
(out / "gpu-h200.json").write_text(json.dumps(res, indent=1) + "\n")
lines = [f"strata gpu_check {res['date']} commit {commit[:12]}", str(res["device"]),
         f"build {build_s} s; tests: {n} run, {fail + err} failed, {skip} skipped ({tests_s} s)",
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
lines += [f"forward {r['model']}: {r['decode_tok_s']:.1f} tok/s, {100 * r['hbm_floor_fraction']:.1f} % of the floor, C(T)/C(1) " +
          " ".join(f"{t}:{c:.2f}" for t, c in r["c_over_c1"].items()) for r in fm.values()]
(out / "gpu_check.txt").write_text("\n".join(lines) + "\n")
print("\n".join([l for l in lines if not l.startswith("forward ")][:6] + [l for l in lines if l.startswith("forward ")]))
PYEOF
[ $tests_rc -eq 0 ] && [ $bench_rc -eq 0 ]
