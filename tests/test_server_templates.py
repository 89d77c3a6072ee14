"""Chat templates render exactly as transformers renders them (Qwen2.5, Qwen3, Qwen3-Coder templates from
llama.cpp's models/templates, in tests/data/templates), in a sandbox; where templates come from; message
boundaries; tool-call parsing of both Qwen forms, blocking and streamed."""
from __future__ import annotations

import json
import random

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from server_util import TEMPLATES
from strata_py.model import Model, default_model_path
from strata_py.server.templates import ChatTemplate, NoTemplate, TemplateError, encode_at_boundaries
from strata_py.server.tool_calls import ToolStream, parse

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "its name"},
                                                    "days": {"type": "integer"}, "units": {"type": "string",
                                                                                             "enum": ["C", "F"]}},
                   "required": ["city"]}}}]


def _call(city, days):
    return {"role": "assistant", "content": "",
            "tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "get_weather", "arguments": {"city": city, "days": days}}}]}


CONVERSATIONS = [
    ([{"role": "user", "content": "hi"}], None),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo ✓"},
      {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "again"}], None),
    ([{"role": "user", "content": "weather in Paris?"}], TOOLS),
    ([{"role": "system", "content": "You help."}, {"role": "user", "content": "weather in Paris?"}, _call("Paris", 2),
      {"role": "tool", "content": '{"temp": 21}'}, {"role": "tool", "content": "second"},
      {"role": "user", "content": "and Rome?"}], TOOLS),
]


@pytest.mark.parametrize("name", ["qwen2.5", "qwen3", "qwen3-coder"])
@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("gen", [True, False])
def test_render_equals_transformers(name, conv, gen):
    src = (TEMPLATES / f"{name}.jinja").read_text()
    msgs, tools = CONVERSATIONS[conv]
    ours = ChatTemplate(src, origin=name, eos_token="<|im_end|>").render(msgs, tools=tools, add_generation_prompt=gen)
    theirs = render_jinja_template(conversations=[msgs], tools=tools, chat_template=src, add_generation_prompt=gen,
                                   eos_token="<|im_end|>", bos_token="")[0][0]
    assert ours == theirs
    if tools:
        assert "get_weather" in ours


@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
def test_request_messages_render_as_sent(conv):
    """The server's translation of request messages (schema.message_dicts: OpenAI bodies to template dicts) keeps
    every role and content: rendered, a parsed request is transformers' rendering of the messages as sent, and a
    'developer' message renders as the 'system' message it is."""
    from strata_py.server.schema import Message, message_dicts
    src = (TEMPLATES / "qwen3.jinja").read_text()
    msgs, tools = CONVERSATIONS[conv]
    parsed = [Message(**m) for m in msgs]
    ours = ChatTemplate(src, origin="qwen3", eos_token="<|im_end|>").render(message_dicts(parsed), tools=tools)
    theirs = render_jinja_template(conversations=[msgs], tools=tools, chat_template=src, add_generation_prompt=True,
                                   eos_token="<|im_end|>", bos_token="")[0][0]
    assert ours == theirs
    if msgs[0]["role"] == "system":
        dev = [Message(**dict(msgs[0], role="developer"))] + parsed[1:]
        assert ChatTemplate(src, origin="qwen3", eos_token="<|im_end|>").render(message_dicts(dev), tools=tools) == theirs


def test_sandbox_and_errors():
    with pytest.raises(TemplateError, match="refused"):
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}", origin="evil").render([])
    with pytest.raises(TemplateError, match="refused"):
        ChatTemplate("{% set ns = namespace(_x=1) %}", origin="ns").render([])
    with pytest.raises(TemplateError, match="only user"):
        ChatTemplate("{{ raise_exception('only user') }}", origin="strict").render([])
    with pytest.raises(ValueError, match="does not compile"):
        ChatTemplate("{% for %}", origin="broken.jinja")
    gen = ChatTemplate("{% generation %}{{ messages[0].content }}{% endgeneration %}|{{ x | tojson }}", origin="g")
    assert gen.render([{"role": "user", "content": "é"}], x={"a": "é"}) == 'é|{"a": "é"}'


def test_template_sources(tiny_model, tmp_path):
    shipped = Model.load(default_model_path(), threads=1)
    t = ChatTemplate.for_model(shipped)
    assert t.origin.endswith("strata-default.jinja")
    assert t.render([{"role": "user", "content": "x"}]) == "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    assert t.stop_texts(shipped.tokenizer) == ["<|im_end|>"]  # plain text in this vocabulary
    with pytest.raises(NoTemplate, match="--chat-template-file"):
        ChatTemplate.for_model(tiny_model)
    assert ChatTemplate.for_model(tiny_model, TEMPLATES / "qwen3.jinja").tool_format == "json"
    assert ChatTemplate.for_model(tiny_model, TEMPLATES / "qwen3-coder.jinja").tool_format == "xml"
    with pytest.raises(ValueError, match="cannot read"):
        ChatTemplate.for_model(tiny_model, tmp_path / "missing.jinja")


@pytest.mark.parametrize("name", ["qwen2.5", "qwen3", "qwen3-coder"])
def test_boundaries_are_shared_by_continuations(name):
    shipped = Model.load(default_model_path(), threads=1)
    t = ChatTemplate((TEMPLATES / f"{name}.jinja").read_text(), origin=name)
    msgs = CONVERSATIONS[3][0]
    text = t.render(msgs, tools=TOOLS)
    offs = t.boundaries(msgs, text, tools=TOOLS)
    assert len(offs) >= 3 and offs == sorted(offs)
    for i, off in enumerate(offs, start=1):
        # any continuation of the first i messages renders text[:off] first
        other = t.render(msgs[:i] + [{"role": "user", "content": "zzz"}], tools=TOOLS)
        assert other.startswith(text[:off])
    ids, bounds = encode_at_boundaries(shipped.tokenizer, text, offs)
    assert ids == shipped.tokenizer.encode(text)
    for k in bounds:
        assert text.startswith(shipped.tokenizer.decode(ids[:k]))
        assert shipped.tokenizer.decode(ids[:k]) in [text[:o] for o in offs]


QWEN_JSON = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
QWEN_XML = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n<parameter=units>\nC\n</parameter>\n</function>\n</tool_call>")
TWO = ('<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": '
       '"{\\"x\\": [1, 2]}"}\n</tool_call>')


@pytest.mark.parametrize("text,content,calls", [
    (QWEN_JSON, "Let me look.\n", [("get_weather", {"city": "Paris", "days": 2})]),
    (QWEN_XML, "", [("get_weather", {"city": "New York", "days": 3, "units": "C"})]),
    (TWO, "", [("a", {}), ("b", {"x": [1, 2]})]),
    ('<tool_call>\n{"name": "a", "arguments": {"k": 1}}', "", [("a", {"k": 1})]),  # unclosed at the end
    ("<tool_call>\nnot json\n</tool_call> and text", "<tool_call>\nnot json\n</tool_call> and text", []),
    ("plain answer, no calls", "plain answer, no calls", []),
    ("a <tool_ that never opens", "a <tool_ that never opens", []),
])
def test_parse_tool_calls(text, content, calls):
    got_content, got = parse(text, TOOLS)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got] == calls
    assert all(c.id.startswith("call_") for c in got)
    assert len({c.id for c in got}) == len(got)
    rng = random.Random(0)
    for _ in range(25):  # streamed in random pieces: the same content and calls
        ts, out, i = ToolStream(TOOLS), [], 0
        while i < len(text):
            n = rng.randint(1, 7)
            out.append(ts.push(text[i:i + n]))
            i += n
        rest, got2 = ts.finish()
        assert "".join(out) + rest == content
        assert [(c.name, c.arguments) for c in got2] == [(c.name, c.arguments) for c in got]


def test_xml_values_follow_the_schema():
    text = ("<tool_call>\n<function=f>\n<parameter=s>\n42\n</parameter>\n<parameter=n>\n42\n</parameter>\n"
            "<parameter=o>\n{\"a\": true}\n</parameter>\n<parameter=free>\n[1, \"x\"]\n</parameter>\n</function>\n"
            "</tool_call>")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"properties": {
        "s": {"type": "string"}, "n": {"type": "number"}, "o": {"type": "object"}}}}}]
    _, calls = parse(text, tools)
    assert json.loads(calls[0].arguments) == {"s": "42", "n": 42, "o": {"a": True}, "free": [1, "x"]}
