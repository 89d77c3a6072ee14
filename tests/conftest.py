"""Shared fixtures: synthetic GGUFs written once per test session by our own synth (real files on disk)."""
from __future__ import annotations

import pytest


def pytest_addoption(parser):
    parser.addoption("--isa", default=None, choices=("scalar", "avx2", "avx512"),
                     help="run the suite as on a CPU whose best kernel path is this one (at most this CPU's): "
                          "tests then see that ISA as the best, as on an AVX2-only or a pre-AVX2 machine")


def pytest_configure(config):
    isa = config.getoption("--isa")
    if isa:
        from strata_py import _core
        _core.limit_isa(isa)


def pytest_report_header(config):
    from strata_py import _core
    return f"strata kernels: best ISA {_core.best_isa()} (active {_core.active_isa()}), VBMI {_core.has_avx512vbmi()}"


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    from strata_py import synth
    return synth.write("tiny", tmp_path_factory.mktemp("synth") / "tiny-f32.gguf", "f32", seed=1)


@pytest.fixture(scope="session")
def tiny_q8_gguf(tmp_path_factory):
    from strata_py import synth
    return synth.write("tiny", tmp_path_factory.mktemp("synth") / "tiny-q8_0.gguf", "q8_0", seed=2, mtp=True)


@pytest.fixture(scope="session")
def tiny_model(tiny_gguf):
    from strata_py.model import Model
    return Model.load(tiny_gguf, threads=2)


@pytest.fixture(scope="session")
def tiny_q8_model(tiny_q8_gguf):
    from strata_py.model import Model
    return Model.load(tiny_q8_gguf, threads=2)
