"""The C++ core under AddressSanitizer + UndefinedBehaviorSanitizer, inside the normal test command.

test_suite_under_asan_ubsan builds a copy of the extension with gcc's -fsanitize=address,undefined at -O0 -g1
(build dir build/asan-O0-*, kept between runs: a rebuild after a C++ change is incremental), stages it as a
strata_py package next to the Python sources, and runs SUBSET below in a subprocess with libasan preloaded. Any
report (heap or stack overflow, use after free, signed overflow, misaligned access, a float-to-int conversion out of
range, ...) fails the run: halt_on_error / -fno-sanitize-recover make the first one fatal. Leak checking is off: the
interpreter itself leaks at exit. On a CPU without AVX-512 the AVX-512 kernel sources are built at -O0 without the
sanitizers (build dir build/asan-O0-*-no512): they only have to link there, as no test on that CPU reaches them, and
instrumented they were a quarter of the build (on the AVX2 development VM the test took 300 s from a clean build
instead of 384 s). Everything at -O0, the bindings too (STRATA_BIND_OPT), and -g1 rather than RelWithDebInfo's -g:
on that VM the build went from 234 s to 84 s and the subset's run from 85 s to 96 s (320 s -> 184 s in all), and
no check is optimised away.

SUBSET runs code in every C++ file under csrc/ (docs/FUZZING.md records the gcov check): the GGUF reader and its
guard, model load and every layer (sessions of the tiny models in every fold mode, MTP, streamed experts), the
kernels of every ISA path this CPU has against their scalar twins (test_kernels, test_quant_kernels), checkpoints
and their faults, sampling, drafting, the thread pool, the bindings, and the fuzz regression corpus. Left out:
tests that run the same code again at larger sizes or for more parameters (listed in DESELECT; the normal suite
runs them), and the RLIMIT_AS test (ASan reserves terabytes of address space).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUBSET = ["tests/test_bad_input.py", "tests/test_checkpoint_file.py", "tests/test_faults.py", "tests/test_session.py",
          "tests/test_kernels.py", "tests/test_quant_kernels.py", "tests/test_sampling.py", "tests/test_suffix_index.py",
          "tests/test_threads.py", "tests/test_experts.py", "tests/test_mtp.py", "tests/test_fuzz_corpus.py",
          # qwen4exp checkpoints (qwen35moe and qwen4exp sessions: the fuzz corpus); steering (processors, masks,
          # the phrase automaton)
          "tests/test_next_windows.py::test_checkpoints_carry_the_new_state",
          "tests/test_steering.py::test_speculative_equals_serial[all]", "tests/test_steering.py::test_row_finish_matches_numpy",
          "tests/test_steering.py::test_mask_kernels_match_twins", "tests/test_steering.py::test_restore_rescans_phrase_state",
          "tests/test_steering.py::test_automaton_bad_input"]
# the same code paths at larger sizes or once more per parameter (run by the normal suite), and RLIMIT_AS
DESELECT = ("not allocate_nothing_big and not speculative_equals_plain and not bit_identical_at_every_budget"
            " and not logits_match_reference")
SAN_FLAGS = "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g1"


def _runtime(name: str) -> str | None:
    try:
        p = subprocess.run(["g++", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return None
    return p if os.path.isabs(p) and os.path.exists(p) else None


def build_extension(build: Path, flags: str = SAN_FLAGS, opt: str = "-O0", plain: str = "") -> Path:
    """Configures (once) and builds the extension with extra compiler flags, the core (STRATA_CORE_OPT) and the
    bindings (STRATA_BIND_OPT) at `opt` and no build type's flags of its own (RelWithDebInfo's -O2 -g dropped);
    returns the built module. plain: a regex of sources built at -O0 without those flags (cmake/strata_core.cmake
    STRATA_PLAIN_SOURCES).
    (tools/subset_coverage.py builds a gcov copy the same way.)"""
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    if not (build / "CMakeCache.txt").exists():
        subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), *gen, "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                        "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=", f"-DPython_EXECUTABLE={sys.executable}",
                        f"-DSTRATA_CORE_OPT={opt}", f"-DSTRATA_BIND_OPT={opt}",
                        f"-DSTRATA_PLAIN_SOURCES={plain}",
                        f"-DCMAKE_CXX_FLAGS={flags}", f"-DCMAKE_SHARED_LINKER_FLAGS={flags}"],
                       check=True, capture_output=True, text=True)
    r = subprocess.run(["cmake", "--build", str(build), "--target", "_core", "-j", str(os.cpu_count() or 2)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    return build / f"_core{suffix}"


def stage(pkg_root: Path, module: Path) -> None:
    """pkg_root/strata_py: the Python sources (symlinked) and the sanitized _core; pkg_root/sitecustomize.py drops
    an editable install's import redirect for strata_py, so that this copy wins in subprocesses too."""
    pkg = pkg_root / "strata_py"
    if pkg.exists():
        shutil.rmtree(pkg)
    pkg.mkdir(parents=True)
    src = ROOT / "python" / "strata_py"
    for p in src.iterdir():
        if not p.name.startswith("_core") and p.name != "__pycache__":
            (pkg / p.name).symlink_to(p)
    shutil.copy(module, pkg / module.name)
    (pkg_root / "sitecustomize.py").write_text(
        "# written by tests/test_sanitizers.py: import the sanitized strata_py staged here, not an editable install\n"
        "import sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path\n"
        "                    if not any(k.startswith('strata_py') for k in getattr(f, 'known_source_files', {}))]\n")


def may_run_avx512() -> bool:
    """Whether the sanitized subprocess could take the AVX-512 kernels: this CPU's path is AVX-512, or the CPU has
    avx512f at all (read off /proc/cpuinfo, past a --isa limit of this process; where it cannot be read: yes)."""
    from strata_py import _core
    if _core.best_isa() == "avx512":
        return True
    try:
        return "avx512f" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return True


def test_suite_under_asan_ubsan(tmp_path):
    # libasan first; libstdc++ preloaded too, or ASan cannot find the real __cxa_throw (python does not link it)
    preload = [_runtime("libasan.so"), _runtime("libstdc++.so")]
    if None in preload or shutil.which("cmake") is None:
        pytest.skip("needs g++ with libasan and cmake (pip install '.[test]' brings cmake)")
    # A CPU without AVX-512 never runs those kernels: they are built plain (-O0, uninstrumented), which saves a
    # quarter of the build; a CPU with AVX-512 sanitizes them like the rest. The build dir is per case.
    plain = "" if may_run_avx512() else r"_avx512[a-z]*\.cpp$"
    tag = f"{sys.implementation.cache_tag}-{sysconfig.get_platform()}" + ("" if not plain else "-no512")
    build = ROOT / "build" / f"asan-O0-{tag}"
    module = build_extension(build, plain=plain)
    stage(build / "pkg", module)
    env = dict(os.environ)
    env.update(
        LD_PRELOAD=" ".join(preload),
        PYTHONPATH=os.pathsep.join([str(build / "pkg"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        # detect_leaks: the interpreter leaks at exit; handle_sigbus: our own guard handles SIGBUS; log_path: a
        # report from a process that dies at once (pytest's captured output with it) still reaches a file
        ASAN_OPTIONS=f"detect_leaks=0:halt_on_error=1:abort_on_error=0:handle_sigbus=0:allow_user_segv_handler=1"
                     f":log_path={tmp_path / 'asan'}",
        UBSAN_OPTIONS=f"halt_on_error=1:print_stacktrace=1:log_path={tmp_path / 'ubsan'}",
    )
    check = "import strata_py._core as c, sys; sys.exit(0 if c.__file__.startswith(sys.argv[1]) else c.__file__)"
    r = subprocess.run([sys.executable, "-c", check, str(build / "pkg")], env=env, capture_output=True, text=True)
    assert r.returncode == 0, f"the sanitized build was not the one imported: {r.stdout}{r.stderr[-2000:]}"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", DESELECT,
                        f"--basetemp={tmp_path / 'base'}", *SUBSET], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=1200)
    out = r.stdout + r.stderr
    reports = "".join(p.read_text(errors="replace") for p in sorted(tmp_path.glob("*san.*")))
    assert r.returncode == 0 and not reports, reports[:8000] + "\n" + out[-4000:]
