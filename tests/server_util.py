"""A real `python -m strata_py.serve` process on 127.0.0.1 (a free port) for the server tests, and its clients."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import json
import urllib.error
import urllib.request

TEMPLATES = Path(__file__).parent / "data" / "templates"
ISA: str | None = None  # pytest --isa: every server process is started with the same kernel limit


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """Starts at once; ready() waits for /health (so that several can start side by side)."""

    def __init__(self, *args: str, api_key: str | None = None):
        self.port = free_port()
        self.api_key = api_key
        self.args = [*args] + (["--api-key", api_key] if api_key else []) + (["--isa", ISA] if ISA else [])
        self.log = tempfile.NamedTemporaryFile(prefix="strata-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([sys.executable, "-m", "strata_py.serve", "--port", str(self.port), "--threads",
                                      "2", *self.args], stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.url = f"http://127.0.0.1:{self.port}"

    def ready(self, timeout: float = 180.0) -> "Server":
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                if self.get("/health", timeout=2).status_code == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not ready after {timeout} s:\n{self.log_text()}")

    def log_text(self) -> str:
        return Path(self.log.name).read_text(errors="replace")[-4000:]

    def client(self, **kw):
        import openai
        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.api_key or "none", max_retries=0,
                             timeout=kw.pop("timeout", 120.0), **kw)

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def request(self, method: str, path: str, *, json_body=None, content: bytes | None = None,
                headers: dict | None = None, timeout: float = 120.0) -> "Response":
        """One plain HTTP request (urllib: raw bodies, any status)."""
        data = json.dumps(json_body).encode() if json_body is not None else content
        h = {**self.headers(), **({"content-type": "application/json"} if data is not None else {}), **(headers or {})}
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return Response(r.status, r.read(), dict(r.headers))
        except urllib.error.HTTPError as e:
            return Response(e.code, e.read(), dict(e.headers))

    def post(self, path: str, json=None, **kw) -> "Response":
        return self.request("POST", path, json_body=json, **kw)

    def get(self, path: str, **kw) -> "Response":
        return self.request("GET", path, **kw)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (uvicorn's graceful shutdown: the timeline writes --slot-save), then the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError(f"server did not stop within {timeout} s:\n{self.log_text()}")
        return self.proc.returncode

    def metrics(self) -> dict:
        """/metrics parsed by the official Prometheus client's parser: {(name, labels): value}."""
        from prometheus_client.parser import text_string_to_metric_families
        r = self.get("/metrics")
        assert r.status_code == 200, r.text
        out = {}
        for fam in text_string_to_metric_families(r.text):
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out


class Response:
    def __init__(self, status: int, body: bytes, headers: dict):
        self.status_code, self.content, self.headers = status, body, {k.lower(): v for k, v in headers.items()}

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self):
        return json.loads(self.content)


def cold_answer(model, ids: list[int], stops: list[str] = (), **options) -> str:
    """What a fresh process answers to prompt ids (a new session, no reuse): the reference for a warm server.
    A stop string cuts the text before its first occurrence (steered decoding's rule)."""
    from strata_py.generate import generate_ids
    from strata_py.tokenizer import StreamDecoder

    dec = StreamDecoder(model.tokenizer, skip_special=True)
    eog = model.tokenizer.eog_ids
    out = []
    for t in generate_ids(model, ids, **options):
        if t in eog:
            break
        out.append(dec.push(t))
    text = "".join(out) + dec.flush()
    for s in stops:
        text = text.split(s)[0]
    return text


def chat_ids(model, template_file, messages, tools=None) -> tuple[list[int], list[str]]:
    """The server's prompt for messages (its template, rendered and tokenized) and the template's stop strings."""
    from strata_py.server.templates import ChatTemplate
    t = ChatTemplate.for_model(model, template_file)
    stops = t.stop_texts(model.tokenizer)
    return model.tokenizer.encode(t.render(messages, tools=tools, add_generation_prompt=True)), stops
