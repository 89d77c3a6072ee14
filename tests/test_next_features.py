"""The engine's other features on qwen35moe and qwen4exp: MTP drafting (qwen35moe), experts streamed through a
small cache, the PLE table read by pread instead of the mapping, quantized files, and the refusals that name the
file and key (a llama.cpp-converted QSA model whose compress ratios were written as 0, bad QSA / PLE metadata)."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from corrupt import rewrite
import exactness
from hf_tiny_next import make_tiny_qwen35moe, make_tiny_qwen4exp
from seeds import fresh_rng
from strata_py.convert import convert
from strata_py.model import Model
from window_util import assert_windows_equal_serial

U32, I32, ARR = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.INT32, gguf.GGUFValueType.ARRAY


@pytest.fixture(scope="module")
def q4_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("q4f")
    make_tiny_qwen4exp(d / "hf", seed=31)
    return convert(d / "hf", d / "q4.gguf", "f32")


@pytest.fixture(scope="module")
def q35_mtp_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("q35f")
    make_tiny_qwen35moe(d / "hf", seed=32, with_mtp=True)
    return convert(d / "hf", d / "q35.gguf", "q8_0")


def _prompt(model, n=40, seed=0):
    return np.random.default_rng(seed).integers(0, model.n_vocab, n).tolist()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_qwen35moe_mtp_drafts_keep_the_output(q35_mtp_path, temperature):
    model = Model.load(q35_mtp_path, threads=2)
    assert model.has_mtp
    prompt = _prompt(model)
    cfg = exactness.config("greedy" if temperature == 0 else "sampled", 3, 40, temperature=temperature)
    exactness.assert_equals_plain(model, prompt, cfg, ["mtp", "mtp+suffix"])


@pytest.mark.parametrize("which", ["q4_path", "q35_mtp_path"])
def test_streamed_experts_keep_the_output(request, which):
    path = request.getfixturevalue(which)
    full = Model.load(path, threads=2)
    small = Model.load(path, threads=2, cache_mib=1)  # a few experts of each layer
    assert small.streaming
    prompt = _prompt(full, 30, 1)
    exactness.assert_equals_plain(small, prompt, exactness.config("greedy", 0, 24), ["none", "suffix"], ref_model=full)
    assert small.expert_stats()["bytes_read"] > 0


def test_ple_rows_by_pread_equal_the_mapping(q4_path):
    mapped = Model.load(q4_path, threads=2)
    pread = Model.load(q4_path, threads=2, ple_map_mib=0)
    assert not mapped._core.ple_pread and pread._core.ple_pread
    ids = _prompt(mapped, 33, 2)
    np.testing.assert_array_equal(mapped.session(n_ctx=64).run(ids), pread.session(n_ctx=64).run(ids))


@pytest.mark.parametrize("typ", ["q8_0", "bf16"])
def test_quantized_qwen4exp_windows(tmp_path, typ):
    d = tmp_path / "hf"
    make_tiny_qwen4exp(d, seed=33)
    model = Model.load(convert(d, tmp_path / f"q4-{typ}.gguf", typ), threads=2)
    assert_windows_equal_serial(model, windows=(1, 3, 8, 9, 16), seed=5, label=typ)


def test_all_zero_compress_ratios_are_refused(q4_path, tmp_path):
    """llama.cpp's converter writes every compress ratio as 0 when transformers has renamed the layer type
    (qwen4exp.md 3.3): the file would run dense attention, which is not the model. Refused naming the layer and key;
    the bench-only dense option loads it."""
    n = Model.load(q4_path)._core.config["n_layer"]
    bad = rewrite(q4_path, tmp_path / "zero-ratios.gguf",
                  set_value=("qwen4exp.attention.compress_ratios", [0] * n, ARR, I32))
    with pytest.raises(ValueError, match=r"zero-ratios.gguf: layer 3 has QSA indexer tensors .*compress_ratios\[3\] is 0"):
        Model.load(bad)
    dense = Model.load(bad, _dense_attention=True)
    assert "QSA on 0 layers" in dense._core.summary()


@pytest.mark.parametrize("key, value, vtype, sub, match", [
    ("qwen4exp.attention.indexer.top_k", 6, U32, None, r"top_k = 6 is not a positive multiple of the compress ratio 4"),
    ("qwen4exp.attention.compress_ratios", [0, 0, 0, 3], ARR, I32, None),  # ratio 3 with budget 8: not a multiple
    ("qwen4exp.ple.layers", [3], ARR, I32, r"ple.layers = \[3\] \(must name a DeltaNet layer"),
    ("qwen4exp.ple.layer_multipliers", [1, 3], ARR, gguf.GGUFValueType.UINT64,
     r"ple.layer_multipliers has 2 entries, ple.ngram_size is 3"),
    ("qwen4exp.hyper_connection.count", 1, U32, None, r"hyper_connection.count = 1"),
    ("qwen4exp.ssm.output_gate_type", "gelu", gguf.GGUFValueType.STRING, None, r"output_gate_type = 'gelu'"),
])
def test_bad_qwen4exp_metadata_is_refused(q4_path, tmp_path, key, value, vtype, sub, match):
    bad = rewrite(q4_path, tmp_path / "bad.gguf", set_value=(key, value, vtype, sub))
    with pytest.raises(ValueError, match=match or r"bad.gguf: inconsistent hyperparameters"):
        Model.load(bad)


def test_missing_layer_layout_is_refused(q4_path, tmp_path):
    bad = rewrite(q4_path, tmp_path / "nolayout.gguf", drop_kv="qwen4exp.attention.recurrent_layers")
    with pytest.raises(ValueError, match=r"nolayout.gguf: missing metadata key 'qwen4exp.attention.recurrent_layers'"):
        Model.load(bad)


def test_ple_table_too_short_is_refused(q4_path, tmp_path):
    r = gguf.GGUFReader(str(q4_path))
    t = next(t for t in r.tensors if t.name == "per_layer_token_embd.weight")
    rows = int(t.shape[1])
    bad = rewrite(q4_path, tmp_path / "short.gguf", reshape=("per_layer_token_embd.weight", (rows // 2, int(t.shape[0]))))
    with pytest.raises(ValueError, match=r"short.gguf: tensor 'per_layer_token_embd.weight' has \d+ rows, but"):
        Model.load(bad)


def test_qsa_selection_rule():
    """The fixed tie rule at a selection boundary (transformers' topk has none): the lower block index wins;
    exact-zero scores (every head's dot negative) are the common tie; NaN ranks last; the result is ascending."""
    from strata_py import _core
    assert _core.qsa_select([0.0] * 8, 2) == [0, 1]
    assert _core.qsa_select([1.0, 0.0, 2.0, 0.0, 0.0, 2.0], 3) == [0, 2, 5]
    assert _core.qsa_select([0.5, 3.0, 0.5, 3.0, 0.5], 3) == [0, 1, 3]
    assert _core.qsa_select([float("nan"), 0.0, 1.0], 2) == [1, 2]
    rng = fresh_rng()
    for _ in range(200):  # against a sort by (score desc, index asc)
        n = int(rng.integers(1, 60))
        s = rng.integers(0, 4, n).astype(np.float32).tolist()  # many ties
        kb = int(rng.integers(1, n + 1))
        want = sorted(sorted(range(n), key=lambda b: (-s[b], b))[:kb])
        assert _core.qsa_select(s, kb) == want
