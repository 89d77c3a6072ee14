"""HF Qwen4-Exp -> GGUF qwen4exp converter (spec qwen4exp.md §1, §3): names, shapes, metadata and its types
(the u64 PLE arrays exact, compress ratios from the QSA layers, HF's PLE EOS), the transforms (HC / indexer / PLE
norms +1, indexer split, PLE shards concatenated), quantized types, the f32 round trip, every validation error."""
from __future__ import annotations

import json
import shutil

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from safetensors.torch import load_file, save_file

from corrupt import copy_field
from gguf_util import metadata_from_gguf_reader, tensors_by_name  # noqa: F401  (sets sys.path)
from hf_tiny_next import TINY_HC, TINY_NEXT, TINY_PLE, TINY_QSA, capture_qsa, make_tiny_qwen4exp

from strata_py import convert as cv
from strata_py import ple_constants

T = TINY_NEXT
H, L, E, I, S = (T["hidden_size"], T["num_hidden_layers"], T["num_experts"], T["moe_intermediate_size"],
                 T["shared_expert_intermediate_size"])
NH, NKV, HD = T["num_attention_heads"], T["num_key_value_heads"], T["head_dim"]
NK, NV, DK, DV, K = (T["linear_num_key_heads"], T["linear_num_value_heads"], T["linear_key_head_dim"],
                     T["linear_value_head_dim"], T["linear_conv_kernel_dim"])
KD, VD = NK * DK, NV * DV
CONV = 2 * KD + VD
HC, R = TINY_HC["hc_count"], TINY_HC["hc_lowrank"]
HCD = HC * H
NI, DI = TINY_QSA["indexer_n_heads"], TINY_QSA["indexer_head_dim"]
NH_PLE = (TINY_PLE["ngram_size"] - 1) * TINY_PLE["heads_per_ngram"]
DP, KP = H // NH_PLE, TINY_PLE["ple_conv_kernel_size"]
PLE_L = TINY_PLE["ple_layer_ids"][0] - 1
SIZES = ple_constants.head_vocab_sizes(TINY_PLE["ngram_vocab_size_base"], NH_PLE, 0)
ROWS = ple_constants.table_rows(SIZES, TINY_PLE["make_ngram_vocab_size_divisible_by"])
V = 384
A = "qwen4exp"
EMB = f"model.layers.{PLE_L}.ple.ple_embedding."


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("q4")
    model = make_tiny_qwen4exp(d, seed=5)
    return d, model, load_file(str(d / "model.safetensors"))


@pytest.fixture(scope="module")
def f32(tiny, tmp_path_factory):
    return cv.convert(tiny[0], tmp_path_factory.mktemp("q4g") / "q4.gguf", "f32")


def _read(path):
    r = gguf.GGUFReader(path)
    return r, tensors_by_name(r), metadata_from_gguf_reader(r)


def _arr(t) -> np.ndarray:
    return np.asarray(t.data, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)])


def _table(sd) -> np.ndarray:
    shards = sorted((k for k in sd if ".ngram_embedding.shard_" in k), key=lambda k: int(k.split("shard_")[1][:-7]))
    assert len(shards) == TINY_PLE["split_ngram_parts"]
    return torch.cat([sd[k] for k in shards]).numpy()


def expected_ne() -> dict[str, list[int]]:
    """ggml ne of every tensor (spec §3.2), written out independently of the converter."""
    ne = {"token_embd.weight": [H, V], "output.weight": [H, V], "output_hc_norm.weight": [HCD],
          "output_hc_down.weight": [HCD, R], "output_hc_up.weight": [R, HCD], "per_layer_token_embd.weight": [DP, ROWS]}
    for b in range(L):
        for m in ("attn", "ffn"):
            ne.update({f"blk.{b}.hc_{m}_norm.weight": [HCD], f"blk.{b}.hc_{m}_down.weight": [HCD, R],
                       f"blk.{b}.hc_{m}_up.weight": [R, HCD], f"blk.{b}.hc_{m}_inject.weight": [HCD, HC]})
        if (b + 1) % 4 == 0:
            ne.update({f"blk.{b}.attn_q.weight": [H, 2 * NH * HD], f"blk.{b}.attn_k.weight": [H, NKV * HD],
                       f"blk.{b}.attn_v.weight": [H, NKV * HD], f"blk.{b}.attn_output.weight": [NH * HD, H],
                       f"blk.{b}.attn_q_norm.weight": [HD], f"blk.{b}.attn_k_norm.weight": [HD],
                       f"blk.{b}.indexer.q_proj.weight": [H, NI * DI], f"blk.{b}.indexer.k_proj.weight": [H, DI],
                       f"blk.{b}.indexer.q_norm.weight": [DI], f"blk.{b}.indexer.k_norm.weight": [DI]})
        else:
            ne.update({f"blk.{b}.attn_qkv.weight": [H, CONV], f"blk.{b}.attn_gate.weight": [H, VD],
                       f"blk.{b}.ssm_beta.weight": [H, NV], f"blk.{b}.ssm_alpha.weight": [H, NV],
                       f"blk.{b}.ssm_conv1d.weight": [K, CONV], f"blk.{b}.ssm_dt.bias": [NV],
                       f"blk.{b}.ssm_a": [NV], f"blk.{b}.ssm_norm.weight": [DV], f"blk.{b}.ssm_out.weight": [VD, H]})
        if b == PLE_L:
            ne.update({f"blk.{b}.ple_key.weight": [H, HCD], f"blk.{b}.ple_value.weight": [H, H],
                       f"blk.{b}.ple_norm_key.weight": [HCD], f"blk.{b}.ple_norm_query.weight": [HCD],
                       f"blk.{b}.ple_norm_conv.weight": [HCD], f"blk.{b}.ple_conv1d.weight": [KP, HCD]})
        ne.update({f"blk.{b}.ffn_gate_inp.weight": [H, E], f"blk.{b}.ffn_gate_exps.weight": [H, I, E],
                   f"blk.{b}.ffn_up_exps.weight": [H, I, E], f"blk.{b}.ffn_down_exps.weight": [I, H, E],
                   f"blk.{b}.ffn_gate_inp_shexp.weight": [H, 1], f"blk.{b}.ffn_gate_shexp.weight": [H, S],
                   f"blk.{b}.ffn_up_shexp.weight": [H, S], f"blk.{b}.ffn_down_shexp.weight": [S, H]})
    return ne


def test_names_and_shapes(f32):
    _, ts, _ = _read(f32)
    want = expected_ne()
    assert set(ts) == set(want)
    for name, ne in want.items():
        assert [int(x) for x in ts[name].shape] == ne, name
        assert ts[name].tensor_type == QT.F32, name


def test_metadata_values_and_types(tiny, f32):
    _, _, sd = tiny
    r, _, md = _read(f32)
    u32, u64, f32t, i32, boo = "UINT32", "UINT64", "FLOAT32", "INT32", "BOOL"
    buf = lambda k: [int(x) for x in sd[EMB + k].tolist()]  # noqa: E731  the checkpoint's int64 buffers
    want = {
        f"{A}.block_count": (L, u32), f"{A}.context_length": (512, u32), f"{A}.embedding_length": (H, u32),
        f"{A}.attention.head_count": (NH, u32), f"{A}.attention.head_count_kv": (NKV, u32),
        f"{A}.attention.key_length": (HD, u32), f"{A}.attention.value_length": (HD, u32),
        f"{A}.rope.freq_base": (10000.0, f32t), f"{A}.rope.dimension_count": (HD // 4, u32),
        f"{A}.rope.dimension_sections": ([2, 1, 1, 0], i32), f"{A}.expert_count": (E, u32),
        f"{A}.expert_used_count": (2, u32), f"{A}.expert_feed_forward_length": (I, u32),
        f"{A}.expert_shared_feed_forward_length": (S, u32), f"{A}.ssm.conv_kernel": (K, u32),
        f"{A}.ssm.state_size": (DK, u32), f"{A}.ssm.group_count": (NK, u32), f"{A}.ssm.time_step_rank": (NV, u32),
        f"{A}.ssm.inner_size": (VD, u32), f"{A}.attention.recurrent_layers": ([True, True, True, False], boo),
        f"{A}.full_attention_interval": (4, u32), f"{A}.hyper_connection.count": (HC, u32),
        f"{A}.hyper_connection.low_rank": (R, u32), f"{A}.attention.indexer.head_count": (NI, u32),
        f"{A}.attention.indexer.key_length": (DI, u32),
        f"{A}.attention.indexer.top_k": (TINY_QSA["indexer_budget"], u32),
        f"{A}.attention.compress_ratios": ([0, 0, 0, TINY_QSA["indexer_compress_ratio"]], i32),
        f"{A}.ple.layers": ([PLE_L], i32), f"{A}.ple.ngram_size": (TINY_PLE["ngram_size"], u32),
        f"{A}.ple.heads_per_ngram": (TINY_PLE["heads_per_ngram"], u32), f"{A}.ple.conv_kernel": (KP, u32),
        f"{A}.ple.eos_token_id": (381, u32), f"{A}.embedding_length_per_layer_input": (DP, u32),
        f"{A}.ple.layer_multipliers": (buf("layer_multipliers"), u64),
        f"{A}.ple.head_offsets": (buf("ngram_heads_offsets"), u64),
        f"{A}.ple.head_vocab_sizes": (buf("ngram_heads_vocab_sizes"), u64),
        "general.architecture": (A, "STRING"), "general.file_type": (0, u32), "general.quantization_version": (2, u32),
        "tokenizer.ggml.eos_token_id": (381, u32),
    }
    for k, (v, ty) in want.items():
        assert md[k] == v, k
        assert gguf.GGUFValueType(r.fields[k].types[-1]).name == ty, k
    extra = {k for k in md if k.startswith(f"{A}.")} - set(want) - {f"{A}.attention.layer_norm_rms_epsilon"}
    assert not extra  # no output_gate_type key for a sigmoid model, no image token
    # the multipliers exceed 2^53: a float round trip anywhere would have changed them
    assert max(md[f"{A}.ple.layer_multipliers"]) > 2 ** 53
    assert md[f"{A}.ple.head_vocab_sizes"] == SIZES
    assert md[f"{A}.ple.layer_multipliers"] == ple_constants.layer_multipliers(V, 3, 0, 1234)


def test_transforms(tiny, f32):
    _, _, sd = tiny
    _, ts, _ = _read(f32)
    hf = lambda n: sd[n].float().numpy()  # noqa: E731
    for b in range(L):
        p = f"model.layers.{b}."
        assert np.array_equal(_arr(ts[f"blk.{b}.hc_attn_norm.weight"]), hf(p + "attn_hyper_connection.hc_norm.weight") + 1)
        assert np.array_equal(_arr(ts[f"blk.{b}.hc_ffn_inject.weight"]),
                              hf(p + "mlp_hyper_connection.block_inject_weight.weight"))
        assert np.array_equal(_arr(ts[f"blk.{b}.hc_ffn_up.weight"]), hf(p + "mlp_hyper_connection.input_mix_weight_up.weight"))
    assert np.array_equal(_arr(ts["output_hc_norm.weight"]), hf("model.hyper_connection_mixer.hc_norm.weight") + 1)
    assert np.array_equal(_arr(ts["output_hc_down.weight"]), hf("model.hyper_connection_mixer.input_mix_weight_down.weight"))
    a = "model.layers.3.self_attn."
    qk = hf(a + "indexer.index_qk_proj.weight")
    assert np.array_equal(_arr(ts["blk.3.indexer.q_proj.weight"]), qk[:NI * DI])
    assert np.array_equal(_arr(ts["blk.3.indexer.k_proj.weight"]), qk[NI * DI:])
    assert np.array_equal(_arr(ts["blk.3.indexer.q_norm.weight"]), hf(a + "indexer.q_layernorm.weight") + 1)
    assert np.array_equal(_arr(ts["blk.3.indexer.k_norm.weight"]), hf(a + "indexer.k_layernorm.weight") + 1)
    assert np.array_equal(_arr(ts["blk.3.attn_k_norm.weight"]), hf(a + "k_norm.weight") + 1)
    p, b = f"model.layers.{PLE_L}.ple.", f"blk.{PLE_L}."
    for n in ("key", "query", "conv"):
        assert np.array_equal(_arr(ts[f"{b}ple_norm_{n}.weight"]), hf(f"{p}norm_{n}.weight") + 1)
    conv = hf(p + "conv1d.weight")
    assert np.abs(conv).min() > 0  # the builder made it non-zero (its init is zero)
    assert np.array_equal(_arr(ts[b + "ple_conv1d.weight"]), conv[:, 0, :])
    assert np.array_equal(_arr(ts[b + "ple_key.weight"]), hf(p + "key_proj.weight"))
    assert np.array_equal(_arr(ts["per_layer_token_embd.weight"]), _table(sd))
    # the Qwen3.5 DeltaNet with its V-head reorder (checked in full in test_convert_qwen35.py)
    perm = [(s % NK) * (NV // NK) + s // NK for s in range(NV)]
    assert np.array_equal(_arr(ts["blk.0.ssm_beta.weight"]), hf("model.layers.0.linear_attn.in_proj_b.weight")[perm])


def test_roundtrip_f32_exact(tiny, f32, tmp_path):
    """GGUF -> HF gives the original tensors bit for bit (the PLE table as one shard equal to the concatenated
    shards, the int64 buffers exact); transformers loads it to the same logits and the same QSA selections."""
    from transformers import Qwen4ExpForCausalLM
    _, model, sd = tiny
    back = cv.gguf_to_hf(f32, tmp_path / "back")
    sd2 = load_file(str(back / "model.safetensors"))
    shard0 = EMB + "ngram_embedding.shard_0.weight"
    assert set(sd2) == {k for k in sd if ".shard_" not in k} | {shard0}
    for k in sd2:
        if k != shard0:
            assert sd2[k].dtype == sd[k].dtype and torch.equal(sd2[k], sd[k]), k
    assert np.array_equal(sd2[shard0].numpy(), _table(sd))
    m2 = Qwen4ExpForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 9, 381, 7, 7, 12, 40, 381, 381, 3, 17, 99, 250, 8, 8, 8, 60, 2, 301, 44]])
    with torch.no_grad(), capture_qsa(model) as s1, capture_qsa(m2) as s2:
        assert torch.equal(m2(ids).logits, model(ids).logits)
    assert s1 == s2 and any(len(s1[3][p]) < (p + 1) // 4 for p in s1[3])  # sparse somewhere


def test_real_checkpoint_spelling_and_eos_list_and_silu(tiny, tmp_path):
    """config.json with `full_attention` (the released checkpoint's spelling) gives the same file; an EOS list
    gives ple.eos_token_id = its FIRST entry (transformers' PLE); a silu gate adds ssm.output_gate_type."""
    d = tmp_path / "fa"
    make_tiny_qwen4exp(d, seed=5, layer_types_spelling="full_attention")
    assert "full_attention" in (d / "config.json").read_text()
    a, b = _read(cv.convert(tiny[0], tmp_path / "a.gguf"))[1:], _read(cv.convert(d, tmp_path / "b.gguf"))[1:]
    assert set(a[0]) == set(b[0]) and all(bytes(a[0][n].data) == bytes(b[0][n].data) for n in a[0])
    assert b[1][f"{A}.attention.compress_ratios"] == [0, 0, 0, 4]
    d2 = tmp_path / "eos"
    make_tiny_qwen4exp(d2, seed=5, eos_token_id=[0, 381], output_gate_type=None)
    md = _read(cv.convert(d2, tmp_path / "c.gguf"))[2]
    assert md[f"{A}.ple.eos_token_id"] == 0
    assert md[f"{A}.ssm.output_gate_type"] == "silu"
    assert cv._other(A).gguf_to_hf(tmp_path / "c.gguf", tmp_path / "c-back")  # and back
    assert json.loads((tmp_path / "c-back" / "config.json").read_text())["output_gate_type"] == "silu"


@pytest.mark.parametrize("out_type", ["q8_0", "f16"])
def test_types(tiny, tmp_path, out_type):
    """As llama.cpp's converter: 1-D tensors, routers, shared-expert gates and ssm_conv1d F32; matrices whose rows
    are not a multiple of the block F16; the rest the type."""
    _, ts, _ = _read(cv.convert(tiny[0], tmp_path / "q.gguf", out_type))
    qt = cv.OUT_TYPES[out_type]
    for n, t in ts.items():
        if len(t.shape) == 1 or n.endswith(("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight")):
            want = QT.F32
        elif int(t.shape[0]) % gguf.GGML_QUANT_SIZES[qt][0]:  # ple_conv1d (4), the table (16), hc *_up (16)
            want = QT.F16
        else:
            want = qt
        assert t.tensor_type == want, n


def test_mtp_dropped_and_mtp_only_refused(tiny, tmp_path):
    d = shutil.copytree(tiny[0], tmp_path / "mtp")
    sd = load_file(str(d / "model.safetensors"))
    sd["mtp.fc.weight"] = torch.zeros(H, 2 * H)
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    assert "mtp" not in " ".join(_read(cv.convert(d, tmp_path / "m.gguf"))[1])
    with pytest.raises(ValueError, match="MTP"):
        cv.convert(d, tmp_path / "n.gguf", mtp_only=True)


# ---------------------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------------------

def _copy(tiny, dst):
    return shutil.copytree(tiny[0], dst)


def _fails(d, tmp_path, match):
    out = tmp_path / "o.gguf"
    with pytest.raises(ValueError, match=match):
        cv.convert(d, out, "q8_0")
    assert not out.exists() and not out.with_name("o.gguf.tmp").exists()


CONFIG_ERRORS = [
    (lambda c: c.pop("indexer_budget"), r"missing key 'indexer_budget' \(every Qwen4-Exp attention layer runs QSA\)"),
    (lambda c: c.update(indexer_kv_heads=2), r"indexer_kv_heads=2: must be 1"),
    (lambda c: c.update(indexer_budget=10), r"indexer_budget=10: must be a multiple of indexer_compress_ratio=4"),
    (lambda c: c.update(indexer_head_dim=4), r"indexer_head_dim=4: must be >= the rotary dims 8"),
    (lambda c: c.update(indexer_compress_ratio=0), r"indexer_compress_ratio=0: must be > 0"),
    (lambda c: c.update(ple_layer_ids=[1, 2]), r"ple_layer_ids=\[1, 2\]: llama.cpp supports exactly one"),
    (lambda c: c.update(ple_layer_ids=[4]), r"ple_layer_ids=\[4\]: must name a linear_attention layer"),
    (lambda c: c.update(ple_embed_dim=128), r"ple_embed_dim=128: must equal hidden_size=64"),
    (lambda c: c.update(eos_token_id=None), r"eos_token_id=None: must be set when PLE is on"),
    (lambda c: c.update(norm_topk_prob=False), r"norm_topk_prob=False"),
    (lambda c: c.update(output_gate_type="gelu"), r"output_gate_type='gelu'.*sigmoid, silu"),
    (lambda c: c.update(hc_count=1), r"hc_count=1: must be > 1"),
    (lambda c: c.update(layer_types=["linear_attention"] * 4), r"layer_types=.*no indexed_attention layer"),
    (lambda c: c.update(layer_types=["linear_attention"] * 3 + ["sliding_attention"]), r"layer_types=.*'indexed_attention'"),
    (lambda c: c.update(split_ngram_parts=4), r"split_ngram_parts=4 needs shard_0..shard_3 \(missing shard_3\)"),
    (lambda c: c.update(split_ngram_parts=2), r"found 3 shards.*split_ngram_parts=2.*\(unexpected shard_2\)"),
    (lambda c: c.update(model_type="qwen4_exp_vision"), r"model_type='qwen4_exp_vision': expected one of qwen3_next"),
]


@pytest.mark.parametrize("edit,match", CONFIG_ERRORS, ids=[m[:40] for _, m in CONFIG_ERRORS])
def test_config_errors(tiny, tmp_path, edit, match):
    d = _copy(tiny, tmp_path / "hf")
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    _fails(d, tmp_path, match)


TENSOR_ERRORS = [
    (lambda sd: sd.pop(EMB + "ngram_embedding.shard_1.weight"), r"found 2 shards.*\(missing shard_1\)"),
    (lambda sd: sd.update({EMB + "ngram_embedding.shard_1.weight": torch.zeros(1366, DP + 1)}),
     r"'model\.layers\.1\.ple\.ple_embedding\.ngram_embedding\.shard_1\.weight' has shape \[1366, 17\], expected \[rows, 16\]"),
    (lambda sd: sd.update({EMB + "ngram_embedding.shard_2.weight": torch.zeros(100, DP)}),
     r"has 2832 rows, fewer than the 4062 the heads index"),
    (lambda sd: sd.update({EMB + "layer_multipliers": sd[EMB + "layer_multipliers"].float()}),
     r"'model\.layers\.1\.ple\.ple_embedding\.layer_multipliers' has dtype F32, expected I64"),
    (lambda sd: sd.update({EMB + "ngram_heads_offsets": sd[EMB + "ngram_heads_offsets"] + 1}),
     r"ngram_heads_offsets=\[1, 1010, 2023, 3042\] are not the running sums"),
    (lambda sd: sd.update({EMB + "layer_multipliers": sd[EMB + "layer_multipliers"] + 1}),
     r"layer_multipliers=\[.*\]: need odd values"),
    (lambda sd: sd.pop("model.layers.3.self_attn.indexer.k_layernorm.weight"),
     r"missing tensor 'model\.layers\.3\.self_attn\.indexer\.k_layernorm\.weight'"),
    (lambda sd: sd.update({"model.layers.3.self_attn.indexer.index_qk_proj.weight": torch.zeros(NI * DI, H)}),
     r"index_qk_proj\.weight' has shape \[128, 64\], config\.json implies \[144, 64\]"),
    (lambda sd: sd.pop("model.hyper_connection_mixer.input_mix_weight_up.weight"),
     r"missing tensor 'model\.hyper_connection_mixer\.input_mix_weight_up\.weight'"),
    (lambda sd: sd.update({"model.norm.weight": torch.zeros(H)}), r"unexpected tensor 'model\.norm\.weight'"),
]


@pytest.mark.parametrize("edit,match", TENSOR_ERRORS, ids=[m[:40] for _, m in TENSOR_ERRORS])
def test_tensor_errors(tiny, tmp_path, edit, match):
    d = _copy(tiny, tmp_path / "hf")
    sd = load_file(str(d / "model.safetensors"))
    edit(sd)
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    _fails(d, tmp_path, match)


def _set_key(src, dst, key, value):
    """Copy a GGUF, changing one array key (as llama.cpp's converter would have written it)."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), A)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == key:
            w.add_key_value(name, value, gguf.GGUFValueType.ARRAY, sub_type=f.types[-1])
        else:
            copy_field(w, name, f)
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_reverse_refuses_all_zero_compress_ratios(f32, tmp_path):
    bad = _set_key(f32, tmp_path / "zero.gguf", f"{A}.attention.compress_ratios", [0, 0, 0, 0])
    with pytest.raises(ValueError, match=r"compress_ratios are all 0 but the file has indexer tensors"):
        cv.gguf_to_hf(bad, tmp_path / "back")
    bad = _set_key(f32, tmp_path / "lin.gguf", f"{A}.attention.compress_ratios", [4, 0, 0, 4])
    with pytest.raises(ValueError, match=r"compress_ratios=\[4, 0, 0, 4\]: need 4 entries, 0 on every recurrent"):
        cv.gguf_to_hf(bad, tmp_path / "back2")
