"""The OpenAI request bodies we accept, their checks, and their translation into one GenerationConfig.

Types are strict (a string is not a number, a bool is not an int); ranges are OpenAI's. Fields OpenAI has and we
do not implement with their meaning (n > 1, best_of > 1, echo, suffix, non-text content parts) are refused
with a 400 naming them; fields that change nothing here (user, metadata, store, parallel_tool_calls, ...) and
unknown fields are ignored, as vLLM and llama-server do. Extensions (vLLM's names): top_k, min_p,
repetition_penalty, chat_template_kwargs; llama-server's and koboldcpp's dry_multiplier, dry_base,
dry_allowed_length, dry_penalty_last_n, dry_sequence_breakers; and `draft` (strata: the drafter for this request, output unchanged).

Every refusal is an ApiError, answered in OpenAI's error shape:
    {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}
"""
from __future__ import annotations

import json
import random
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from ..config import GenerationConfig


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, type: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)


class StreamOptions(_Body):
    include_usage: bool = False


class ContentPart(_Body):
    type: str
    text: str | None = None


class FunctionCall(_Body):
    name: str
    arguments: Union[str, dict] = "{}"


class MessageToolCall(_Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDef(_Body):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Body):
    name: str = "response"
    schema_: dict | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _Sampling(_Body):
    model: str | None = None
    max_tokens: int | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, lt=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0)
    # DRY (llama-server's and koboldcpp's names; OpenAI clients send them through extra_body)
    dry_multiplier: float | None = Field(None, ge=0)
    dry_base: float | None = Field(None, ge=1)
    dry_allowed_length: int | None = Field(None, ge=0)
    dry_penalty_last_n: int | None = Field(None, ge=-1)
    dry_sequence_breakers: list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)
    stop: Union[str, list[str], None] = None
    logit_bias: dict[str, float] | None = None
    n: int | None = Field(None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    draft: str | None = None


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    chat_template_kwargs: dict | None = None


class CompletionRequest(_Sampling):
    prompt: Union[str, list[int], list[str], list[list[int]]] = ""
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)


class TokenizeRequest(_Body):
    model: str | None = None
    content: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    tools: list[Tool] | None = None
    add_generation_prompt: bool = True


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


# ------------------------------------------------------------------------------------------ validation errors
_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "function", "literal"}


def _param(loc: tuple) -> str | None:
    parts = []
    for p in loc:
        if p == "body" and not parts:
            continue
        if isinstance(p, str) and ("[" in p or p.split("-")[0] in _TYPE_TAGS):
            continue  # a union branch tag, not a field
        parts.append(str(p))
    return ".".join(parts) or None


def from_validation(errors: list[dict]) -> ApiError:
    """The first pydantic / FastAPI error as a 400 naming the field (or the JSON syntax error)."""
    e = errors[0]
    if e.get("type") == "json_invalid":
        where = e.get("loc", ())[-1] if e.get("loc") else "?"
        return ApiError(400, f"the request body is not valid JSON ({e.get('ctx', {}).get('error', e.get('msg'))} "
                             f"at character {where})")
    param = _param(tuple(e.get("loc", ())))
    if e.get("type") == "missing" and param is None:
        return ApiError(400, "the request needs a JSON body")
    got = e.get("input")
    shown = "" if e.get("type") == "missing" else f" (got {json.dumps(got)[:80] if _jsonable(got) else repr(got)[:80]})"
    return ApiError(400, f"'{param}': {e.get('msg', 'invalid value')}{shown}", param)


def _jsonable(x) -> bool:
    try:
        json.dumps(x)
        return True
    except (TypeError, ValueError):
        return False


# ------------------------------------------------------------------------------------------ translation
def message_dicts(messages: list[Message]) -> list[dict]:
    """Messages as the template sees them: text content, 'developer' as 'system', tool-call arguments as dicts
    (templates such as Qwen3-Coder's iterate over them; JSON-text arguments are parsed, as vLLM does)."""
    out = []
    for i, m in enumerate(messages):
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role}
        if isinstance(m.content, list):
            texts = []
            for j, part in enumerate(m.content):
                if part.type != "text" or part.text is None:
                    raise ApiError(400, f"content part type {part.type!r} is not supported (text only)",
                                   f"messages.{i}.content.{j}.type")
                texts.append(part.text)
            d["content"] = "".join(texts)
        else:
            d["content"] = m.content if m.content is not None else ""
        for k in ("name", "tool_call_id", "reasoning_content"):
            if getattr(m, k) is not None:
                d[k] = getattr(m, k)
        if m.tool_calls:
            calls = []
            for j, c in enumerate(m.tool_calls):
                args = c.function.arguments
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except ValueError:
                        raise ApiError(400, f"tool call arguments are not valid JSON: {args[:80]!r}",
                                       f"messages.{i}.tool_calls.{j}.function.arguments") from None
                calls.append({"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}})
            d["tool_calls"] = calls
        out.append(d)
    return out


def check_model(name: str | None, served: str) -> None:
    if name is not None and name != served:
        raise ApiError(404, f"the model {name!r} does not exist (this server has {served!r})", "model",
                       code="model_not_found")


def _refuse_unsupported(req: _Sampling) -> None:
    if req.n is not None and req.n != 1:
        raise ApiError(400, "only n=1 is supported (one timeline decodes one answer at a time); send n requests",
                       "n")
    if req.stream_options is not None and not req.stream:
        raise ApiError(400, "stream_options is only allowed with stream=true", "stream_options")
    if isinstance(req, CompletionRequest):
        if req.echo:
            raise ApiError(400, "echo is not supported", "echo")
        if req.suffix is not None:
            raise ApiError(400, "suffix (fill-in-the-middle) is not supported", "suffix")
        if req.best_of not in (None, 1):
            raise ApiError(400, "only best_of=1 is supported", "best_of")


def generation_config(req: _Sampling, base: GenerationConfig, *, n_vocab: int, available: int,
                      default_max: int | None, seed: int, draft_names: list[str]) -> GenerationConfig:
    """The request's GenerationConfig: `base` (the server's defaults) with the request's fields over it.
    available: tokens that can still be generated after the prompt in the context."""
    _refuse_unsupported(req)
    kw: dict[str, Any] = {}
    max_tokens = getattr(req, "max_completion_tokens", None)
    max_tokens = req.max_tokens if max_tokens is None else max_tokens
    if max_tokens is None:
        max_tokens = available if default_max is None else min(default_max, available)
    elif max_tokens > available:
        raise ApiError(400, f"max_tokens={max_tokens} does not fit: the context leaves room for {available} tokens "
                            "after the prompt", "max_tokens", code="context_length_exceeded")
    kw["max_tokens"] = max_tokens
    for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
        v = getattr(req, name)
        if v is not None:
            kw[name] = float(v)
    if req.top_k is not None:
        kw["top_k"] = max(0, req.top_k)  # -1 (vLLM) and 0 both mean off
    for name in ("dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n"):
        v = getattr(req, name)
        if v is not None:
            kw[name] = v
    if req.dry_sequence_breakers is not None:
        if not req.dry_sequence_breakers or not all(req.dry_sequence_breakers):  # llama-server refuses [] too
            raise ApiError(400, "dry_sequence_breakers must be a non-empty list of non-empty strings",
                           "dry_sequence_breakers")
        kw["dry_sequence_breakers"] = list(req.dry_sequence_breakers)
    kw["seed"] = seed % 2**64
    if req.draft is not None:
        if req.draft != "none" and req.draft not in draft_names:
            raise ApiError(400, f"unknown drafter {req.draft!r} (known: none, {', '.join(draft_names)})", "draft")
        kw["draft"] = req.draft
    steer: dict[str, Any] = {}  # steered decoding (issue 15): GenerationConfig's stop, logit_bias, json_schema
    if req.stop:
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop)
        for i, s in enumerate(stops):
            if not s:
                raise ApiError(400, "stop strings must not be empty", f"stop.{i}" if len(stops) > 1 else "stop")
        steer["stop"] = stops
    if req.logit_bias:
        bias = {}
        for k, v in req.logit_bias.items():
            try:
                tid = int(k)
            except ValueError:
                tid = -1
            if not (0 <= tid < n_vocab) or str(tid) != k.strip():
                raise ApiError(400, f"logit_bias key {k!r} is not a token id in 0..{n_vocab - 1}", "logit_bias")
            if not (-100 <= v <= 100):
                raise ApiError(400, f"logit_bias of token {k} is {v}: must be in [-100, 100]", "logit_bias")
            bias[tid] = float(v)
        steer["logit_bias"] = bias
    rf = getattr(req, "response_format", None)
    if rf is not None and rf.type != "text":
        if rf.type == "json_object":
            steer["json_schema"] = {"type": "object"}
        else:
            if rf.json_schema is None or rf.json_schema.schema_ is None:
                raise ApiError(400, "response_format json_schema needs json_schema.schema", "response_format.json_schema")
            steer["json_schema"] = rf.json_schema.schema_
    kw.update(steer)
    try:
        return base.replace(**kw)
    except ValueError as e:
        raise ApiError(400, str(e), config_param(str(e))) from None


_CONFIG_PARAM = {"json_schema": "response_format"}  # GenerationConfig field -> the request field it came from


def config_param(msg: str) -> str | None:
    """The request field behind a GenerationConfig error ("bad option NAME=VALUE: why"), or None."""
    if msg.startswith("bad option "):
        name = msg[len("bad option "):].split("=", 1)[0].split(":", 1)[0].strip()
        return _CONFIG_PARAM.get(name, name)
    return None


def request_seed(seed: int | None, default: int | None) -> int:
    """A request's seed: its own, else the server's --seed, else a fresh random one (like OpenAI's API)."""
    if seed is not None:
        return seed
    if default is not None:
        return default
    return random.SystemRandom().randrange(2**63)
