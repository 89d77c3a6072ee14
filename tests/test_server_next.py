"""The server on the newer architectures: a qwen4exp model (QSA past its budget, a PLE layer, hyper-connections)
and a qwen35moe model with an MTP block served by a real `python -m strata_py.serve` process, driven by the
official openai client: warm turns (restored QSA index keys, PLE history, DeltaNet state) answer exactly what a
cold process answers, for the suffix and MTP drafters, greedy and sampled."""
from __future__ import annotations

import pytest

from hf_tiny_next import make_tiny_qwen35moe, make_tiny_qwen4exp
from server_util import Server, chat_ids, cold_answer
from strata_py.convert import convert
from strata_py.model import Model

TURNS = ["def parse(argv):", "Now with a default.", "And the tests, please."]


@pytest.fixture(scope="module", params=["qwen4exp", "qwen35moe"])
def served(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"srv-{request.param}")
    if request.param == "qwen4exp":
        make_tiny_qwen4exp(d / "hf", seed=41)
    else:
        make_tiny_qwen35moe(d / "hf", seed=42, with_mtp=True)
    path = convert(d / "hf", d / "m.gguf", "f32")
    server = Server("--model", str(path), "--checkpoint-gap", "8", "--ctx", "512").ready()
    yield request.param, Model.load(path, threads=2), server
    server.stop()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_warm_turns_equal_cold_answers(served, temperature):
    arch, model, server = served
    client = server.client()
    msgs = [{"role": "system", "content": "You write Python."}]
    for k, user in enumerate(TURNS):
        msgs.append({"role": "user", "content": user})
        for draft in ("suffix", "mtp") if arch == "qwen35moe" else ("suffix", "none"):
            r = client.chat.completions.create(model="m", messages=msgs, max_tokens=20, temperature=temperature,
                                               seed=7 + k, extra_body={"draft": draft})
            ids, stops = chat_ids(model, None, msgs)
            want = cold_answer(model, ids, stops, max_tokens=20, temperature=temperature, seed=7 + k, draft="none")
            assert r.choices[0].message.content == want, (arch, k, draft)
            if k:
                assert r.usage.prompt_tokens_details.cached_tokens > 0
        msgs.append({"role": "assistant", "content": r.choices[0].message.content})
    assert len(model.tokenizer.encode(str(msgs))) > 12  # past the tiny QSA budget of 8 tokens
