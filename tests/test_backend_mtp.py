"""The MTP block on a backend session (csrc/model/backend_forward.cpp mtp_forward; issue 19's MTP-drafted decoding
on the GPU): drafts and draft logits equal the native session's bit for bit through runs, partial commits,
mtp_prefill and the re-sync of a long backlog (its cells zeroed on the backend); MTP-drafted decoding (greedy and
sampled, mtp and mtp+suffix) gives the native tokens, which are plain decoding's. The backend is the CPU backend
(CI) and the GPU where one is usable (the CPU side then on its scalar kernels: the GPU's attention is attend_ref's)."""
from __future__ import annotations

import numpy as np
import pytest

from backend_util import assert_same, decode_equal
from seeds import fresh_rng


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
