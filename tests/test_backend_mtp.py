"""The MTP block on a backend session (csrc/model/backend_forward.cpp mtp_forward; issue 19's MTP-drafted decoding
on the GPU): drafts and draft logits equal the native session's bit for bit through runs, partial commits,
mtp_prefill and the re-sync of a long backlog (its cells zeroed on the backend); MTP-drafted decoding (greedy and
sampled, mtp and mtp+suffix) gives the native tokens, which are plain decoding's. The backend is the CPU backend
(CI) and the GPU where one is usable (the CPU side then on its scalar kernels: the GPU's attention is attend_ref's).
On the GPU the drafts of repeated shapes replay recorded steps, the chain on the card for a Q8_0 embedding table
and through the host (one int down, one row up per depth) for a Q4_K one; drafts running into the end of the MTP
cells are cut as the native session cuts them."""
from __future__ import annotations

import numpy as np
import pytest

from backend_util import assert_same, decode_equal
from seeds import fresh_rng
from strata_py import Model, _core, synth


@pytest.fixture(scope="module")
def tiny_q4k_model(tmp_path_factory):
    """An MTP model whose token_embd is Q4_K: no device dequantizer for its rows, so the GPU chains through the host."""
    return Model.load(str(synth.write("tiny", tmp_path_factory.mktemp("q4k") / "tiny-q4_k.gguf", "q4_k", seed=3,
                                      mtp=True)))


# backend: conftest.py's fixture (the CPU backend, and the GPU where one is usable)

def test_mtp_drafts_equal_native(tiny_q8_model, backend):
    m = tiny_q8_model
    assert m.has_mtp
    rng = fresh_rng()
    V = m.n_vocab
    ref = m.session(n_ctx=160, max_window=8, mtp=True, backend="cpu")
    got = m.session(n_ctx=160, max_window=8, mtp=True, backend=backend)
    prompt = rng.integers(0, V, int(rng.integers(20, 70))).tolist()  # more than a 64-row piece at times
    for s in (ref, got):
        s.run(prompt)
        s.commit(len(prompt))
        s.mtp_prefill()
    for w in range(10):
        root = int(rng.integers(0, V))
        k = int(rng.integers(1, 6))
        backlog = 8 if w == 6 else 0  # once: the older rows become empty history (zeroed cells)
        d_ref, d_got = ref.mtp_draft(root, k, max_backlog=backlog), got.mtp_draft(root, k, max_backlog=backlog)
        assert d_ref == d_got, f"window {w}: drafts {d_got} vs native {d_ref}"
        assert_same(ref._core.mtp_logits(), got._core.mtp_logits(), f"window {w} draft logits")
        toks = [root] + d_ref
        assert_same(ref.run(toks), got.run(toks), f"window {w} verify")
        keep = int(rng.integers(1, len(toks) + 1))
        ref.commit(keep)
        got.commit(keep)
        if w == 5:  # a stretch without drafts: the backlog grows past max_backlog
            for _ in range(12):
                t = [int(rng.integers(0, V))]
                ref.run(t), got.run(t)
                ref.commit(1), got.commit(1)
        assert ref._core.mtp_position == got._core.mtp_position
    assert ref.tokens == got.tokens


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("draft", ["mtp", "mtp+suffix"])
def test_mtp_decode_equals_native(tiny_q8_model, backend, temperature, draft):
    seed = int(fresh_rng().integers(1 << 62))
    drafted = decode_equal(tiny_q8_model, backend, np.random.default_rng(seed), temperature=temperature, draft=draft,
                           label=f"{draft} t={temperature}")
    plain = decode_equal(tiny_q8_model, backend, np.random.default_rng(seed), temperature=temperature, draft="none")
    assert drafted == plain


@pytest.mark.parametrize("table", ["q8_0", "q4_k"])
def test_mtp_recorded_drafts_equal_native(tiny_q8_model, tiny_q4k_model, backend, table):
    """Windows of the same shapes over and over (k and keep repeat): from the third of a shape on, the GPU replays
    its recorded steps; drafts and their logits stay the native session's, up to the context's end, where the
    chain runs into the MTP block's 16 cells past n_ctx."""
    m = tiny_q8_model if table == "q8_0" else tiny_q4k_model
    rng = fresh_rng()
    V, n_ctx = m.n_vocab, 48
    ref = m.session(n_ctx=n_ctx, max_window=4, mtp=True, backend="cpu")
    got = m.session(n_ctx=n_ctx, max_window=4, mtp=True, backend=backend)
    prompt = rng.integers(0, V, 5).tolist()
    for s in (ref, got):
        s.run(prompt)
        s.commit(len(prompt))
        s.mtp_prefill()
    replays = _core.recorded_step_replays()
    w = 0
    while ref.position + 4 <= n_ctx:
        root = int(rng.integers(0, V))
        k = (1, 3, 3, 2)[w % 4]
        d_ref, d_got = ref.mtp_draft(root, k), got.mtp_draft(root, k)
        assert d_ref == d_got, f"window {w}: drafts {d_got} vs native {d_ref}"
        assert_same(ref._core.mtp_logits(), got._core.mtp_logits(), f"window {w} draft logits")
        toks = [root] + d_ref
        assert_same(ref.run(toks), got.run(toks), f"window {w} verify")
        keep = min((1, 2, 4, 3)[w % 4], len(toks))
        ref.commit(keep), got.commit(keep)
        w += 1
    # the context's end: the chain runs into the MTP cells past n_ctx and is cut there as natively
    tail = rng.integers(0, V, n_ctx - ref.position).tolist()
    for s in (ref, got):
        for t in tail:
            s.run([t])
            s.commit(1)
    d_ref, d_got = ref.mtp_draft(3, 16), got.mtp_draft(3, 16)
    assert d_ref == d_got and len(d_ref) == 16
    assert_same(ref._core.mtp_logits(), got._core.mtp_logits(), "draft logits at the context's end")
    if backend == "cuda":
        assert _core.recorded_step_replays() > replays + w // 2, "the MTP drafts replayed no recorded steps"


def test_cold_steps_count_warmups_only(tiny_q8_model, backend):
    """Session.cold_steps (the controller skips cost samples of windows during which it grew): on the GPU it grows
    while a shape is recorded (its first sight), then stays while the same shapes replay; the CPU backend and the
    native session record nothing (0). Options no other test's sessions of the model use: no closed session's
    recordings serve it (test_backend_session_reuse.py)."""
    m = tiny_q8_model
    rng = fresh_rng()
    s = m.session(n_ctx=120, max_window=4, mtp=True, backend=backend)
    native = m.session(n_ctx=120, max_window=4, mtp=True, backend="cpu")
    prompt = rng.integers(0, m.n_vocab, 8).tolist()
    counts = []
    for x in (s, native):
        x.run(prompt)
        x.commit(len(prompt))
        x.mtp_prefill()
    for _ in range(6):
        for x in (s, native):
            d = x.mtp_draft(int(rng.integers(0, m.n_vocab)), 2)
            x.run([5] + d)
            x.commit(2)
        counts.append(s._core.cold_steps)
    assert native._core.cold_steps == 0
    if backend == "cuda":
        assert counts[0] > 0 and counts[-1] == counts[-3], counts
    else:
        assert counts == [0] * 6
