"""Shared fixtures: synthetic GGUFs written once per test session by our own synth (real files on disk)."""
from __future__ import annotations

import pytest


def pytest_addoption(parser):
    parser.addoption("--isa", default=None, choices=("scalar", "avx2", "avx512"),
                     help="run the suite as on a CPU whose best kernel path is this one (at most this CPU's): "
                          "tests then see that ISA as the best, as on an AVX2-only or a pre-AVX2 machine")
    parser.addoption("--rng-seed", type=int, default=None,
                     help="seed of every fresh random input (tests/seeds.py); a failed test prints the seeds it drew")
    parser.addoption("--run-first", default="",
                     help="a comma list of test names (function names, without parameters) run before every other "
                          "test, in that order: tools/gpu_check.sh's key tests ahead of its time cap")


def pytest_collection_modifyitems(config, items):
    """--run-first: the named tests moved to the front, in the order named; the others keep theirs."""
    first = [n for n in config.getoption("--run-first").split(",") if n]
    if not first:
        return
    rank = {n: i for i, n in enumerate(first)}
    key = lambda it: rank.get(getattr(it, "originalname", None) or it.name, len(first))  # noqa: E731
    items[:] = sorted(items, key=key)  # stable: the rest keep their order


def pytest_configure(config):
    import seeds
    seeds.FIXED = config.getoption("--rng-seed")
    isa = config.getoption("--isa")
    if isa:
        from strata_py import _core
        _core.limit_isa(isa)
        import server_util  # the server and chat processes of the tests compute as this one does
        server_util.ISA = isa


def pytest_report_header(config):
    from strata_py import _core
    return f"strata kernels: best ISA {_core.best_isa()} (active {_core.active_isa()}), VBMI {_core.has_avx512vbmi()}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that drew fresh random inputs (seeds.fresh_rng) says which seeds, and how to replay them."""
    import seeds
    if call.when == "setup":
        seeds.used.clear()
    rep = (yield).get_result()
    if rep.failed and seeds.used:
        rep.sections.append(("random seeds", f"fresh_rng() seeds: {seeds.used}; replay: pytest "
                                             f"'{item.nodeid}' --rng-seed {seeds.used[0]}"))


def _cuda_usable() -> bool:
    from strata_py import _core
    return _core.cuda_available()


@pytest.fixture(params=["cpu-backend", pytest.param("cuda", marks=pytest.mark.skipif(
    not _cuda_usable(), reason="no usable CUDA device here"))])
def backend(request):
    """A backend session's backend: the CPU backend (everywhere, CI included) and the GPU where one is usable. On the
    GPU the native sessions compared with it run the CPU's scalar kernels (the GPU's attention is attend_ref's
    order: kernels/attend.h), restored afterwards."""
    if request.param != "cuda":
        yield request.param
        return
    from strata_py import _core
    prev = _core.active_isa()
    _core.force_isa("scalar")
    yield request.param
    _core.force_isa(prev)


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    from strata_py import synth
    return synth.write("tiny", tmp_path_factory.mktemp("synth") / "tiny-f32.gguf", "f32", seed=1)


@pytest.fixture(scope="session")
def tiny_q8_gguf(tmp_path_factory):
    from strata_py import synth
    return synth.write("tiny", tmp_path_factory.mktemp("synth") / "tiny-q8_0.gguf", "q8_0", seed=2, mtp=True)


@pytest.fixture(scope="session")
def tiny_q8_long_gguf(tmp_path_factory):
    """tiny_q8_gguf's weights (same seed, same file name) declaring a 32768-token context: the tiny server's, so that
    a request can outlast a client deterministically (30 000 tokens with the end token banned)."""
    from strata_py import synth
    return synth.write("tiny", tmp_path_factory.mktemp("synth_long") / "tiny-q8_0.gguf", "q8_0", seed=2, mtp=True,
                       n_ctx=32768)


@pytest.fixture(scope="session")
def tiny_model(tiny_gguf):
    from strata_py.model import Model
    return Model.load(tiny_gguf, threads=2)


@pytest.fixture(scope="session")
def tiny_q8_model(tiny_q8_gguf):
    from strata_py.model import Model
    return Model.load(tiny_q8_gguf, threads=2)


# ---- server processes for tests/test_server_*.py (tests/server_util.py) -------------------------------------
# Two real `python -m strata_py.serve` processes, started side by side on first use and stopped at the end:
#   default: the shipped model, with Qwen3's chat template (tool calls in JSON), --draft auto
#   tiny:    the synthetic tiny model with an MTP block (its 32k-context twin file), Qwen3-Coder's template (XML
#            tool calls), an API key, CORS for one origin and a queue of 7
_servers: dict = {}


@pytest.fixture(scope="session")
def _server_pool(tiny_q8_long_gguf):
    from server_util import TEMPLATES, Server
    _servers["default"] = Server("--chat-template-file", str(TEMPLATES / "qwen3.jinja"), "--checkpoint-gap", "16")
    _servers["tiny"] = Server("--model", str(tiny_q8_long_gguf), "--chat-template-file",
                              str(TEMPLATES / "qwen3-coder.jinja"), "--checkpoint-gap", "16", "--max-queue", "7", "--cors-origins", "http://example.org",
                              api_key="sekret")
    yield _servers
    for s in _servers.values():
        s.stop()


@pytest.fixture(scope="session")
def default_server(_server_pool):
    return _server_pool["default"].ready()


@pytest.fixture(scope="session")
def tiny_server(_server_pool):
    return _server_pool["tiny"].ready()
