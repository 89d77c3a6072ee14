"""The CUDA backend compiles (issue 19). This machine and CI have nvcc but no GPU, so this is where every change is
compiled for CUDA on every run; the GPU tests run on the lent device (tools/gpu_check.sh). The project's own CMake
(cmake/strata_core.cmake with STRATA_CUDA=ON: its archs, its exactness flags) builds the object of every
csrc/**/*.cu; the CPU objects are the ordinary build's. Skipped, with the reason, where nvcc is absent.

The device code is compiled without optimization here (-Xcicc -O0 -Xptxas -O0): every front-end and template error
and every PTX the assembler rejects still fails the check, and matmul.cu takes 22 s instead of 135 s on the 2-core
development VM (cicc 75 s and ptxas 49 s of it at -O3). The optimized build is the one tools/gpu_check.sh makes and
tests on the device."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NVCC = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.access(p, os.X_OK)), None)
CU = sorted(ROOT.glob("csrc/**/*.cu"))


@pytest.mark.skipif(NVCC is None, reason="no nvcc on this machine: the CUDA sources compile where a toolkit is")
@pytest.mark.skipif(shutil.which("ninja") is None, reason="ninja (a test dependency) is not on the PATH")
def test_every_cuda_source_compiles(tmp_path):
    assert CU, "no CUDA sources found under csrc/"
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(strata_cuda_check LANGUAGES CXX)\n"
        "set(CMAKE_CXX_STANDARD 17)\nfind_package(Threads REQUIRED)\n"
        f'include("{ROOT}/cmake/strata_core.cmake")\n')
    build = tmp_path / "build"
    env = {**os.environ, "CUDACXX": NVCC}
    cfg = subprocess.run(["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", "-DSTRATA_CUDA=ON",
                          "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_CUDA_FLAGS=-Xcicc -O0 -Xptxas -O0"],
                         capture_output=True, text=True, env=env)
    assert cfg.returncode == 0, cfg.stdout[-3000:] + cfg.stderr[-3000:]
    assert "CUDA backend ON" in cfg.stdout
    targets = subprocess.run(["ninja", "-C", str(build), "-t", "targets", "all"], capture_output=True, text=True,
                             check=True).stdout
    objs = [line.split(":")[0] for line in targets.splitlines() if line.split(":")[0].endswith(".cu.o")]
    assert len(objs) == len(CU), (objs, CU)  # one object per source (the names CMake gives them)
    jobs = str(max(1, min(4, os.cpu_count() or 1)))
    out = subprocess.run(["ninja", "-C", str(build), "-j", jobs, *objs], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    for o in objs:
        assert (build / o).stat().st_size > 0, o


def kernel_bodies(text: str):
    """(name, body head) of each __global__ function defined in a CUDA source."""
    import re
    for m in re.finditer(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(", text):
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        brace = text.index("{", i)
        yield m.group(1), text[brace + 1:brace + 400]


def test_every_kernel_waits_for_its_predecessor_first():
    """launch.cuh's contract, read off the sources: every kernel of csrc/kernels/cuda is launched by launch() (which
    may carry programmatic dependent launch, so its blocks can start while the kernel before still runs) and calls
    pdl_wait() before anything else, but for the L2 prefetch of its weights (prefetch_rows, a cache hint). A kernel
    without it could read its input before the kernel that writes it is done."""
    import re
    srcs = sorted((ROOT / "csrc/kernels/cuda").glob("*.cu*"))
    names = []
    for p in srcs:
        text = re.sub(r"//[^\n]*", "", p.read_text())  # code only
        assert "<<<" not in text, f"{p.name}: a <<<>>> launch (kernels launch by launch.cuh's launch())"
        for name, head in kernel_bodies(text):
            stmts = [s.strip() for s in head.split(";")]
            first = next(s for s in stmts if not s.startswith("if (!kTiled && !sel) prefetch_rows")
                         and not re.match(r"(if \(!sel\) )?prefetch_rows\(", s))
            assert first == "pdl_wait()", f"{p.name}: kernel {name} does not start with pdl_wait(): {head[:160]!r}"
            names.append(name)
    assert len(names) >= 30 and "k_iq2xxs_warp1" in names and "k_mma" in names, names
    # the backend's own kernel (the launch-latency probe) is launched plainly, without the attribute
    assert re.findall(r"(\w+)<<<", (ROOT / "csrc/backend/cuda_backend.cu").read_text()) == ["k_empty"]
