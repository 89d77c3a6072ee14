"""Window parity check shared by the per-type model tests (not a test module)."""
from __future__ import annotations

import numpy as np


def assert_windows_equal_serial(model, windows=(1, 3, 8, 9), seed=11, label=""):
    """Windows of T rows (9 = two kernel passes) give exactly the logits of serial decoding of the same tokens,
    after a 10-token prompt; the serial logits are finite."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, model.n_vocab, 10).tolist()
    seq = rng.integers(0, model.n_vocab, max(windows)).tolist()
    s = model.session(n_ctx=64, max_window=max(16, max(windows)))
    s.run(prompt)
    s.commit(len(prompt))
    base = s.checkpoint()
    ref = []
    for t in seq:
        ref.append(s.run([t])[0].copy())
        s.commit(1)
    assert np.all(np.isfinite(ref)), label
    for T in windows:
        s.restore(base)
        np.testing.assert_array_equal(s.run(seq[:T]), np.asarray(ref[:T]), err_msg=f"{label} T={T}")


def serial_reference(model, prompt, seq, n_ctx=128):
    """Serial decoding after a prompt window: the logits after each token of seq and the state after each prefix."""
    s = model.session(n_ctx=n_ctx)
    s.run(prompt)
    s.commit(len(prompt))
    logits, states = [], [s.export_state()]
    for t in seq:
        logits.append(s.run([t])[0].copy())
        s.commit(1)
        states.append(s.export_state())
    return logits, states


def assert_same_state(a, b, label=""):
    """Two export_state() dicts hold the same keys and bit-identical arrays."""
    assert a.keys() == b.keys(), label
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=f"{label} {k}")


class Oracle:
    """Drafts the serial output exactly for `right` tokens, then a wrong token (every T and keep occurs)."""

    def __init__(self, serial, prompt_len, right, V):
        self.serial, self.n0, self.right, self.V = serial, prompt_len, right, V

    def propose(self, context, max_drafts):
        done = len(context) - self.n0  # tokens emitted so far (context = prompt + emitted)
        future = self.serial[done:done + max_drafts]
        drafts = list(future[: self.right])
        if len(drafts) < max_drafts and len(future) > len(drafts):
            drafts.append((future[len(drafts)] + 1) % self.V)
        return drafts

    def observe(self, drafts, accepted):
        pass
