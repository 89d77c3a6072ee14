"""The OpenAI-compatible HTTP API over one timeline (FastAPI on uvicorn; streams with sse-starlette).

    POST /v1/chat/completions  POST /v1/completions   blocking, or SSE with stream=true (+ stream_options)
    GET  /v1/models            GET  /health           GET  /metrics (Prometheus text)
    POST /tokenize             POST /detokenize

A request is checked and tokenized here (a 4xx in OpenAI's error shape names the bad field), then queued on the
model's one timeline (timeline.py), whose worker thread sends events back through an asyncio queue. A client
that goes away (a closed stream, or a blocking request whose connection drops) cancels its request: the worker
stops after the token in hand, within one window.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from .. import __version__
from ..config import GenerationConfig
from .answer import FINGERPRINT, Answer, Events, chat_logprobs, completion_logprobs, dumps, failure
from .options import ServerOptions
from .schema import (ApiError, ChatRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest, check_model,
                     from_validation, generation_config, message_dicts, request_seed)
from .templates import ChatTemplate, NoTemplate, TemplateError, encode_at_boundaries
from .timeline import Closed, Failed, QueueFull, Request, Timeline
from .tool_calls import ToolStream, forcing_grammar, parse as parse_tool_calls

class _AuthAndCount:
    """Plain ASGI middleware (a BaseHTTPMiddleware would hide the client's disconnect from the routes): the API key
    on every route but /health and CORS preflights, and strata_requests_total by route and status."""

    def __init__(self, app, *, api_key: str | None, state: dict):
        self.app, self.api_key, self.state = app, api_key, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        if self.api_key and path != "/health" and scope["method"] != "OPTIONS":
            headers = dict(scope["headers"])
            if headers.get(b"authorization", b"").decode("latin-1") != f"Bearer {self.api_key}":
                err = ApiError(401, "missing or wrong API key (send 'Authorization: Bearer KEY')",
                               code="invalid_api_key")
                return await JSONResponse(err.body(), status_code=401)(scope, receive, send)
        status = []

        async def send_status(message):
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)
        try:
            await self.app(scope, receive, send_status)
        finally:
            tl = self.state["timeline"]
            if path.startswith("/v1/") and tl is not None and status:
                tl.metrics.inc("strata_requests_total", route=path, status=status[0])


def create_app(model, opts: ServerOptions, cfg: GenerationConfig, *, timeline: Timeline | None = None) -> FastAPI:
    """The API for `model` with request defaults `cfg` (its drafter, sampling defaults, window size)."""
    from ..drafting import names as drafter_names

    opts = opts.validate()
    name = opts.model_alias or model.path.name.removesuffix(".gguf")
    tok = model.tokenizer
    try:
        template: ChatTemplate | None = ChatTemplate.for_model(model, opts.chat_template_file)
        no_template = ""
    except NoTemplate as e:
        template, no_template = None, str(e)
    chat_stops = template.stop_texts(tok) if template is not None else []
    created = int(time.time())
    state: dict = {"timeline": timeline}

    @asynccontextmanager
    async def lifespan(app):
        if state["timeline"] is None:
            state["timeline"] = Timeline(model, cfg=cfg, ctx=opts.ctx, prompt_cache_mib=opts.prompt_cache_mib,
                                         checkpoint_gap=opts.checkpoint_gap, max_queue=opts.max_queue,
                                         slot_save=opts.slot_save)
        yield
        await run_in_threadpool(state["timeline"].close)

    app = FastAPI(title="strata", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    if opts.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(opts.cors_origins), allow_methods=["*"],
                           allow_headers=["*"])

    def tl() -> Timeline:
        return state["timeline"]

    def metrics():
        return tl().metrics

    app.add_middleware(_AuthAndCount, api_key=opts.api_key, state=state)

    @app.exception_handler(ApiError)
    async def _api_error(request, exc: ApiError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(request, exc: RequestValidationError):
        err = from_validation(list(exc.errors()))
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, exc: StarletteHTTPException):
        err = ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                       type="invalid_request_error" if exc.status_code < 500 else "server_error")
        return JSONResponse(err.body(), status_code=exc.status_code)

    # ------------------------------------------------------------------------------------------ plain routes
    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "strata",
                                            "meta": {"n_ctx": tl().n_ctx, "n_ctx_train": model.n_ctx_train,
                                                     "n_vocab": model.n_vocab, "has_mtp": model.has_mtp,
                                                     "chat_template": template.origin if template else None}}]}

    @app.get("/metrics")
    async def prom():
        return PlainTextResponse(metrics().render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        check_model(body.model, name)
        if body.messages is not None:
            tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
            text = _render(message_dicts(body.messages), tools, body.add_generation_prompt, {})
        elif body.content is not None or body.prompt is not None:
            text = body.content if body.content is not None else body.prompt
        else:
            raise ApiError(400, "give 'content' (or 'prompt') text, or 'messages'", "content")
        ids = tok.encode(text)
        return {"tokens": ids, "count": len(ids), "max_model_len": tl().n_ctx}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        check_model(body.model, name)
        for i, t in enumerate(body.tokens):
            if not (0 <= t < tok.n_vocab):
                raise ApiError(400, f"token id {t} is outside the vocabulary [0, {tok.n_vocab})", f"tokens.{i}")
        text = tok.decode(body.tokens)
        return {"content": text, "prompt": text}

    # ------------------------------------------------------------------------------------------ generation
    def _render(msgs, tools, add_generation_prompt, extra) -> str:
        if template is None:
            raise ApiError(400, no_template, "messages", code="no_chat_template")
        try:
            return template.render(msgs, tools=tools, add_generation_prompt=add_generation_prompt, **extra)
        except TemplateError as e:
            raise ApiError(400, str(e), "messages") from None

    def _check_context(n: int, param: str) -> int:
        n_ctx = tl().n_ctx
        if n > n_ctx:
            raise ApiError(400, f"the prompt has {n} tokens, more than this server's context of {n_ctx} tokens",
                           param, code="context_length_exceeded")
        return n_ctx - n + 1  # the last emitted token needs no cell of its own

    def _config(req, n_prompt: int, param: str) -> GenerationConfig:
        available = _check_context(n_prompt, param)
        return generation_config(req, cfg, n_vocab=tok.n_vocab, available=available,
                                 default_max=opts.default_max_tokens, seed=request_seed(req.seed, opts.seed),
                                 draft_names=drafter_names())

    def _prepare_chat(req: ChatRequest):
        msgs = message_dicts(req.messages)
        choice = req.tool_choice
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        forced = None  # tool_choice "required" or a named function: the output is made a call (a grammar)
        if choice not in (None, "auto", "none"):
            if not tools:
                raise ApiError(400, "tool_choice asks for a tool call but the request has no tools", "tool_choice")
            if req.response_format is not None and req.response_format.type != "text":
                raise ApiError(400, "tool_choice forcing a call cannot be combined with response_format",
                               "tool_choice")
            try:
                forced = forcing_grammar(tools, None if choice == "required" else choice.function.name,
                                         template.tool_format)
            except ValueError as e:
                raise ApiError(400, str(e), "tool_choice") from None
        if choice == "none":
            tools = None
        extra = dict(req.chat_template_kwargs or {})
        text = _render(msgs, tools, True, extra)
        offsets = template.boundaries(msgs, text, tools=tools, **extra)
        ids, bounds = encode_at_boundaries(tok, text, offsets)
        c = _config(req, len(ids), "messages")
        if chat_stops:  # the template's end-of-turn marker, where it is plain text in this vocabulary
            c = c.replace(stop=list(dict.fromkeys(list(c.stop) + chat_stops)))
        if forced is not None:
            c = c.replace(grammar=forced)
        return ids, bounds, c, tools

    def _prompt_ids(req: CompletionRequest) -> list[int]:
        p = req.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise ApiError(400, f"{len(p)} prompts in one request: only one is supported", "prompt")
            p = p[0]
        if isinstance(p, str):
            ids = tok.encode(p)
        else:
            for i, t in enumerate(p):
                if not (0 <= t < tok.n_vocab):
                    raise ApiError(400, f"token id {t} is outside the vocabulary [0, {tok.n_vocab})", f"prompt.{i}")
            ids = list(p)
        if not ids:  # an empty prompt starts from the document separator (as generate() does)
            start = tok.bos_id if tok.bos_id is not None else tok.eos_id
            if start is None:
                raise ApiError(400, "empty prompt and the model has no BOS/EOS token to start from", "prompt")
            ids = [start]
        return ids

    async def _submit(ids, c, bounds, logprobs) -> tuple[Request, Events]:
        ev = Events(asyncio.get_running_loop())
        job = Request(ids, c, ev.emit, boundaries=bounds, logprobs=logprobs)
        try:
            tl().submit(job)
        except QueueFull as e:
            raise ApiError(503, f"the server is busy: {e}; retry later", type="server_error", code="queue_full") from None
        except Closed as e:
            raise ApiError(503, str(e), type="server_error", code="shutting_down") from None
        return job, ev

    async def _watching(request: HttpRequest, job: Request, awaitable):
        """Await `awaitable`, cancelling the job if the client goes away meanwhile (and if we leave early)."""
        async def watch():
            while True:
                if await request.is_disconnected():
                    job.cancel()
                    return
                await asyncio.sleep(0.05)
        w = asyncio.create_task(watch())
        try:
            return await awaitable
        except BaseException:
            job.cancel()
            raise
        finally:
            w.cancel()

    async def _collect(request: HttpRequest, job: Request, ev: Events, ans: Answer) -> None:
        async def run():
            async for batch in ev.batches():
                ans.add(batch)
        await _watching(request, job, run())

    async def _first(request: HttpRequest, job: Request, ev: Events) -> list:
        """A stream's first events, once its prompt is computed: a request that fails before any token (a bad
        constraint, the server closing) answers with an HTTP error, not with a stream."""
        batch = await _watching(request, job, ev.next_batch())
        for e in batch:
            if isinstance(e, Failed):
                raise failure(e.error)
        return batch

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: HttpRequest):
        check_model(req.model, name)
        ids, bounds, c, tools = await run_in_threadpool(_prepare_chat, req)
        lp = (req.top_logprobs or 0) if req.logprobs else None
        job, ev = await _submit(ids, c, bounds, lp)
        rid, now = "chatcmpl-" + uuid.uuid4().hex, int(time.time())
        ans = Answer(tok)
        if not req.stream:
            await _collect(request, job, ev, ans)
            text = "".join(ans.text)
            msg: dict = {"role": "assistant", "content": text}
            finish = ans.finish_reason()
            if tools:
                content, calls = parse_tool_calls(text, tools)
                if calls:
                    msg = {"role": "assistant", "content": content or None,
                           "tool_calls": [x.as_openai() for x in calls]}
                    finish = "tool_calls"
            return {"id": rid, "object": "chat.completion", "created": now, "model": name,
                    "system_fingerprint": FINGERPRINT,
                    "choices": [{"index": 0, "message": msg, "finish_reason": finish,
                                 "logprobs": chat_logprobs(tok, ans.tokens) if lp is not None else None}],
                    "usage": ans.usage(), "strata": ans.timings()}
        first_batch = await _first(request, job, ev)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(delta, finish=None, toks=None):
            ch = {"index": 0, "delta": delta, "finish_reason": finish,
                  "logprobs": chat_logprobs(tok, toks) if (lp is not None and toks) else None}
            d = {"id": rid, "object": "chat.completion.chunk", "created": now, "model": name,
                 "system_fingerprint": FINGERPRINT, "choices": [ch]}
            if include_usage:
                d["usage"] = None
            return {"data": dumps(d)}

        async def stream():
            ts = ToolStream(tools) if tools else None
            first = True
            try:
                async for piece, toks in ans.pieces(ev, first_batch):
                    if piece is None:  # the request failed: an error event ends the stream
                        yield {"data": dumps(toks.body())}
                        return
                    if first:  # the role goes out with the first token (time to first chunk = time to first token)
                        first = False
                        yield chunk({"role": "assistant", "content": ""})
                    if ts is not None:
                        piece = ts.push(piece)
                    if piece or (toks and lp is not None):
                        yield chunk({"content": piece}, toks=toks)
                finish = ans.finish_reason()
                if ts is not None:
                    rest, calls = ts.finish()
                    if rest:
                        yield chunk({"content": rest})
                    if calls:
                        yield chunk({"tool_calls": [x.as_openai(i) for i, x in enumerate(calls)]})
                        finish = "tool_calls"
                yield chunk({}, finish if finish != "cancelled" else "stop")
                if include_usage:
                    yield {"data": dumps({"id": rid, "object": "chat.completion.chunk", "created": now, "model": name,
                                          "system_fingerprint": FINGERPRINT, "choices": [], "usage": ans.usage(),
                                          "strata": ans.timings()})}
                yield {"data": "[DONE]"}
            finally:
                job.cancel()  # the client went away (or we are done: a no-op)
        return EventSourceResponse(stream(), ping=15)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: HttpRequest):
        check_model(req.model, name)
        ids = await run_in_threadpool(_prompt_ids, req)
        c = _config(req, len(ids), "prompt")
        lp = req.logprobs
        job, ev = await _submit(ids, c, [], lp)
        rid, now = "cmpl-" + uuid.uuid4().hex, int(time.time())
        ans = Answer(tok)
        if not req.stream:
            await _collect(request, job, ev, ans)
            return {"id": rid, "object": "text_completion", "created": now, "model": name,
                    "system_fingerprint": FINGERPRINT,
                    "choices": [{"index": 0, "text": "".join(ans.text), "finish_reason": ans.finish_reason(),
                                 "logprobs": completion_logprobs(tok, ans.tokens, 0) if lp is not None else None}],
                    "usage": ans.usage(), "strata": ans.timings()}
        first_batch = await _first(request, job, ev)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(text, finish=None, toks=None, offset=0):
            d = {"id": rid, "object": "text_completion", "created": now, "model": name,
                 "system_fingerprint": FINGERPRINT,
                 "choices": [{"index": 0, "text": text, "finish_reason": finish,
                              "logprobs": completion_logprobs(tok, toks, offset) if (lp is not None and toks) else None}]}
            if include_usage:
                d["usage"] = None
            return {"data": dumps(d)}

        async def stream():
            offset = 0
            try:
                async for piece, toks in ans.pieces(ev, first_batch):
                    if piece is None:
                        yield {"data": dumps(toks.body())}
                        return
                    if piece or (toks and lp is not None):
                        yield chunk(piece, toks=toks, offset=offset)
                    offset += len(piece)
                finish = ans.finish_reason()
                yield chunk("", finish if finish != "cancelled" else "stop")
                if include_usage:
                    yield {"data": dumps({"id": rid, "object": "text_completion", "created": now, "model": name,
                                          "choices": [], "usage": ans.usage(), "strata": ans.timings()})}
                yield {"data": "[DONE]"}
            finally:
                job.cancel()
        return EventSourceResponse(stream(), ping=15)

    app.state.served = state
    return app

