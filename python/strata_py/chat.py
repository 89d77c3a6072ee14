"""`python -m strata_py.chat`: a terminal chat on the same timeline as the server (server/timeline.py), so each
turn reuses the state of the last one exactly (the prompt's new tokens are all that is computed).

    python -m strata_py.chat                                   # the shipped default model
    python -m strata_py.chat --model M.gguf --system "You are terse." --temperature 0.7 --draft mtp

Commands: /reset (forget the conversation), /stats (the last reply's numbers), /save FILE (the conversation,
and the session state beside it as FILE.session), /load FILE, /system TEXT, /help, /quit. Ctrl-C interrupts a
reply (what was shown is kept as the assistant's turn) and returns to the prompt; Ctrl-D leaves.
"""
from __future__ import annotations

import argparse
import json
import queue
import signal
import sys
import threading
from pathlib import Path

from .cli_options import add_generation_args, add_model_args, generation_config, load_model
from .serve import add_server_args, server_options

HELP = ("/reset  forget the conversation      /stats  numbers of the last reply\n"
        "/save FILE  write the conversation (and FILE.session)   /load FILE  read one back\n"
        "/system TEXT  set the system message (and reset)        /quit  leave (or Ctrl-D)\n"
        "Ctrl-C interrupts a reply.")
FORMAT = "strata-chat"


class Chat:
    """A conversation on a timeline: messages, the template, and the last reply's numbers."""

    def __init__(self, model, timeline, template, cfg, system: str | None = None):
        self.model, self.timeline, self.template, self.cfg = model, timeline, template, cfg
        self.system = system
        self.messages: list[dict] = []
        self.last: dict = {}
        self.stops = template.stop_texts(model.tokenizer)
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.last = {}

    def reply(self, text: str, on_piece) -> str:
        """Run one turn, calling on_piece(text) as it streams; Ctrl-C stops it. Returns the reply."""
        from .server.templates import encode_at_boundaries
        from .server.timeline import Done, Failed, Request, Started, Token

        self.messages.append({"role": "user", "content": text})
        try:  # nothing runs yet: an error or Ctrl-C here leaves the conversation as it was
            prompt = self.template.render(self.messages, add_generation_prompt=True)
            ids, bounds = encode_at_boundaries(self.model.tokenizer, prompt,
                                               self.template.boundaries(self.messages, prompt))
            room = self.timeline.n_ctx - len(ids) + 1
            if room < 1:
                raise ValueError(f"the conversation has {len(ids)} tokens, more than the context of "
                                 f"{self.timeline.n_ctx}: /reset, or start with a larger --ctx")
            cfg = self.cfg.replace(max_tokens=min(self.cfg.max_tokens, room))
            if self.stops and "stop" in type(cfg).__dataclass_fields__:
                cfg = cfg.replace(stop=list(dict.fromkeys(list(cfg.stop) + self.stops)))
            events: queue.Queue = queue.Queue()
            req = Request(ids, cfg, events.put, boundaries=bounds)
            self.timeline.submit(req)
        except BaseException:
            self.messages.pop()
            raise
        pieces, started, done, failed = [], None, None, None
        # Ctrl-C while the reply streams cancels the request; its Done still arrives, within one window. The signal
        # only sets a flag here: a KeyboardInterrupt raised inside events.get() could land between the queue's
        # lock being taken and its `with` block starting, leaving the lock held, and the timeline's thread then
        # blocks forever in events.put() (seen once in ~10 runs of test_chat_pty under load: no output after ^C).
        hit = [False]
        main = threading.current_thread() is threading.main_thread()
        prev = signal.signal(signal.SIGINT, lambda *_: hit.__setitem__(0, True)) if main else None
        try:
            cancelled = False
            while done is None and failed is None:
                if hit[0] and not cancelled:
                    req.cancel()
                    cancelled = True
                try:
                    ev = events.get(timeout=0.05)
                except queue.Empty:
                    continue
                if isinstance(ev, Started):
                    started = ev
                elif isinstance(ev, Token):
                    pieces.append(ev.text)
                    on_piece(ev.text)
                elif isinstance(ev, Done):
                    done = ev
                elif isinstance(ev, Failed):
                    failed = ev.error
        finally:
            if main:
                signal.signal(signal.SIGINT, prev)
        if failed is not None:
            self.messages.pop()
            raise failed
        answer = "".join(pieces)
        self.messages.append({"role": "assistant", "content": answer})
        self.last = dict(done.stats, finish=done.finish_reason, prompt_tokens=len(ids),
                         cached_tokens=started.cached_tokens if started else done.stats.get("cached_tokens", 0),
                         prefill_ms=(started.prefill_s * 1e3) if started else 0.0)
        return answer

    def save(self, path: str) -> str:
        p = Path(path)
        data = {"format": FORMAT, "version": 1, "model": self.model.path.name, "system": self.system,
                "messages": self.messages}
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
        tmp.replace(p)
        n = self.timeline.save_live(str(p) + ".session") if self.messages else 0
        return f"saved {len(self.messages)} messages to {p}" + (f" and {n} tokens of state to {p}.session" if n else "")

    def load(self, path: str) -> str:
        p = Path(path)
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ValueError(f"{p}: cannot read a saved chat ({e})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("messages"), list):
            raise ValueError(f"{p}: not a saved strata chat (no 'format': '{FORMAT}' with 'messages')")
        for i, m in enumerate(data["messages"]):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise ValueError(f"{p}: messages[{i}] is not a {{role, content}} message")
        self.system, self.messages, self.last = data.get("system"), data["messages"], {}
        note = f"loaded {len(self.messages)} messages from {p}"
        state = Path(str(p) + ".session")
        if state.exists():
            try:
                note += f"; {self.timeline.load_file(str(state))} tokens of state from {state}"
            except ValueError as e:
                note += f"; state not used ({e})"
        return note


def _stats_table(chat: Chat):
    from rich.table import Table

    t = Table(title="last reply", show_header=False)
    s = chat.last
    if not s:
        t.add_row("no reply yet", "")
        return t
    rows = [("prompt tokens", s["prompt_tokens"]), ("reused from a checkpoint", s["cached_tokens"]),
            ("prefill ms", f"{s['prefill_ms']:.1f}"), ("generated tokens", s.get("generated_tokens", 0)),
            ("decode tok/s", f"{s.get('decode_tok_s', 0.0):.1f}"), ("windows", s.get("windows", 0)),
            ("drafted / accepted", f"{s.get('drafted', 0)} / {s.get('accepted', 0)}"),
            ("finish", s["finish"]), ("checkpoints held", f"{len(chat.timeline.cache)} "
                                      f"({chat.timeline.cache.nbytes / 2**20:.1f} MiB)")]
    for k, v in rows:
        t.add_row(k, str(v))
    return t


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m strata_py.chat", description=__doc__.split("\n\n")[0])
    add_model_args(ap)
    add_generation_args(ap)
    add_server_args(ap)
    ap.add_argument("--system", default=None, help="the system message")
    return ap


def main(argv=None) -> int:
    from rich.console import Console
    from rich.markup import escape

    a = _parser().parse_args(argv)
    console = Console(highlight=False)
    try:
        cfg = generation_config(a)
        opts = server_options(a)
        model = load_model(a)
        from .server.templates import ChatTemplate
        from .server.timeline import Timeline
        template = ChatTemplate.for_model(model, opts.chat_template_file)
        timeline = Timeline(model, cfg=cfg, ctx=opts.ctx, prompt_cache_mib=opts.prompt_cache_mib,
                            checkpoint_gap=opts.checkpoint_gap, max_queue=1, slot_save=opts.slot_save)
    except (ValueError, FileNotFoundError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    chat = Chat(model, timeline, template, cfg, a.system)
    console.print(f"[bold]strata chat[/] · {model.path.name} · draft {cfg.draft} · /help for commands")
    try:
        while True:
            try:
                line = console.input("[bold green]>>> [/]")
            except KeyboardInterrupt:
                console.print()
                continue
            except EOFError:
                console.print()
                break
            line = line.strip()
            if not line:
                continue
            if line.startswith("/"):
                cmd, _, arg = line.partition(" ")
                arg = arg.strip()
                try:
                    if cmd in ("/quit", "/exit"):
                        break
                    elif cmd == "/help":
                        console.print(HELP, markup=False)
                    elif cmd == "/reset":
                        chat.reset()
                        console.print("[dim]conversation cleared[/]")
                    elif cmd == "/stats":
                        console.print(_stats_table(chat))
                    elif cmd == "/system":
                        chat.system = arg or None
                        chat.reset()
                        console.print("[dim]system message set; conversation cleared[/]")
                    elif cmd in ("/save", "/load"):
                        if not arg:
                            raise ValueError(f"{cmd} needs a file name")
                        note = chat.save(arg) if cmd == "/save" else chat.load(arg)
                        console.print(f"[dim]{escape(note)}[/]", soft_wrap=True)
                    else:
                        console.print(f"[red]unknown command {cmd}[/] (/help)")
                except (ValueError, RuntimeError, OSError) as e:
                    console.print(f"[red]error:[/] {escape(str(e))}", soft_wrap=True)
                continue
            try:
                chat.reply(line, lambda piece: console.print(piece, end="", markup=False, soft_wrap=True))
            except (ValueError, RuntimeError) as e:
                console.print(f"\n[red]error:[/] {escape(str(e))}", soft_wrap=True)
                continue
            except KeyboardInterrupt:  # before the reply started: nothing was sent
                console.print("\n[dim]\\[interrupted][/]")
                continue
            if chat.last.get("finish") == "cancelled":
                console.print("\n[dim]\\[interrupted][/]")
            else:
                console.print()
    finally:
        timeline.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
