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
