"""HF Qwen4-Exp -> GGUF qwen4exp converter (spec qwen4exp.md §1, §3): names, shapes, metadata and its types
(the u64 PLE arrays exact, compress ratios from the QSA layers, HF's PLE EOS), the transforms (HC / indexer / PLE
norms +1, indexer split, PLE shards concatenated), quantized types, the f32 round trip, every validation error."""
from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from safetensors.torch import load_file

from corrupt import copy_field
from convert_util import (assert_refused, assert_tensor_table, copy_checkpoint, edit_config, edit_tensors,
                          ne_attention, ne_moe, ne_qwen35_deltanet)
from gguf_util import f32_array as _arr, read_gguf as _read  # (sets sys.path)
from hf_tiny_next import (DK, DV, E, H, HD, I, K, L, NH, NK, NKV, NV, S, TINY_HC, TINY_PLE,  # noqa: E741
                          TINY_QSA, capture_qsa, make_tiny_qwen4exp)

from strata_py import convert as cv
from strata_py import ple_constants

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
            ne.update({**ne_attention(b, H, NH, NKV, HD),
                       f"blk.{b}.indexer.q_proj.weight": [H, NI * DI], f"blk.{b}.indexer.k_proj.weight": [H, DI],
                       f"blk.{b}.indexer.q_norm.weight": [DI], f"blk.{b}.indexer.k_norm.weight": [DI]})
        else:
            ne.update(ne_qwen35_deltanet(b, H, NK, NV, DK, DV, K))
        if b == PLE_L:
            ne.update({f"blk.{b}.ple_key.weight": [H, HCD], f"blk.{b}.ple_value.weight": [H, H],
                       f"blk.{b}.ple_norm_key.weight": [HCD], f"blk.{b}.ple_norm_query.weight": [HCD],
                       f"blk.{b}.ple_norm_conv.weight": [HCD], f"blk.{b}.ple_conv1d.weight": [KP, HCD]})
        ne.update(ne_moe(b, H, E, I, S))
    return ne


def test_names_and_shapes(f32):
    assert_tensor_table(f32, expected_ne(), QT.F32)


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
        f"{A}.ssm.inner_size": (NV * DV, u32), f"{A}.attention.recurrent_layers": ([True, True, True, False], boo),
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
        assert np.array_equal(_arr(ts[f"blk.{b}.hc_attn_norm.weight"]),
                              hf(p + "attn_hyper_connection.hc_norm.weight") + 1)
        assert np.array_equal(_arr(ts[f"blk.{b}.hc_ffn_inject.weight"]),
                              hf(p + "mlp_hyper_connection.block_inject_weight.weight"))
        assert np.array_equal(_arr(ts[f"blk.{b}.hc_ffn_up.weight"]),
                              hf(p + "mlp_hyper_connection.input_mix_weight_up.weight"))
    assert np.array_equal(_arr(ts["output_hc_norm.weight"]), hf("model.hyper_connection_mixer.hc_norm.weight") + 1)
    assert np.array_equal(_arr(ts["output_hc_down.weight"]),
                          hf("model.hyper_connection_mixer.input_mix_weight_down.weight"))
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
    assert cv.gguf_to_hf(tmp_path / "c.gguf", tmp_path / "c-back")  # and back
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
    d = copy_checkpoint(tiny[0], tmp_path / "mtp")
    edit_tensors(d, lambda sd: sd.update({"mtp.fc.weight": torch.zeros(H, 2 * H)}))
    assert "mtp" not in " ".join(_read(cv.convert(d, tmp_path / "m.gguf"))[1])
    with pytest.raises(ValueError, match="MTP"):
        cv.convert(d, tmp_path / "n.gguf", mtp_only=True)


# ---------------------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------------------

CONFIG_ERRORS = [
    (lambda c: c.pop("indexer_budget"), r"missing key 'indexer_budget' \(every Qwen4-Exp attention layer runs QSA\)"),
    (lambda c: c.update(indexer_kv_heads=2), r"indexer_kv_heads=2: must be 1"),
    (lambda c: c.update(indexer_budget=10), r"indexer_budget=10: must be a multiple of indexer_compress_ratio=4"),
    (lambda c: c.update(indexer_head_dim=4), r"indexer_head_dim=4: must be >= the rotary dims 8"),
    (lambda c: c.update(indexer_compress_ratio=0), r"indexer_compress_ratio=0: must be > 0"),
    # without partial_rotary_factor, Qwen4ExpTextConfig rotates the whole head (its class, unlike Qwen3.5's, sets no
    # 0.25 default; llama.cpp's converter would assume 0.25): 32 rotary dims no longer fit the 16-dim indexer head
    (lambda c: (c["rope_parameters"].pop("partial_rotary_factor"),
                c["rope_parameters"].update(mrope_section=[8, 4, 4])),
     r"indexer_head_dim=16: must be >= the rotary dims 32"),
    (lambda c: c.update(ple_layer_ids=[1, 2]), r"ple_layer_ids=\[1, 2\]: llama.cpp supports exactly one"),
    (lambda c: c.update(ple_layer_ids=[4]), r"ple_layer_ids=\[4\]: must name a linear_attention layer"),
    (lambda c: c.update(ple_embed_dim=128), r"ple_embed_dim=128: must equal hidden_size=64"),
    (lambda c: c.update(eos_token_id=None), r"eos_token_id=None: must be set when PLE is on"),
    (lambda c: c.update(norm_topk_prob=False), r"norm_topk_prob=False"),
    (lambda c: c.update(output_gate_type="gelu"), r"output_gate_type='gelu'.*sigmoid, silu"),
    (lambda c: c.update(hc_count=1), r"hc_count=1: must be > 1"),
    (lambda c: c.update(layer_types=["linear_attention"] * 4), r"layer_types=.*no indexed_attention layer"),
    (lambda c: c.update(layer_types=["linear_attention"] * 3 + ["sliding_attention"]),
     r"layer_types=.*'indexed_attention'"),
    (lambda c: c.update(split_ngram_parts=4), r"split_ngram_parts=4 needs shard_0..shard_3 \(missing shard_3\)"),
    (lambda c: c.update(split_ngram_parts=2), r"found 3 shards.*split_ngram_parts=2.*\(unexpected shard_2\)"),
    (lambda c: c.update(model_type="qwen4_exp_vision"), r"model_type='qwen4_exp_vision': expected one of qwen3_next"),
]


@pytest.mark.parametrize("edit,match", CONFIG_ERRORS, ids=[m[:40] for _, m in CONFIG_ERRORS])
def test_config_errors(tiny, tmp_path, edit, match):
    d = copy_checkpoint(tiny[0], tmp_path / "hf")
    edit_config(d, edit)
    assert_refused(d, tmp_path, match)


TENSOR_ERRORS = [
    (lambda sd: sd.pop(EMB + "ngram_embedding.shard_1.weight"), r"found 2 shards.*\(missing shard_1\)"),
    (lambda sd: sd.update({EMB + "ngram_embedding.shard_1.weight": torch.zeros(1366, DP + 1)}),
     r"'model\.layers\.1\.ple\.ple_embedding\.ngram_embedding\.shard_1\.weight' has shape \[1366, 17\], "
     r"expected \[rows, 16\]"),
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
    d = copy_checkpoint(tiny[0], tmp_path / "hf")
    edit_tensors(d, edit)
    assert_refused(d, tmp_path, match)


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
