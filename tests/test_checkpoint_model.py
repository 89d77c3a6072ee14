"""Checkpoints are bound to their model (issue 21): the fingerprint covers the weights (csrc/model/fingerprint.h),
so a checkpoint of another model of the same shapes (another seed, a "fine-tune" of one tensor) is refused, in
memory and from a file, with an error naming the checkpoint, the model it was saved with and this session's
model; restoring into a session with a smaller context, with MTP state, and into a model whose experts stream from
disk continues exactly as the uninterrupted timeline."""
from __future__ import annotations

import re
import shutil

import gguf
import numpy as np
import pytest

import exactness
from strata_py import synth
from strata_py.generate import generate_ids, make_proposer
from strata_py.model import Model
from strata_py.speculative import LoopStats, decode


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """Two tiny f32 models with the same tensor table and hyperparameters, different weights (seeds 1 and 7)."""
    d = tmp_path_factory.mktemp("twins")
    a = synth.write("tiny", d / "a.gguf", "f32", seed=1, mtp=True)
    b = synth.write("tiny", d / "b.gguf", "f32", seed=7, mtp=True)
    return a, b


def _tensor_table(path):
    r = gguf.GGUFReader(str(path))
    return [(t.name, int(t.tensor_type), [int(x) for x in t.shape], int(t.data_offset)) for t in r.tensors]


def test_fingerprint_covers_the_weights(twins, tmp_path):
    a, b = twins
    assert _tensor_table(a) == _tensor_table(b) and a.stat().st_size == b.stat().st_size  # same shapes
    fa, fb = Model.load(a, threads=1)._core.fingerprint, Model.load(b, threads=1)._core.fingerprint
    assert fa != fb
    copy = tmp_path / "copy.gguf"
    shutil.copy(a, copy)
    assert Model.load(copy, threads=1)._core.fingerprint == fa  # the path is not part of it
    # a "fine-tune" of one small tensor (every byte of one norm changed) is another model too
    r = gguf.GGUFReader(str(a))
    t = next(t for t in r.tensors if t.name == "blk.1.attn_norm.weight")
    data = bytearray(a.read_bytes())
    start = int(t.data_offset)
    w = np.frombuffer(bytes(data[start:start + int(t.n_bytes)]), np.float32) * np.float32(1.001)
    data[start:start + int(t.n_bytes)] = w.tobytes()
    tuned = tmp_path / "tuned.gguf"
    tuned.write_bytes(bytes(data))
    assert Model.load(tuned, threads=1)._core.fingerprint not in (fa, fb)


def _timeline(model, n_ctx=128, mtp=False):
    s = model.session(n_ctx=n_ctx, max_window=8, mtp=mtp)
    rng = np.random.default_rng(3)
    toks = rng.integers(0, model.n_vocab, 30).tolist()
    s.run(toks[:20])
    s.commit(20)
    s.run(toks[20:26])
    s.commit(4)  # a verify window, 4 of its 6 rows kept (a pending lazy fold)
    return s, toks


def test_checkpoint_of_another_model_is_refused_naming_both(twins, tmp_path):
    a, b = twins
    ma, mb = Model.load(a, threads=1), Model.load(b, threads=1)
    s, _ = _timeline(ma)
    cp = s.checkpoint()
    with pytest.raises(ValueError, match=rf"restore\(\): the checkpoint was taken with model {re.escape(str(a))} "
                                         rf"\(fingerprint [0-9a-f]+\); this session's model is {re.escape(str(b))}"):
        mb.session(n_ctx=128).restore(cp)
    p = tmp_path / "a.cp"
    s.save(p)
    with pytest.raises(ValueError, match=rf"{re.escape(str(p))}: checkpoint was saved from a different model: "
                                         rf"{re.escape(str(a))} \(fingerprint [0-9a-f]+\); this session's model is "
                                         rf"{re.escape(str(b))}"):
        mb.load_session(p, n_ctx=128)
    t = ma.load_session(p, n_ctx=128)  # its own model reads it
    assert t.position == s.position and t.tokens == s.tokens


def test_restore_into_a_smaller_context(tiny_q8_model, tmp_path):
    m = tiny_q8_model
    s, toks = _timeline(m, n_ctx=128)
    want = s.run(toks[24:30]).copy()
    s.commit(6)
    s2, _ = _timeline(m, n_ctx=128)
    cp = s2.checkpoint()
    p = tmp_path / "s.cp"
    s2.save(p)
    for n_ctx in (30, 24):  # room for the continuation; exactly the checkpoint's position (24)
        small = m.session(n_ctx=n_ctx, max_window=8)
        small.restore(cp)
        from_file = m.load_session(p, n_ctx=n_ctx, max_window=8)
        for t in (small, from_file):
            if n_ctx == 30:
                np.testing.assert_array_equal(t.run(toks[24:30]), want)
            else:
                with pytest.raises(ValueError):  # a full context: no room for a window
                    t.run(toks[24:25])
    with pytest.raises(ValueError, match="checkpoint position 24 exceeds this session's context 23"):
        m.session(n_ctx=23).restore(cp)
    with pytest.raises(ValueError, match=rf"{re.escape(str(p))}: checkpoint position 24 exceeds this session's "
                                         rf"context of 23 tokens"):
        m.load_session(p, n_ctx=23)


def test_restore_with_mtp_state_continues_exactly(tiny_q8_model):
    """A mid-generation checkpoint of an MTP session (its block's K/V and backlog) restored into a new, smaller
    MTP session: continuing with MTP drafts gives plain decoding's tokens."""
    m = tiny_q8_model
    prompt = np.random.default_rng(5).integers(0, m.n_vocab, 18).tolist()
    for label, cfg in exactness.cases(seeds=(2,), max_tokens=30):
        plain = exactness.plain(m, prompt, cfg)
        mtp = cfg.replace(draft="mtp")
        s = m.session(n_ctx=256, max_window=16, mtp=True)
        first = list(generate_ids(m, prompt, mtp.replace(max_tokens=11), session=s))
        assert first == plain[:11], label
        cp = s.checkpoint()
        t = m.session(n_ctx=64, max_window=16, mtp=True)
        t.restore(cp)
        assert t._core.mtp_position == s._core.mtp_position > 0  # the MTP block's state came along
        assert t.mtp_draft(first[-1], 3) == s.mtp_draft(first[-1], 3)
        st = LoopStats()
        drafter = make_proposer(m, mtp.replace(fixed_t=4))  # fixed windows: it drafts whatever its estimates
        drafter.bind(t)
        rest = list(decode(t, first[-1], mtp.replace(max_tokens=19), set(), st, drafter, origin=t.steer_origin))
        assert first + rest == plain and st.drafted > 0, label


def test_restore_while_experts_stream(tmp_path):
    """Checkpoints move between a fully resident model and the same file with streamed experts (one model: one
    fingerprint), in memory and through files, and continue exactly."""
    path = synth.write("tiny", tmp_path / "t.gguf", "q8_0", seed=9)
    full = Model.load(path, threads=2)
    with pytest.raises(ValueError, match="needs at least") as ei:
        Model.load(path, threads=2, cache_mib=0)
    lo = int(str(ei.value).split("needs at least ")[1].split(" MiB")[0])
    small = Model.load(path, threads=2, cache_mib=lo)
    assert small.streaming and small._core.fingerprint == full._core.fingerprint
    prompt = np.random.default_rng(6).integers(0, full.n_vocab, 16).tolist()
    cfg = exactness.config("sampled", 1, 24)
    plain = exactness.plain(full, prompt, cfg)
    for src, dst in ((full, small), (small, full)):
        s = src.session(n_ctx=128, max_window=8)
        first = list(generate_ids(src, prompt, cfg.replace(max_tokens=9, draft="suffix"), session=s))
        s.save(tmp_path / "cp.bin")
        for how in ("memory", "file"):
            if how == "memory":
                t = dst.session(n_ctx=64, max_window=8)
                t.restore(s.checkpoint())
            else:
                t = dst.load_session(tmp_path / "cp.bin", n_ctx=64, max_window=8)
            rest = list(decode(t, first[-1], cfg.replace(max_tokens=15), set(), LoopStats(),
                               exactness.Adversarial(2).make(plain, len(prompt), dst.n_vocab), origin=t.steer_origin))
            assert first + rest == plain, (src.streaming, how)
    assert small.expert_stats()["bytes_read"] > 0
