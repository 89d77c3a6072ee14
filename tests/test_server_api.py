"""The OpenAI API of `python -m strata_py.serve` (a real process; the official openai client): streaming ==
blocking == strata_py.generate, logprobs, usage, tokenize, metrics, and 4xx answers in OpenAI's error shape
after which the server keeps serving."""
from __future__ import annotations

import json

import openai
import pytest

from server_util import TEMPLATES, chat_ids, cold_answer
from strata_py.generate import generate
from strata_py.model import Model
from strata_py.server.templates import ChatTemplate

MODEL = "strata-default-q8_0"
PROMPT = "def parse_args(argv):\n"


@pytest.fixture(scope="module")
def default_model():
    return Model.load(threads=2)


def _stream_completion(client, **kw):
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    return "".join(c.choices[0].text for c in chunks if c.choices), chunks[-1].usage, chunks


def _stream_chat(client, **kw):
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks[-1].usage, chunks


@pytest.mark.parametrize("temperature,seed", [(0.0, 0), (0.9, 11)])
def test_completion_stream_equals_blocking_equals_generate(default_server, default_model, temperature, seed):
    c = default_server.client()
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=48, temperature=temperature, seed=seed, top_p=0.95)
    ref = "".join(generate(default_model, PROMPT, max_tokens=48, temperature=temperature, seed=seed, top_p=0.95))
    blk = c.completions.create(**kw)
    text, usage, chunks = _stream_completion(c, **kw)
    assert blk.choices[0].text == text == ref
    assert len(ref) > 20
    assert blk.usage.prompt_tokens == usage.prompt_tokens == len(default_model.tokenizer.encode(PROMPT))
    assert blk.usage.completion_tokens == usage.completion_tokens > 0
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")
    assert blk.object == "text_completion" and blk.model == MODEL


def test_dry_request_fields(default_server, default_model):
    """llama-server's DRY fields through the openai client's extra_body: the answer equals strata_py.generate with
    the same options; a bad value is a 400 naming the field."""
    c = default_server.client()
    dry = dict(dry_multiplier=1.2, dry_base=2.0, dry_allowed_length=1, dry_penalty_last_n=64,
               dry_sequence_breakers=["\n"])
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0.0)
    ref = "".join(generate(default_model, PROMPT, max_tokens=40, temperature=0.0, **dry))
    assert c.completions.create(**kw, extra_body=dry).choices[0].text == ref
    assert c.completions.create(**kw, extra_body={"dry_multiplier": 0.0}).choices[0].text != ref
    _error(default_server.post("/v1/completions", json={"prompt": "x", "dry_base": 0.5}), 400, "dry_base")
    _error(default_server.post("/v1/completions", json={"prompt": "x", "dry_sequence_breakers": []}), 400,
           "dry_sequence_breakers")


def test_chat_stream_equals_blocking_equals_generate(default_server, default_model):
    c = default_server.client()
    msgs = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def fib(n):"}]
    kw = dict(model=MODEL, messages=msgs, max_tokens=40, temperature=0.7, seed=3)
    ids, stops = chat_ids(default_model, TEMPLATES / "qwen3.jinja", msgs)
    ref = cold_answer(default_model, ids, stops, max_tokens=40, temperature=0.7, seed=3)
    blk = c.chat.completions.create(**kw)
    text, usage, chunks = _stream_chat(c, **kw)
    assert blk.choices[0].message.content == text == ref
    assert chunks[0].choices[0].delta.role == "assistant"
    assert usage.prompt_tokens == blk.usage.prompt_tokens == len(ids)
    assert blk.object == "chat.completion" and blk.choices[0].message.role == "assistant"


def test_logprobs_stream_equals_blocking(default_server, tiny_server):
    c = tiny_server.client()  # (the shipped model ends a chat reply at once: it is a code model)
    kw = dict(model="tiny-q8_0", messages=[{"role": "user", "content": "import os\n"}], max_tokens=12,
              temperature=0.0, logprobs=True, top_logprobs=3)
    blk = c.chat.completions.create(**kw)
    chunks = list(c.chat.completions.create(stream=True, **kw))
    lp_b = blk.choices[0].logprobs.content
    lp_s = [e for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in lp_b] == [(e.token, e.logprob) for e in lp_s]
    assert len(lp_b) >= 1
    text = bytes(b for e in lp_b for b in e.bytes).decode("utf-8", errors="replace")
    assert text == blk.choices[0].message.content
    for e in lp_b:  # greedy: the chosen token is the most likely one
        assert len(e.top_logprobs) == 3 and e.logprob <= 0
        assert e.top_logprobs[0].logprob == e.logprob
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
    comp = default_server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0.0,
                                                      logprobs=2)
    lp = comp.choices[0].logprobs
    assert "".join(lp.tokens) == comp.choices[0].text and len(lp.token_logprobs) == len(lp.tokens)
    assert all(len(t) == 2 for t in lp.top_logprobs) and lp.text_offset[0] == 0


def test_cached_tokens_and_same_answer(default_server):
    c = default_server.client()
    msgs = [{"role": "user", "content": "class Stack:\n    def push(self, x):"}]
    a = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0.0)
    b = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0.0)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert b.usage.prompt_tokens_details.cached_tokens == b.usage.prompt_tokens - 1


def test_models_health_tokenize(default_server, default_model):
    r = default_server.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    models = default_server.client().models.list().data
    assert [m.id for m in models] == [MODEL]
    r = default_server.post("/tokenize", json={"content": PROMPT})
    assert r.json()["tokens"] == default_model.tokenizer.encode(PROMPT)
    r = default_server.post("/detokenize", json={"tokens": r.json()["tokens"]})
    assert r.json()["content"] == PROMPT
    msgs = [{"role": "user", "content": "hi"}]
    r = default_server.post("/tokenize", json={"messages": msgs})
    tmpl = ChatTemplate.for_model(default_model, TEMPLATES / "qwen3.jinja")
    assert r.json()["tokens"] == default_model.tokenizer.encode(tmpl.render(msgs, add_generation_prompt=True))


def _error(r, status: int, param):
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["message"]
    assert e["param"] == param, e
    return e


def test_malformed_requests_answer_4xx_and_the_server_keeps_serving(default_server):
    s = default_server
    chat = "/v1/chat/completions"
    user = [{"role": "user", "content": "x"}]
    e = _error(s.post("/v1/completions", content=b'{"prompt": "x", ', headers={"content-type": "application/json"}),
               400, None)
    assert "JSON" in e["message"]
    e = _error(s.post("/v1/completions", json={"model": "gpt-4", "prompt": "x"}), 404, "model")
    assert e["code"] == "model_not_found" and "gpt-4" in e["message"]
    _error(s.post("/v1/completions", json={"prompt": "x", "temperature": "hot"}), 400, "temperature")
    _error(s.post("/v1/completions", json={"prompt": "x", "max_tokens": -1}), 400, "max_tokens")
    _error(s.post("/v1/completions", json={"prompt": "x", "max_tokens": True}), 400, "max_tokens")
    _error(s.post("/v1/completions", json={"prompt": "x", "top_p": 0}), 400, "top_p")
    _error(s.post("/v1/completions", json={"prompt": "x", "n": 2}), 400, "n")
    _error(s.post("/v1/completions", json={"prompt": [5, 99999]}), 400, "prompt.1")
    _error(s.post("/v1/completions", json={"prompt": "x", "stream_options": {"include_usage": True}}), 400,
           "stream_options")
    e = _error(s.post("/v1/completions", json={"prompt": "a " * 5000}), 400, "prompt")
    assert e["code"] == "context_length_exceeded"
    e = _error(s.post(chat, json={"messages": [{"role": "user", "content": "a " * 5000}]}), 400, "messages")
    assert e["code"] == "context_length_exceeded"
    e = _error(s.post("/v1/completions", json={"prompt": "x", "max_tokens": 5000}), 400, "max_tokens")
    _error(s.post(chat, json={"model": MODEL}), 400, "messages")
    _error(s.post(chat, json={"messages": []}), 400, "messages")
    _error(s.post(chat, json={"messages": [{"role": "robot", "content": "x"}]}), 400, "messages.0.role")
    _error(s.post(chat, json={"messages": [{"role": "user", "content": 5}]}), 400, "messages.0.content")
    _error(s.post(chat, json={"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}), 400,
           "messages.0.content.0.type")
    _error(s.post(chat, json={"messages": user, "draft": "psychic"}), 400, "draft")
    _error(s.post(chat, json={"messages": user, "logit_bias": {"banana": 1}}), 400, "logit_bias")
    _error(s.post(chat, json={"messages": user, "top_logprobs": 50}), 400, "top_logprobs")
    _error(s.post("/detokenize", json={"tokens": [1, -3]}), 400, "tokens.1")
    _error(s.post("/v1/nothing", json={}), 404, None)
    _error(s.get("/v1/chat/completions"), 405, None)
    with pytest.raises(openai.BadRequestError) as ei:  # the official client sees the same shape
        s.client().completions.create(model=MODEL, prompt="x", max_tokens=-5)
    assert ei.value.status_code == 400 and ei.value.body["param"] == "max_tokens"
    ok = s.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0.0)
    assert ok.usage.completion_tokens >= 1


def test_metrics_parse(default_server):
    s = default_server
    s.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0.0)
    s.post("/v1/completions", json={"prompt": "x", "temperature": "hot"})
    m = s.metrics()
    assert m[("strata_requests_total", (("route", "/v1/completions"), ("status", "200")))] >= 1
    assert m[("strata_requests_total", (("route", "/v1/completions"), ("status", "400")))] >= 1
    assert m[("strata_generated_tokens_total", ())] >= 4
    assert m[("strata_prompt_tokens_total", ())] >= m[("strata_prompt_tokens_cached_total", ())]
    assert m[("strata_prefix_cache_lookups_total", ())] >= m[("strata_prefix_cache_hits_total", ())]
    assert m[("strata_prefix_cache_entries", ())] >= 1 and m[("strata_prefix_cache_bytes", ())] > 0
    assert m[("strata_time_to_first_token_seconds_count", ())] >= 1
    assert 0 <= m[("strata_draft_acceptance_ratio", ())] <= 1
    assert json.dumps(m is not None)
