"""HF Qwen3-Next -> GGUF converter: names, shapes, metadata, transforms, types, MTP, round trip, bad input."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from safetensors.torch import load_file, save_file

from convert_util import ne_attention, ne_moe
from gguf_util import metadata_from_gguf_reader, tensor_f32, tensors_by_name  # noqa: F401  (sets sys.path)
from hf_tiny import TINY, make_tiny_hf, tiny_tokenizer_json

from strata_py import convert as cv
from strata_py.tokenizer import CONTROL, NORMAL, QWEN2_REGEX, UNUSED, USER_DEFINED

H, L = TINY["hidden_size"], TINY["num_hidden_layers"]
E, I, S = TINY["num_experts"], TINY["moe_intermediate_size"], TINY["shared_expert_intermediate_size"]
NH, NKV, HD = TINY["num_attention_heads"], TINY["num_key_value_heads"], TINY["head_dim"]
NK, NV, DK, DV = (TINY["linear_num_key_heads"], TINY["linear_num_value_heads"], TINY["linear_key_head_dim"],
                  TINY["linear_value_head_dim"])
KD, VD = NK * DK, NV * DV
CONV = 2 * KD + VD
K = TINY["linear_conv_kernel_dim"]
V = 384
FULL = {3}  # full_attention_interval 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    model = make_tiny_hf(d, with_mtp=True)
    return d, model, load_file(str(d / "model.safetensors"))


@pytest.fixture(scope="module")
def f32(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("gguf") / "tiny-f32.gguf"
    cv.convert(tiny[0], out, "f32")
    return out


def _reader(path):
    r = gguf.GGUFReader(path)
    return r, tensors_by_name(r), metadata_from_gguf_reader(r)


def _ne(t) -> list[int]:
    return [int(x) for x in t.shape]


def expected_shapes(layout="current", mtp=True) -> dict[str, list[int]]:
    """ggml ne of every tensor (spec §2.2), written out independently of the converter."""
    ne = {"token_embd.weight": [H, V], "output_norm.weight": [H], "output.weight": [H, V]}

    def block(b, full):
        ne.update({f"blk.{b}.attn_norm.weight": [H], f"blk.{b}.post_attention_norm.weight": [H]})
        if full:
            ne.update(ne_attention(b, H, NH, NKV, HD))
        else:
            if layout == "current":
                ne.update({f"blk.{b}.attn_qkv.weight": [H, CONV], f"blk.{b}.attn_gate.weight": [H, VD]})
            else:
                ne[f"blk.{b}.ssm_in.weight"] = [H, 2 * KD + 2 * VD]
            ne.update({f"blk.{b}.ssm_ba.weight": [H, 2 * NV], f"blk.{b}.ssm_conv1d.weight": [K, CONV],
                       f"blk.{b}.ssm_dt.bias": [NV], f"blk.{b}.ssm_a": [NV], f"blk.{b}.ssm_norm.weight": [DV],
                       f"blk.{b}.ssm_out.weight": [VD, H]})
        ne.update(ne_moe(b, H, E, I, S))

    for i in range(L):
        block(i, i in FULL)
    if mtp:
        block(L, True)
        ne.update({f"blk.{L}.nextn.eh_proj.weight": [2 * H, H], f"blk.{L}.nextn.enorm.weight": [H],
                   f"blk.{L}.nextn.hnorm.weight": [H], f"blk.{L}.nextn.shared_head_norm.weight": [H]})
    return ne


# ---------------------------------------------------------------------------------------------------------
# names, shapes, metadata
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["current", "legacy"])
def test_names_and_shapes(tiny, tmp_path, layout):
    out = cv.convert(tiny[0], tmp_path / "t.gguf", "f32", layout=layout)
    _, ts, _ = _reader(out)
    want = expected_shapes(layout)
    assert set(ts) == set(want)
    for name, ne in want.items():
        assert _ne(ts[name]) == ne, name


def test_metadata(f32):
    _, _, md = _reader(f32)
    a = "qwen3next"
    want = {
        "general.architecture": a, "general.alignment": 32, "general.file_type": 0,
        "general.quantization_version": 2,
        f"{a}.block_count": L + 1, f"{a}.nextn_predict_layers": 1, f"{a}.context_length": 512,
        f"{a}.embedding_length": H, f"{a}.feed_forward_length": TINY["intermediate_size"],
        f"{a}.attention.head_count": NH, f"{a}.attention.head_count_kv": NKV,
        f"{a}.attention.key_length": HD, f"{a}.attention.value_length": HD,
        f"{a}.rope.freq_base": 10000.0, f"{a}.rope.dimension_count": int(HD * 0.25),
        f"{a}.expert_count": E, f"{a}.expert_used_count": 2, f"{a}.expert_feed_forward_length": I,
        f"{a}.expert_shared_feed_forward_length": S, f"{a}.ssm.conv_kernel": K, f"{a}.ssm.state_size": DK,
        f"{a}.ssm.group_count": NK, f"{a}.ssm.time_step_rank": NV, f"{a}.ssm.inner_size": VD,
        f"{a}.full_attention_interval": 4,
    }
    for k, v in want.items():
        assert md[k] == v, k
    assert md[f"{a}.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6, rel=1e-6)
    assert md["general.name"]


def test_tokenizer_metadata(tmp_path):
    d = tmp_path / "hf"
    make_tiny_hf(d, vocab_size=400)  # 16 padding slots
    out = cv.convert(d, tmp_path / "t.gguf", "f32")
    _, ts, md = _reader(out)
    tj = json.loads(tiny_tokenizer_json())
    inv = {i: t for t, i in tj["model"]["vocab"].items()}
    tokens, types = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == 400 == _ne(ts["token_embd.weight"])[1]
    assert md["tokenizer.ggml.model"] == "gpt2" and md["tokenizer.ggml.pre"] == "gpt-2"
    assert tokens[0] == "<|endoftext|>" and types[0] == CONTROL
    assert tokens[380:384] == ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    assert types[380:384] == [CONTROL, CONTROL, USER_DEFINED, USER_DEFINED]
    assert all(tokens[i] == inv[i] and types[i] == NORMAL for i in range(1, 380))
    assert tokens[384:] == [f"[PAD{i}]" for i in range(384, 400)] and set(types[384:]) == {UNUSED}
    assert md["tokenizer.ggml.merges"] == [" ".join(m) for m in tj["model"]["merges"]]
    assert md["tokenizer.ggml.bos_token_id"] == 0       # config.json (tokenizer_config bos is null)
    assert md["tokenizer.ggml.eos_token_id"] == 381     # tokenizer_config eos_token <|im_end|>
    assert md["tokenizer.ggml.padding_token_id"] == 0
    assert md["tokenizer.ggml.add_bos_token"] is False
    assert md["tokenizer.chat_template"].startswith("{% for m in messages %}<|im_start|>")


def test_detect_pre_tokenizer():
    qwen = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    assert cv.detect_pre_tokenizer(qwen) == "qwen2"
    assert cv.detect_pre_tokenizer({"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}) == "gpt-2"
    odd = json.loads(json.dumps(qwen))
    odd["pretokenizers"][0]["pattern"]["Regex"] = r"\p{N}{1,3}| ?\p{L}+"
    with pytest.raises(ValueError, match=r"p\{N\}\{1,3\}"):
        cv.detect_pre_tokenizer(odd)
    with pytest.raises(ValueError, match="Metaspace"):
        cv.detect_pre_tokenizer({"type": "Sequence", "pretokenizers": [{"type": "Metaspace"}]})


# ---------------------------------------------------------------------------------------------------------
# transforms
# ---------------------------------------------------------------------------------------------------------

def test_norms_plus_one_and_ssm_transforms(tiny, f32):
    _, _, sd = tiny
    r, ts, _ = _reader(f32)
    g = lambda n: tensor_f32(r, n)  # noqa: E731
    hf = lambda n: sd[n].numpy()  # noqa: E731
    pairs = [("output_norm.weight", "model.norm.weight")]
    for i in range(L):
        p = f"model.layers.{i}."
        pairs += [(f"blk.{i}.attn_norm.weight", p + "input_layernorm.weight"),
                  (f"blk.{i}.post_attention_norm.weight", p + "post_attention_layernorm.weight")]
        if i in FULL:
            pairs += [(f"blk.{i}.attn_q_norm.weight", p + "self_attn.q_norm.weight"),
                      (f"blk.{i}.attn_k_norm.weight", p + "self_attn.k_norm.weight")]
    pairs += [(f"blk.{L}.nextn.enorm.weight", "mtp.pre_fc_norm_embedding.weight"),
              (f"blk.{L}.nextn.hnorm.weight", "mtp.pre_fc_norm_hidden.weight"),
              (f"blk.{L}.nextn.shared_head_norm.weight", "mtp.norm.weight"),
              (f"blk.{L}.attn_norm.weight", "mtp.layers.0.input_layernorm.weight"),
              (f"blk.{L}.attn_q_norm.weight", "mtp.layers.0.self_attn.q_norm.weight")]
    for gname, hname in pairs:
        assert np.abs(hf(hname)).max() > 0.1, f"{hname} was not perturbed"
        np.testing.assert_array_equal(g(gname), hf(hname) + 1, err_msg=gname)
    for i in set(range(L)) - FULL:
        p = f"model.layers.{i}.linear_attn."
        np.testing.assert_array_equal(g(f"blk.{i}.ssm_norm.weight"), hf(p + "norm.weight"))  # NOT +1
        np.testing.assert_array_equal(g(f"blk.{i}.ssm_a"), -np.exp(hf(p + "A_log")))
        np.testing.assert_array_equal(g(f"blk.{i}.ssm_dt.bias"), hf(p + "dt_bias"))
        np.testing.assert_array_equal(g(f"blk.{i}.ssm_conv1d.weight"), hf(p + "conv1d.weight")[:, 0, :])
        np.testing.assert_array_equal(g(f"blk.{i}.ssm_ba.weight"), hf(p + "in_proj_ba.weight"))
        np.testing.assert_array_equal(g(f"blk.{i}.ssm_out.weight"), hf(p + "out_proj.weight"))
        assert (g(f"blk.{i}.ssm_a") < 0).all()


def test_qkvz_split_matches_hf_ordering(tiny, f32, tmp_path):
    """attn_qkv·x must equal HF's post-fix_query_key_value_ordering [q|k|v] (the conv input) and attn_gate·x its z;
    the legacy ssm_in is the raw in_proj_qkvz, and merge_qkvz(attn_qkv, attn_gate) rebuilds it."""
    _, model, sd = tiny
    r, _, _ = _reader(f32)
    legacy = gguf.GGUFReader(cv.convert(tiny[0], tmp_path / "legacy.gguf", "f32", layout="legacy"))
    hp = cv.read_hparams(json.loads((tiny[0] / "config.json").read_text()))
    x = torch.randn(1, 5, H, generator=torch.Generator().manual_seed(3))
    for i in set(range(L)) - FULL:
        la = model.model.layers[i].linear_attn
        with torch.no_grad():
            q, k, v, z, b, a = la.fix_query_key_value_ordering(la.in_proj_qkvz(x), la.in_proj_ba(x))
        want_qkv = torch.cat([t.reshape(1, 5, -1) for t in (q, k, v)], dim=-1).numpy()
        qkv, gate = tensor_f32(r, f"blk.{i}.attn_qkv.weight"), tensor_f32(r, f"blk.{i}.attn_gate.weight")
        np.testing.assert_allclose(x.numpy() @ qkv.T, want_qkv, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(x.numpy() @ gate.T, z.reshape(1, 5, -1).numpy(), rtol=1e-5, atol=1e-6)
        # ssm_ba stays grouped per key head: [b(r) | a(r)] x nk
        ba = (x.numpy() @ tensor_f32(r, f"blk.{i}.ssm_ba.weight").T).reshape(1, 5, NK, 2 * (NV // NK))
        np.testing.assert_allclose(ba[..., :NV // NK].reshape(1, 5, NV), b.numpy(), rtol=1e-5, atol=1e-6)
        raw = sd[f"model.layers.{i}.linear_attn.in_proj_qkvz.weight"].numpy()
        np.testing.assert_array_equal(tensor_f32(legacy, f"blk.{i}.ssm_in.weight"), raw)
        np.testing.assert_array_equal(cv.merge_qkvz(qkv, gate, hp), raw)


def test_expert_stacking(tiny, f32):
    _, _, sd = tiny
    r, _, _ = _reader(f32)
    for b, pre in [(i, f"model.layers.{i}.") for i in range(L)] + [(L, "mtp.layers.0.")]:
        for part in ("gate", "up", "down"):
            st = tensor_f32(r, f"blk.{b}.ffn_{part}_exps.weight")
            for e in range(E):
                np.testing.assert_array_equal(st[e], sd[f"{pre}mlp.experts.{e}.{part}_proj.weight"].numpy())
            np.testing.assert_array_equal(tensor_f32(r, f"blk.{b}.ffn_{part}_shexp.weight"),
                                          sd[f"{pre}mlp.shared_expert.{part}_proj.weight"].numpy())
        np.testing.assert_array_equal(tensor_f32(r, f"blk.{b}.ffn_gate_inp.weight"),
                                      sd[f"{pre}mlp.gate.weight"].numpy())
        np.testing.assert_array_equal(tensor_f32(r, f"blk.{b}.ffn_gate_inp_shexp.weight"),
                                      sd[f"{pre}mlp.shared_expert_gate.weight"].numpy())


def test_fused_sharded_bf16_checkpoint(tiny, tmp_path):
    """transformers-v5 fused experts, a sharded index and bf16 storage convert to the same tensors as the
    per-expert fp32 checkpoint, up to the bf16 rounding of the source."""
    d = tmp_path / "fused"
    make_tiny_hf(d, with_mtp=True, shards=3, fused_experts=True, dtype="bfloat16")
    assert (d / "model.safetensors.index.json").exists() and not (d / "model.safetensors").exists()
    out = cv.convert(d, tmp_path / "fused.gguf", "f32")
    ref = tiny[2]
    r, ts, _ = _reader(out)
    assert set(ts) == set(expected_shapes())
    for i in range(E):
        np.testing.assert_array_equal(tensor_f32(r, "blk.0.ffn_up_exps.weight")[i],
                                      ref[f"model.layers.0.mlp.experts.{i}.up_proj.weight"].bfloat16().float().numpy())
        np.testing.assert_array_equal(tensor_f32(r, f"blk.{L}.ffn_down_exps.weight")[i],
                                      ref[f"mtp.layers.0.mlp.experts.{i}.down_proj.weight"].bfloat16().float().numpy())
    np.testing.assert_array_equal(tensor_f32(r, "blk.1.attn_norm.weight"),
                                  ref["model.layers.1.input_layernorm.weight"].bfloat16().float().numpy() + 1)


def test_transformers_loads_fused_experts(tiny, tmp_path):
    """Fact check for the engine: transformers 5 loads a checkpoint with fused expert names as well."""
    from transformers import Qwen3NextForCausalLM
    d = tmp_path / "fused32"
    make_tiny_hf(d, fused_experts=True)
    m = Qwen3NextForCausalLM.from_pretrained(d).eval()
    ids = torch.tensor([[1, 50, 200, 7, 381]])
    with torch.no_grad():
        torch.testing.assert_close(m(ids).logits, tiny[1](ids).logits, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------
# MTP variants
# ---------------------------------------------------------------------------------------------------------

def test_no_mtp_and_mtp_only(tiny, tmp_path):
    _, ts, md = _reader(cv.convert(tiny[0], tmp_path / "nomtp.gguf", "f32", mtp=False))
    assert set(ts) == set(expected_shapes(mtp=False))
    assert md["qwen3next.block_count"] == L and "qwen3next.nextn_predict_layers" not in md

    _, ts, md = _reader(cv.convert(tiny[0], tmp_path / "mtponly.gguf", "f32", mtp_only=True))
    want = {n for n in expected_shapes() if n.startswith(f"blk.{L}.")}
    want |= {"token_embd.weight", "output_norm.weight", "output.weight"}  # shared with the MTP head
    assert set(ts) == want
    assert md["qwen3next.block_count"] == L + 1 and md["qwen3next.nextn_predict_layers"] == 1
    with pytest.raises(ValueError, match="MTP-only"):
        cv.gguf_to_hf(tmp_path / "mtponly.gguf", tmp_path / "back")


def test_mtp_only_without_mtp_tensors_refused(tmp_path):
    d = tmp_path / "hf"
    make_tiny_hf(d)
    with pytest.raises(ValueError, match="no mtp"):
        cv.convert(d, tmp_path / "x.gguf", "f32", mtp_only=True)
    assert not (tmp_path / "x.gguf").exists()
    _, ts, md = _reader(cv.convert(d, tmp_path / "y.gguf", "f32"))  # default mtp=True, none present
    assert md["qwen3next.block_count"] == L and f"blk.{L}.attn_q.weight" not in ts


# ---------------------------------------------------------------------------------------------------------
# types
# ---------------------------------------------------------------------------------------------------------

def _expected_type(name, ne, out_type):
    if len(ne) < 2 or any(s in name for s in ("norm", "ffn_gate_inp", "ssm_conv1d")) or not name.endswith("weight"):
        return QT.F32
    return {"f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0, "f32": QT.F32}[out_type]


@pytest.mark.parametrize("out_type", ["f16", "bf16", "q8_0"])
def test_types_and_bits(tiny, f32, tmp_path, out_type):
    out = cv.convert(tiny[0], tmp_path / f"t-{out_type}.gguf", out_type)
    r, ts, md = _reader(out)
    r32, ts32, _ = _reader(f32)
    assert md["general.file_type"] == {"f16": 1, "bf16": 32, "q8_0": 7}[out_type]
    assert set(ts) == set(ts32)
    for name, t in ts.items():
        ne = _ne(t)
        want = _expected_type(name, ne, out_type)
        assert t.tensor_type == want, name
        ref = tensor_f32(r32, name)
        if want == QT.F32:
            np.testing.assert_array_equal(tensor_f32(r, name), ref, err_msg=name)
        else:  # the bytes are exactly gguf.quants.quantize of the f32 tensor
            np.testing.assert_array_equal(np.asarray(t.data).view(np.uint8).reshape(-1),
                                          np.asarray(gguf.quants.quantize(ref, want)).view(np.uint8).reshape(-1),
                                          err_msg=name)


def test_rows_not_multiple_of_block_stay_f16():
    assert cv.tensor_type("blk.0.attn_q.weight", (8, 48), "q8_0") == QT.F16
    assert cv.tensor_type("blk.0.attn_q.weight", (8, 64), "q8_0") == QT.Q8_0
    assert cv.tensor_type("blk.0.attn_q.weight", (8, 48), "bf16") == QT.BF16
    assert cv.tensor_type("blk.0.ffn_gate_inp.weight", (8, 64), "q8_0") == QT.F32
    assert cv.tensor_type("blk.0.ssm_a", (8,), "q8_0") == QT.F32


# ---------------------------------------------------------------------------------------------------------
# round trip through transformers
# ---------------------------------------------------------------------------------------------------------

IDS = torch.tensor([[0, 5, 17, 200, 33, 90, 12, 7, 300, 2, 99, 381, 150, 44, 8, 260, 19, 380]])


def _logits(d):
    from transformers import Qwen3NextForCausalLM
    m = Qwen3NextForCausalLM.from_pretrained(d).eval()
    with torch.no_grad():
        return m(IDS).logits


@pytest.mark.parametrize("layout", ["current", "legacy"])
def test_roundtrip_f32_exact(tiny, tmp_path, layout):
    out = cv.convert(tiny[0], tmp_path / "t.gguf", "f32", layout=layout)
    back = cv.gguf_to_hf(out, tmp_path / "back")
    want = _logits(tiny[0])  # the original checkpoint as transformers loads it
    got = _logits(back)
    # hf_tiny puts norms on a grid where w+1-1 == w and A_log where log(exp(a)) == a, so this is exact
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    sd, sd0 = load_file(str(back / "model.safetensors")), tiny[2]
    assert set(sd) == set(sd0)  # mtp.* included
    for k in sd0:
        assert torch.equal(sd[k], sd0[k]), k
    cfg = json.loads((back / "config.json").read_text())
    assert cfg["mtp_num_hidden_layers"] == 1 and cfg["layer_types"][3] == "full_attention"
    assert json.loads((back / "tokenizer_config.json").read_text())["eos_token"] == "<|im_end|>"


def test_roundtrip_q8_0(tiny, tmp_path):
    """gguf_to_hf of a Q8_0 file holds exactly gguf.quants.dequantize of what was written: converting it
    back to f32 reproduces the dequantized Q8_0 tensors bit for bit. Logits stay close to the original."""
    q8 = cv.convert(tiny[0], tmp_path / "q8.gguf", "q8_0")
    back = cv.gguf_to_hf(q8, tmp_path / "back")
    again = cv.convert(back, tmp_path / "again.gguf", "f32")
    rq, tq, _ = _reader(q8)
    ra, ta, _ = _reader(again)
    assert set(tq) == set(ta)
    for name, t in tq.items():
        want = gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(reversed(_ne(t))))
        np.testing.assert_array_equal(tensor_f32(ra, name), want, err_msg=name)
    ref = _logits(tiny[0])
    got = _logits(back)
    # Q8_0 noise is amplified by top-2-of-8 routing flips in a random tiny model, so only a loose check here
    assert (got - ref).abs().mean() < 0.1 * ref.std()
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.8


def test_roundtrip_tokenizer(tiny, f32, tmp_path):
    from tokenizers import Tokenizer as HFTok
    back = cv.gguf_to_hf(f32, tmp_path / "back")
    orig = HFTok.from_str(tiny_tokenizer_json())
    rebuilt = HFTok.from_file(str(back / "tokenizer.json"))
    text = "def f(x):\n    return x ** 2  # 😀 日本語 <|im_end|> <think>12345</think>"
    assert rebuilt.encode(text).ids == orig.encode(text).ids


# ---------------------------------------------------------------------------------------------------------
# bad input: ValueError naming the problem, no output file
# ---------------------------------------------------------------------------------------------------------

def _copy_tiny(tiny, dst: Path) -> Path:
    dst.mkdir()
    for f in tiny[0].iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _assert_fails(d, out, match):
    with pytest.raises(ValueError, match=match):
        cv.convert(d, out, "q8_0")
    assert not out.exists()
    assert not out.with_name(out.name + ".tmp").exists()


def test_missing_config_key(tiny, tmp_path):
    d = _copy_tiny(tiny, tmp_path / "hf")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["linear_num_value_heads"]
    (d / "config.json").write_text(json.dumps(cfg))
    _assert_fails(d, tmp_path / "o.gguf", "linear_num_value_heads")


def test_unsupported_config_value(tiny, tmp_path):
    d = _copy_tiny(tiny, tmp_path / "hf")
    cfg = json.loads((d / "config.json").read_text())
    cfg["layer_types"][0] = "full_attention"  # not periodic: the GGUF cannot say so
    (d / "config.json").write_text(json.dumps(cfg))
    _assert_fails(d, tmp_path / "o.gguf", "layer_types")


def _edit_tensors(d: Path, fn):
    sd = load_file(str(d / "model.safetensors"))
    fn(sd)
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})


def test_missing_tensor(tiny, tmp_path):
    d = _copy_tiny(tiny, tmp_path / "hf")
    _edit_tensors(d, lambda sd: sd.pop("model.layers.2.linear_attn.A_log"))
    _assert_fails(d, tmp_path / "o.gguf", r"model\.layers\.2\.linear_attn\.A_log")


def test_missing_expert(tiny, tmp_path):
    d = _copy_tiny(tiny, tmp_path / "hf")
    _edit_tensors(d, lambda sd: sd.pop("mtp.layers.0.mlp.experts.5.up_proj.weight"))
    _assert_fails(d, tmp_path / "o.gguf", r"mtp\.layers\.0\.mlp\.experts\.5\.up_proj\.weight")


def test_wrong_shape(tiny, tmp_path):
    d = _copy_tiny(tiny, tmp_path / "hf")
    _edit_tensors(d, lambda sd: sd.update({"model.layers.3.self_attn.q_proj.weight": torch.zeros(2 * NH * HD, H + 1)}))
    _assert_fails(d, tmp_path / "o.gguf", r"model\.layers\.3\.self_attn\.q_proj\.weight.*\[256, 65\]")


def test_unexpected_tensor(tiny, tmp_path):
    d = _copy_tiny(tiny, tmp_path / "hf")
    _edit_tensors(d, lambda sd: sd.update({"model.layers.0.linear_attn.conv1d.bias": torch.zeros(CONV)}))
    _assert_fails(d, tmp_path / "o.gguf", r"model\.layers\.0\.linear_attn\.conv1d\.bias")


def test_failure_while_writing_leaves_old_file(tiny, tmp_path):
    """A tensor that passes the plan but cannot be read (int dtype) fails mid-write: the half-written
    OUT.tmp is removed and an existing OUT is left untouched."""
    d = _copy_tiny(tiny, tmp_path / "hf")
    _edit_tensors(d, lambda sd: sd.update({"model.norm.weight": torch.zeros(H, dtype=torch.int32)}))
    out = tmp_path / "o.gguf"
    out.write_bytes(b"old")
    with pytest.raises(ValueError, match=r"model\.norm\.weight.*I32"):
        cv.convert(d, out, "f32")
    assert out.read_bytes() == b"old"
    assert not out.with_name(out.name + ".tmp").exists()


def test_unknown_pre_tokenizer_refused(tiny, tmp_path):
    d = _copy_tiny(tiny, tmp_path / "hf")
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["pre_tokenizer"] = {"type": "Whitespace"}
    (d / "tokenizer.json").write_text(json.dumps(tj))
    _assert_fails(d, tmp_path / "o.gguf", "Whitespace")


# ---------------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------------

def test_cli(tiny, tmp_path, capsys):
    out = tmp_path / "cli.gguf"
    assert cv.main([str(tiny[0]), str(out), "--type", "bf16", "--layout", "legacy", "--no-mtp"]) == 0
    _, ts, md = _reader(out)
    assert "blk.0.ssm_in.weight" in ts and ts["blk.0.ssm_in.weight"].tensor_type == QT.BF16
    assert md["qwen3next.block_count"] == L
    assert cv.main([str(tmp_path / "nowhere"), str(tmp_path / "x.gguf")]) == 1
    assert "config.json" in capsys.readouterr().err


def test_cli_module_entry_point(tiny, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "python"))
    out = tmp_path / "m.gguf"
    p = subprocess.run([sys.executable, "-m", "strata_py.convert", str(tiny[0]), str(out), "--type", "q8_0",
                        "--mtp-only"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    _, ts, _ = _reader(out)
    assert ts[f"blk.{L}.nextn.eh_proj.weight"].tensor_type == QT.Q8_0
    assert not math.isnan(float(tensor_f32(gguf.GGUFReader(out), "output_norm.weight").sum()))
