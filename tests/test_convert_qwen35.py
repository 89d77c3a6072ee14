"""HF Qwen3.5-MoE -> GGUF qwen35moe converter (spec qwen4exp.md §2, §4): names, shapes, metadata and its types,
the V-head reorder, MTP, quantized types, the f32 round trip, and every validation error."""
from __future__ import annotations

import json
import shutil

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from safetensors.torch import load_file, save_file

from convert_util import (assert_refused, assert_tensor_table, copy_checkpoint, edit_config, edit_tensors,
                          ne_attention, ne_moe, ne_qwen35_deltanet)
from gguf_util import f32_array as _arr, read_gguf as _read  # (sets sys.path)
from hf_tiny_next import DK, DV, E, H, HD, I, K, L, NH, NK, NKV, NV, S, make_tiny_qwen35moe  # noqa: E741

from strata_py import convert as cv

RV, KD, VD = NV // NK, NK * DK, NV * DV
CONV = 2 * KD + VD
V = 384
A = "qwen35moe"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("q35")
    model = make_tiny_qwen35moe(d, seed=3, with_mtp=True)
    return d, model, load_file(str(d / "model.safetensors"))


@pytest.fixture(scope="module")
def f32(tiny, tmp_path_factory):
    return cv.convert(tiny[0], tmp_path_factory.mktemp("q35g") / "q35.gguf", "f32")


def expected_ne(mtp=True) -> dict[str, list[int]]:
    """ggml ne of every tensor (spec §4.2 and qwen3next.md §2.2), written out independently of the converter."""
    ne = {"token_embd.weight": [H, V], "output_norm.weight": [H], "output.weight": [H, V]}

    def block(b, full):
        ne.update({f"blk.{b}.attn_norm.weight": [H], f"blk.{b}.post_attention_norm.weight": [H]})
        ne.update(ne_attention(b, H, NH, NKV, HD) if full else ne_qwen35_deltanet(b, H, NK, NV, DK, DV, K))
        ne.update(ne_moe(b, H, E, I, S))

    for i in range(L):
        block(i, (i + 1) % 4 == 0)
    if mtp:
        block(L, True)
        ne.update({f"blk.{L}.nextn.eh_proj.weight": [2 * H, H], f"blk.{L}.nextn.enorm.weight": [H],
                   f"blk.{L}.nextn.hnorm.weight": [H], f"blk.{L}.nextn.shared_head_norm.weight": [H]})
    return ne


def test_names_and_shapes(f32):
    assert_tensor_table(f32, expected_ne(), QT.F32)


def test_metadata_values_and_types(f32):
    r, _, md = _read(f32)
    u32, f32t, i32, boo = "UINT32", "FLOAT32", "INT32", "BOOL"
    want = {  # key: (value, GGUF type (array: element type))
        f"{A}.block_count": (L + 1, u32), f"{A}.nextn_predict_layers": (1, u32), f"{A}.context_length": (512, u32),
        f"{A}.embedding_length": (H, u32), f"{A}.attention.head_count": (NH, u32),
        f"{A}.attention.head_count_kv": (NKV, u32), f"{A}.attention.key_length": (HD, u32),
        f"{A}.attention.value_length": (HD, u32), f"{A}.rope.freq_base": (10000.0, f32t),
        f"{A}.rope.dimension_count": (HD // 4, u32), f"{A}.rope.dimension_sections": ([2, 1, 1, 0], i32),
        f"{A}.expert_count": (E, u32), f"{A}.expert_used_count": (2, u32),
        f"{A}.expert_feed_forward_length": (I, u32), f"{A}.expert_shared_feed_forward_length": (S, u32),
        f"{A}.ssm.conv_kernel": (K, u32), f"{A}.ssm.state_size": (DK, u32), f"{A}.ssm.group_count": (NK, u32),
        f"{A}.ssm.time_step_rank": (NV, u32), f"{A}.ssm.inner_size": (VD, u32),
        f"{A}.attention.recurrent_layers": ([True, True, True, False, False], boo),
        f"{A}.full_attention_interval": (4, u32), "general.architecture": (A, "STRING"),
        "general.file_type": (0, u32), "general.quantization_version": (2, u32),
        "tokenizer.ggml.pre": ("gpt-2", "STRING"),
    }
    for k, (v, ty) in want.items():
        assert md[k] == v, k
        assert gguf.GGUFValueType(r.fields[k].types[-1]).name == ty, k
    assert md[f"{A}.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6, rel=1e-6)
    assert not any(k.startswith(f"{A}.") for k in set(md) - set(want) - {f"{A}.attention.layer_norm_rms_epsilon"})


def test_v_head_reorder_and_transforms(tiny, f32):
    """GGUF value head s is HF value head g*rv + v with g = s mod nk, v = s // nk (spec 4.2), on every value axis;
    q/k rows, ssm_norm and the attention/MoE tensors are as in qwen3next (norms +1)."""
    _, _, sd = tiny
    _, ts, _ = _read(f32)
    hf = lambda n: sd[n].float().numpy()  # noqa: E731
    perm = [(s % NK) * RV + s // NK for s in range(NV)]  # GGUF slot -> HF slot
    rows = lambda d: np.concatenate([np.arange(p * d, (p + 1) * d) for p in perm])  # noqa: E731
    for i in range(3):
        p, b = f"model.layers.{i}.linear_attn.", f"blk.{i}."
        qkv = hf(p + "in_proj_qkv.weight")
        got = _arr(ts[b + "attn_qkv.weight"])
        assert np.array_equal(got[:2 * KD], qkv[:2 * KD])
        assert np.array_equal(got[2 * KD:], qkv[2 * KD:][rows(DV)])
        assert np.array_equal(_arr(ts[b + "attn_gate.weight"]), hf(p + "in_proj_z.weight")[rows(DV)])
        assert np.array_equal(_arr(ts[b + "ssm_beta.weight"]), hf(p + "in_proj_b.weight")[perm])
        assert np.array_equal(_arr(ts[b + "ssm_alpha.weight"]), hf(p + "in_proj_a.weight")[perm])
        assert np.array_equal(_arr(ts[b + "ssm_dt.bias"]), hf(p + "dt_bias")[perm])
        assert np.array_equal(_arr(ts[b + "ssm_a"]), -np.exp(hf(p + "A_log")[perm]))
        conv = hf(p + "conv1d.weight")[:, 0, :]
        gc = _arr(ts[b + "ssm_conv1d.weight"])
        assert np.array_equal(gc[:2 * KD], conv[:2 * KD]) and np.array_equal(gc[2 * KD:], conv[2 * KD:][rows(DV)])
        assert np.array_equal(_arr(ts[b + "ssm_out.weight"]), hf(p + "out_proj.weight")[:, rows(DV)])
        assert np.array_equal(_arr(ts[b + "ssm_norm.weight"]), hf(p + "norm.weight"))  # gated norm: no +1
        assert np.array_equal(_arr(ts[b + "attn_norm.weight"]), hf(f"model.layers.{i}.input_layernorm.weight") + 1)
    a = "model.layers.3.self_attn."
    assert np.array_equal(_arr(ts["blk.3.attn_q_norm.weight"]), hf(a + "q_norm.weight") + 1)
    assert np.array_equal(_arr(ts["blk.3.attn_q.weight"]), hf(a + "q_proj.weight"))
    for e in (0, 5):
        assert np.array_equal(_arr(ts["blk.3.ffn_up_exps.weight"])[e],
                              hf(f"model.layers.3.mlp.experts.{e}.up_proj.weight"))
    assert np.array_equal(_arr(ts[f"blk.{L}.nextn.enorm.weight"]), hf("mtp.pre_fc_norm_embedding.weight") + 1)
    assert np.array_equal(_arr(ts["output_norm.weight"]), hf("model.norm.weight") + 1)


def test_roundtrip_f32_exact(tiny, f32, tmp_path):
    """GGUF -> HF gives the original tensors bit for bit, mtp.* included, and transformers loads it to the same
    logits."""
    from transformers import Qwen3_5MoeForCausalLM
    d, model, sd = tiny
    back = cv.gguf_to_hf(f32, tmp_path / "back")
    sd2 = load_file(str(back / "model.safetensors"))
    assert set(sd2) == set(sd)
    for k in sd:
        assert torch.equal(sd2[k], sd[k]), k
    m2 = Qwen3_5MoeForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    ids = torch.tensor([list(range(5, 40, 3))])
    with torch.no_grad():
        assert torch.equal(m2(ids).logits, model(ids).logits)


def test_fused_sharded_bf16_and_multimodal_names(tiny, tmp_path):
    """The same model as fused-expert bf16 shards, and under a multimodal checkpoint's names
    (model.language_model.*, a vision tower, text_config), converts to the same tensors (bf16 widened)."""
    d2 = tmp_path / "fused"
    make_tiny_qwen35moe(d2, seed=3, with_mtp=True, fused_experts=True, shards=3, dtype="bfloat16")
    ref = _read(cv.convert(tiny[0], tmp_path / "a.gguf", "f32"))[1]
    got = _read(cv.convert(d2, tmp_path / "b.gguf", "f32"))[1]
    assert set(got) == set(ref)
    for n in ref:
        want = torch.from_numpy(_arr(ref[n]).copy()).to(torch.bfloat16).float().numpy()
        if n.endswith(("norm.weight",)) and "ssm_norm" not in n:
            want = (torch.from_numpy(_arr(ref[n]) - 1).to(torch.bfloat16).float() + 1).numpy()
        if n.endswith("ssm_a"):
            continue  # -exp of a bf16-rounded A_log
        assert np.array_equal(_arr(got[n]), want), n

    mm = tmp_path / "mm"
    mm.mkdir()
    for f in tiny[0].iterdir():
        shutil.copy(f, mm / f.name)
    cfg = json.loads((mm / "config.json").read_text())
    (mm / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5MoeForConditionalGeneration"],
                                                "model_type": "qwen3_5_moe", "text_config": cfg,
                                                "image_token_id": 248056}))
    sd = load_file(str(mm / "model.safetensors"))
    sd = {(k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v for k, v in sd.items()}
    sd["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 3)
    save_file(sd, str(mm / "model.safetensors"), metadata={"format": "pt"})
    got = _read(cv.convert(mm, tmp_path / "c.gguf", "f32"))[1]
    assert set(got) == set(ref)
    assert all(bytes(got[n].data) == bytes(ref[n].data) for n in ref)


@pytest.mark.parametrize("out_type", ["q8_0", "f16"])
def test_types(tiny, tmp_path, out_type):
    """Norms, 1-D tensors, routers, shared-expert gates and conv1d stay F32; other matrices get the type."""
    _, ts, md = _read(cv.convert(tiny[0], tmp_path / "q.gguf", out_type, mtp=False))
    assert md["general.file_type"] == int(cv.FILE_TYPES[out_type])
    kept = ("norm.weight", "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight")
    f32_names = {n for n in ts if len(ts[n].shape) == 1 or n.endswith(kept)}
    for n, t in ts.items():
        assert t.tensor_type == (QT.F32 if n in f32_names else cv.OUT_TYPES[out_type]), n
    assert not any(n.startswith(f"blk.{L}.") for n in ts) and f"{A}.nextn_predict_layers" not in md


def test_mtp_only(tiny, tmp_path):
    _, ts, md = _read(cv.convert(tiny[0], tmp_path / "m.gguf", "f32", mtp_only=True))
    assert md[f"{A}.block_count"] == L + 1 and md[f"{A}.nextn_predict_layers"] == 1
    assert {n for n in ts if n.startswith("blk.")} == {n for n in expected_ne() if n.startswith(f"blk.{L}.")}


# ---------------------------------------------------------------------------------------------------------
# validation: every error names the file / key / tensor and the value
# ---------------------------------------------------------------------------------------------------------

CONFIG_ERRORS = [
    (lambda c: c.pop("linear_num_value_heads"), r"missing key 'linear_num_value_heads'"),
    (lambda c: c.update(linear_num_value_heads=5), r"linear_num_value_heads=5.*multiple of linear_num_key_heads=2"),
    (lambda c: c.update(linear_value_head_dim=32), r"linear_value_head_dim=32.*linear_key_head_dim=16"),
    (lambda c: c["layer_types"].__setitem__(1, "sliding_attention"), r"layer_types=.*'linear_attention' or"),
    (lambda c: c.update(layer_types=c["layer_types"][:3]), r"layer_types=.*need 4 entries"),
    (lambda c: c.update(hidden_act="gelu"), r"hidden_act='gelu'"),
    (lambda c: c["rope_parameters"].update(mrope_section=[1, 1, 1]), r"mrope_section=\[1, 1, 1\].*rot/2 = 4"),
    (lambda c: c["rope_parameters"].update(rope_type="yarn"), r"rope_type='yarn'"),
    (lambda c: c["rope_parameters"].update(partial_rotary_factor=0.3), r"partial_rotary_factor=0.3.*9 rotary"),
    (lambda c: c.update(num_experts_per_tok=9), r"num_experts_per_tok=9.*num_experts=8"),
    (lambda c: c.update(model_type="qwen3_5_text"), r"model_type='qwen3_5_text'"),
]


@pytest.mark.parametrize("edit,match", CONFIG_ERRORS, ids=[m for _, m in CONFIG_ERRORS])
def test_config_errors(tiny, tmp_path, edit, match):
    d = copy_checkpoint(tiny[0], tmp_path / "hf")
    edit_config(d, edit)
    assert_refused(d, tmp_path, match)


TENSOR_ERRORS = [
    (lambda sd: sd.pop("model.layers.1.linear_attn.in_proj_z.weight"),
     r"missing tensor 'model\.layers\.1\.linear_attn\.in_proj_z\.weight'"),
    (lambda sd: sd.update({"model.layers.0.linear_attn.in_proj_qkv.weight": torch.zeros(CONV - 1, H)}),
     r"'model\.layers\.0\.linear_attn\.in_proj_qkv\.weight' has shape \[159, 64\], config\.json implies \[160, 64\]"),
    (lambda sd: sd.update({"model.layers.0.linear_attn.in_proj_ba.weight": torch.zeros(2 * NV, H)}),
     r"unexpected tensor 'model\.layers\.0\.linear_attn\.in_proj_ba\.weight'"),
    (lambda sd: sd.pop("mtp.layers.0.mlp.experts.7.down_proj.weight"), r"mtp\.layers\.0\.mlp\.experts\.7\.down_proj"),
]


@pytest.mark.parametrize("edit,match", TENSOR_ERRORS, ids=[m[:40] for _, m in TENSOR_ERRORS])
def test_tensor_errors(tiny, tmp_path, edit, match):
    d = copy_checkpoint(tiny[0], tmp_path / "hf")
    edit_tensors(d, edit)
    assert_refused(d, tmp_path, match)


def test_reverse_refuses_other_architecture_and_legacy_layout(tiny, f32, tmp_path):
    with pytest.raises(ValueError, match=r"general\.architecture='qwen35moe', expected 'qwen4exp'"):
        cv.GGUFSource(f32, "qwen4exp")
    with pytest.raises(ValueError, match=r"--layout 'legacy'.*qwen35moe"):
        cv.convert(tiny[0], tmp_path / "x.gguf", layout="legacy")
