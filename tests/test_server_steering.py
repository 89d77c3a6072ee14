"""Steered decoding through the API: a tool-call round trip in both Qwen forms (the call forced by tool_choice,
parsed into OpenAI tool_calls, sent back with its result and rendered as transformers renders it),
response_format json_schema / json_object output that validates, stop strings, logit_bias."""
from __future__ import annotations

import json

import jsonschema
import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from server_util import TEMPLATES
from strata_py.generate import generate
from strata_py.model import Model

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city for some days",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 14}},
                   "required": ["city", "days"]}}}
NOOP = {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def default_model():
    return Model.load(threads=2)


def _stream_tool_calls(client, **kw):
    chunks = list(client.chat.completions.create(stream=True, **kw))
    calls = [tc for c in chunks if c.choices and c.choices[0].delta.tool_calls for tc in c.choices[0].delta.tool_calls]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return calls, finish


@pytest.mark.parametrize("which", ["default", "tiny"])
def test_tool_call_round_trip(request, which, default_model, tiny_q8_model):
    server = request.getfixturevalue(f"{which}_server")
    model_id, model = ("strata-default-q8_0", default_model) if which == "default" else ("tiny-q8_0", tiny_q8_model)
    template = TEMPLATES / ("qwen3.jinja" if which == "default" else "qwen3-coder.jinja")
    c = server.client()
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw = dict(model=model_id, messages=msgs, tools=[WEATHER, NOOP], temperature=0.0, max_tokens=250,
              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    r = c.chat.completions.create(**kw)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    call = ch.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    calls, finish = _stream_tool_calls(c, **kw)  # streamed: the same call
    assert [(x.function.name, x.function.arguments) for x in calls] == [("get_weather", call.function.arguments)]
    assert finish == ["tool_calls"]
    r2 = c.chat.completions.create(model=model_id, messages=msgs, tools=[WEATHER, NOOP], temperature=0.0,
                                   max_tokens=40, tool_choice="required")
    assert r2.choices[0].message.tool_calls[0].function.name in ("get_weather", "noop")
    # the result goes back: the server renders the call and the tool's answer as transformers does
    history = msgs + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                      {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear", "c": 21}'}]
    r3 = c.chat.completions.create(model=model_id, messages=history, tools=[WEATHER, NOOP], max_tokens=8,
                                   temperature=0.0)
    assert r3.choices[0].finish_reason in ("stop", "length", "tool_calls")
    tok = server.post("/tokenize", json={"messages": history, "tools": [WEATHER, NOOP]}).json()["tokens"]
    as_dicts = [dict(m) for m in history]
    as_dicts[1] = {"role": "assistant", "content": "", "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": args}}]}
    want = render_jinja_template(conversations=[as_dicts], tools=[WEATHER, NOOP], chat_template=template.read_text(),
                                 add_generation_prompt=True, bos_token="", eos_token="<|endoftext|>")[0][0]
    assert tok == model.tokenizer.encode(want)
    assert r3.usage.prompt_tokens == len(tok)
    assert r3.usage.prompt_tokens_details.cached_tokens > 0  # the first turn's prompt was reused


def test_tool_choice_errors(default_server):
    s = default_server
    base = {"messages": [{"role": "user", "content": "x"}]}
    r = s.post("/v1/chat/completions", json={**base, "tool_choice": "required"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    r = s.post("/v1/chat/completions", json={**base, "tools": [WEATHER],
                                             "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    assert r.status_code == 400 and "nope" in r.json()["error"]["message"]


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "tags", "n"], "additionalProperties": False}


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_response_format_json_schema_validates(default_server, temperature):
    c = default_server.client()
    kw = dict(model="strata-default-q8_0", messages=[{"role": "user", "content": "Describe a function as JSON."}],
              max_tokens=120, temperature=temperature, seed=5,
              response_format={"type": "json_schema", "json_schema": {"name": "fn", "schema": SCHEMA, "strict": True}})
    r = c.chat.completions.create(**kw)
    out = json.loads(r.choices[0].message.content)
    jsonschema.validate(out, SCHEMA)
    assert r.choices[0].finish_reason == "stop"
    chunks = list(c.chat.completions.create(stream=True, **kw))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == r.choices[0].message.content
    r = c.chat.completions.create(model="strata-default-q8_0", messages=[{"role": "user", "content": "JSON!"}],
                                  max_tokens=60, temperature=temperature, seed=2,
                                  response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)


@pytest.mark.parametrize("stream", [False, True])
def test_bad_schema_is_a_400(default_server, stream):
    """Compiled before any work: a 400 naming the field, a streamed request's too (not a 200 stream)."""
    r = default_server.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], "stream": stream,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
    r = default_server.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                          "response_format": {"type": "json_schema"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format.json_schema"


def test_stop_strings_and_logit_bias(default_server, default_model):
    c = default_server.client()
    prompt = "def parse_args(argv):\n"
    for stop in (["\n"], ["return", "):"], "argv"):
        stops = [stop] if isinstance(stop, str) else stop
        ref = "".join(generate(default_model, prompt, max_tokens=60, temperature=0.0, stop=stops))
        blk = c.completions.create(model="strata-default-q8_0", prompt=prompt, max_tokens=60, temperature=0.0,
                                   stop=stop)
        streamed = "".join(ch.choices[0].text for ch in c.completions.create(
            model="strata-default-q8_0", prompt=prompt, max_tokens=60, temperature=0.0, stop=stop, stream=True)
            if ch.choices)
        assert blk.choices[0].text == streamed == ref
        assert not any(s in ref for s in stops)
    plain = c.completions.create(model="strata-default-q8_0", prompt=prompt, max_tokens=8, temperature=0.0)
    first = default_model.tokenizer.encode(plain.choices[0].text)[0]
    biased = c.completions.create(model="strata-default-q8_0", prompt=prompt, max_tokens=8, temperature=0.0,
                                  logit_bias={str(first): -100})
    assert default_model.tokenizer.encode(biased.choices[0].text)[:1] != [first]
    assert biased.choices[0].text == "".join(generate(default_model, prompt, max_tokens=8, temperature=0.0,
                                                      logit_bias={first: -100.0}))
