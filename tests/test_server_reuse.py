"""Exact prefix reuse: a warm server (each turn restores the last one's checkpoint) answers exactly what a cold
process answers, for every drafter, greedy and sampled; the checkpoint ring survives a restart (--slot-save)."""
from __future__ import annotations

import pytest

from server_util import TEMPLATES, Server, chat_ids, cold_answer
from strata_py.model import Model

MODEL = "strata-default-q8_0"
DRAFTS = ["none", "suffix", "auto", "mtp", "mtp+suffix"]
TURNS = ["def add(a, b):", "Now the same for multiply.", "And a test for both, with pytest."]


@pytest.fixture(scope="module")
def default_model():
    return Model.load(threads=2)


def no_end_marker(model) -> dict[int, float]:
    """logit_bias banning the tokens that could start the text "<|im_end|>": the shipped model is a code model
    and would end a chat reply at once (a stop string); banned, it writes code (and the bias is exercised)."""
    t = model.tokenizer
    return {i: -100.0 for i in range(t.n_vocab) if t.token_bytes(i).lstrip() in (b"<", b"</")}


def converse(client, model, template, turns, *, temperature, draft, max_tokens=24, seed0=100, model_id=MODEL):
    """Run a conversation on the server; check every turn against a cold answer; return the cached counts."""
    msgs = [{"role": "system", "content": "You are a Python programmer."}]
    cached, prev_len = [], 0
    bias = no_end_marker(model)
    for k, user in enumerate(turns):
        msgs.append({"role": "user", "content": user})
        r = client.chat.completions.create(model=model_id, messages=msgs, max_tokens=max_tokens,
                                           temperature=temperature, top_p=0.9, seed=seed0 + k, extra_body={"draft": draft},
                                           logit_bias={str(i): b for i, b in bias.items()})
        got = r.choices[0].message.content
        ids, stops = chat_ids(model, template, msgs)
        want = cold_answer(model, ids, stops, max_tokens=max_tokens, temperature=temperature, top_p=0.9,
                           seed=seed0 + k, draft="none", logit_bias=bias)
        assert got == want, f"turn {k} with draft={draft}, temperature={temperature}"
        assert len(got) >= 20, got
        assert r.usage.prompt_tokens == len(ids)
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
        if k:  # at least the previous prompt was reused (the template renders earlier turns unchanged)
            assert cached[-1] >= prev_len - 1, (cached, prev_len)
        prev_len = len(ids)
        msgs.append({"role": "assistant", "content": got})
    return cached


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("draft", DRAFTS)
def test_warm_equals_cold_every_drafter(default_server, default_model, draft, temperature):
    converse(default_server.client(), default_model, TEMPLATES / "qwen3.jinja", TURNS, temperature=temperature,
             draft=draft)


@pytest.fixture(scope="module")
def backend_server():
    """The server on backend sessions (--backend cpu-backend: the GPU's forward, over the CPU backend)."""
    s = Server("--backend", "cpu-backend", "--chat-template-file", str(TEMPLATES / "qwen3.jinja")).ready()
    yield s
    s.stop()


@pytest.mark.parametrize("draft,temperature", [("none", 0.0), ("suffix", 0.8), ("mtp", 0.0)])
def test_backend_server_warm_equals_cold(backend_server, default_model, draft, temperature):
    """On a backend session the prompt cache takes and restores checkpoints in the backend's memory: every turn
    reuses the last one's prompt and equals the native cold answer."""
    cached = converse(backend_server.client(), default_model, TEMPLATES / "qwen3.jinja", TURNS, temperature=temperature,
                      draft=draft)
    assert all(c > 0 for c in cached[1:]), cached


def test_two_conversations_interleaved(default_server, default_model):
    """Turns of two conversations alternate on one timeline: each still equals its cold answers."""
    c = default_server.client()
    tmpl = TEMPLATES / "qwen3.jinja"
    a = [{"role": "user", "content": "import json"}]
    b = [{"role": "user", "content": "class Tree:"}]
    for k in range(3):
        bias = no_end_marker(default_model)
        for conv in (a, b):
            r = c.chat.completions.create(model=MODEL, messages=conv, max_tokens=16, temperature=0.6, seed=k,
                                          logit_bias={str(i): v for i, v in bias.items()})
            ids, stops = chat_ids(default_model, tmpl, conv)
            assert r.choices[0].message.content == cold_answer(default_model, ids, stops, max_tokens=16,
                                                               temperature=0.6, seed=k, logit_bias=bias)
            assert r.choices[0].message.content
            conv += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": f"step {k}"}]


def test_message_boundary_checkpoints(default_server, default_model):
    """A long conversation arriving cold is checkpointed at message starts: an edit of its last message reuses
    everything before it."""
    c = default_server.client()
    long = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"def f{i}(x):\n    return x * {i}\n" * 3}
            for i in range(7)]
    r1 = c.chat.completions.create(model=MODEL, messages=long, max_tokens=4, temperature=0.0)
    edited = long[:-1] + [{"role": "user", "content": "something else entirely"}]
    r2 = c.chat.completions.create(model=MODEL, messages=edited, max_tokens=4, temperature=0.0)
    assert r1.usage.prompt_tokens > 200
    ids_long, _ = chat_ids(default_model, TEMPLATES / "qwen3.jinja", long)
    ids_edit, _ = chat_ids(default_model, TEMPLATES / "qwen3.jinja", edited)
    common = next(i for i, (x, y) in enumerate(zip(ids_long, ids_edit)) if x != y)
    # the checkpoint where the last message starts (its header is shared, its text is not)
    assert common - 1 <= r2.usage.prompt_tokens_details.cached_tokens <= common
    ids, stops = chat_ids(default_model, TEMPLATES / "qwen3.jinja", edited)
    assert r2.choices[0].message.content == cold_answer(default_model, ids, stops, max_tokens=4, temperature=0.0)


def test_slot_save_survives_restart(tmp_path, default_model):
    """--slot-save DIR: the ring is written on shutdown and read at start; the next turn after a restart reuses
    it and still equals the cold answer."""
    slots = tmp_path / "slots"
    tmpl = TEMPLATES / "qwen3.jinja"
    s = Server("--chat-template-file", str(tmpl), "--slot-save", str(slots)).ready()
    try:
        converse(s.client(), default_model, tmpl, TURNS[:2], temperature=0.0, draft="auto")
    finally:
        assert s.stop() in (0, -15), s.log_text()  # uvicorn re-raises SIGTERM after its graceful shutdown
    files = list(slots.glob("*.strata-session"))
    assert len(files) >= 2
    (slots / "junk.strata-session").write_bytes(b"not a checkpoint")  # refused, and the rest still loads
    s = Server("--chat-template-file", str(tmpl), "--slot-save", str(slots)).ready()
    try:
        cached = converse(s.client(), default_model, tmpl, TURNS[:2], temperature=0.0, draft="auto")
        assert cached[0] > 0  # turn 1 was served from a file checkpoint right after the restart
    finally:
        s.stop()
