"""The window transaction guard, checkpoints (memory and file) and seeded sampling."""
from __future__ import annotations

import numpy as np
import pytest

from strata_py import GenerationConfig


def _prefilled(model, fold="lazy", n=10):
    s = model.session(n_ctx=64, fold=fold)
    s.run(list(range(1, n + 1)))
    s.commit(n)
    return s


def test_guards_leave_session_usable(tiny_model):
    s = _prefilled(tiny_model)
    with pytest.raises(RuntimeError, match=r"commit\(1\) with no window"):
        s.commit(1)
    s.run([5, 6, 7])
    with pytest.raises(RuntimeError, match="commit is pending"):
        s.run([1])
    with pytest.raises(ValueError, match="keep must be in 1..3"):
        s.commit(4)
    with pytest.raises(ValueError, match="keep must be in 1..3"):
        s.commit(0)
    s.commit(2)  # still usable after the refused calls
    assert s.position == 12
    s.run(list(range(20)))  # a prompt window (T > max_window)
    with pytest.raises(ValueError, match="prompt window of 20 rows"):
        s.commit(19)
    s.commit(20)
    assert s.position == 32


def test_bad_tokens_and_context(tiny_model):
    s = tiny_model.session(n_ctx=16)
    with pytest.raises(ValueError, match="token id 100000 at row 1"):
        s.run([1, 100000])
    with pytest.raises(ValueError, match="exceed the context of 16"):
        s.run(list(range(17)))
    with pytest.raises(ValueError, match="empty window"):
        s.run([])
    assert s.position == 0 and not s._core.pending_commit
    with pytest.raises(ValueError, match="fold='sideways'"):
        tiny_model.session(fold="sideways")
    with pytest.raises(ValueError, match="n_ctx"):
        tiny_model.session(n_ctx=10**9)


@pytest.mark.parametrize("fold", ["lazy", "eager", "partial"])
def test_checkpoint_roundtrip_memory_and_file(tiny_model, tmp_path, fold):
    s = _prefilled(tiny_model, fold)
    s.run([3, 4, 5, 6])
    s.commit(2)  # leaves a pending lazy fold in lazy / partial mode
    cp = s.checkpoint()
    path = tmp_path / "s.ckpt"
    s.save(path)
    ref = s.run([9, 8, 7])
    s.commit(3)
    ref_next = s.run([1])
    s.commit(1)
    for restored in (None, "file"):
        if restored is None:
            t = tiny_model.session(n_ctx=64, fold=fold)
            t.restore(cp)
        else:
            t = tiny_model.load_session(path, n_ctx=64, fold=fold)
        assert t.position == 12
        np.testing.assert_array_equal(t.run([9, 8, 7]), ref)
        t.commit(3)
        np.testing.assert_array_equal(t.run([1]), ref_next)
        t.commit(1)


def test_checkpoint_refuses_damage_and_other_models(tiny_model, tiny_q8_model, tmp_path):
    s = _prefilled(tiny_model)
    path = tmp_path / "s.ckpt"
    s.save(path)
    with pytest.raises(ValueError, match="different model"):
        tiny_q8_model.load_session(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="damaged checkpoint"):
        tiny_model.load_session(bad)
    bad.write_bytes(bytes(data[:100]))
    with pytest.raises(ValueError, match="damaged|bad magic"):
        tiny_model.load_session(bad)
    bad.write_bytes(b"hello world, not a checkpoint")
    with pytest.raises(ValueError, match="bad magic"):
        tiny_model.load_session(bad)


def test_seeded_sampling_reproducible(tiny_model):
    from strata_py.generate import generate_ids
    prompt = [5, 6, 7, 8]
    a = list(generate_ids(tiny_model, prompt, max_tokens=24, temperature=1.0, seed=42, stop_at_eos=False))
    b = list(generate_ids(tiny_model, prompt, max_tokens=24, temperature=1.0, seed=42, stop_at_eos=False))
    c = list(generate_ids(tiny_model, prompt, max_tokens=24, temperature=1.0, seed=43, stop_at_eos=False))
    assert a == b and len(a) == 24
    assert a != c


def test_bad_generation_options(tiny_model):
    from strata_py.generate import generate_ids
    with pytest.raises(ValueError, match="temperature"):
        list(generate_ids(tiny_model, [1, 2], temperature=-1.0))
    with pytest.raises(ValueError, match="top_p"):
        list(generate_ids(tiny_model, [1, 2], top_p=0.0))
    with pytest.raises(ValueError, match=r"max_draft=64: must be in 0\.\.63"):
        list(generate_ids(tiny_model, [1, 2], max_draft=64))
    with pytest.raises(ValueError, match="unknown option 'bogus'"):
        list(generate_ids(tiny_model, [1, 2], bogus=1))
    with pytest.raises(ValueError, match="prompt of 40 tokens exceeds the context of 32"):
        list(generate_ids(tiny_model, list(range(40)), n_ctx=32))
