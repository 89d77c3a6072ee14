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


def check_every_window_and_keep(model, fold, prompt_lens, rng, W, n_ctx=128):
    """For each prompt length p0 (prompt windows longer than W commit all): every window T <= W and every keep
    from the same checkpoint gives the serial logits, the next run (which applies a pending lazy fold first) the
    serial next logits, and then exactly the serial state."""
    V = model.n_vocab
    for p0 in prompt_lens:
        prompt = rng.integers(0, V, p0).tolist()
        seq = rng.integers(0, V, W + 2).tolist()
        ref_logits, ref_states = serial_reference(model, prompt, seq, n_ctx)
        s = model.session(n_ctx=n_ctx, max_window=W, fold=fold)
        s.run(prompt)
        s.commit(p0)
        base = s.checkpoint()
        for T in range(1, W + 1):
            for keep in range(1, T + 1):
                s.restore(base)
                out = s.run(seq[:T])
                for i in range(T):
                    np.testing.assert_array_equal(out[i], ref_logits[i], err_msg=f"p0={p0} T={T} row {i}")
                s.commit(keep)
                assert s.position == p0 + keep
                nxt = s.run([seq[keep]])[0]
                np.testing.assert_array_equal(nxt, ref_logits[keep], err_msg=f"p0={p0} T={T} keep={keep} next")
                s.commit(1)
                assert_same_state(s.export_state(), ref_states[keep + 1], f"p0={p0} T={T} keep={keep}")


def check_random_windows(model, fold, rng, W, n_windows=40, n_ctx=512):
    """A long random sequence of windows and keeps ends in the serial state, with the serial next logits."""
    V = model.n_vocab
    s = model.session(n_ctx=n_ctx, max_window=W, fold=fold)
    prompt = rng.integers(0, V, 13).tolist()
    s.run(prompt)
    s.commit(len(prompt))
    kept = []
    for _ in range(n_windows):
        T = int(rng.integers(1, W + 1))
        keep = int(rng.integers(1, T + 1))
        inputs = rng.integers(0, V, T).tolist()
        s.run(inputs)
        s.commit(keep)
        kept += inputs[:keep]
    probe = int(rng.integers(0, V))
    last = s.run([probe])[0]
    s.commit(1)
    r = model.session(n_ctx=n_ctx, max_window=W)  # the prompt runs as the same kind of window in both
    r.run(prompt)
    r.commit(len(prompt))
    for t in kept:
        r.run([t])
        r.commit(1)
    np.testing.assert_array_equal(last, r.run([probe])[0])
    r.commit(1)
    assert_same_state(s.export_state(), r.export_state())


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
