"""The OpenAI-compatible server and the engine it shares with the terminal chat.

    options.py       ServerOptions (host, port, API key, queue, context, prompt-cache budget, slot files)
    timeline.py      one decoding timeline per model: session, checkpoint ring, FIFO queue, worker thread
    prefix_cache.py  exact checkpoints keyed by token prefix, LRU within a budget; slot files
    templates.py     chat templates (sandboxed Jinja, as transformers renders them); message boundaries
    schema.py        request bodies, their checks, their GenerationConfig; OpenAI's error shape
    tool_calls.py    <tool_call> blocks (Qwen JSON, Qwen3-Coder XML) -> OpenAI tool_calls
    token_text.py    an answer's text aligned with its tokens (stop strings held back, logprobs per token)
    answer.py        a request's events, and the OpenAI shapes of text, usage and logprobs
    metrics.py       counters in Prometheus' text format
    app.py           the FastAPI routes
"""
