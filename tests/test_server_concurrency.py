"""One timeline, many clients: 8 concurrent clients each get their serial answers; a full queue answers 503; a
client that goes away (a closed stream, a blocking request that times out) is cancelled and leaves the session
and the checkpoint ring consistent; the API key and CORS. On the synthetic tiny model (with an MTP block)."""
from __future__ import annotations

import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from server_util import TEMPLATES, chat_ids, cold_answer

MODEL = "tiny-q8_0"
LONG_PROMPT = "hello"
LONG_TOKENS = 30000  # the tiny server's file declares 32768 cells: ~8 s of decoding here, far past any client timeout


@pytest.fixture(scope="module")
def long_body(tiny_q8_model):
    """A request that runs LONG_TOKENS tokens: greedy, DRY off, every end token banned by logit bias."""
    ban = {str(t): -100 for t in tiny_q8_model.tokenizer.eog_ids}
    return {"prompt": LONG_PROMPT, "max_tokens": LONG_TOKENS, "temperature": 0.0, "dry_multiplier": 0.0,
            "logit_bias": ban}


def _wait(cond, timeout=30.0, what="condition"):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _metric(server, name):
    return server.metrics().get((name, ()), 0.0)


def _job(client, k: int):
    """Request k of a fixed mix: chat and completions, streaming and blocking, drafters, greedy and sampled."""
    draft = ["none", "suffix", "auto", "mtp", "mtp+suffix"][k % 5]
    temperature = 0.0 if k % 2 == 0 else 0.9
    common = dict(model=MODEL, max_tokens=12 + k % 5, temperature=temperature, seed=k, extra_body={"draft": draft})
    if k % 3 == 0:
        r = client.completions.create(prompt=f"request {k} says", **common)
        return r.choices[0].text
    msgs = [{"role": "user", "content": f"conversation {k % 4}"}]
    if k % 3 == 1:
        r = client.chat.completions.create(messages=msgs, **common)
        return r.choices[0].message.content
    chunks = client.chat.completions.create(messages=msgs, stream=True, **common)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_eight_concurrent_clients_get_their_serial_answers(tiny_server):
    client = tiny_server.client()
    n_clients, per_client = 8, 3
    jobs = [[c * per_client + i for i in range(per_client)] for c in range(n_clients)]
    serial = {k: _job(client, k) for ks in jobs for k in ks}

    def run(ks):
        cl = tiny_server.client()
        return {k: _job(cl, k) for k in ks}

    waits0 = tiny_server.metrics()[("strata_queue_wait_seconds_count", ())]
    with ThreadPoolExecutor(n_clients) as ex:
        futures = [ex.submit(run, ks) for ks in jobs]
        results = {}
        for f in futures:
            results.update(f.result(timeout=300))  # the run ends by itself: every request is answered
    assert len(results) == n_clients * per_client
    for k, text in results.items():
        assert text == serial[k], f"request {k}"
    # every request went through the timeline's queue once (a count: the waits' seconds depend on the machine)
    assert tiny_server.metrics()[("strata_queue_wait_seconds_count", ())] == waits0 + n_clients * per_client


def _open_stream(server, body: dict):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}),
                 headers={"content-type": "application/json", **server.headers()})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    return conn, resp


def _read_events(resp, n: int) -> list[str]:
    out = []
    while len(out) < n:
        line = resp.fp.readline().decode().strip()
        if line.startswith("data:"):
            out.append(line[5:].strip())
    return out


def test_queue_full_answers_503_then_drains(tiny_server, long_body):
    s = tiny_server
    conn, resp = _open_stream(s, {**long_body, "draft": "none"})
    _read_events(resp, 2)  # it runs
    client = s.client()
    with ThreadPoolExecutor(7) as ex:
        waiting = [ex.submit(client.completions.create, model=MODEL, prompt=f"q{i}", max_tokens=4, temperature=0.0)
                   for i in range(7)]
        _wait(lambda: _metric(s, "strata_queue_length") == 7, what="7 queued requests")
        rejected0 = _metric(s, "strata_requests_rejected_total")
        r = s.post("/v1/completions", json={"prompt": "one too many", "max_tokens": 4})
        assert r.status_code == 503, r.text
        e = r.json()["error"]
        assert e["code"] == "queue_full" and e["type"] == "server_error"
        with pytest.raises(openai.APIStatusError) as ei:
            client.completions.create(model=MODEL, prompt="again", max_tokens=4)
        assert ei.value.status_code == 503
        assert _metric(s, "strata_requests_rejected_total") == rejected0 + 2
        conn.close()  # the long one goes away: the queue drains
        assert all(f.result(timeout=120).usage.completion_tokens >= 1 for f in waiting)


def test_disconnect_mid_stream_cancels_and_leaves_state_consistent(tiny_server, tiny_q8_model, long_body):
    s = tiny_server
    cancelled0 = _metric(s, "strata_requests_cancelled_total")
    generated0 = _metric(s, "strata_generated_tokens_total")
    conn, resp = _open_stream(s, {**long_body, "draft": "auto"})
    _read_events(resp, 3)
    conn.close()
    _wait(lambda: _metric(s, "strata_requests_cancelled_total") == cancelled0 + 1, what="the cancellation")
    assert _metric(s, "strata_generated_tokens_total") - generated0 < LONG_TOKENS  # it stopped early
    # the timeline is consistent: a continuation of the cancelled prompt, and an unrelated request, are exact
    ids = tiny_q8_model.tokenizer.encode(LONG_PROMPT)
    for prompt_ids in (ids, tiny_q8_model.tokenizer.encode("unrelated")):
        r = s.client().completions.create(model=MODEL, prompt=prompt_ids, max_tokens=20, temperature=0.7, seed=4)
        assert r.choices[0].text == cold_answer(tiny_q8_model, prompt_ids, max_tokens=20, temperature=0.7, seed=4)


def test_blocking_client_timeout_cancels(tiny_server, long_body):
    s = tiny_server
    cancelled0 = _metric(s, "strata_requests_cancelled_total")
    generated0 = _metric(s, "strata_generated_tokens_total")
    with pytest.raises(openai.APITimeoutError):
        s.client(timeout=1.0).completions.create(
            model=MODEL, prompt=long_body["prompt"], max_tokens=LONG_TOKENS, temperature=0.0,
            logit_bias=long_body["logit_bias"], extra_body={"draft": "none", "dry_multiplier": 0.0})
    _wait(lambda: _metric(s, "strata_requests_cancelled_total") == cancelled0 + 1, what="the cancellation")
    assert _metric(s, "strata_generated_tokens_total") - generated0 < LONG_TOKENS  # cut short, not finished
    r = s.client().completions.create(model=MODEL, prompt="after", max_tokens=3, temperature=0.0)
    assert r.usage.completion_tokens >= 1


def test_chat_on_the_coder_template(tiny_server, tiny_q8_model):
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    r = tiny_server.client().chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, temperature=0.0)
    ids, stops = chat_ids(tiny_q8_model, TEMPLATES / "qwen3-coder.jinja", msgs)
    assert r.choices[0].message.content == cold_answer(tiny_q8_model, ids, stops, max_tokens=10, temperature=0.0)


def test_api_key_and_cors(tiny_server):
    s = tiny_server
    r = s.request("POST", "/v1/completions", json_body={"prompt": "x"}, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = s.request("GET", "/v1/models", headers={"Authorization": ""})
    assert r.status_code == 401
    assert s.request("GET", "/health", headers={"Authorization": ""}).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0).models.list()
    pre = {"Origin": "http://example.org", "Access-Control-Request-Method": "POST", "Authorization": ""}
    r = s.request("OPTIONS", "/v1/chat/completions", headers=pre)
    assert r.status_code == 200 and r.headers.get("access-control-allow-origin") == "http://example.org"
    r = s.request("OPTIONS", "/v1/chat/completions", headers={**pre, "Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in r.headers


def test_many_threads_each_answered_or_refused(tiny_server):
    """12 threads at once on a queue of 7: every request is answered, or refused with 503; none hangs."""
    client = tiny_server.client(timeout=60)
    done = []

    def one(i):
        try:
            client.completions.create(model=MODEL, prompt=f"r{i}", max_tokens=5, temperature=0.0)
            done.append(i)
        except openai.APIStatusError as e:
            assert e.status_code == 503
            done.append(i)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(done) == list(range(12))
