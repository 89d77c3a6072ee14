"""Shared fixtures: synthetic GGUFs written once per test session by our own synth (real files on disk)."""
from __future__ import annotations

import pytest


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
