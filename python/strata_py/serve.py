"""`python -m strata_py.serve`: the OpenAI-compatible server (server/app.py) on uvicorn.

    python -m strata_py.serve                                   # the shipped default model on 127.0.0.1:8080
    python -m strata_py.serve --model M.gguf --port 8000 --draft mtp --prompt-cache-mib 4096 --slot-save DIR

One decoding timeline per loaded model: requests are served one at a time, in arrival order, from exact
checkpoints of earlier prompts and answers (server/timeline.py). Request defaults are strata's measured ones
(GenerationConfig: temperature 0.7, min_p 0.05, DRY 0.8), a fresh random seed and max_tokens up to the context,
unless given here. `--cache-mib` is the routed-expert
cache, as in `python -m strata_py.generate`; the checkpoint ring's budget is `--prompt-cache-mib`.
"""
from __future__ import annotations

import argparse
import sys

from .cli_options import add_generation_args, add_model_args, generation_config, load_model
from .config import GenerationConfig
from .server.options import ServerOptions


def add_server_args(ap: argparse.ArgumentParser) -> None:
    d = ServerOptions()
    ap.add_argument("--ctx", type=int, default=None, help="context of the timeline (default: min(model's, 32768))")
    ap.add_argument("--prompt-cache-mib", type=int, default=d.prompt_cache_mib,
                    help="budget of the checkpoint ring that reuses earlier prompts and answers (0 = no reuse)")
    ap.add_argument("--checkpoint-gap", type=int, default=d.checkpoint_gap,
                    help="checkpoints at message boundaries inside a prompt, at least this many tokens apart")
    ap.add_argument("--slot-save", metavar="DIR", default=None,
                    help="write the checkpoint ring to DIR on shutdown and read it back at start")
    ap.add_argument("--chat-template-file", metavar="FILE", default=None,
                    help="a Jinja chat template to use instead of the GGUF's tokenizer.chat_template")


def server_options(a: argparse.Namespace, **kw) -> ServerOptions:
    return ServerOptions(ctx=a.ctx, prompt_cache_mib=a.prompt_cache_mib, checkpoint_gap=a.checkpoint_gap,
                         slot_save=a.slot_save, chat_template_file=a.chat_template_file, **kw).validate()


def _parser() -> argparse.ArgumentParser:
    d = ServerOptions()
    ap = argparse.ArgumentParser(prog="python -m strata_py.serve", description=__doc__.split("\n\n")[0])
    add_model_args(ap)
    add_generation_args(ap, GenerationConfig())
    ap.set_defaults(seed=None, max_tokens=None)
    add_server_args(ap)
    ap.add_argument("--host", default=d.host, help="address to bind (default: loopback only)")
    ap.add_argument("--port", type=int, default=d.port)
    ap.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (all routes but /health)")
    ap.add_argument("--cors-origins", default="", help="comma-separated origins allowed by CORS ('*' for any)")
    ap.add_argument("--max-queue", type=int, default=d.max_queue,
                    help="requests that may wait behind the running one; more are answered 503")
    ap.add_argument("--alias", default=None, help="the model's id in the API (default: the file name)")
    ap.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))
    return ap


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    try:
        seed, max_tokens = a.seed, a.max_tokens
        a.seed, a.max_tokens = 0, GenerationConfig().max_tokens  # per request: its own, or the options below
        cfg = generation_config(a)
        opts = server_options(a, host=a.host, port=a.port, api_key=a.api_key,
                              cors_origins=[o.strip() for o in a.cors_origins.split(",") if o.strip()],
                              max_queue=a.max_queue, model_alias=a.alias, seed=seed, default_max_tokens=max_tokens)
        model = load_model(a)
        import uvicorn

        from .server.app import create_app
        app = create_app(model, opts, cfg)
    except (ValueError, FileNotFoundError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"strata: serving {model.path.name} on http://{opts.host}:{opts.port}/v1 (draft {cfg.draft}, "
          f"prompt cache {opts.prompt_cache_mib} MiB{', slots in ' + opts.slot_save if opts.slot_save else ''})",
          file=sys.stderr, flush=True)
    config = uvicorn.Config(app, host=opts.host, port=opts.port, log_level=a.log_level, timeout_graceful_shutdown=5,
                            access_log=a.log_level in ("info", "debug"))
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
