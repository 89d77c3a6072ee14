"""The MTP block: logits against a reference assembled from transformers' own Qwen3-Next modules
(transformers ignores mtp.* on load, so the block is rebuilt from Qwen3NextDecoderLayer + RMSNorm + fc),
drafting state across windows, refusal without an MTP block."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import exactness
from hf_tiny import make_tiny_hf
from strata_py.config import GenerationConfig
from strata_py.convert import convert
from strata_py.model import Model


@pytest.fixture(scope="module")
def hf_mtp(tmp_path_factory):
    d = tmp_path_factory.mktemp("hfmtp")
    model = make_tiny_hf(d, seed=5, with_mtp=True)
    return d, model


def _reference_mtp(d, ref_model):
    """An MTP forward from transformers parts, loaded with the checkpoint's mtp.* tensors."""
    from safetensors.torch import load_file
    from transformers.models.qwen3_next import modeling_qwen3_next as q

    cfg = ref_model.config
    sd = {}
    for f in d.glob("*.safetensors"):
        sd.update({k: v.float() for k, v in load_file(str(f)).items() if k.startswith("mtp.")})
    attn_idx = next(i for i, t in enumerate(cfg.layer_types) if t == "full_attention")
    layer = q.Qwen3NextDecoderLayer(cfg, attn_idx).eval()
    lsd = {k[len("mtp.layers.0."):]: v for k, v in sd.items() if k.startswith("mtp.layers.0.")}
    E = cfg.num_experts  # transformers v5 keeps experts fused: gate_up_proj [E, 2I, H], down_proj [E, H, I]
    ex = lambda e, n: lsd.pop(f"mlp.experts.{e}.{n}_proj.weight")
    lsd["mlp.experts.gate_up_proj"] = torch.stack([torch.cat([ex(e, "gate"), ex(e, "up")]) for e in range(E)])
    lsd["mlp.experts.down_proj"] = torch.stack([ex(e, "down") for e in range(E)])
    layer.load_state_dict(lsd)
    norms = {n: q.Qwen3NextRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps) for n in
             ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")}
    for n, m in norms.items():
        m.weight.data = sd[f"mtp.{n}.weight"]
    fc = sd["mtp.fc.weight"]
    rotary = ref_model.model.rotary_emb

    def forward(h, next_ids):  # h [T, H] post-final-norm main hidden states, next_ids [T]
        e = ref_model.model.embed_tokens(torch.tensor(next_ids))
        x = torch.cat([norms["pre_fc_norm_embedding"](e), norms["pre_fc_norm_hidden"](h)], -1) @ fc.T
        T = x.shape[0]
        pos = torch.arange(T)[None]
        pe = rotary(x[None], pos)
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        x = layer(x[None], position_embeddings=pe, attention_mask=mask, position_ids=pos)
        x = x[0] if isinstance(x, tuple) else x
        return ref_model.lm_head(norms["norm"](x[0]))
    return forward


def test_mtp_logits_match_reference(hf_mtp, tmp_path):
    d, ref_model = hf_mtp
    model = Model.load(convert(d, tmp_path / "mtp.gguf", "f32"), threads=2)
    assert model.has_mtp
    ids = np.random.default_rng(2).integers(0, model.n_vocab, 20).tolist()
    root = 7
    s = model.session(n_ctx=64, mtp=True)
    s.run(ids[:-1])
    s.commit(len(ids) - 1)
    s.run([ids[-1]])
    s.commit(1)
    s.mtp_draft(root, 1)
    ours = s._core.mtp_logits()[0]
    with torch.no_grad():
        h = ref_model.model(torch.tensor([ids])).last_hidden_state[0]
        mtp = _reference_mtp(d, ref_model)
        ref = mtp(h, ids[1:] + [root])[-1].numpy()
    assert np.linalg.norm(ours - ref) / np.linalg.norm(ref) <= 1e-4


def test_mtp_refused_without_block(tiny_model):
    with pytest.raises(ValueError, match="no MTP block"):
        tiny_model.session(mtp=True)


@pytest.mark.parametrize("draft", ["mtp", "mtp+suffix"])
@pytest.mark.parametrize("temperature,seed", [(0.0, 0), (0.8, 1), (1.0, 7)])
def test_mtp_speculative_equals_plain(tiny_q8_model, draft, temperature, seed):
    rng = np.random.default_rng(seed)
    block = rng.integers(0, tiny_q8_model.n_vocab, 12).tolist()
    for prompt in (block * 3, rng.integers(0, tiny_q8_model.n_vocab, 30).tolist(), block[:2]):
        cfg = exactness.config("greedy", seed, 48, temperature=temperature, top_k=40)
        exactness.assert_equals_plain(tiny_q8_model, prompt, cfg, [draft])


def test_mtp_drafter_refused_without_block(tiny_model):
    from strata_py.generate import generate_ids
    with pytest.raises(ValueError, match="no MTP block"):
        list(generate_ids(tiny_model, [1, 2, 3], draft="mtp"))


def test_mtp_state_follows_commits(tiny_q8_model):
    s = tiny_q8_model.session(n_ctx=64, mtp=True)
    s.run(list(range(1, 12)))
    s.commit(11)
    d1 = s.mtp_draft(12, 3)
    assert len(d1) == 3 and s._core.mtp_position == 11
    s.run([12] + d1)
    s.commit(2)  # reject the last two drafts; the block consumes exactly the kept rows next time
    s.mtp_draft(5, 2)
    assert s._core.mtp_position == 13
    with pytest.raises(RuntimeError, match="no newly committed rows"):
        s.mtp_draft(5, 1)


def test_mtp_prefill_then_draft_equals_draft(tiny_q8_model):
    # feeding the prompt rows at prefill (mtp_prefill) and the last one at the first draft gives the very
    # drafts (and draft logits) of feeding them all at the first draft
    prompt = list(range(3, 40))
    out = []
    for early in (False, True):
        s = tiny_q8_model.session(n_ctx=128, mtp=True)
        s.run(prompt)
        s.commit(len(prompt))
        if early:
            s.mtp_prefill()
            assert s._core.mtp_position == len(prompt) - 1
            s.mtp_prefill()  # nothing more to feed until the next root is known
            assert s._core.mtp_position == len(prompt) - 1
        out.append((s.mtp_draft(7, 3), s._core.mtp_logits()))
    assert out[0][0] == out[1][0]
    np.testing.assert_array_equal(out[0][1], out[1][1])


def test_separate_mtp_file(hf_mtp, tmp_path):
    """An MTP-only GGUF (the converter's --mtp-only) attaches to the trunk converted with --no-mtp and drafts
    exactly as the built-in block; one from another model is refused with a clear error."""
    d, _ = hf_mtp
    whole = Model.load(convert(d, tmp_path / "whole.gguf", "f32"), threads=2)
    trunk = convert(d, tmp_path / "trunk.gguf", "f32", mtp=False)
    only = convert(d, tmp_path / "mtp-only.gguf", "f32", mtp_only=True)
    assert not Model.load(trunk).has_mtp
    split = Model.load(trunk, threads=2, mtp=only)
    assert split.has_mtp
    outs = []
    for m in (whole, split):
        s = m.session(n_ctx=64, mtp=True)
        s.run(list(range(1, 15)))
        s.commit(14)
        s.mtp_draft(3, 2)
        outs.append(s._core.mtp_logits())
    np.testing.assert_array_equal(outs[0], outs[1])


def test_mtp_file_that_does_not_fit(hf_mtp, tiny_gguf, tmp_path):
    d, _ = hf_mtp  # hidden 64 against the synthetic tiny model's 256
    only = convert(d, tmp_path / "other-mtp.gguf", "f32", mtp_only=True)
    with pytest.raises(ValueError, match="does not fit .*embedding_length is 64 \\(the model has 256\\)"):
        Model.load(tiny_gguf, mtp=only)


def test_mtp_file_without_block(tiny_gguf):
    with pytest.raises(ValueError, match="no MTP block"):
        Model.load(tiny_gguf, mtp=tiny_gguf)


def test_mtp_draft_resyncs_from_the_last_rows_of_a_long_backlog(tiny_q8_model):
    # max_backlog: after a long stretch without drafts only the last rows go through the block, the older
    # become empty history; the position bookkeeping stays exact and the drafts are ordinary drafts
    s = tiny_q8_model.session(n_ctx=128, mtp=True)
    s.run(list(range(3, 50)))
    s.commit(47)
    d = s.mtp_draft(7, 2, max_backlog=8)
    assert len(d) == 2 and all(0 <= t < tiny_q8_model.n_vocab for t in d)
    assert s._core.mtp_position == 47
    full = tiny_q8_model.session(n_ctx=128, mtp=True)
    full.run(list(range(3, 50)))
    full.commit(47)
    full.mtp_draft(7, 2)
    assert full._core.mtp_position == 47
    # the cut changed what the block saw: its logits differ from feeding every row
    assert not np.array_equal(s._core.mtp_logits(), full._core.mtp_logits())


def test_a_request_starts_from_the_models_mtp_acceptance():
    """MtpCosts (one per loaded model) keeps the drafts kept / rejected per depth: the next request's controller
    starts from them, scaled to PRIOR_OUTCOMES a depth, so it drafts at once where MTP drafts were kept and not
    where they were rejected; a request with no history starts from the controller's own prior."""
    from strata_py.drafting.mtp import PRIOR_OUTCOMES, MtpCosts, MtpDrafter
    from strata_py.controller import WindowCosts
    cfg = GenerationConfig(draft="mtp")
    costs = WindowCosts()
    for _ in range(4):  # C(T) = 1 + 0.5 (T - 1): one draft pays only where it is kept half the time or more
        for T in (1, 2, 4):
            costs.record(T, 1.0 + 0.5 * (T - 1))

    def request(shared, accepted):
        d = MtpDrafter(cfg, costs=costs, mtp=shared)
        first = d.controller.choose(3, 1)
        for _ in range(40):
            d._used = "mtp"
            d.observe([1, 2, 3], accepted)
        return first

    good, bad = MtpCosts(), MtpCosts()
    assert request(good, 3) == 0 and request(bad, 0) == 0  # no history: the prior (0.2) does not pay
    assert request(good, 3) == 3  # every draft kept before: three at once
    assert request(bad, 0) == 0
    kept, rej = good.prior()
    assert kept == [PRIOR_OUTCOMES] * 3 and rej == [0.0] * 3
    kept, rej = bad.prior()
    assert kept == [0.0] * 3 and rej == [PRIOR_OUTCOMES, 0.0, 0.0]
