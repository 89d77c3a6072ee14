"""The prefix cache and the timeline in-process (no HTTP): restores are exact for every drafter, from memory and
from files, the ring keeps the longest true prefix within its budget, and the worker survives bad requests."""
from __future__ import annotations

import queue
import threading

import pytest

import exactness
from server_util import cold_answer
from strata_py.config import GenerationConfig
from strata_py.generate import generate_ids
from strata_py.server.prefix_cache import PrefixCache
from strata_py.server.timeline import Done, Failed, QueueFull, Request, Started, Timeline, Token

DRAFTS = ["none", "suffix", "auto", "mtp", "mtp+suffix"]


@pytest.mark.parametrize("draft", DRAFTS)
def test_restored_checkpoints_are_exact_for_every_drafter(tiny_q8_model, tmp_path, draft):
    """Checkpoints taken mid-prefill (before the MTP block ran), at the end of an answer, and read from a file:
    continuing from each gives exactly the cold tokens."""
    m = tiny_q8_model
    cfg = GenerationConfig(max_tokens=30, temperature=0.8, seed=9, draft=draft, stop_at_eos=False)
    prompt = [(7 * i) % 300 + 1 for i in range(60)] * 2
    cold = exactness.plain(m, prompt, cfg)  # draft="none" from scratch: every drafter, restored, gives these
    s = m.session(n_ctx=512, max_window=cfg.max_window, mtp=True)
    s.run(prompt[:50])
    s.commit(50)
    mid = s.checkpoint()                       # MTP history all in backlog (the block has not run)
    s.save(tmp_path / "mid.session")            # files keep no MTP state
    for restore in ("memory", "file"):
        s2 = m.session(n_ctx=512, max_window=cfg.max_window, mtp=True)
        if restore == "memory":
            s2.restore(mid)
        else:
            s2.load(tmp_path / "mid.session")
        assert list(generate_ids(m, prompt, cfg, session=s2)) == cold
    warm = list(generate_ids(m, prompt, cfg, session=s))  # the session that took the checkpoint, continued
    assert warm == cold


def test_prefix_cache_lookup_and_lru(tiny_model):
    s = tiny_model.session(n_ctx=128)
    cps = {}
    for n in (4, 8, 12):
        s.reset()
        s.run(list(range(1, n + 1)))
        s.commit(n)
        cps[n] = s.checkpoint()
    size = cps[12].nbytes
    c = PrefixCache(budget_bytes=2 * size + cps[4].nbytes // 2)  # room for two
    for n in (4, 8):
        assert c.add(list(range(1, n + 1)), cps[n], "prompt")
    ids = list(range(1, 20))
    assert len(c.lookup(ids, limit=18).tokens) == 8            # the longest key that is a prefix
    assert len(c.lookup(ids, limit=6).tokens) == 4             # within the limit only
    assert c.lookup([1, 2, 3, 5, 6, 7, 8, 9, 10], limit=9) is None  # shares a beginning, is not a prefix
    c.lookup(list(range(1, 6)), limit=5)                        # 4 is now the most recently used
    assert c.add(list(range(1, 13)), cps[12], "answer")         # evicts 8, the least recently used
    assert sorted(len(e.tokens) for e in c.entries()) == [4, 12]
    assert c.stats.evictions == 1 and c.nbytes <= c.budget
    assert not PrefixCache(budget_bytes=size - 1).add(list(range(1, 13)), cps[12], "answer")  # too large
    assert c.add(list(range(1, 13)), cps[12], "answer") and len(c) == 2  # the same tokens: refreshed, not doubled


def _run(tl: Timeline, ids, cfg, **kw):
    events: queue.Queue = queue.Queue()
    req = Request(ids, cfg, events.put, **kw)
    tl.submit(req)
    out = []
    while True:
        ev = events.get(timeout=60)
        out.append(ev)
        if isinstance(ev, (Done, Failed)):
            return req, out


def test_timeline_serves_reuses_and_survives_bad_requests(tiny_q8_model):
    m = tiny_q8_model
    cfg = GenerationConfig(max_tokens=12, temperature=0.0, draft="mtp+suffix")
    tl = Timeline(m, cfg=cfg, ctx=256, prompt_cache_mib=64, checkpoint_gap=4, max_queue=0)
    try:
        ids = [5, 6, 7, 8, 9, 10, 11, 12] * 3
        _, ev = _run(tl, ids, cfg, boundaries=[8, 16])
        text = "".join(e.text for e in ev if isinstance(e, Token))
        assert text == cold_answer(m, ids, max_tokens=12, temperature=0.0)
        assert {e.kind for e in tl.cache.entries()} == {"boundary", "prompt", "answer"}
        _, ev = _run(tl, ids[:17] + [99, 98], cfg)              # an edit after the boundary at 16
        assert ev[0].cached_tokens == 16 and isinstance(ev[0], Started)
        _, ev = _run(tl, list(range(300)), cfg)                 # longer than the context: refused, worker lives
        assert isinstance(ev[-1], Failed) and "context" in str(ev[-1].error)
        _, ev = _run(tl, [m.n_vocab + 5], cfg)                  # a token outside the vocabulary
        assert isinstance(ev[-1], Failed) and "vocabulary" in str(ev[-1].error)
        events: queue.Queue = queue.Queue()
        req = Request(ids, cfg, events.put)
        req.cancel()                                            # cancelled while it waited: nothing runs
        tl.submit(req)
        done = events.get(timeout=60)
        assert isinstance(done, Done) and done.finish_reason == "cancelled" and done.completion_tokens == 0
        # max_queue 0: a request waits for nothing; one arriving while another runs is refused
        gate = threading.Event()
        slow = Request(list(range(1, 40)), cfg.replace(max_tokens=3000, stop_at_eos=False),
                       lambda e: gate.set() if isinstance(e, Token) else None)
        tl.submit(slow)
        assert gate.wait(60)
        with pytest.raises(QueueFull):
            tl.submit(Request(ids, cfg, lambda e: None))
        slow.cancel()
    finally:
        tl.close()


def test_a_client_that_resubmits_on_done_finds_its_slot_free(tiny_q8_model):
    """max_queue bounds the requests waiting behind the one being served. A request's Done goes out after it has
    left the timeline, so a client that sends its next request on seeing it (8 clients, --max-queue 7) is not
    refused while the others wait; a third waiting request still is."""
    m = tiny_q8_model
    cfg = GenerationConfig(max_tokens=4, temperature=0.0, draft="none")
    tl = Timeline(m, cfg=cfg, ctx=256, prompt_cache_mib=64, max_queue=1)
    try:
        gate, results = threading.Event(), queue.Queue()
        resubmitted: list = []

        def on_a(ev):
            if isinstance(ev, Started):
                gate.wait(60)  # A holds the timeline until B waits behind it
            if isinstance(ev, (Done, Failed)):
                try:  # from the worker thread, as a client reacting to its answer: B still waits
                    tl.submit(Request([5, 6, 7], cfg, results.put))
                    resubmitted.append("admitted")
                except QueueFull as e:
                    resubmitted.append(f"refused: {e}")

        tl.submit(Request([1, 2, 3], cfg, on_a))
        b_events: queue.Queue = queue.Queue()
        tl.submit(Request([9, 10, 11], cfg, b_events.put))   # waits behind A: the queue holds 1
        with pytest.raises(QueueFull):                        # a second waiting request is one too many
            tl.submit(Request([12, 13], cfg, lambda ev: None))
        gate.set()
        for q in (b_events, results):
            while not isinstance(ev := q.get(timeout=60), (Done, Failed)):
                pass
            assert isinstance(ev, Done), ev
        assert resubmitted == ["admitted"]
    finally:
        tl.close()
