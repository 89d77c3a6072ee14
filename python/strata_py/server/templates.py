"""Chat templates: a model's `tokenizer.chat_template` (Jinja), rendered the way transformers renders it.

transformers (utils/chat_template_utils.py) compiles templates in jinja2's ImmutableSandboxedEnvironment with
trim_blocks and lstrip_blocks, the loopcontrols extension and a `{% generation %}` block tag, overrides
`tojson` (json.dumps, non-ASCII kept, optional indent / separators / sort_keys), and adds `raise_exception`,
`strftime_now`, `dict` and an underscore-refusing `namespace`; it renders with `messages`, `tools`,
`documents`, `add_generation_prompt` and the special tokens (`bos_token`, `eos_token`). We do the same, so a
GGUF's template gives the prompt its model was trained on (tests/test_server_templates.py compares the two).

Where the template comes from, first found: --chat-template-file; the GGUF's `tokenizer.chat_template`; for the
model shipped in the package (which has none), data/strata-default.jinja, a small ChatML. A model with none of
these has no chat route (NoTemplate: the server answers 400 naming the fix).

Message boundaries (for the prefix cache's checkpoints inside long prompts): where the render of the first i
messages stops being shared with every continuation of them (ChatTemplate.boundaries).
"""
from __future__ import annotations

import json
import os
from datetime import datetime
from functools import lru_cache
from importlib import resources
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

DEFAULT_TEMPLATE_NAME = "strata-default.jinja"
_SENTINEL = "\u2063strata-boundary\u2063"  # a user message no conversation contains


class NoTemplate(ValueError):
    """The model has no chat template (the chat route cannot render messages)."""


class TemplateError(ValueError):
    """The template refused the conversation (raise_exception) or failed while rendering."""


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask tag): renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """jinja's namespace(), refusing underscore attributes (no reach into Python internals), as transformers."""

    def __init__(*args, **kwargs):  # noqa: N805  (jinja's own signature trick)
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set underscore attributes ({name!r})")


def _raise(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = lambda *a, **k: dict(*a, **k)
    env.globals["namespace"] = _Namespace
    return env.from_string(source)


def default_template_path() -> Path:
    return Path(str(resources.files("strata_py") / "data" / DEFAULT_TEMPLATE_NAME))


class ChatTemplate:
    def __init__(self, source: str, *, origin: str, bos_token: str = "", eos_token: str = ""):
        try:
            self._template = _compile(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise ValueError(f"{origin}: the chat template does not compile: {e} (line {e.lineno})") from None
        self.source = source
        self.origin = origin
        self.bos_token = bos_token
        self.eos_token = eos_token
        # the tool-call form the model was taught (tool_calls.py parses both)
        self.tool_format = "xml" if "<function=" in source else "json" if "<tool_call>" in source else None

    @classmethod
    def for_model(cls, model, override: str | Path | None = None) -> "ChatTemplate":
        """The model's template (see the module docstring for the order); NoTemplate if it has none."""
        from .. import _core
        from ..model import default_model_path

        tok = model.tokenizer
        bos = tok.tokens[tok.bos_id] if tok.bos_id is not None else ""
        eos = tok.tokens[tok.eos_id] if tok.eos_id is not None else ""
        if override is not None:
            p = Path(override)
            try:
                return cls(p.read_text(encoding="utf-8"), origin=str(p), bos_token=bos, eos_token=eos)
            except OSError as e:
                raise ValueError(f"{p}: cannot read the chat template ({e.strerror})") from None
        src = _core.gguf_metadata(str(model.path)).get("tokenizer.chat_template")
        if isinstance(src, str) and src.strip():
            return cls(src, origin=f"{model.path} (tokenizer.chat_template)", bos_token=bos, eos_token=eos)
        if Path(model.path).resolve() == default_model_path().resolve():
            p = default_template_path()
            return cls(p.read_text(encoding="utf-8"), origin=str(p), bos_token=bos, eos_token=eos)
        raise NoTemplate(f"{model.path.name} has no chat template (no tokenizer.chat_template in the GGUF): "
                         "use /v1/completions, or start the server with --chat-template-file FILE")

    def render(self, messages: list[dict], *, tools: list[dict] | None = None, add_generation_prompt: bool = True,
               **extra) -> str:
        try:
            return self._template.render(messages=messages, tools=tools, documents=None,
                                         add_generation_prompt=add_generation_prompt, bos_token=self.bos_token,
                                         eos_token=self.eos_token, **extra)
        except jinja2.exceptions.TemplateError as e:
            raise TemplateError(f"the chat template ({self.origin}) refused the messages: {e}") from None
        except (TypeError, AttributeError, KeyError, IndexError, ValueError) as e:
            raise TemplateError(f"the chat template ({self.origin}) failed on these messages: "
                                f"{type(e).__name__}: {e}") from None

    def boundaries(self, messages: list[dict], text: str, *, tools: list[dict] | None = None, **extra) -> list[int]:
        """Character offsets in `text` (the full render) up to which the conversation's first i messages render
        the same as in any continuation of them, for i >= 1: the longer of (a) the render of messages[:i] when
        `text` starts with it, and (b) the common prefix of `text` and the render of messages[:i] followed by a
        sentinel user message. (b) handles templates that render a conversation's last turn differently (Qwen3
        marks the last assistant turn with <think> tags): a checkpoint there serves any edit of message i."""
        out = []
        for i in range(1, len(messages)):
            best = 0
            try:
                part = self.render(messages[:i], tools=tools, add_generation_prompt=False, **extra)
                if part and text.startswith(part):
                    best = len(part)
            except TemplateError:
                pass  # e.g. a template that insists on a user message last
            try:
                probe = self.render(messages[:i] + [{"role": "user", "content": _SENTINEL}], tools=tools,
                                    add_generation_prompt=False, **extra)
                best = max(best, len(os.path.commonprefix([text, probe])))
            except TemplateError:
                pass  # e.g. a template that refuses two user messages in a row
            if best:
                out.append(best)
        return out

    def stop_texts(self, tokenizer) -> list[str]:
        """End-of-turn markers that are plain text for this vocabulary (they end a reply as stop strings)."""
        vocab = set(tokenizer.tokens[i] for i in range(tokenizer.n_vocab) if tokenizer.is_control(i))
        return [m for m in ("<|im_end|>",) if m in self.source and m not in vocab]


def encode_at_boundaries(tokenizer, text: str, char_offsets: list[int]) -> tuple[list[int], list[int]]:
    """Token ids of `text` (exactly tokenizer.encode(text)) and, for each character offset where a token ends
    (the next one starts at or after it), the number of tokens before it. Offsets inside a token are dropped."""
    enc = tokenizer.hf_tokenizer.encode(text, add_special_tokens=False)
    ends = {}
    offs = enc.offsets
    for k, (_, e) in enumerate(offs):
        if k + 1 == len(offs) or offs[k + 1][0] >= e:
            ends[e] = k + 1
    return list(enc.ids), [ends[c] for c in char_offsets if c in ends]
