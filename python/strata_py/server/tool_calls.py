"""Tool calls in a model's output, parsed into OpenAI `tool_calls`, in the two forms Qwen models are taught:

  Qwen2.5 / Qwen3 / Qwen3-Next (JSON; Hermes style):
      <tool_call>
      {"name": "get_weather", "arguments": {"city": "Paris"}}
      </tool_call>
  Qwen3-Coder (XML):
      <tool_call>
      <function=get_weather>
      <parameter=city>
      Paris
      </parameter>
      </function>
      </tool_call>

Both are recognised whatever the template taught (a model may answer in either). An XML parameter's text is
converted by the tool's JSON Schema type for it (string stays text; integer, number, boolean, object, array and
null are parsed as JSON, falling back to the text); the arguments go out as a JSON string, as OpenAI sends them.
A block that does not parse stays in the content, untouched, and a final block that the model did not close
(it stopped at its end-of-turn token) is parsed as if it were closed.

Streaming (ToolStream): text is passed on until something that may begin "<tool_call>" appears; from there it
is held, and the calls are parsed when the answer ends (the held text that is not a call is then released).
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ..steering.grammar import JSON_DEFAULTS

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_FUNC = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|\Z)", re.DOTALL)
_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text
    id: str = ""

    def as_openai(self, index: int | None = None) -> dict:
        d = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            d["index"] = index
        return d


def _param_types(tools: list[dict] | None, name: str) -> dict:
    for t in tools or []:
        f = t.get("function", t) if isinstance(t, dict) else {}
        if isinstance(f, dict) and f.get("name") == name:
            props = (f.get("parameters") or {}).get("properties") or {}
            return {k: (v.get("type") if isinstance(v, dict) else None) for k, v in props.items()}
    return {}


def _convert(text: str, typ) -> object:
    if typ == "string" or (isinstance(typ, list) and "string" in typ):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def _parse_block(body: str, tools: list[dict] | None) -> ToolCall | None:
    body = body.strip()
    m = _FUNC.match(body)
    if m:  # Qwen3-Coder XML
        name = m.group(1).strip()
        types = _param_types(tools, name)
        args = {}
        for pm in _PARAM.finditer(m.group(2)):
            key = pm.group(1).strip()
            val = pm.group(2)
            val = val[1:] if val.startswith("\n") else val
            val = val[:-1] if val.endswith("\n") else val
            args[key] = _convert(val, types.get(key))
        return ToolCall(name, json.dumps(args, ensure_ascii=False))
    try:  # JSON
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            json.loads(args)
        except ValueError:
            return None
        return ToolCall(obj["name"], args)
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def parse(text: str, tools: list[dict] | None = None) -> tuple[str, list[ToolCall]]:
    """(content, calls): the calls found in `text`, and the text outside them as it is ("" when that is only
    whitespace around calls). Without calls, the text is returned unchanged."""
    calls: list[ToolCall] = []
    outside: list[str] = []
    pos = 0
    for m in _BLOCK.finditer(text):
        call = _parse_block(m.group(1), tools)
        if call is None:
            continue
        call.id = "call_" + uuid.uuid4().hex[:24]
        calls.append(call)
        outside.append(text[pos:m.start()])
        pos = m.end()
    if not calls:
        return text, []
    outside.append(text[pos:])
    content = "".join(outside)
    return ("" if not content.strip() else content), calls


def _partial_open(buf: str) -> int:
    """Length of the longest tail of buf that is a proper prefix of "<tool_call>"."""
    return next((n for n in range(min(len(OPEN) - 1, len(buf)), 0, -1) if buf.endswith(OPEN[:n])), 0)


class ToolStream:
    """Content deltas of a streamed answer that may hold tool calls; what it sends, plus finish()'s content,
    is exactly parse(whole answer)'s content.

    Text before the first "<tool_call>" is sent as it comes, except a tail that may still become that tag and a
    beginning that is only whitespace (parse drops whitespace-only content around calls); from the tag on,
    everything is held until finish()."""

    def __init__(self, tools: list[dict] | None):
        self.tools = tools
        self._pre = ""        # text before any tag, not sent yet
        self._held = ""       # from the first tag on
        self._holding = False
        self._sent_any = False

    def push(self, piece: str) -> str:
        """The part of the answer that is certainly content, to send now ("" when held)."""
        if self._holding:
            self._held += piece
            return ""
        buf = self._pre + piece
        i = buf.find(OPEN)
        if i >= 0:
            self._holding, self._held, out, tail = True, buf[i:], buf[:i], ""
        else:
            k = _partial_open(buf)
            out, tail = buf[:len(buf) - k], buf[len(buf) - k:]
        if not self._sent_any and not out.strip():
            self._pre = out + tail
            return ""
        self._sent_any = True
        self._pre = tail
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(content still to send, calls) at the end of the answer."""
        if not self._holding:
            return self._pre, []
        after, calls = parse(self._held, self.tools)
        if not calls:
            return self._pre + self._held, []
        rest = self._pre + after
        return ("" if not self._sent_any and not rest.strip() else rest), calls


# ------------------------------------------------------------------------------------------ forcing a call
_XML_TEXT = r"/[^<\n]+/"  # a string parameter's value: one line of text


def _function(tool: dict) -> dict:
    return tool.get("function", tool)


def _strict(schema):
    """The schema with additionalProperties false wherever an object leaves it open (OpenAI's strict mode): a
    forced call's arguments hold the listed properties only (a small model would otherwise pad them forever)."""
    if isinstance(schema, list):
        return [_strict(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (_strict(v) if k in ("items", "anyOf", "oneOf", "allOf", "prefixItems") else v) for k, v in schema.items()}
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {k: _strict(v) for k, v in schema["properties"].items()}
    if (schema.get("type") == "object" or "properties" in schema) and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def _xml_value(schema: dict) -> str:
    """The Lark rule body for one XML parameter value: a string is one line of text (its enum and maxLength
    kept); anything else is its JSON text (bare for numbers and booleans, as Qwen3-Coder writes them), with the
    schema's bounds enforced by llguidance's JSON compiler."""
    if isinstance(schema.get("enum"), list) and all(isinstance(v, str) and "\n" not in v for v in schema["enum"]):
        return " | ".join(json.dumps(v) for v in schema["enum"])
    if schema.get("type") == "string":
        n = schema.get("maxLength")
        return f"/[^<\\n]{{1,{int(n)}}}/" if isinstance(n, int) and n >= 1 else _XML_TEXT
    return "%json " + json.dumps({**schema, "x-guidance": JSON_DEFAULTS})


def forcing_grammar(tools: list[dict], name: str | None, fmt: str | None) -> str:
    """A Lark grammar (llguidance's dialect) whose sentences are exactly one call, in the template's form, of the
    named tool (or of any tool: tool_choice "required"), its arguments valid for the tool's parameters."""
    funcs = [_function(t) for t in tools]
    if name is not None:
        funcs = [f for f in funcs if f.get("name") == name]
        if not funcs:
            raise ValueError(f"tool_choice names {name!r}, which is not one of the request's tools")
    rules = []
    if fmt == "xml":
        alts = []
        for i, f in enumerate(funcs):
            params = _strict(f.get("parameters") or {})
            props = params.get("properties") or {}
            required = [p for p in params.get("required", list(props)) if p in props]
            body = " ".join(f'"<parameter={p}>\\n" v{i}_{j} "\\n</parameter>\\n"' for j, p in enumerate(required))
            for j, p in enumerate(required):
                rules.append(f"v{i}_{j}: {_xml_value(props[p] or {})}")
            rules.append(f'call{i}: "<function={f["name"]}>\\n" {body} "</function>"')
            alts.append(f"call{i}")
        start = f'start: "<tool_call>\\n" ({" | ".join(alts)}) "\\n</tool_call>"'
    else:
        schema = {"anyOf": [{"type": "object", "properties": {"name": {"const": f["name"]},
                                                              "arguments": _strict(f.get("parameters") or {"type": "object"})},
                             "required": ["name", "arguments"], "additionalProperties": False} for f in funcs],
                  "x-guidance": JSON_DEFAULTS}  # Qwen's layout: {"name": "f", "arguments": {...}}, no free whitespace
        start = f'start: "<tool_call>\\n" %json {json.dumps(schema)} "\\n</tool_call>"'
    return "\n".join([start, *rules])
