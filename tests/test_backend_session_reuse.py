"""A backend session takes over the last closed session's buffers and recorded steps (BackendModel::parked,
csrc/model/backend_forward.cpp) when n_ctx and max_window match, its state zeroed in place: it computes a
fresh session's logits and MTP drafts bit for bit (the native session's too), though the closed one left DeltaNet
state, conv history, replay rows, KV and MTP cells behind; on the GPU it replays the closed one's recorded steps
(no cold step where the closed one ran the same shapes). A session without MTP takes over buffers with MTP cells
(requests with and without MTP drafts share them), not the other way round; a session of another n_ctx gets new
buffers. The backend is the CPU backend (CI) and the GPU where one is usable (conftest.py's `backend`)."""
from __future__ import annotations

import gc

import numpy as np

from backend_util import assert_same
from seeds import fresh_rng
from strata_py import GenerationConfig, Model, _core
from strata_py.generate import generate_ids

OPTS = dict(n_ctx=112, max_window=4, mtp=True)  # options no other test's sessions of tiny_q8_model use


def _script(rng, V):
    """A prompt, then (root, keep) per MTP-drafted window."""
    return rng.integers(0, V, 21).tolist(), [(int(rng.integers(0, V)), int(rng.integers(1, 4))) for _ in range(8)]


def _play(s, script):
    """The script on session s: each run's logits and each window's drafts and draft logits."""
    prompt, windows = script
    out = [s.run(prompt)]
    s.commit(len(prompt))
    s.mtp_prefill()
    for root, keep in windows:
        d = s.mtp_draft(root, 2)
        out += [np.array(d, dtype=np.float32), s._core.mtp_logits(), s.run([root] + d)]
        s.commit(min(keep, 1 + len(d)))
    return out


def _same(a, b, label):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert_same(x, y, f"{label}: output {i}")


def test_a_closed_sessions_buffers_serve_the_next_with_a_fresh_state(tiny_q8_model, backend):
    m = tiny_q8_model
    script = _script(fresh_rng(), m.n_vocab)
    native = _play(m.session(**OPTS, backend="cpu"), script)
    closed = m.session(**OPTS, backend=backend)
    first = _play(closed, script)
    cold_first = closed._core.cold_steps
    _same(native, first, "a new session")
    del closed  # parked with its state as the script left it
    n = _core.adopted_backend_sessions()
    again = m.session(**OPTS, backend=backend)
    assert _core.adopted_backend_sessions() == n + 1, "the closed session's buffers were not taken over"
    _same(native, _play(again, script), "the session that took over the closed one's buffers")
    if backend == "cuda":
        assert cold_first > 0 and again._core.cold_steps == 0, (cold_first, again._core.cold_steps)
    del again
    other = m.session(**{**OPTS, "n_ctx": 104}, backend=backend)
    assert _core.adopted_backend_sessions() == n + 1, "a session of another n_ctx took over the parked buffers"
    _same(_play(m.session(**{**OPTS, "n_ctx": 104}, backend="cpu"), script), _play(other, script), "n_ctx 104")
    del other
    plain = m.session(n_ctx=104, max_window=4, backend=backend)  # no MTP: takes over the MTP-capable buffers
    assert _core.adopted_backend_sessions() == n + 2
    prompt = script[0]
    assert_same(m.session(n_ctx=104, max_window=4, backend="cpu").run(prompt), plain.run(prompt), "without MTP")
    del plain
    _same(_play(m.session(**{**OPTS, "n_ctx": 104}, backend="cpu"), script),
          _play(m.session(**{**OPTS, "n_ctx": 104}, backend=backend), script), "MTP again")
    assert _core.adopted_backend_sessions() == n + 3
    no_mtp = m.session(n_ctx=96, max_window=4, backend=backend)  # new buffers without MTP cells
    del no_mtp
    with_mtp = m.session(n_ctx=96, max_window=4, mtp=True, backend=backend)
    assert _core.adopted_backend_sessions() == n + 3, "an MTP session took over buffers without MTP cells"
    _same(_play(m.session(**{**OPTS, "n_ctx": 96}, backend="cpu"), script), _play(with_mtp, script), "n_ctx 96")


def test_each_request_takes_over_the_last_ones_session(tiny_q8_gguf, backend):
    """generate_ids' requests, MTP-drafted and plain alternated as bench_spec runs them: from the second on each
    takes over the last one's buffers, with the garbage collector off (the MTP drafter sits in a reference cycle:
    it lets its session go at the request's end, else the session lived on until a collection and the next
    request started cold); every request gives plain decoding's tokens."""
    m = Model.load(tiny_q8_gguf, backend=backend)  # its own backend copy: nothing parked by other tests
    ids = m.tokenizer.encode("the same prompt for every request")
    cfg = GenerationConfig(max_tokens=12, temperature=0.0, stop_at_eos=False)
    outs, adopted = [], []
    gc.disable()
    try:
        for draft in ("mtp", "none", "mtp", "mtp", "none"):
            a0 = _core.adopted_backend_sessions()
            outs.append(list(generate_ids(m, ids, cfg.replace(draft=draft))))
            adopted.append(_core.adopted_backend_sessions() - a0)
    finally:
        gc.enable()
    assert adopted[1:] == [1, 1, 1, 1], adopted
    assert all(o == outs[0] for o in outs), outs
