"""Reference parity for the two newer architectures: tiny random Qwen3.5-MoE (`qwen35moe`) and Qwen3.8-Flash-Next
(`qwen4exp`: QSA, PLE, hyper-connections) models built with transformers (tests/hf_tiny_next.py), converted by our
converter, give the transformers logits (max over positions of ||diff|| / ||ref|| <= 1e-4) in one prompt window
and one token at a time, with sequences long enough that QSA selects sparsely (a budget of 8 tokens) and a PLE
layer; QSA selects exactly transformers' blocks at every position; greedy continuations are identical."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import exactness
from hf_tiny_next import capture_qsa, make_tiny_qwen35moe, make_tiny_qwen4exp
from strata_py.convert import convert
from strata_py.model import Model

TOL = 1e-4
N = 72  # tokens: QSA (budget 8, blocks of 4) is sparse from position 12 on


def _rel(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.linalg.norm(ours - ref, axis=-1) / np.linalg.norm(ref, axis=-1)))


@pytest.fixture(scope="module", params=["qwen35moe", "qwen4exp"])
def arch(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    make = make_tiny_qwen35moe if request.param == "qwen35moe" else make_tiny_qwen4exp
    ref = make(d / "hf", seed=11)
    path = convert(d / "hf", d / "tiny.gguf", "f32")
    return request.param, ref, Model.load(path, threads=2)


def _ids(model, n, seed):
    return np.random.default_rng(seed).integers(0, model.n_vocab, n).tolist()


def test_logits_match_transformers(arch):
    name, ref_model, model = arch
    assert model.config["arch"] == name
    ids = _ids(model, N, 0)
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0].float().numpy()
    s = model.session(n_ctx=128)
    window = s.run(ids)  # one prompt window
    s.commit(N)
    assert _rel(window, ref) <= TOL
    s = model.session(n_ctx=128)
    serial = []
    for t in ids:
        serial.append(s.run([t])[0])
        s.commit(1)
    assert _rel(np.stack(serial), ref) <= TOL


def test_eos_cuts_the_ngram_context(arch):
    """PLE hashes n-grams that an EOS resets (qwen4exp.md 1.7): EOS tokens inside the sequence, checked against
    transformers like any other sequence."""
    name, ref_model, model = arch
    if name != "qwen4exp":
        pytest.skip("PLE is qwen4exp's")
    ids = _ids(model, 40, 3)
    eos = ref_model.config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    for p in (0, 5, 6, 17, 30, 31):
        ids[p] = eos
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0].float().numpy()
    s = model.session(n_ctx=64)
    assert _rel(s.run(ids), ref) <= TOL


def test_qsa_selects_the_reference_blocks(arch):
    name, ref_model, model = arch
    if name != "qwen4exp":
        pytest.skip("QSA is qwen4exp's")
    ids = _ids(model, N, 1)
    with capture_qsa(ref_model) as ref_sel, torch.no_grad():
        ref_model(torch.tensor([ids]))
    assert ref_sel, "transformers recorded no QSA selection"
    # one prompt window, and one token at a time
    s = model.session(n_ctx=128)
    s.record_qsa(True)
    s.run(ids)
    window = s.qsa_selected()
    s.commit(N)
    serial = {}
    s = model.session(n_ctx=128)
    s.record_qsa(True)
    for t in ids:
        s.run([t])
        for layer, rows in s.qsa_selected().items():
            serial.setdefault(layer, []).append(rows[0])
        s.commit(1)
    assert set(window) == set(ref_sel)
    r, kb = model.config["qsa_ratio"], model.config["qsa_budget"] // model.config["qsa_ratio"]
    sparse = 0
    for layer, per_pos in ref_sel.items():
        for p in range(N):
            n_c = (p + 1) // r
            want = sorted(per_pos[p])
            dense = list(range(n_c))  # strata reports a dense row as []: every complete block
            assert (window[layer][p] or dense) == want, f"layer {layer} position {p}"
            assert (serial[layer][p] or dense) == want, f"layer {layer} position {p} (serial)"
            assert bool(window[layer][p]) == (n_c > kb)
            sparse += n_c > kb
    assert sparse > 0.8 * N * len(ref_sel)  # most positions of every QSA layer selected sparsely


def test_greedy_continuation_identical(arch):
    name, ref_model, model = arch
    prompt = model.tokenizer.encode("def parse_args(argv):\n    return argv")
    with torch.no_grad():
        out = ref_model.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False, min_new_tokens=32,
                                 pad_token_id=0)
    ref = out[0, len(prompt):].tolist()
    cfg = exactness.config("greedy", 0, 32)
    assert exactness.plain(model, prompt, cfg) == ref
    exactness.assert_equals_plain(model, prompt, cfg, ["suffix"], reference=ref)
