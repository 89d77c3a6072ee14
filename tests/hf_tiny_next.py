"""Tiny random Qwen3.5-MoE and Qwen4-Exp (Qwen3.8-Flash-Next) checkpoints for tests (not a test module).

`make_tiny_qwen35moe(out_dir)` and `make_tiny_qwen4exp(out_dir)` build the model with transformers
(`Qwen3_5MoeForCausalLM`, `Qwen4ExpForCausalLM`), save it with `save_pretrained` (per-expert names, PLE table in
`split_ngram_parts` shards, as real checkpoints) plus the tiny byte-level BPE tokenizer of hf_tiny.py, and return
the model (eval mode, fp32). Shapes are chosen so that the conventions a converter or an engine can get wrong show:
- nk = 2 key heads, nv = 6 value heads (rv = 3): the grouped -> tiled V-head reorder (spec 4.2) is not its own
  inverse, and pairing value head s with key head s mod nk differs from s // rv;
- every zero-centred norm (attention q/k, HC, indexer, PLE), the gated `linear_attn.norm`, A_log, dt_bias and both
  conv weights are moved off their init (the PLE conv weight, zero at init, becomes non-zero), on a 2^-12 grid where
  a GGUF stores w + 1, so the f32 round trip is bit-exact;
- the hyper-connection mixers are scaled up so their sigmoid gates and inject scales spread over (0, 1) / (0, 2)
  instead of sitting at 0.5 / 1;
- QSA: compress ratio 4, a budget of 8 tokens (2 blocks), 8 indexer heads (exact-zero score ties at a selection
  boundary are then rare, spec 1.5), so queries past 12 tokens select sparsely;
- PLE on layer index 1 (config `ple_layer_ids` = [2], 1-based) with n-gram size 3, 2 heads per n-gram and an
  n-gram vocabulary base of 1000: a table of 4096 x 16.

`capture_qsa(model)` records which complete blocks transformers' QSA indexers select, per layer and query position.
"""
from __future__ import annotations

import json
import math
import re
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from hf_tiny import (CHAT_TEMPLATE, _exp_log_exact, _fuse_experts, _grid, _mtp_tensors, _write_shards,
                     tiny_tokenizer_json)

# shared by both architectures (Qwen3.5 trunk)
TINY_NEXT = dict(
    hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, rms_norm_eps=1e-6, max_position_embeddings=512, tie_word_embeddings=False,
    initializer_range=0.1,
)
# the tiny dimensions under the names the tests use
H, L, E, I, S = (TINY_NEXT["hidden_size"], TINY_NEXT["num_hidden_layers"], TINY_NEXT["num_experts"],  # noqa: E741
                 TINY_NEXT["moe_intermediate_size"], TINY_NEXT["shared_expert_intermediate_size"])
NH, NKV, HD = TINY_NEXT["num_attention_heads"], TINY_NEXT["num_key_value_heads"], TINY_NEXT["head_dim"]
NK, NV, DK, DV, K = (TINY_NEXT["linear_num_key_heads"], TINY_NEXT["linear_num_value_heads"],
                     TINY_NEXT["linear_key_head_dim"], TINY_NEXT["linear_value_head_dim"],
                     TINY_NEXT["linear_conv_kernel_dim"])
# text-only interleaved mRoPE: sum(mrope_section) = rot / 2 = 4 (spec 1.8)
ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
        "mrope_interleaved": True}
TINY_QSA = dict(indexer_n_heads=8, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8, indexer_compress_ratio=4)
TINY_HC = dict(hc_count=4, hc_lowrank=16)
TINY_PLE = dict(ple_layer_ids=[2], ngram_size=3, heads_per_ngram=2, ngram_vocab_size_base=1000,
                make_ngram_vocab_size_divisible_by=128, ple_conv_kernel_size=4, split_ngram_parts=3)

_ZC_NORM = re.compile(r"(norm\.weight|norm_(key|query|conv)\.weight)$")  # every RMSNorm weight, PLE's included
_HC_MIX = re.compile(r"(input_mix_weight_down|input_mix_weight_up|block_inject_weight)\.weight$")


def _tokenizer(out_dir: Path) -> tuple[int, int, int]:
    """Write tokenizer.json / tokenizer_config.json; return (vocab size, <|endoftext|> id, <|im_end|> id)."""
    from tokenizers import Tokenizer
    (out_dir / "tokenizer.json").write_text(tiny_tokenizer_json(), encoding="utf-8")
    tk = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    tc = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
          "pad_token": "<|endoftext|>", "add_bos_token": False, "model_max_length": 512,
          "chat_template": CHAT_TEMPLATE}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tc, indent=2))
    return tk.get_vocab_size(with_added_tokens=True), tk.token_to_id("<|endoftext|>"), tk.token_to_id("<|im_end|>")


def _perturb(model, gen: torch.Generator):
    """Move every convention-sensitive parameter away from its init (zeros / ones / the A_log law / N(0, 0.1))."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if _ZC_NORM.search(name):
                p.add_(_grid(0.3 * torch.randn(p.shape, generator=gen)))
            elif name.endswith("A_log"):
                p.copy_(_exp_log_exact(torch.randn(p.shape, generator=gen)))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith("conv1d.weight"):  # the GDN conv and the PLE conv (zero at init)
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif _HC_MIX.search(name):
                # down: W·xn / hc with xn of unit RMS per stream; up: into a sigmoid. A std of 3/sqrt(fan_in) gives
                # pre-activations of a few units, so the gates are far from constant.
                p.copy_(3.0 * torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))


def _rewrite(out_dir: Path, config, gen, *, with_mtp=False, mtp_layer_cls=None, fused_experts=False, shards=1,
             dtype="float32", edit_config=None):
    """Post-process the saved checkpoint: add mtp.*, fuse experts, store bf16, shard, edit config.json."""
    if edit_config is not None or with_mtp:
        cfg = json.loads((out_dir / "config.json").read_text())
        if with_mtp:
            cfg["mtp_num_hidden_layers"] = 1
        if edit_config is not None:
            edit_config(cfg)
        (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    if not (with_mtp or fused_experts or shards > 1 or dtype != "float32"):
        return
    sd = load_file(str(out_dir / "model.safetensors"))
    if with_mtp:
        sd.update(_mtp_tensors(config, gen, layer_cls=mtp_layer_cls))
    if fused_experts:
        sd = _fuse_experts(sd, config.num_experts)
    if dtype == "bfloat16":
        sd = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in sd.items()}
    if shards > 1:
        _write_shards(sd, out_dir, shards)
    else:
        save_file({k: v.contiguous() for k, v in sd.items()}, str(out_dir / "model.safetensors"),
                  metadata={"format": "pt"})


def _build(model_cls, config, out_dir: Path, seed: int):
    """The transformers model of `config` with seeded random weights, perturbed, saved; (model, generator)."""
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    _perturb(model, gen)
    model.save_pretrained(out_dir)
    return model, gen


def make_tiny_qwen35moe(out_dir, *, seed: int = 0, with_mtp: bool = False, fused_experts: bool = False,
                        shards: int = 1, dtype: str = "float32", **overrides):
    """Write a tiny random Qwen3.5-MoE checkpoint (layers 0-2 Gated DeltaNet, layer 3 gated attention, 8 experts
    top-2 + shared expert) to `out_dir`; return the transformers model (eval, fp32).

    with_mtp adds random `mtp.*` tensors (one full-attention MoE layer, per-expert names; transformers ignores them).
    fused_experts writes transformers-v5 fused `gate_up_proj` / `down_proj`; shards > 1 writes an index + shards;
    dtype "bfloat16" stores every tensor as bf16. `overrides` replace config fields (e.g. num_hidden_layers,
    layer_types, eos_token_id)."""
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    n_tok, eot, im_end = _tokenizer(out_dir)
    kw = {**TINY_NEXT, "vocab_size": n_tok, "rope_parameters": dict(ROPE), "bos_token_id": eot,
          "eos_token_id": im_end, "pad_token_id": eot, **overrides}
    n = kw["num_hidden_layers"]
    kw.setdefault("layer_types", ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)])
    config = Qwen3_5MoeTextConfig(**kw)
    model, gen = _build(Qwen3_5MoeForCausalLM, config, out_dir, seed)
    _rewrite(out_dir, config, gen, with_mtp=with_mtp, mtp_layer_cls=Qwen3_5MoeDecoderLayer,
             fused_experts=fused_experts, shards=shards, dtype=dtype)
    return model


def make_tiny_qwen4exp(out_dir, *, seed: int = 0, budget: int = 8, compress_ratio: int = 4, indexer_heads: int = 8,
                       ple: bool = True, n_layers: int = 4, eos_token_id=None, output_gate_type: str | None = "sigmoid",
                       layer_types_spelling: str = "indexed_attention", fused_experts: bool = False,
                       shards: int = 1, dtype: str = "float32", **overrides):
    """Write a tiny random Qwen4-Exp checkpoint to `out_dir`; return the transformers model (eval, fp32).

    Layers: linear_attention except every 4th (i+1 % 4 == 0), which runs QSA; hc_count 4 streams, hc_lowrank 16.
    budget / compress_ratio / indexer_heads: the QSA indexer (budget in tokens, a multiple of the ratio).
    ple: one PLE layer, index 1 (`ple_layer_ids` = [2]); its table is saved as 3 shards (`split_ngram_parts`).
    eos_token_id: default `<|im_end|>` (an int). A list makes HF's PLE use its first entry while llama.cpp's
    converter writes the last (spec 3.3).
    output_gate_type: the GDN output gate; "sigmoid" by default because llama.cpp's qwen4exp graph hard-codes it
    (spec §6); None gives transformers' default (hidden_act, silu).
    layer_types_spelling: "indexed_attention" (what save_pretrained writes) or "full_attention" (what the real
    checkpoint's config.json says; transformers renames it on load).
    fused_experts / shards / dtype: as make_tiny_qwen35moe. `overrides` replace config fields."""
    from transformers import Qwen4ExpForCausalLM, Qwen4ExpTextConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    n_tok, eot, im_end = _tokenizer(out_dir)
    kw = {**TINY_NEXT, **TINY_HC, **TINY_QSA, "num_hidden_layers": n_layers, "vocab_size": n_tok,
          "rope_parameters": dict(ROPE), "indexer_budget": budget, "indexer_compress_ratio": compress_ratio,
          "indexer_n_heads": indexer_heads, "output_gate_type": output_gate_type, "bos_token_id": eot,
          "eos_token_id": im_end if eos_token_id is None else eos_token_id, "pad_token_id": eot}
    if ple:
        kw.update(TINY_PLE)
    kw.update(overrides)
    config = Qwen4ExpTextConfig(**kw)
    model, gen = _build(Qwen4ExpForCausalLM, config, out_dir, seed)

    def spell(cfg):
        if layer_types_spelling != "indexed_attention":
            cfg["layer_types"] = [layer_types_spelling if t == "indexed_attention" else t for t in cfg["layer_types"]]

    _rewrite(out_dir, config, gen, fused_experts=fused_experts, shards=shards, dtype=dtype, edit_config=spell)
    return model


class QSASelections(dict):
    """{layer index: {query position p: tuple of the complete blocks selected, ascending}} as transformers'
    QSA indexers chose them. A block b covers positions [b*r, b*r + r); the tail (positions past the query's
    last complete block) is always attended and not listed. Filled by `capture_qsa`."""

    def blocks(self, layer: int, p: int) -> tuple[int, ...]:
        return self[layer][p]


@contextmanager
def capture_qsa(model):
    """Record transformers' QSA selections while the block runs (batch of one unpadded sequence):

        with capture_qsa(model) as sel:
            model(ids)
        sel[3][47]  # blocks layer 3 selected for the query at position 47

    A forward hook on every `Qwen4ExpTextQSAIndexer` reads the boolean selection mask it returns
    ([batch, 1, queries, keys]); the queries of one call are the last `queries` positions of the keys, so
    incremental (cached) calls record their own positions. Each recorded set is checked to be whole blocks plus
    the whole tail, so a mask of any other shape fails loudly here."""
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextQSAIndexer

    sel = QSASelections()

    def hook(module, args, output):
        mask = output[0, 0]  # [queries, keys]
        q, kv = mask.shape
        r = module.compress_ratio
        layer = sel.setdefault(module.layer_idx, {})
        for i in range(q):
            p = kv - q + i
            row = mask[i, :p + 1]
            n_c = (p + 1) // r
            blocks = tuple(b for b in range(n_c) if bool(row[b * r]))
            for b in range(n_c):
                assert bool(row[b * r:(b + 1) * r].all()) == (b in blocks) and \
                    bool(row[b * r:(b + 1) * r].any()) == (b in blocks), (module.layer_idx, p, b)
            assert bool(row[n_c * r:].all()) and not bool(mask[i, p + 1:].any()), (module.layer_idx, p)
            layer[p] = blocks

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, Qwen4ExpTextQSAIndexer)]
    try:
        yield sel
    finally:
        for h in handles:
            h.remove()
