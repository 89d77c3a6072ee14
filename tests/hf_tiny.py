"""Tiny random Qwen3-Next checkpoints for tests (not a test module).

`make_tiny_hf(out_dir)` writes a 4-layer model (layers 0-2 Gated DeltaNet, layer 3 gated attention, 8 experts
top-2 + shared expert) with transformers' `save_pretrained`, plus a small byte-level BPE tokenizer trained on a
few stdlib sources. Every weight whose convention a converter can get wrong (all RMSNorms, the gated
`linear_attn.norm`, `A_log`, `dt_bias`, conv1d) is moved well away from its initial value, so a missed +1 or a
wrong sign shows in the logits. With `with_mtp=True` random `mtp.*` tensors are added to the safetensors in the
layout of the real checkpoints (transformers ignores them on load).
"""
from __future__ import annotations

import json
import math
import shutil
import sysconfig
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

TINY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
    linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2,
    moe_intermediate_size=32, shared_expert_intermediate_size=32, norm_topk_prob=True, rms_norm_eps=1e-6,
    max_position_embeddings=512, tie_word_embeddings=False, initializer_range=0.1,
)
STDLIB_SOURCES = ("textwrap.py", "heapq.py", "bisect.py", "shlex.py")
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@lru_cache(maxsize=1)
def tiny_tokenizer_json() -> str:
    """A deterministic 384-token byte-level BPE (GPT-2 regex pre-tokenizer) as tokenizer.json text:
    380 trained (incl. `<|endoftext|>` = 0), then `<|im_start|>`, `<|im_end|>` (special) and
    `<think>`, `</think>` (added, not special)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    lib = Path(sysconfig.get_paths()["stdlib"])
    texts = [(lib / f).read_text(encoding="utf-8") for f in STDLIB_SOURCES]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=380, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")])
    tk.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>")])
    return tk.to_str()


def _grid(x: torch.Tensor) -> torch.Tensor:
    return torch.round(x * 4096) / 4096


def _exp_log_exact(x: torch.Tensor) -> torch.Tensor:
    """Nudge each value by a few ulps until fp32 log(exp(a)) == a, so the GGUF's ssm_a = -exp(A_log)
    inverts exactly (the f32 round-trip test is then bit-exact rather than within rounding)."""
    out = []
    for a in x.numpy().astype(np.float32):
        b = a
        while np.log(np.exp(b)) != b:
            b = np.nextafter(b, np.float32(np.inf))
        out.append(b)
    return torch.from_numpy(np.array(out, dtype=np.float32)).reshape(x.shape)


def _perturb(model, gen: torch.Generator):
    """Move convention-sensitive parameters away from their init (zeros / ones / the A_log law)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):          # all RMSNorms (zero-centred) and the gated linear_attn.norm
                # on a 2^-12 grid, so the GGUF's w+1 is exact in fp32 and gguf_to_hf gives w back bit for bit
                p.add_(_grid(0.3 * torch.randn(p.shape, generator=gen)))
            elif name.endswith("A_log"):
                p.copy_(_exp_log_exact(torch.randn(p.shape, generator=gen)))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith("conv1d.weight"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))


def _mtp_tensors(config, gen: torch.Generator, layer_cls=None) -> dict[str, torch.Tensor]:
    """Random mtp.* tensors shaped like Qwen3-Next's: fc [H, 2H], three norms [H], and mtp.layers.0 = one
    full-attention decoder layer with MoE, experts under per-expert names (spec §1.7). layer_cls: the decoder
    layer class to shape it (default Qwen3NextDecoderLayer; Qwen3.5-MoE's has the same names)."""
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextDecoderLayer
    H, E, I = config.hidden_size, config.num_experts, config.moe_intermediate_size
    full = config.layer_types.index("full_attention")
    layer = (layer_cls or Qwen3NextDecoderLayer)(config, full)
    out: dict[str, torch.Tensor] = {}
    for name, p in layer.state_dict().items():
        if name == "mlp.experts.gate_up_proj":
            w = torch.randn(p.shape, generator=gen) / math.sqrt(H)
            for e in range(E):
                out[f"mtp.layers.0.mlp.experts.{e}.gate_proj.weight"] = w[e, :I].contiguous()
                out[f"mtp.layers.0.mlp.experts.{e}.up_proj.weight"] = w[e, I:].contiguous()
        elif name == "mlp.experts.down_proj":
            w = torch.randn(p.shape, generator=gen) / math.sqrt(I)
            for e in range(E):
                out[f"mtp.layers.0.mlp.experts.{e}.down_proj.weight"] = w[e].contiguous()
        elif name.endswith("norm.weight"):
            out[f"mtp.layers.0.{name}"] = _grid(0.3 * torch.randn(p.shape, generator=gen))
        else:
            out[f"mtp.layers.0.{name}"] = torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1])
    out["mtp.fc.weight"] = torch.randn(H, 2 * H, generator=gen) / math.sqrt(2 * H)
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{n}.weight"] = _grid(0.3 * torch.randn(H, generator=gen))
    return out


def _fuse_experts(sd: dict[str, torch.Tensor], E: int) -> dict[str, torch.Tensor]:
    """Rewrite per-expert names as transformers-v5 fused gate_up_proj [E, 2I, H] / down_proj [E, H, I]."""
    out, prefixes = {}, set()
    for k, v in sd.items():
        if ".mlp.experts." in k and k.split(".mlp.experts.")[1].split(".")[0].isdigit():
            prefixes.add(k.split(".mlp.experts.")[0] + ".mlp.experts.")
        else:
            out[k] = v
    for p in sorted(prefixes):
        g = [sd[f"{p}{e}.gate_proj.weight"] for e in range(E)]
        u = [sd[f"{p}{e}.up_proj.weight"] for e in range(E)]
        out[p + "gate_up_proj"] = torch.stack([torch.cat([a, b]) for a, b in zip(g, u)])
        out[p + "down_proj"] = torch.stack([sd[f"{p}{e}.down_proj.weight"] for e in range(E)])
    return out


def _write_shards(sd: dict[str, torch.Tensor], out_dir: Path, shards: int):
    (out_dir / "model.safetensors").unlink(missing_ok=True)
    names = sorted(sd)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: sd[n].contiguous() for n in names[s::shards]}
        save_file(part, str(out_dir / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in sd.values())},
             "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def make_tiny_hf(out_dir, *, seed: int = 0, with_mtp: bool = False, vocab_tokenizer=None,
                 vocab_size: int | None = None, shards: int = 1, fused_experts: bool = False,
                 dtype: str = "float32", sizes: dict | None = None):
    """Write a tiny random Qwen3-Next checkpoint to `out_dir`; return the transformers model (eval mode, fp32).

    vocab_tokenizer: path of a tokenizer.json to ship instead of the trained tiny one.
    vocab_size: config vocab (default: the tokenizer's size; larger leaves `[PAD{i}]` slots in the GGUF).
    shards > 1 writes model-0000k-of-0000n.safetensors + model.safetensors.index.json.
    fused_experts writes transformers-v5 fused `mlp.experts.gate_up_proj` / `down_proj` instead of
    per-expert names. dtype "bfloat16" stores every tensor as bf16 (the returned model stays fp32).
    sizes: config fields that replace TINY's (e.g. hidden_size=256: rows wide enough for K-quants)."""
    from tokenizers import Tokenizer
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if vocab_tokenizer is not None:
        shutil.copyfile(vocab_tokenizer, out_dir / "tokenizer.json")
    else:
        (out_dir / "tokenizer.json").write_text(tiny_tokenizer_json(), encoding="utf-8")
    tk = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    n_tok = tk.get_vocab_size(with_added_tokens=True)
    eot, im_end = tk.token_to_id("<|endoftext|>"), tk.token_to_id("<|im_end|>")

    dims = dict(TINY, **(sizes or {}))
    n_layer = dims["num_hidden_layers"]
    config = Qwen3NextConfig(
        **dims, vocab_size=vocab_size or n_tok,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n_layer)],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        bos_token_id=eot, eos_token_id=im_end if im_end is not None else eot, pad_token_id=eot,
    )
    torch.manual_seed(seed)
    model = Qwen3NextForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    _perturb(model, gen)
    model.save_pretrained(out_dir)

    tc = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
          "pad_token": "<|endoftext|>", "add_bos_token": False, "model_max_length": 512,
          "chat_template": CHAT_TEMPLATE}
    if im_end is None:
        tc["eos_token"] = "<|endoftext|>"
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tc, indent=2))

    if with_mtp or shards > 1 or fused_experts or dtype != "float32":
        sd = load_file(str(out_dir / "model.safetensors"))
        if with_mtp:
            sd.update(_mtp_tensors(config, gen))
        if fused_experts:
            sd = _fuse_experts(sd, config.num_experts)
        if dtype == "bfloat16":
            sd = {k: v.to(torch.bfloat16) for k, v in sd.items()}
        if with_mtp:
            cfg = json.loads((out_dir / "config.json").read_text())
            cfg["mtp_num_hidden_layers"] = 1
            (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
        if shards > 1:
            _write_shards(sd, out_dir, shards)
        else:
            save_file({k: v.contiguous() for k, v in sd.items()}, str(out_dir / "model.safetensors"),
                      metadata={"format": "pt"})
    return model
