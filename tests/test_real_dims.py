"""Qwen3-Next-80B-A3B's real layer dimensions (hidden 2048, 16 query heads of 256 and 2 KV heads, 16/32 DeltaNet
heads of 128, experts of 512 with a shared expert, top-10 routing), with 4 layers (three DeltaNet, one
attention), 10 experts and a 1024-token vocabulary so that it fits a CI run: strata against transformers
float32 on the same weights <= 1e-4, and windows equal serial decoding bit for bit at these shapes. The
full-vocabulary and 512-expert checks (and llama.cpp beside them) are bench/check_real_dims.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from strata_py import synth
from strata_py.model import Model
from window_util import assert_windows_equal_serial

synth.SIZES.setdefault("80b-ci", dict(synth.SIZES["80b"], n_vocab=1024, n_layer=4, n_expert=10))


@pytest.fixture(scope="module")
def real_q8(tmp_path_factory):
    return synth.write("80b-ci", tmp_path_factory.mktemp("real") / "80b-ci-q8_0.gguf", "q8_0", seed=13)


def test_real_dims_match_transformers(real_q8, tmp_path):
    from transformers import Qwen3NextForCausalLM

    from strata_py.convert import gguf_to_hf
    model = Model.load(real_q8, threads=2)
    c = model.config
    assert (c["n_embd"], c["n_head"], c["n_head_kv"], c["head_dim"], c["n_expert_used"]) == (2048, 16, 2, 256, 10)
    ids = np.random.default_rng(2).integers(0, model.n_vocab, 24).tolist()
    ref_model = Qwen3NextForCausalLM.from_pretrained(gguf_to_hf(real_q8, tmp_path / "hf"), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0].float().numpy()
    got = model.session(n_ctx=64).run(ids)
    rel = np.max(np.linalg.norm(got - ref, axis=-1) / np.linalg.norm(ref, axis=-1))
    assert rel <= 1e-4, rel


def test_real_dims_windows_equal_serial(real_q8):
    assert_windows_equal_serial(Model.load(real_q8, threads=2), windows=(2, 9), label="80b dims")
