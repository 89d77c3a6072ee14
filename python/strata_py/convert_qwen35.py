"""Hugging Face Qwen3.5-MoE (`Qwen3_5MoeForCausalLM` / `...ForConditionalGeneration`) <-> GGUF `qwen35moe`
in llama.cpp's layout (spec qwen4exp.md §2, §4). Called by `convert.convert` / `convert.gguf_to_hf`.

What differs from qwen3next (convert.py), forward:
  1. the Gated DeltaNet has four projections (`in_proj_qkv` [q_all|k_all|v_all], `in_proj_z`, `in_proj_b`,
     `in_proj_a`), written as `attn_qkv`, `attn_gate`, `ssm_beta`, `ssm_alpha`;
  2. every value-head axis of the DeltaNet goes from HF's grouped order (slot g*rv + v, g the key head) to the
     tiled order (slot v*nk + g), so GGUF value head s reads key head s mod nk (spec §4.2): the v rows of attn_qkv
     and the v channels of ssm_conv1d, attn_gate's rows, ssm_beta / ssm_alpha rows, ssm_a, ssm_dt.bias, and
     ssm_out's columns; q/k rows and channels and ssm_norm (shared by all heads) are unchanged;
  3. layers follow `layer_types` (`attention.recurrent_layers`, bool per block, MTP block false);
     `full_attention_interval` is written as the config's value, else 4 (llama.cpp does the same);
  4. interleaved mRoPE: `rope.dimension_sections` = mrope_section padded with 0 to four (default [11,11,10,0]);
  5. no `feed_forward_length` (the class has no intermediate_size), norms +1 and experts as qwen3next.
A multimodal checkpoint (`model.language_model.*`, `model.visual.*`, config with `text_config`) converts to the
same text-only file: the vision tower is left out, as llama.cpp's text model does.
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import convert as cv

log = logging.getLogger("strata.convert")

ARCH = "qwen35moe"
MODEL_TYPES = ("qwen3_5_moe_text", "qwen3_5_moe")
DEFAULT_MROPE = (11, 11, 10)


@dataclass(frozen=True)
class Hparams(cv.Hparams):
    """Qwen3.5 trunk: Qwen3-Next's fields plus the explicit layer pattern and the mRoPE sections."""
    recurrent: tuple[bool, ...] = ()           # per layer: Gated DeltaNet (linear_attention)
    mrope_sections: tuple[int, ...] = (11, 11, 10, 0)

    def is_full_attention(self, i: int) -> bool:
        return not self.recurrent[i]


def text_config(cfg: dict, model_types: tuple[str, ...], what: str) -> dict:
    """config.json of a text model, or of a multimodal one (its `text_config` over the top level, as llama.cpp
    merges them). ValueError when model_type is not one of `model_types`."""
    mt = cfg.get("model_type")
    if mt not in model_types:
        raise ValueError(f"config.json: model_type={mt!r}: expected one of {', '.join(model_types)} for {what}")
    if isinstance(cfg.get("text_config"), dict):
        return {**cfg, **cfg["text_config"]}
    return cfg


class _Config:
    """Required / defaulted config.json fields with errors that name the key and the value."""

    def __init__(self, cfg: dict):
        self.cfg = cfg

    def req(self, key):
        if key not in self.cfg or self.cfg[key] is None:
            raise ValueError(f"config.json: missing key {key!r}")
        return self.cfg[key]

    def bad(self, key, why, value=None):
        raise ValueError(f"config.json: {key}={self.cfg.get(key) if value is None else value!r}: {why}")

    def want(self, key, allowed, why):
        if key in self.cfg and self.cfg[key] is not None and self.cfg[key] not in allowed:
            self.bad(key, why)


def read_trunk(cfg: dict, linear: str, attention: tuple[str, ...], default_prf: float, cls=None, **extra):
    """The Qwen3.5 trunk hyperparameters shared by qwen35moe and qwen4exp, checked.
    linear / attention: the layer_types spellings; default_prf: partial_rotary_factor when the config has none
    (0.25 for Qwen3.5, 1.0 for Qwen4-Exp: their config classes differ; llama.cpp assumes 0.25)."""
    c = _Config(cfg)
    c.want("hidden_act", ("silu",), "only 'silu' is supported (llama.cpp's graph hard-codes SiLU experts)")
    c.want("attention_bias", (False,), "attention biases are not supported")
    if cfg.get("rope_scaling"):
        c.bad("rope_scaling", "RoPE scaling is not supported")
    rp = cfg.get("rope_parameters") or {}
    if rp.get("rope_type", "default") != "default":
        raise ValueError(f"config.json: rope_parameters.rope_type={rp['rope_type']!r}: only 'default' is supported")
    theta = float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    prf = float(rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", default_prf)))

    n_layer = int(c.req("num_hidden_layers"))
    n_embd, n_head, n_head_kv = int(c.req("hidden_size")), int(c.req("num_attention_heads")), \
        int(c.req("num_key_value_heads"))
    head_dim = int(c.req("head_dim"))
    rope_dim = int(head_dim * prf)
    if not (0 < rope_dim <= head_dim) or rope_dim % 2:
        raise ValueError(f"config.json: partial_rotary_factor={prf!r} gives {rope_dim} rotary dims of head_dim "
                         f"{head_dim}: need an even count in [2, head_dim]")
    sections = list(rp.get("mrope_section", DEFAULT_MROPE))
    if len(sections) > 4 or any(int(x) < 0 for x in sections):
        raise ValueError(f"config.json: rope_parameters.mrope_section={sections!r}: need at most 4 entries >= 0")
    if sum(sections) < rope_dim // 2:
        # llama.cpp leaves rotary pairs beyond the sections unrotated for text (angle 0), transformers rotates them
        raise ValueError(f"config.json: rope_parameters.mrope_section={sections!r} covers {sum(sections)} rotary "
                         f"pairs, fewer than rot/2 = {rope_dim // 2}: llama.cpp and transformers would disagree")
    sections = tuple(int(x) for x in sections) + (0,) * (4 - len(sections))
    if n_head % n_head_kv:
        c.bad("num_attention_heads", f"must be a multiple of num_key_value_heads={n_head_kv}")
    nk, nv = int(c.req("linear_num_key_heads")), int(c.req("linear_num_value_heads"))
    if nv % nk:
        c.bad("linear_num_value_heads", f"must be a multiple of linear_num_key_heads={nk}")
    dk, dv = int(c.req("linear_key_head_dim")), int(c.req("linear_value_head_dim"))
    if dk != dv:
        c.bad("linear_value_head_dim", f"must equal linear_key_head_dim={dk} (llama.cpp's ssm.state_size is both)")
    n_expert, n_used = int(c.req("num_experts")), int(c.req("num_experts_per_tok"))
    if not (0 < n_used <= n_expert):
        c.bad("num_experts_per_tok", f"must be in [1, num_experts={n_expert}]")

    lt = cfg.get("layer_types")
    interval = cfg.get("full_attention_interval")
    if lt is None:  # the config classes' default: attention iff (i+1) % interval == 0
        every = int(interval if interval is not None else 4)
        if every < 1:
            c.bad("full_attention_interval", "must be >= 1")
        recurrent = tuple(bool((i + 1) % every) for i in range(n_layer))
    else:
        if len(lt) != n_layer or any(t != linear and t not in attention for t in lt):
            c.bad("layer_types", f"need {n_layer} entries, each {linear!r} or {' / '.join(map(repr, attention))}")
        recurrent = tuple(t == linear for t in lt)
    return (cls or Hparams)(
        n_vocab=int(c.req("vocab_size")), n_embd=n_embd, n_ff=0, n_layer=n_layer, n_head=n_head,
        n_head_kv=n_head_kv, head_dim=head_dim, n_ctx=int(c.req("max_position_embeddings")),
        eps=float(c.req("rms_norm_eps")), rope_theta=theta, rope_dim=rope_dim, n_expert=n_expert,
        n_expert_used=n_used, n_ff_exp=int(c.req("moe_intermediate_size")),
        n_ff_shexp=int(c.req("shared_expert_intermediate_size")), conv_kernel=int(c.req("linear_conv_kernel_dim")),
        nk=nk, nv=nv, dk=dk, dv=dv, interval=int(interval if interval is not None else 4),
        tie=bool(cfg.get("tie_word_embeddings", False)), bos_token_id=cv._first_id(cfg.get("bos_token_id")),
        eos_token_id=cv._first_id(cfg.get("eos_token_id")), pad_token_id=cv._first_id(cfg.get("pad_token_id")),
        recurrent=recurrent, mrope_sections=sections, **extra)


def read_hparams(cfg: dict) -> Hparams:
    """Check a Qwen3.5-MoE config.json and extract what the converter needs; ValueError names the key."""
    cfg = text_config(cfg, MODEL_TYPES, "qwen35moe")
    return read_trunk(cfg, "linear_attention", ("full_attention",), 0.25)


# ------------------------------------------------------------------------------------------------
# the V-head reorder (spec §4.2)
# ------------------------------------------------------------------------------------------------

def v_tiled(a: np.ndarray, axis: int, nk: int, rv: int, d: int) -> np.ndarray:
    """HF grouped value heads (slot g*rv + v, blocks of d) -> GGUF tiled (slot v*nk + g) along `axis`."""
    return _swap_heads(a, axis, (nk, rv, d))


def v_grouped(a: np.ndarray, axis: int, nk: int, rv: int, d: int) -> np.ndarray:
    """Inverse of v_tiled: view the axis as [rv, nk, d], swap the first two, flatten."""
    return _swap_heads(a, axis, (rv, nk, d))


def _swap_heads(a: np.ndarray, axis: int, split: tuple[int, int, int]) -> np.ndarray:
    axis %= a.ndim
    assert a.shape[axis] == split[0] * split[1] * split[2], (a.shape, axis, split)
    v = a.reshape(a.shape[:axis] + split + a.shape[axis + 1:])
    return np.ascontiguousarray(np.swapaxes(v, axis, axis + 1)).reshape(a.shape)


class Planner(cv._Planner):
    """qwen3next's planner (attention, MoE, norms) with the Qwen3.5 DeltaNet."""

    def deltanet(self, b: str, pre: str):
        hp, H, K = self.hp, self.hp.n_embd, self.hp.conv_kernel
        nk, rv, dv, kd = hp.nk, hp.nv // hp.nk, hp.dv, hp.key_dim
        tiled = lambda d, axis=0: (lambda w: v_tiled(w, axis, nk, rv, d))  # noqa: E731

        def qkv(w):  # [q_all | k_all | v_all] rows (or conv channels): only the v part is reordered
            return np.concatenate([w[:2 * kd], v_tiled(w[2 * kd:], 0, nk, rv, dv)], axis=0)

        self.plain(f"{b}.attn_qkv.weight", f"{pre}in_proj_qkv.weight", (hp.conv_dim, H), qkv)
        self.plain(f"{b}.attn_gate.weight", f"{pre}in_proj_z.weight", (hp.value_dim, H), tiled(dv))
        self.plain(f"{b}.ssm_beta.weight", f"{pre}in_proj_b.weight", (hp.nv, H), tiled(1))
        self.plain(f"{b}.ssm_alpha.weight", f"{pre}in_proj_a.weight", (hp.nv, H), tiled(1))
        self.plain(f"{b}.ssm_conv1d.weight", f"{pre}conv1d.weight", (hp.conv_dim, 1, K),
                   lambda w: qkv(w.reshape(hp.conv_dim, K)), out_shape=(hp.conv_dim, K))
        self.plain(f"{b}.ssm_dt.bias", f"{pre}dt_bias", (hp.nv,), tiled(1))
        self.plain(f"{b}.ssm_a", f"{pre}A_log", (hp.nv,), lambda a: -np.exp(v_tiled(a, 0, nk, rv, 1)))
        self.norm(f"{b}.ssm_norm.weight", f"{pre}norm.weight", hp.dv, plus_one=False)
        self.plain(f"{b}.ssm_out.weight", f"{pre}out_proj.weight", (H, hp.value_dim), tiled(dv, axis=1))


def hf_deltanet(sd: dict, g: cv.GGUFSource, b: str, la: str, hp: Hparams):
    """Inverse of Planner.deltanet: the Qwen3.5 DeltaNet of block b back to HF names under `la`."""
    nk, rv, dv, kd = hp.nk, hp.nv // hp.nk, hp.dv, hp.key_dim
    grouped = lambda a, d, axis=0: v_grouped(a, axis, nk, rv, d)  # noqa: E731

    def qkv(w):
        return np.concatenate([w[:2 * kd], grouped(w[2 * kd:], dv)], axis=0)

    sd[la + "in_proj_qkv.weight"] = qkv(g.get(f"{b}.attn_qkv.weight"))
    sd[la + "in_proj_z.weight"] = grouped(g.get(f"{b}.attn_gate.weight"), dv)
    sd[la + "in_proj_b.weight"] = grouped(g.get(f"{b}.ssm_beta.weight"), 1)
    sd[la + "in_proj_a.weight"] = grouped(g.get(f"{b}.ssm_alpha.weight"), 1)
    sd[la + "conv1d.weight"] = qkv(g.get(f"{b}.ssm_conv1d.weight"))[:, None, :]
    sd[la + "dt_bias"] = grouped(g.get(f"{b}.ssm_dt.bias"), 1)
    sd[la + "A_log"] = np.log(-grouped(g.get(f"{b}.ssm_a"), 1))
    sd[la + "norm.weight"] = g.get(f"{b}.ssm_norm.weight")
    sd[la + "out_proj.weight"] = grouped(g.get(f"{b}.ssm_out.weight"), dv, axis=1)


# ------------------------------------------------------------------------------------------------
# checkpoint names: a multimodal checkpoint keeps the text model under model.language_model.
# ------------------------------------------------------------------------------------------------

_VISION = re.compile(r"^(model\.visual\.|visual\.|model\.vision_tower\.)")


def text_source(hf_dir: Path) -> cv.SafetensorsSource:
    """The checkpoint's tensors under text-model names: `model.language_model.X` -> `model.X`; the vision tower
    (`model.visual.*`) is dropped (and logged)."""
    src = cv.SafetensorsSource(hf_dir)
    vision = [n for n in src.entries if _VISION.match(n)]
    if vision:
        log.info("%s: leaving out %d vision tensors (%s ...): the GGUF is the text model", hf_dir, len(vision),
                 vision[0])
    entries = {}
    for n, e in src.entries.items():
        if _VISION.match(n):
            continue
        m = n.replace("model.language_model.", "model.", 1) if n.startswith("model.language_model.") else n
        if m in entries:
            raise ValueError(f"{hf_dir}: tensor {n!r} and another both map to {m!r}")
        entries[m] = e
    src.entries = entries
    return src


# ------------------------------------------------------------------------------------------------
# metadata and the conversion
# ------------------------------------------------------------------------------------------------

def trunk_metadata(arch: str, hp: Hparams, out_type: str, name: str, n_mtp: int) -> dict:
    """general.* and the `{arch}.` keys of the Qwen3.5 trunk, with llama.cpp's names and types (spec §3.1, §4.1):
    qwen3next's keys (convert.model_metadata) without feed_forward_length (the Qwen3.5 classes have no
    intermediate_size), plus the mRoPE sections and the layer pattern."""
    md = cv.model_metadata(hp, out_type, name, n_mtp, arch)
    del md[f"{arch}.feed_forward_length"]
    md[f"{arch}.rope.dimension_sections"] = list(hp.mrope_sections)
    md[f"{arch}.attention.recurrent_layers"] = list(hp.recurrent) + [False] * n_mtp
    return md


def model_name(cfg: dict, hf_dir: Path, default: str) -> str:
    return Path(cfg.get("_name_or_path") or hf_dir.resolve().name).name or default


def read_config(hf_dir: Path) -> dict:
    p = hf_dir / "config.json"
    if not p.exists():
        raise ValueError(f"{hf_dir}: config.json not found")
    return json.loads(p.read_text(encoding="utf-8"))


def convert(hf_dir, out_path, out_type: str = "f32", mtp: bool = True, mtp_only: bool = False) -> Path:
    """Convert the HF Qwen3.5-MoE checkpoint in `hf_dir` into a `qwen35moe` GGUF at `out_path` (atomically).
    out_type, mtp, mtp_only: as convert.convert (the MTP block becomes blk.{n_layer} + nextn.*)."""
    hf_dir, out_path = Path(hf_dir), Path(out_path)
    cfg = read_config(hf_dir)
    hp = read_hparams(cfg)
    src = text_source(hf_dir)
    outs, n_mtp = cv.plan(src, hp, out_type, "current", mtp, mtp_only, planner=Planner)
    md = trunk_metadata(ARCH, hp, out_type, model_name(cfg, hf_dir, ARCH), n_mtp)
    md.update(cv.read_vocab(hf_dir, hp))
    cv.write_gguf(out_path, ARCH, md, outs)
    log.info("wrote %s: %d tensors, %s", out_path, len(outs), out_type)
    return out_path


# ------------------------------------------------------------------------------------------------
# reverse: GGUF -> HF (for tests)
# ------------------------------------------------------------------------------------------------

def trunk_hparams(g: cv.GGUFSource, n_layer: int, cls=None, **extra) -> Hparams:
    rec = [bool(x) for x in g.key("attention.recurrent_layers")]
    if len(rec) < n_layer:
        raise ValueError(f"{g.path}: {g.arch}.attention.recurrent_layers has {len(rec)} entries, "
                         f"block_count implies at least {n_layer}")
    sections = tuple(int(x) for x in g.key("rope.dimension_sections", [*DEFAULT_MROPE, 0]))
    return g.hparams(n_layer, cls or Hparams, recurrent=tuple(rec[:n_layer]), mrope_sections=sections, **extra)


def trunk_config(hp: Hparams, layer_names: tuple[str, str]) -> dict:
    """The config.json fields of the Qwen3.5 trunk (layer_names: the linear / attention spellings)."""
    sections = list(hp.mrope_sections)
    while len(sections) > 3 and sections[-1] == 0:
        sections.pop()
    return {
        "dtype": "float32", "vocab_size": hp.n_vocab, "hidden_size": hp.n_embd,
        "num_hidden_layers": hp.n_layer, "num_attention_heads": hp.n_head, "num_key_value_heads": hp.n_head_kv,
        "head_dim": hp.head_dim, "hidden_act": "silu", "attention_bias": False,
        "max_position_embeddings": hp.n_ctx, "rms_norm_eps": hp.eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": hp.rope_theta,
                            "partial_rotary_factor": hp.rope_dim / hp.head_dim, "mrope_section": sections,
                            "mrope_interleaved": True},
        "linear_conv_kernel_dim": hp.conv_kernel, "linear_key_head_dim": hp.dk, "linear_value_head_dim": hp.dv,
        "linear_num_key_heads": hp.nk, "linear_num_value_heads": hp.nv,
        "num_experts": hp.n_expert, "num_experts_per_tok": hp.n_expert_used,
        "moe_intermediate_size": hp.n_ff_exp, "shared_expert_intermediate_size": hp.n_ff_shexp,
        "layer_types": [layer_names[0] if r else layer_names[1] for r in hp.recurrent],
        "tie_word_embeddings": hp.tie,
        "bos_token_id": hp.bos_token_id, "eos_token_id": hp.eos_token_id, "pad_token_id": hp.pad_token_id,
    }


def gguf_to_hf(gguf_path, out_dir) -> Path:
    """Write an HF Qwen3.5-MoE checkpoint (`Qwen3_5MoeForCausalLM`, fp32, per-expert names, `mtp.*` when the file
    has an MTP block) equivalent to the qwen35moe GGUF, every transform undone (the V-head reorder included)."""
    g = cv.GGUFSource(gguf_path, ARCH)
    n_mtp = int(g.key("nextn_predict_layers", 0))
    n_layer = int(g.key("block_count")) - n_mtp
    if "blk.0.attn_norm.weight" not in g:
        raise ValueError(f"{gguf_path}: has no blk.0 tensors (an MTP-only GGUF cannot become a full HF model)")
    hp = trunk_hparams(g, n_layer)
    sd: dict[str, np.ndarray] = {"model.embed_tokens.weight": g.get("token_embd.weight")}

    def block(bid: int, pre: str, full_attention: bool):
        b = f"blk.{bid}"
        sd[f"{pre}input_layernorm.weight"] = cv.minus1(g.get(f"{b}.attn_norm.weight"))
        sd[f"{pre}post_attention_layernorm.weight"] = cv.minus1(g.get(f"{b}.post_attention_norm.weight"))
        if full_attention:
            cv.hf_attention(sd, g, b, pre)
        else:
            hf_deltanet(sd, g, b, pre + "linear_attn.", hp)
        cv.hf_moe(sd, g, b, pre + "mlp.", hp.n_embd)

    for i in range(n_layer):
        block(i, f"model.layers.{i}.", hp.is_full_attention(i))
    if n_mtp:
        block(n_layer, "mtp.layers.0.", True)
        cv.hf_mtp_head(sd, g, n_layer)
    sd["model.norm.weight"] = cv.minus1(g.get("output_norm.weight"))
    if not hp.tie:
        sd["lm_head.weight"] = g.get("output.weight")
    cfg = {"architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text",
           **trunk_config(hp, ("linear_attention", "full_attention"))}
    if n_mtp:
        cfg["mtp_num_hidden_layers"] = n_mtp
    return cv.write_hf(Path(out_dir), cfg, sd, g)

