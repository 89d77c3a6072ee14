"""Mutation check (issue 21's bar): deliberate engine bugs, each applied to a scratch copy of the tree, must make
a targeted part of the test suite fail. The list and the last results: docs/TESTING.md.

    python tools/mutation_check.py                      # every mutant; scratch copy in /work/scratch/suite/mutation
    python tools/mutation_check.py --only fold-row,sampler-position --work /tmp/mut --json out.json

1. The tree (tracked and untracked files that git does not ignore) is copied to WORK/src; the working tree is
   never written. The C++ extension is built from that copy in WORK/build (cmake + ninja, nice 10), once in full;
   a C++ mutant then recompiles its one source file and relinks.
2. Baseline: every mutant's tests pass on the unmutated copy (else a failure would prove nothing).
3. Per mutant: the patch (an exact string that must occur once in its file) is applied in the copy, the extension
   rebuilt if it is C++, the mutant's tests run (`pytest -x`, PYTHONPATH = the copy's python/, from the copy's root,
   by the base interpreter so that no editable install of the working tree can answer the import); the original
   file is written back and its hash checked before the next mutant.
A mutant is *killed* when its tests fail; one that survives is a hole in the suite. Exit status: 0 when every
mutant is killed and the baseline passed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str            # what a developer might have written
    path: str           # file, relative to the repository root
    old: str            # exact text, once in the file
    new: str
    tests: tuple        # pytest node ids / files (relative to the root), run with -x

    @property
    def cpp(self) -> bool:
        return self.path.startswith("csrc/")


MUTANTS = [
    # --- the acceptance walk and the loop (Python)
    Mutant("keep-one-more", "off-by-one keep: the first rejected draft is kept too", "python/strata_py/speculative.py",
           "        if out[i] != inputs[i + 1]:\n            keep = i + 1\n",
           "        if out[i] != inputs[i + 1]:\n            keep = min(T, i + 2)\n",
           ("tests/test_exactness.py", "tests/test_speculative.py::test_adversarial_drafters_through_generate_ids")),
    Mutant("eog-not-cut", "an end-of-generation token does not end the window's prefix", "python/strata_py/speculative.py",
           "        if out[i] in eog:\n            return i + 1\n", "        if out[i] in eog:\n            return keep\n",
           ("tests/test_loop_edges.py::test_eos_at_every_row_of_a_window_tiny",)),
    Mutant("context-room", "a window may cross the context limit by one row", "python/strata_py/speculative.py",
           "session.n_ctx - session.position, max_window)", "session.n_ctx - session.position + 1, max_window)",
           ("tests/test_loop_edges.py::test_windows_stop_at_the_context_limit",)),
    Mutant("stop-cut", "a stop string cuts the prefix one token late", "python/strata_py/speculative.py",
           "                    keep, stopped = j + 1, True", "                    keep, stopped = min(j + 2, len(inputs)), True",
           ("tests/test_steering.py::test_speculative_equals_serial",)),
    Mutant("utf8-split", "the text stream decodes each token's bytes alone (splits UTF-8 characters)",
           "python/strata_py/steering/stop.py", "        return self._dec.decode(buf[:len(buf) - h] if h else buf)",
           "        return (buf[:len(buf) - h] if h else buf).decode(\"utf-8\", \"replace\")",
           ("tests/test_loop_edges.py::test_utf8_split_across_the_rows_of_a_window",)),
    Mutant("chat-role", "a wrong chat-template role: system messages rendered as user messages",
           "python/strata_py/server/schema.py", '{"role": "system" if m.role == "developer" else m.role}',
           '{"role": "user" if m.role in ("system", "developer") else m.role}',
           ("tests/test_server_templates.py",)),
    # --- sampling and processors (C++)
    Mutant("sampler-position", "the sampler ignores the position key: every row of a window draws row 0's uniform",
           "csrc/sampling/sampler.cpp", "    out[i] = pick_token(row.data(), n_vocab, p, pos0 + i + 1);",
           "    out[i] = pick_token(row.data(), n_vocab, p, pos0 + 1);",
           ("tests/test_speculative.py::test_adversarial_drafters_through_generate_ids",)),
    Mutant("penalty-row", "a processor applied to the wrong row: every row's penalties use row 0's history",
           "csrc/sampling/sampler.cpp", "      row_history(committed, n_committed, inputs, i, p.penalty_last_n, hist);",
           "      row_history(committed, n_committed, inputs, 0, p.penalty_last_n, hist);",
           ("tests/test_speculative.py::test_adversarial_drafters_through_generate_ids",)),
    # --- state and rollback (C++)
    Mutant("fold-row", "a wrong fold row: lazy and eager folds skip row 0 as the partial mode does",
           "csrc/state/session.cpp", "const int64_t first = opt_.fold == FoldMode::Partial ? 1 : 0;",
           "const int64_t first = opt_.fold == FoldMode::Partial ? 1 : 1;",
           ("tests/test_window.py::test_export_after_commit_flushes_fold",)),
    Mutant("steer-rollback", "a skipped rollback: the phrase automaton steps over the rejected rows too",
           "csrc/state/session.cpp", "    for (int i = 0; i < keep; i++)\n      if (pos_ + i >= steer_origin_)",
           "    for (int i = 0; i < last_T_; i++)\n      if (pos_ + i >= steer_origin_)",
           ("tests/test_steering.py::test_speculative_equals_serial",)),
    Mutant("ple-rollback", "a skipped rollback: the PLE conv history shifts in every row of a verify window",
           "csrc/state/session.cpp", "ple_.commit_rows(keep);", "ple_.commit_rows(last_T_);",
           ("tests/test_next_windows.py::test_speculative_equals_serial",)),
    Mutant("tokens-keep", "an off-by-one keep in the committed token history",
           "csrc/state/session.cpp", "tokens_.insert(tokens_.end(), last_tokens_.begin(), last_tokens_.begin() + keep);",
           "tokens_.insert(tokens_.end(), last_tokens_.begin(), last_tokens_.begin() + (keep > 1 ? keep - 1 : keep));",
           ("tests/test_session.py",)),
    # --- kernels and the checkpoint binding (C++)
    Mutant("attention-cell", "attention leaves the last cell out of the weighted sum of values",
           "csrc/kernels/attend.cpp", "      for (int64_t c = 0; c < n; c++) {\n        const float p = sc[c] * inv;",
           "      for (int64_t c = 0; c + 1 < n; c++) {\n        const float p = sc[c] * inv;",
           ("tests/test_attention_f64.py",)),
    Mutant("act-quant-trunc", "the int8 activation quantizer truncates instead of rounding to nearest",
           "csrc/kernels/quants.cpp", "qb[i] = (int16_t)std::nearbyint(iscale * xb[i]);", "qb[i] = (int16_t)(iscale * xb[i]);",
           ("tests/test_quant_kernels.py::test_synthetic_model_loads_and_matmul_matches_float64",)),
    Mutant("fingerprint-weights", "the model fingerprint hashes the tensor table only, not the weights",
           "csrc/model/fingerprint.cpp", "    if (!t.data || t.nbytes == 0) continue;", "    continue;",
           ("tests/test_checkpoint_model.py",)),
]


def _nice() -> list[str]:
    """nice 10 in all: run under `nice -n 10` itself, the tool adds nothing (nice is relative)."""
    n = max(0, 10 - os.nice(0))
    return ["nice", "-n", str(n)] if n else []


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def copy_tree(src: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for f in filter(None, files):
        a, b = ROOT / f, src / f
        if a.is_file():
            b.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(a, b)


def build(src: Path, bdir: Path, log) -> float:
    t0 = time.monotonic()
    if not (bdir / "build.ninja").exists():
        subprocess.run([*_nice(), "cmake", "-S", str(src), "-B", str(bdir), "-G", "Ninja",
                        "-DCMAKE_BUILD_TYPE=Release", f"-DPython_EXECUTABLE={base_python()}"],
                       check=True, stdout=log, stderr=subprocess.STDOUT)
    subprocess.run([*_nice(), "cmake", "--build", str(bdir), "-j", "2"], check=True, stdout=log,
                   stderr=subprocess.STDOUT)
    so = next(bdir.glob("_core*.so"))
    shutil.copy2(so, src / "python" / "strata_py" / so.name)
    return time.monotonic() - t0


PYTHON = None  # --python: an interpreter with the test dependencies and without strata installed


def base_python() -> str:
    """The interpreter without a virtual environment's editable install of the working tree: --python, else the
    base interpreter of the running one (which must then have the test dependencies)."""
    return PYTHON or getattr(sys, "_base_executable", None) or sys.executable


def run_tests(src: Path, tests, timeout: int) -> tuple[int, float, str]:
    env = dict(os.environ, PYTHONPATH=str(src / "python"), PYTHONDONTWRITEBYTECODE="1")
    probe = subprocess.run([base_python(), "-c", "import strata_py; print(strata_py.__file__)"], cwd=src, env=env,
                           capture_output=True, text=True)
    where = probe.stdout.strip()
    if not where.startswith(str(src)):
        raise SystemExit(f"the scratch copy's strata_py is not the one imported ({where!r} {probe.stderr[-500:]})")
    t0 = time.monotonic()
    try:
        r = subprocess.run([*_nice(), base_python(), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                            *tests], cwd=src, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired:
        rc, out = -1, "timed out"
    failed = next((ln for ln in out.splitlines() if ln.startswith(("FAILED", "ERROR"))), out.strip().splitlines()[-1:])
    return rc, time.monotonic() - t0, failed if isinstance(failed, str) else " ".join(failed)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="/work/scratch/suite/mutation", help="scratch directory (a copy and a build)")
    ap.add_argument("--only", default="", help="comma-separated mutant names")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per test run")
    ap.add_argument("--python", default=None,
                    help="interpreter for the build and the tests: one with the test extra's dependencies and "
                         "without strata installed (default: the base interpreter of this one)")
    a = ap.parse_args(argv)
    global PYTHON
    PYTHON = a.python
    chosen = [m for m in MUTANTS if not a.only or m.name in a.only.split(",")]
    if a.only and len(chosen) != len(a.only.split(",")):
        raise SystemExit(f"unknown mutant in {a.only!r}: known {', '.join(m.name for m in MUTANTS)}")
    work = Path(a.work)
    src, bdir = work / "src", work / "build"
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    copy_tree(src)
    for m in chosen:  # every patch applies exactly once, before anything runs
        n = (src / m.path).read_text().count(m.old)
        if n != 1:
            raise SystemExit(f"mutant {m.name}: the text to replace occurs {n} times in {m.path}")
    log = open(work / "build.log", "a")
    print(f"building the extension from {src} in {bdir} ...", flush=True)
    full = build(src, bdir, log)
    print(f"  {full:.0f} s", flush=True)
    tests = sorted({t for m in chosen for t in m.tests})
    rc, secs, what = run_tests(src, tests, a.timeout * 2)
    print(f"baseline: {len(tests)} targets {'pass' if rc == 0 else 'FAIL: ' + what} ({secs:.0f} s)", flush=True)
    results = {"baseline": {"tests": tests, "passed": rc == 0, "seconds": round(secs, 1), "build_s": round(full, 1)},
               "mutants": []}
    for m in chosen:
        f = src / m.path
        original, digest = f.read_bytes(), _sha(f)
        try:
            f.write_text(original.decode().replace(m.old, m.new))
            b = build(src, bdir, log) if m.cpp else 0.0
            rc, secs, what = run_tests(src, m.tests, a.timeout)
        finally:
            f.write_bytes(original)
            assert _sha(f) == digest, f"{m.path} not restored"
        killed = rc != 0
        results["mutants"].append({"name": m.name, "bug": m.bug, "file": m.path, "tests": list(m.tests),
                                   "killed": killed, "first_failure": what if killed else "",
                                   "build_s": round(b, 1), "test_s": round(secs, 1)})
        print(f"{m.name:22s} {'KILLED' if killed else 'SURVIVED'}  build {b:4.0f} s  tests {secs:4.0f} s  {what[:110]}",
              flush=True)
    if any(m.cpp for m in chosen):
        build(src, bdir, log)  # the copy's extension unmutated again
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    n_killed = sum(r["killed"] for r in results["mutants"])
    print(f"{n_killed} of {len(chosen)} mutants killed; baseline {'passed' if results['baseline']['passed'] else 'FAILED'}")
    return 0 if n_killed == len(chosen) and results["baseline"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
