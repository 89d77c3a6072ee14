"""Hugging Face Qwen3-Next checkpoint <-> GGUF in llama.cpp's `qwen3next` layout (spec §2, §4); Qwen3.5-MoE
(`qwen35moe`) and Qwen4-Exp (`qwen4exp`) checkpoints go to convert_qwen35.py / convert_qwen4exp.py (by model_type).

    python -m strata_py.convert HF_DIR OUT.gguf --type f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|iq4_nl|mxfp4
                                [--layout current|legacy] [--no-mtp] [--mtp-only]

Forward (`convert`), what happens to the HF tensors (spec §2.3):
  1. every `*norm.weight` except `linear_attn.norm.weight` gets +1 (zero-centred RMSNorm folded into a plain one);
  2. `A_log` -> `ssm_a = -exp(A_log)`; `dt_bias` -> `ssm_dt.bias` unchanged; conv1d [C,1,K] -> [C,K];
  3. `in_proj_qkvz` (grouped per key head [q|k|v|z] x nk) -> `attn_qkv` [q_all|k_all|v_all] + `attn_gate` [z_all]
     (layout "current"), or kept raw as `ssm_in` (layout "legacy", the first llama.cpp generation);
  4. experts (per-expert `mlp.experts.E.*_proj.weight`, or transformers-v5 fused `gate_up_proj`/`down_proj`)
     stacked into `ffn_{gate,up,down}_exps` [E, out, in];
  5. MTP (`mtp.*`): `mtp.layers.0.*` becomes block n_layer through the normal mapping, plus
     `nextn.{eh_proj,enorm,hnorm,shared_head_norm}` (norms +1); block_count = n_layer + 1.
All arithmetic is done in float32 (bf16/f16 sources are widened first, as llama.cpp's converter does).
The conversion is planned in full (every name and shape checked against config.json) before the output is
opened, then streamed tensor by tensor into OUT.tmp, which is renamed to OUT only on success.

Reverse (`gguf_to_hf`): dequantizes every tensor and undoes the transforms, writing config.json,
model.safetensors (fp32, `mtp.*` included) and tokenizer files, loadable by
`transformers.Qwen3NextForCausalLM.from_pretrained`. Used to check GGUFs against transformers; it holds the
whole model in memory as fp32, so it is meant for small models.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from .tokenizer import (CONTROL, NORMAL, UNUSED, USER_DEFINED, GPT2_REGEX, QWEN2_REGEX, QWEN2_REGEX_EXPANDED,
                        QWEN35_REGEX, QWEN35_REGEX_EXPANDED)

log = logging.getLogger("strata.convert")

ARCH = "qwen3next"
OUT_TYPES = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0, "q4_0": QT.Q4_0, "q4_1": QT.Q4_1,
             "q5_0": QT.Q5_0, "q5_1": QT.Q5_1, "iq4_nl": QT.IQ4_NL, "mxfp4": QT.MXFP4}
_LFT = gguf.LlamaFileType
FILE_TYPES = {"f32": _LFT.ALL_F32, "f16": _LFT.MOSTLY_F16, "bf16": _LFT.MOSTLY_BF16, "q8_0": _LFT.MOSTLY_Q8_0,
              "q4_0": _LFT.MOSTLY_Q4_0, "q4_1": _LFT.MOSTLY_Q4_1, "q5_0": _LFT.MOSTLY_Q5_0, "q5_1": _LFT.MOSTLY_Q5_1,
              "iq4_nl": _LFT.MOSTLY_IQ4_NL, "mxfp4": _LFT.MOSTLY_MXFP4_MOE}
LAYOUTS = ("current", "legacy")
ALIGNMENT = 32  # GGUF default; written explicitly as general.alignment


# ------------------------------------------------------------------------------------------------
# the other architectures (issue 14) live in their own modules, chosen by config.json's model_type
# (HF -> GGUF) or general.architecture (GGUF -> HF); this file keeps the shared machinery and qwen3next.
# ------------------------------------------------------------------------------------------------

OTHER_ARCHS = {"qwen35moe": "convert_qwen35", "qwen4exp": "convert_qwen4exp"}
OTHER_MODEL_TYPES = {"qwen3_5_moe_text": "qwen35moe", "qwen3_5_moe": "qwen35moe",
                     "qwen4_exp_text": "qwen4exp", "qwen4_exp": "qwen4exp"}


def _other(arch: str):
    import importlib
    return importlib.import_module(f".{OTHER_ARCHS[arch]}", __package__)


def _file_architecture(path: Path) -> str | None:
    f = gguf.GGUFReader(path).fields.get("general.architecture")
    return None if f is None else f.contents()


# ------------------------------------------------------------------------------------------------
# config.json -> hyperparameters
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Hparams:
    """The Qwen3-Next hyperparameters the GGUF records, read and checked from config.json."""
    n_vocab: int
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ctx: int
    eps: float
    rope_theta: float
    rope_dim: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int
    conv_kernel: int
    nk: int          # linear_num_key_heads   (ssm.group_count)
    nv: int          # linear_num_value_heads (ssm.time_step_rank)
    dk: int          # linear_key_head_dim    (ssm.state_size)
    dv: int          # linear_value_head_dim
    interval: int    # full_attention_interval: layer i is full attention iff (i+1) % interval == 0
    tie: bool
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None

    @property
    def key_dim(self) -> int:
        return self.nk * self.dk

    @property
    def value_dim(self) -> int:
        return self.nv * self.dv

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def is_full_attention(self, i: int) -> bool:
        return (i + 1) % self.interval == 0


def _first_id(v):
    if isinstance(v, list):
        return int(v[0]) if v else None
    return None if v is None else int(v)


def read_hparams(cfg: dict) -> Hparams:
    """Check config.json and extract what the converter needs; ValueError names the offending key."""
    def req(key):
        if key not in cfg or cfg[key] is None:
            raise ValueError(f"config.json: missing key {key!r}")
        return cfg[key]

    def bad(key, why):
        raise ValueError(f"config.json: {key}={cfg.get(key)!r}: {why}")

    mt = cfg.get("model_type")
    if mt is not None and mt != "qwen3_next":
        bad("model_type", f"expected one of {', '.join(['qwen3_next', *OTHER_MODEL_TYPES])}")
    for key, want in (("hidden_act", "silu"), ("attention_bias", False), ("norm_topk_prob", True),
                      ("decoder_sparse_step", 1)):
        if key in cfg and cfg[key] != want:
            bad(key, f"only {want!r} is supported (llama.cpp's qwen3next graph hard-codes it)")
    if cfg.get("mlp_only_layers"):
        bad("mlp_only_layers", "dense layers are not supported: every layer must be MoE")

    rp = cfg.get("rope_parameters") or {}
    if cfg.get("rope_scaling"):
        bad("rope_scaling", "RoPE scaling is not supported")
    if rp.get("rope_type", "default") != "default":
        raise ValueError(f"config.json: rope_parameters.rope_type={rp['rope_type']!r}: only 'default' is supported")
    theta = rp.get("rope_theta", cfg.get("rope_theta"))
    if theta is None:
        raise ValueError("config.json: missing key 'rope_theta' (or rope_parameters.rope_theta)")
    prf = rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))

    n_layer = int(req("num_hidden_layers"))
    n_head, n_head_kv = int(req("num_attention_heads")), int(req("num_key_value_heads"))
    n_embd = int(req("hidden_size"))
    head_dim = int(cfg.get("head_dim") or n_embd // n_head)
    nk, nv = int(req("linear_num_key_heads")), int(req("linear_num_value_heads"))
    if nv % nk != 0:
        bad("linear_num_value_heads", f"must be a multiple of linear_num_key_heads={nk}")
    if n_head % n_head_kv != 0:
        bad("num_attention_heads", f"must be a multiple of num_key_value_heads={n_head_kv}")
    n_expert, n_used = int(req("num_experts")), int(req("num_experts_per_tok"))
    if not (0 < n_used <= n_expert):
        bad("num_experts_per_tok", f"must be in [1, num_experts={n_expert}]")

    interval = cfg.get("full_attention_interval")
    lt = cfg.get("layer_types")
    if lt is not None:
        if len(lt) != n_layer or any(t not in ("linear_attention", "full_attention") for t in lt):
            bad("layer_types", f"need {n_layer} entries of 'linear_attention'/'full_attention'")
        full = [i for i, t in enumerate(lt) if t == "full_attention"]
        derived = (full[0] + 1) if full else n_layer + 1
        if interval is not None and int(interval) != derived:
            bad("full_attention_interval", f"disagrees with layer_types (which imply {derived})")
        interval = derived
        if any((t == "full_attention") != ((i + 1) % interval == 0) for i, t in enumerate(lt)):
            bad("layer_types", "is not periodic (full attention iff (i+1) % interval == 0); "
                               "the qwen3next GGUF only records full_attention_interval")
    interval = int(interval if interval is not None else 4)
    if interval < 1:
        bad("full_attention_interval", "must be >= 1")

    return Hparams(
        n_vocab=int(req("vocab_size")), n_embd=n_embd, n_ff=int(cfg.get("intermediate_size") or 0),
        n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
        n_ctx=int(req("max_position_embeddings")), eps=float(req("rms_norm_eps")),
        rope_theta=float(theta), rope_dim=int(head_dim * float(prf)),
        n_expert=n_expert, n_expert_used=n_used, n_ff_exp=int(req("moe_intermediate_size")),
        n_ff_shexp=int(req("shared_expert_intermediate_size")), conv_kernel=int(req("linear_conv_kernel_dim")),
        nk=nk, nv=nv, dk=int(req("linear_key_head_dim")), dv=int(req("linear_value_head_dim")),
        interval=interval, tie=bool(cfg.get("tie_word_embeddings", False)),
        bos_token_id=_first_id(cfg.get("bos_token_id")), eos_token_id=_first_id(cfg.get("eos_token_id")),
        pad_token_id=_first_id(cfg.get("pad_token_id")),
    )


# ------------------------------------------------------------------------------------------------
# safetensors source, read without torch (header + byte ranges)
# ------------------------------------------------------------------------------------------------

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}


class SafetensorsSource:
    """All tensors of a checkpoint directory: one `model.safetensors`, a sharded set listed by
    `model.safetensors.index.json`, or every `*.safetensors` file. `shape(name)` reads only headers;
    `load(name)` returns a float32 array."""

    def __init__(self, hf_dir: Path):
        index = hf_dir / "model.safetensors.index.json"
        if index.exists():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            paths = [hf_dir / f for f in files]
        else:
            paths = sorted(hf_dir.glob("*.safetensors"))
        if not paths:
            raise ValueError(f"{hf_dir}: no *.safetensors files")
        self.entries: dict[str, tuple[Path, str, tuple[int, ...], int, int]] = {}
        for p in paths:
            if not p.exists():
                raise ValueError(f"{index}: lists {p.name}, which does not exist")
            with open(p, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(n))
            base = 8 + n
            for name, e in header.items():
                if name == "__metadata__":
                    continue
                if name in self.entries:
                    raise ValueError(f"tensor {name!r} appears in both {self.entries[name][0].name} and {p.name}")
                b0, b1 = e["data_offsets"]
                self.entries[name] = (p, e["dtype"], tuple(e["shape"]), base + b0, base + b1)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def names(self) -> list[str]:
        return list(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name][2]

    def load(self, name: str) -> np.ndarray:
        path, dt, shape, b0, b1 = self.entries[name]
        if dt not in _ST_DTYPES:
            raise ValueError(f"tensor {name!r} has dtype {dt}; supported: {', '.join(_ST_DTYPES)}")
        with open(path, "rb") as f:
            f.seek(b0)
            buf = f.read(b1 - b0)
        a = np.frombuffer(buf, dtype=_ST_DTYPES[dt])
        if a.size != math.prod(shape):
            raise ValueError(f"tensor {name!r}: {b1 - b0} bytes do not hold shape {shape} of {dt}")
        if dt == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        return a.astype(np.float32).reshape(shape)


# ------------------------------------------------------------------------------------------------
# tokenizer.json / tokenizer_config.json -> tokenizer.ggml.* metadata
# ------------------------------------------------------------------------------------------------

def _looks_special(t: str) -> bool:
    # llama.cpp's does_token_look_special (the cases that matter for byte-level BPE vocabularies)
    return (t.startswith("<|") and t.endswith("|>")) or (t.startswith("<｜") and t.endswith("｜>")) \
        or t in ("<pad>", "<mask>")


def detect_pre_tokenizer(pt: dict | None) -> str:
    """Map a tokenizer.json `pre_tokenizer` to llama.cpp's `tokenizer.ggml.pre`: 'qwen2' / 'qwen35' for
    Split(Qwen2 / Qwen3.5 regex) + ByteLevel(no regex), 'gpt-2' for ByteLevel with GPT-2's regex (built in or as a
    Split). Anything else raises."""
    if pt is None:
        raise ValueError("tokenizer.json: no pre_tokenizer (expected Qwen2's Split+ByteLevel or GPT-2's ByteLevel)")
    items = pt.get("pretokenizers", []) if pt.get("type") == "Sequence" else [pt]
    kinds = [p.get("type") for p in items]
    splits = [p for p in items if p.get("type") == "Split"]
    bls = [p for p in items if p.get("type") == "ByteLevel"]
    if len(bls) != 1 or len(splits) > 1 or len(splits) + len(bls) != len(items):
        raise ValueError(f"tokenizer.json: unsupported pre_tokenizer sequence {kinds}")
    bl = bls[0]
    if bl.get("add_prefix_space", False):
        raise ValueError("tokenizer.json: ByteLevel pre_tokenizer with add_prefix_space=true is not supported")
    if not splits:
        if bl.get("use_regex", True):
            return "gpt-2"
        raise ValueError("tokenizer.json: ByteLevel pre_tokenizer with use_regex=false and no Split is not supported")
    sp = splits[0]
    pattern = sp.get("pattern", {})
    rx = pattern.get("Regex", pattern.get("String"))
    if bl.get("use_regex", True) or sp.get("invert", False) or sp.get("behavior", "Isolated") != "Isolated":
        raise ValueError(f"tokenizer.json: unsupported Split/ByteLevel combination for pattern {rx!r}")
    if rx in (QWEN2_REGEX, QWEN2_REGEX_EXPANDED):
        return "qwen2"
    if rx in (QWEN35_REGEX, QWEN35_REGEX_EXPANDED):
        return "qwen35"
    if rx == GPT2_REGEX:
        return "gpt-2"
    raise ValueError(f"tokenizer.json: unsupported pre-tokenizer regex {rx!r} (known: Qwen2's, Qwen3.5's, "
                     f"GPT-2's)")


def read_vocab(hf_dir: Path, hp: Hparams) -> dict:
    """The `tokenizer.*` metadata (spec §4) from tokenizer.json (+ tokenizer_config.json, chat_template.jinja)."""
    tj_path = hf_dir / "tokenizer.json"
    if not tj_path.exists():
        raise ValueError(f"{hf_dir}: tokenizer.json not found (needed for the tokenizer metadata)")
    tj = json.loads(tj_path.read_text(encoding="utf-8"))
    model = tj.get("model") or {}
    if model.get("type") != "BPE":
        raise ValueError(f"tokenizer.json: model.type={model.get('type')!r}; only byte-level BPE is supported")
    if (tj.get("decoder") or {}).get("type") != "ByteLevel":
        raise ValueError(f"tokenizer.json: decoder={tj.get('decoder')!r}; expected ByteLevel")
    pre = detect_pre_tokenizer(tj.get("pre_tokenizer"))

    by_id: dict[int, tuple[str, int]] = {}
    for text, i in model["vocab"].items():
        by_id[int(i)] = (text, NORMAL)
    added_by_content: dict[str, int] = {}
    for a in tj.get("added_tokens", []):
        i, text = int(a["id"]), a["content"]
        ty = CONTROL if (a.get("special") or _looks_special(text)) else USER_DEFINED
        by_id[i] = (text, ty)
        added_by_content[text] = i
    top = max(by_id) + 1
    if top > hp.n_vocab:
        raise ValueError(f"tokenizer.json has token id {top - 1} but config.json vocab_size={hp.n_vocab}")
    tokens, types = [], []
    for i in range(hp.n_vocab):
        text, ty = by_id.get(i, (f"[PAD{i}]", UNUSED))
        tokens.append(text)
        types.append(ty)

    merges = []
    for m in model.get("merges", []):
        merges.append(m if isinstance(m, str) else f"{m[0]} {m[1]}")

    tc_path = hf_dir / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text(encoding="utf-8")) if tc_path.exists() else {}
    content_to_id = {t: i for i, t in reversed(list(enumerate(tokens))) if types[i] != UNUSED}
    content_to_id.update(added_by_content)

    def special_id(kind: str, from_config: int | None) -> int | None:
        v = tc.get(f"{kind}_token")
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            if v not in content_to_id:
                raise ValueError(f"tokenizer_config.json: {kind}_token={v!r} is not in the vocabulary")
            return content_to_id[v]
        return from_config

    md: dict = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
    }
    for kind, key, cfg_v in (("bos", "bos_token_id", hp.bos_token_id), ("eos", "eos_token_id", hp.eos_token_id),
                             ("pad", "padding_token_id", hp.pad_token_id)):
        v = special_id(kind, cfg_v)
        if v is not None:
            if not (0 <= v < hp.n_vocab):
                raise ValueError(f"{kind} token id {v} is outside vocab_size={hp.n_vocab}")
            md[f"tokenizer.ggml.{key}"] = v
    md["tokenizer.ggml.add_bos_token"] = bool(tc.get("add_bos_token", False))
    if "add_eos_token" in tc:
        md["tokenizer.ggml.add_eos_token"] = bool(tc["add_eos_token"])
    tmpl = None
    jinja = hf_dir / "chat_template.jinja"
    if jinja.exists():
        tmpl = jinja.read_text(encoding="utf-8")
    elif isinstance(tc.get("chat_template"), str):
        tmpl = tc["chat_template"]
    elif isinstance(tc.get("chat_template"), list):
        named = {t.get("name"): t.get("template") for t in tc["chat_template"]}
        tmpl = named.get("default") or next(iter(named.values()), None)
    if tmpl:
        md["tokenizer.chat_template"] = tmpl
    return md


# ------------------------------------------------------------------------------------------------
# the plan: every output tensor with its GGUF name, numpy shape, type and a producer
# ------------------------------------------------------------------------------------------------

@dataclass
class _Out:
    name: str                       # GGUF tensor name
    shape: tuple[int, ...]          # numpy order (= ggml ne reversed)
    qtype: QT
    make: Callable[[], np.ndarray]  # float32 array of `shape`
    source: str                     # HF tensor(s) it comes from, for messages
    # optional: float32 pieces of `shape` along axis 0, in order (tables too large to hold whole; `make` unused)
    chunks: Callable[[], Iterable[np.ndarray]] | None = None
    raw: bool = False  # chunks are already encoded as qtype (synthetic blocks): their bytes are written as they are


_NEVER_QUANTIZE = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight")


def tensor_type(name: str, shape: tuple[int, ...], out_type: str) -> QT:
    """ggml type for one output tensor (spec §2.5): 1-D tensors, norms, routers, the shared-expert gate and
    conv1d stay F32; other >=2-D `*weight` tensors get `out_type`. Q8_0 needs rows (ne0 = shape[-1]) that are a
    multiple of 32; a tensor whose rows are not stays F16."""
    if len(shape) < 2 or not name.endswith("weight") or name.endswith("norm.weight") \
            or any(name.endswith(s) for s in _NEVER_QUANTIZE):
        return QT.F32
    qt = OUT_TYPES[out_type]
    block = gguf.GGML_QUANT_SIZES[qt][0]
    if shape[-1] % block != 0:
        log.warning("%s: rows of %d are not a multiple of %d; stored as F16 instead of %s",
                    name, shape[-1], block, qt.name)
        return QT.F16
    return qt


def _nbytes(shape: tuple[int, ...], qt: QT) -> int:
    block, size = gguf.GGML_QUANT_SIZES[qt]
    return math.prod(shape[:-1]) * (shape[-1] // block) * size


def _encode(a: np.ndarray, qt: QT) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.float32)
    if qt == QT.F32:
        return a
    if qt == QT.F16:
        return a.astype(np.float16)
    if qt == QT.IQ4_NL:
        return quantize_iq4_nl(a)
    return gguf.quants.quantize(a, qt)


def quantize_iq4_nl(a: np.ndarray) -> np.ndarray:
    """IQ4_NL blocks of a float32 array (..., cols), cols % 32 == 0 (gguf.quants has no IQ4_NL quantizer).
    Per block of 32: d = the value of largest magnitude / -127 (IQ4_NL's first table entry, as llama.cpp
    starts its search), each code the table entry nearest to x / d. Valid blocks, not llama.cpp's optimised
    choice of d."""
    kv = np.asarray(gguf.quants.IQ4_NL.kvalues, dtype=np.float32)
    shape = a.shape
    x = a.reshape(-1, 32).astype(np.float32)
    amax_at = np.abs(x).argmax(axis=1)
    d = (x[np.arange(len(x)), amax_at] / np.float32(-127.0)).astype(np.float16)
    df = d.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(df != 0, x / df, 0.0)
    codes = np.abs(y[:, :, None] - kv[None, None, :]).argmin(axis=2).astype(np.uint8)  # (nb, 32)
    qs = codes[:, :16] | (codes[:, 16:] << 4)
    blocks = np.concatenate([d.view(np.uint8).reshape(-1, 2), qs], axis=1)
    return blocks.reshape(*shape[:-1], shape[-1] // 32 * 18)


class _Planner:
    """Builds the output list, checking each HF tensor's presence and shape against config.json first."""

    def __init__(self, src: SafetensorsSource, hp: Hparams, out_type: str, layout: str):
        self.src, self.hp, self.out_type, self.layout = src, hp, out_type, layout
        self.outs: list[_Out] = []
        self.used: set[str] = set()

    def need(self, hf: str, shape: tuple[int, ...], purpose: str) -> str:
        if hf not in self.src:
            raise ValueError(f"missing tensor {hf!r} (needed for {purpose})")
        got = self.src.shape(hf)
        if tuple(got) != tuple(shape):
            raise ValueError(f"tensor {hf!r} has shape {list(got)}, config.json implies {list(shape)}")
        self.used.add(hf)
        return hf

    def add(self, name: str, shape: tuple[int, ...], make: Callable[[], np.ndarray], source: str):
        self.outs.append(_Out(name, tuple(shape), tensor_type(name, tuple(shape), self.out_type), make, source))

    def plain(self, name: str, hf: str, shape: tuple[int, ...], fn: Callable[[np.ndarray], np.ndarray] | None = None,
              out_shape: tuple[int, ...] | None = None):
        self.need(hf, shape, name)
        load = self.src.load
        make = (lambda: load(hf)) if fn is None else (lambda: fn(load(hf)))
        self.add(name, out_shape or shape, make, hf)

    def norm(self, name: str, hf: str, n: int, plus_one: bool = True):
        self.plain(name, hf, (n,), (lambda w: w + np.float32(1.0)) if plus_one else None)

    # ---- blocks -------------------------------------------------------------------------------
    def block(self, bid: int, pre: str, full_attention: bool):
        hp, H = self.hp, self.hp.n_embd
        b = f"blk.{bid}"
        self.norm(f"{b}.attn_norm.weight", f"{pre}input_layernorm.weight", H)
        if full_attention:
            self.attention(b, pre + "self_attn.")
        else:
            self.deltanet(b, pre + "linear_attn.")
        self.norm(f"{b}.post_attention_norm.weight", f"{pre}post_attention_layernorm.weight", H)
        self.moe(b, pre + "mlp.")

    def attention(self, b: str, pre: str):
        """Gated attention (q_proj rows per head [q | gate]), q/k norms +1."""
        hp, H = self.hp, self.hp.n_embd
        q_out, kv_out = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        self.plain(f"{b}.attn_q.weight", f"{pre}q_proj.weight", (2 * q_out, H))
        self.plain(f"{b}.attn_k.weight", f"{pre}k_proj.weight", (kv_out, H))
        self.plain(f"{b}.attn_v.weight", f"{pre}v_proj.weight", (kv_out, H))
        self.plain(f"{b}.attn_output.weight", f"{pre}o_proj.weight", (H, q_out))
        self.norm(f"{b}.attn_q_norm.weight", f"{pre}q_norm.weight", hp.head_dim)
        self.norm(f"{b}.attn_k_norm.weight", f"{pre}k_norm.weight", hp.head_dim)

    def deltanet(self, b: str, pre: str):
        hp, H = self.hp, self.hp.n_embd
        qkvz = f"{pre}in_proj_qkvz.weight"
        n_qkvz = 2 * hp.key_dim + 2 * hp.value_dim
        if self.layout == "legacy":
            self.plain(f"{b}.ssm_in.weight", qkvz, (n_qkvz, H))
        else:
            self.need(qkvz, (n_qkvz, H), f"{b}.attn_qkv.weight")
            load = self.src.load
            self.add(f"{b}.attn_qkv.weight", (hp.conv_dim, H), lambda: split_qkvz(load(qkvz), hp)[0], qkvz)
            self.add(f"{b}.attn_gate.weight", (hp.value_dim, H), lambda: split_qkvz(load(qkvz), hp)[1], qkvz)
        self.plain(f"{b}.ssm_ba.weight", f"{pre}in_proj_ba.weight", (2 * hp.nv, H))
        K = hp.conv_kernel
        self.plain(f"{b}.ssm_conv1d.weight", f"{pre}conv1d.weight", (hp.conv_dim, 1, K),
                   lambda w: w.reshape(hp.conv_dim, K), out_shape=(hp.conv_dim, K))
        self.plain(f"{b}.ssm_dt.bias", f"{pre}dt_bias", (hp.nv,))
        self.plain(f"{b}.ssm_a", f"{pre}A_log", (hp.nv,), lambda a: -np.exp(a))
        self.norm(f"{b}.ssm_norm.weight", f"{pre}norm.weight", hp.dv, plus_one=False)
        self.plain(f"{b}.ssm_out.weight", f"{pre}out_proj.weight", (H, hp.value_dim))

    def moe(self, b: str, pre: str):
        hp, H, E, I = self.hp, self.hp.n_embd, self.hp.n_expert, self.hp.n_ff_exp
        self.plain(f"{b}.ffn_gate_inp.weight", f"{pre}gate.weight", (E, H))
        load = self.src.load
        fused = next((n for n in (f"{pre}experts.gate_up_proj", f"{pre}experts.gate_up_proj.weight")
                      if n in self.src), None)
        if fused is not None:  # transformers-v5 layout: gate_up [E, 2I, H] (gate rows first), down [E, H, I]
            down = f"{pre}experts.down_proj"
            if down not in self.src:
                down += ".weight"
            self.need(fused, (E, 2 * I, H), f"{b}.ffn_gate_exps.weight")
            self.add(f"{b}.ffn_gate_exps.weight", (E, I, H), lambda: load(fused)[:, :I, :], fused)
            self.add(f"{b}.ffn_up_exps.weight", (E, I, H), lambda: load(fused)[:, I:, :], fused)
            self.plain(f"{b}.ffn_down_exps.weight", down, (E, H, I))
        else:  # per-expert checkpoint names, stacked on a new leading axis
            for part, shape in (("gate", (I, H)), ("up", (I, H)), ("down", (H, I))):
                names = [self.need(f"{pre}experts.{e}.{part}_proj.weight", shape, f"{b}.ffn_{part}_exps.weight")
                         for e in range(E)]
                self.add(f"{b}.ffn_{part}_exps.weight", (E, *shape),
                         (lambda ns: lambda: np.stack([load(n) for n in ns]))(names), f"{pre}experts.*.{part}_proj")
        S = hp.n_ff_shexp
        self.plain(f"{b}.ffn_gate_inp_shexp.weight", f"{pre}shared_expert_gate.weight", (1, H))
        self.plain(f"{b}.ffn_gate_shexp.weight", f"{pre}shared_expert.gate_proj.weight", (S, H))
        self.plain(f"{b}.ffn_up_shexp.weight", f"{pre}shared_expert.up_proj.weight", (S, H))
        self.plain(f"{b}.ffn_down_shexp.weight", f"{pre}shared_expert.down_proj.weight", (H, S))


def split_qkvz(w: np.ndarray, hp: Hparams) -> tuple[np.ndarray, np.ndarray]:
    """HF in_proj_qkvz [nk*(2dk + 2r*dv), H], grouped per key head as [q|k|v|z], into
    attn_qkv [2*nk*dk + nv*dv, H] = [q_all | k_all | v_all] and attn_gate [nv*dv, H] = z_all (spec §2.3.5).
    This is HF's post-fix_query_key_value_ordering channel order, so conv1d needs no reordering."""
    r = hp.nv // hp.nk
    g = w.reshape(hp.nk, 2 * hp.dk + 2 * r * hp.dv, -1)           # [nk, 768, H]
    q = g[:, :hp.dk]                                               # [nk, dk, H]
    k = g[:, hp.dk:2 * hp.dk]
    v = g[:, 2 * hp.dk:2 * hp.dk + r * hp.dv]                      # [nk, r*dv, H] = value heads g*r + j
    z = g[:, 2 * hp.dk + r * hp.dv:]
    H = w.shape[-1]
    qkv = np.concatenate([q.reshape(-1, H), k.reshape(-1, H), v.reshape(-1, H)], axis=0)
    return qkv, np.ascontiguousarray(z.reshape(-1, H))


def merge_qkvz(qkv: np.ndarray, gate: np.ndarray, hp: Hparams) -> np.ndarray:
    """Inverse of `split_qkvz`: rebuild HF's per-key-head grouped in_proj_qkvz."""
    r, H = hp.nv // hp.nk, qkv.shape[-1]
    q = qkv[:hp.key_dim].reshape(hp.nk, hp.dk, H)
    k = qkv[hp.key_dim:2 * hp.key_dim].reshape(hp.nk, hp.dk, H)
    v = qkv[2 * hp.key_dim:].reshape(hp.nk, r * hp.dv, H)
    z = gate.reshape(hp.nk, r * hp.dv, H)
    return np.concatenate([q, k, v, z], axis=1).reshape(-1, H)


def plan(src: SafetensorsSource, hp: Hparams, out_type: str, layout: str = "current",
         mtp: bool = True, mtp_only: bool = False, planner=None) -> tuple[list[_Out], int]:
    """Every output tensor in file order, and the number of MTP layers written (0 or 1).
    planner: the _Planner class (qwen35moe passes its own, with the Qwen3.5 DeltaNet).
    Raises ValueError for a missing/misshapen tensor or an HF tensor that nothing maps."""
    if out_type not in OUT_TYPES:
        raise ValueError(f"unknown output type {out_type!r} (choose from {', '.join(OUT_TYPES)})")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r} (choose from {', '.join(LAYOUTS)})")
    if mtp_only and not mtp:
        raise ValueError("--mtp-only and --no-mtp contradict each other")
    p = (planner or _Planner)(src, hp, out_type, layout)
    H, V = hp.n_embd, hp.n_vocab

    mtp_layers = sorted({int(m.group(1)) for n in src.names() if (m := re.match(r"mtp\.layers\.(\d+)\.", n))})
    has_mtp = any(n.startswith("mtp.") for n in src.names())
    if mtp_only and not has_mtp:
        raise ValueError("--mtp-only: the checkpoint has no mtp.* tensors")
    n_mtp = 1 if (mtp and has_mtp) else 0
    if n_mtp and mtp_layers != [0]:
        raise ValueError(f"MTP: expected exactly one layer mtp.layers.0, found mtp.layers.{mtp_layers}")

    # llama.cpp's MTP-only file keeps the embedding, the final norm and the head, which the MTP block shares.
    p.plain("token_embd.weight", "model.embed_tokens.weight", (V, H))
    if not mtp_only:
        for i in range(hp.n_layer):
            p.block(i, f"model.layers.{i}.", hp.is_full_attention(i))
    if n_mtp:
        n = hp.n_layer
        p.block(n, "mtp.layers.0.", full_attention=True)
        p.plain(f"blk.{n}.nextn.eh_proj.weight", "mtp.fc.weight", (H, 2 * H))
        p.norm(f"blk.{n}.nextn.enorm.weight", "mtp.pre_fc_norm_embedding.weight", H)
        p.norm(f"blk.{n}.nextn.hnorm.weight", "mtp.pre_fc_norm_hidden.weight", H)
        p.norm(f"blk.{n}.nextn.shared_head_norm.weight", "mtp.norm.weight", H)
    p.norm("output_norm.weight", "model.norm.weight", H)
    if hp.tie:
        p.used.add("lm_head.weight")  # a tied checkpoint may still carry a copy; it is not written
    else:
        p.plain("output.weight", "lm_head.weight", (V, H))

    skipped = {n for n in src.names() if n.startswith("mtp.")} if not n_mtp else set()
    if mtp_only:
        skipped |= {n for n in src.names() if n.startswith("model.layers.")}
    extra = sorted(set(src.names()) - p.used - skipped)
    if extra:
        raise ValueError(f"unexpected tensor {extra[0]!r} ({len(extra)} unmapped in all); "
                         f"is this a Qwen3-Next checkpoint matching config.json?")
    return p.outs, n_mtp


# ------------------------------------------------------------------------------------------------
# writing
# ------------------------------------------------------------------------------------------------

class U64Array(list):
    """A metadata list written as a GGUF uint64 array (int lists default to int32)."""


def _add_metadata(w: gguf.GGUFWriter, md: dict):
    for key, v in md.items():
        if isinstance(v, U64Array):
            w.add_key_value(key, list(v), gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.UINT64)
        elif isinstance(v, bool):
            w.add_bool(key, v)
        elif isinstance(v, int):
            w.add_uint32(key, v) if v >= 0 else w.add_int32(key, v)
        elif isinstance(v, float):
            w.add_float32(key, v)
        elif isinstance(v, str):
            w.add_string(key, v)
        elif isinstance(v, list):
            if v and isinstance(v[0], int) and not isinstance(v[0], bool):
                w.add_key_value(key, v, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
            else:
                w.add_array(key, v)
        else:
            raise TypeError(f"metadata {key}: unsupported value type {type(v).__name__}")


def model_metadata(hp: Hparams, out_type: str, name: str, n_mtp: int, arch: str = ARCH) -> dict:
    """general.* and qwen3next.* keys (spec §2.1), in the order llama.cpp writes them (`arch`: the prefix, for
    the architectures that build on these keys)."""
    a = arch
    md = {
        "general.type": "model",
        "general.name": name,
        "general.alignment": ALIGNMENT,
        f"{a}.block_count": hp.n_layer + n_mtp,
        f"{a}.context_length": hp.n_ctx,
        f"{a}.embedding_length": hp.n_embd,
        f"{a}.feed_forward_length": hp.n_ff,
        f"{a}.attention.head_count": hp.n_head,
        f"{a}.attention.head_count_kv": hp.n_head_kv,
        f"{a}.attention.key_length": hp.head_dim,
        f"{a}.attention.value_length": hp.head_dim,
        f"{a}.rope.freq_base": hp.rope_theta,
        f"{a}.attention.layer_norm_rms_epsilon": hp.eps,
        f"{a}.expert_count": hp.n_expert,
        f"{a}.expert_used_count": hp.n_expert_used,
        f"{a}.expert_feed_forward_length": hp.n_ff_exp,
        f"{a}.expert_shared_feed_forward_length": hp.n_ff_shexp,
        f"{a}.ssm.conv_kernel": hp.conv_kernel,
        f"{a}.ssm.state_size": hp.dk,
        f"{a}.ssm.group_count": hp.nk,
        f"{a}.ssm.time_step_rank": hp.nv,
        f"{a}.ssm.inner_size": hp.value_dim,
        f"{a}.full_attention_interval": hp.interval,
        f"{a}.rope.dimension_count": hp.rope_dim,
        "general.file_type": int(FILE_TYPES[out_type]),
        "general.quantization_version": gguf.GGML_QUANT_VERSION,
    }
    if n_mtp:
        md[f"{a}.nextn_predict_layers"] = n_mtp
    return md


def write_atomically(w: gguf.GGUFWriter, tmp: Path, out_path: Path, write: Callable[[], None]) -> None:
    """Run write() on the writer of `tmp`, then rename tmp to out_path; on any failure remove tmp, so a failed
    conversion never leaves a half-written file (or replaces a good one)."""
    try:
        write()
        w.close()
        os.replace(tmp, out_path)
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise


def convert(hf_dir, out_path, out_type: str = "f32", layout: str = "current", mtp: bool = True,
            mtp_only: bool = False) -> Path:
    """Convert the HF Qwen3-Next checkpoint in `hf_dir` into a `qwen3next` GGUF at `out_path`.

    out_type: a key of OUT_TYPES (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4) for >=2-D weight
    matrices (norms, routers, shared-expert gates, conv1d and 1-D tensors stay F32).
    layout: "current" (attn_qkv + attn_gate) or "legacy" (ssm_in).
    mtp=False drops `mtp.*`; mtp_only=True writes only the MTP block plus the shared token_embd/output_norm/output.
    Writes OUT.tmp and renames it, so a failure leaves no output. Returns the output path."""
    hf_dir, out_path = Path(hf_dir), Path(out_path)
    cfg_path = hf_dir / "config.json"
    if not cfg_path.exists():
        raise ValueError(f"{hf_dir}: config.json not found")
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    arch = OTHER_MODEL_TYPES.get(cfg.get("model_type"))
    if arch is not None:
        if layout != "current":
            raise ValueError(f"--layout {layout!r}: only qwen3next has a legacy GDN layout, this is {arch}")
        return _other(arch).convert(hf_dir, out_path, out_type, mtp=mtp, mtp_only=mtp_only)
    hp = read_hparams(cfg)
    src = SafetensorsSource(hf_dir)
    outs, n_mtp = plan(src, hp, out_type, layout, mtp, mtp_only)
    vocab_md = read_vocab(hf_dir, hp)
    name = Path(cfg.get("_name_or_path") or hf_dir.resolve().name).name or "qwen3next"
    md = model_metadata(hp, out_type, name, n_mtp)
    md.update(vocab_md)

    write_gguf(out_path, ARCH, md, outs)
    log.info("wrote %s: %d tensors, %s", out_path, len(outs), out_type)
    return out_path


def write_gguf(out_path: Path, arch: str, md: dict, outs: list[_Out]) -> None:
    """Write metadata `md` and the planned tensors `outs` (in order) to out_path, atomically (OUT.tmp, renamed)."""
    tmp = out_path.with_name(out_path.name + ".tmp")
    w = gguf.GGUFWriter(tmp, arch)

    def write():
        w.data_alignment = ALIGNMENT
        _add_metadata(w, md)
        for o in outs:
            # a non-uint8 placeholder dtype keeps `shape` as the logical (element) shape
            w.add_tensor_info(o.name, o.shape, np.dtype(np.float32), _nbytes(o.shape, o.qtype), raw_dtype=o.qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for o in outs:
            if o.chunks is not None:
                _write_chunked(w, o)
                continue
            a = o.make()
            if a.shape != o.shape:
                raise ValueError(f"{o.name} (from {o.source}): produced shape {a.shape}, planned {o.shape}")
            w.write_tensor_data(_encode(a, o.qtype))

    write_atomically(w, tmp, out_path, write)


def _write_chunked(w: gguf.GGUFWriter, o: _Out) -> None:
    """Write one tensor piece by piece (row blocks along axis 0, each encoded alone: every type here has blocks
    within a row), as GGUFWriter.write_tensor_data writes a whole one: aligned start, padding after."""
    fout = w.fout[0]
    if next(iter(w.tensors[0])) != o.name:  # tensor data must follow the order of the tensor infos
        raise RuntimeError(f"{o.name}: written out of order")
    ti = w.tensors[0].pop(o.name)
    w.write_padding(fout, fout.tell())
    rows = nbytes = 0
    for a in o.chunks():
        if not o.raw and (a.shape[1:] != o.shape[1:] or rows + a.shape[0] > o.shape[0]):
            raise ValueError(f"{o.name} (from {o.source}): piece of shape {a.shape} after {rows} rows "
                             f"does not fit the planned {o.shape}")
        data = np.ascontiguousarray(a) if o.raw else _encode(a, o.qtype)
        data.tofile(fout)
        rows += a.shape[0]
        nbytes += data.nbytes
    if nbytes != ti.nbytes:
        raise ValueError(f"{o.name} (from {o.source}): pieces give {nbytes} bytes ({rows} rows), planned "
                         f"{ti.nbytes} for {o.shape} {o.qtype.name}")
    w.write_padding(fout, ti.nbytes)
    w.state = gguf.gguf_writer.WriterState.WEIGHTS


# ------------------------------------------------------------------------------------------------
# reverse: GGUF -> HF checkpoint (for checking GGUFs against transformers)
# ------------------------------------------------------------------------------------------------

def gguf_metadata(reader: gguf.GGUFReader) -> dict:
    """Metadata of a GGUFReader as a plain dict (str/int/float/bool/list), skipping the GGUF.* header fields."""
    md = {}
    for name, f in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        md[name] = f.contents()
    return md


def _f32_repr(x: float) -> float:
    # shortest decimal that round-trips the stored float32 (1e-06, not 9.99999997e-07)
    return float(str(np.float32(x)))


class GGUFSource:
    """A GGUF read back for the reverse conversion: `md` (metadata), `key(k)` (an `{arch}.k` value, ValueError
    naming the file and key when missing without a default), `get(name)` (float32, numpy order, dequantized
    with gguf.quants.dequantize), `name in src`."""

    def __init__(self, path, arch: str):
        self.path = Path(path)
        self.arch = arch
        r = gguf.GGUFReader(self.path)
        self.md = gguf_metadata(r)
        if self.md.get("general.architecture") != arch:
            raise ValueError(f"{self.path}: general.architecture={self.md.get('general.architecture')!r}, "
                             f"expected {arch!r}")
        self.tensors = {t.name: t for t in r.tensors}

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def key(self, k: str, default=None):
        full = f"{self.arch}.{k}"
        if full not in self.md:
            if default is not None:
                return default
            raise ValueError(f"{self.path}: missing metadata {full}")
        return self.md[full]

    def get(self, name: str) -> np.ndarray:
        if name not in self.tensors:
            raise ValueError(f"{self.path}: missing tensor {name!r}")
        t = self.tensors[name]
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        return np.ascontiguousarray(a.reshape(tuple(int(x) for x in reversed(t.shape))), dtype=np.float32)

    def hparams(self, n_layer: int, cls=None, **extra) -> Hparams:
        """The Hparams fields every Qwen hybrid GGUF records (cls: an Hparams subclass, extra: its own fields)."""
        key, md = self.key, self.md
        nv = int(key("ssm.time_step_rank"))
        return (cls or Hparams)(
            n_vocab=int(self.tensors["token_embd.weight"].shape[1]), n_embd=int(key("embedding_length")),
            n_ff=int(key("feed_forward_length", 0)), n_layer=n_layer, n_head=int(key("attention.head_count")),
            n_head_kv=int(key("attention.head_count_kv")), head_dim=int(key("attention.key_length")),
            n_ctx=int(key("context_length")), eps=_f32_repr(key("attention.layer_norm_rms_epsilon")),
            rope_theta=_f32_repr(key("rope.freq_base")), rope_dim=int(key("rope.dimension_count")),
            n_expert=int(key("expert_count")), n_expert_used=int(key("expert_used_count")),
            n_ff_exp=int(key("expert_feed_forward_length")), n_ff_shexp=int(key("expert_shared_feed_forward_length")),
            conv_kernel=int(key("ssm.conv_kernel")), nk=int(key("ssm.group_count")), nv=nv,
            dk=int(key("ssm.state_size")), dv=int(key("ssm.inner_size")) // nv,
            interval=int(key("full_attention_interval", 4)), tie="output.weight" not in self.tensors,
            bos_token_id=md.get("tokenizer.ggml.bos_token_id"), eos_token_id=md.get("tokenizer.ggml.eos_token_id"),
            pad_token_id=md.get("tokenizer.ggml.padding_token_id"), **extra)


def minus1(a: np.ndarray) -> np.ndarray:
    """Undo the +1 folding of a zero-centred norm weight."""
    return a - np.float32(1.0)


def hf_attention(sd: dict, g: GGUFSource, b: str, pre: str):
    """Gated attention of block b (q/k/v/o, q/k norms) back to HF names under `pre`."""
    for hf, gg in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
        sd[f"{pre}self_attn.{hf}.weight"] = g.get(f"{b}.{gg}.weight")
    sd[f"{pre}self_attn.q_norm.weight"] = minus1(g.get(f"{b}.attn_q_norm.weight"))
    sd[f"{pre}self_attn.k_norm.weight"] = minus1(g.get(f"{b}.attn_k_norm.weight"))


def hf_moe(sd: dict, g: GGUFSource, b: str, m: str, H: int):
    """Router, per-expert and shared-expert weights of block b back to HF names under `m` (…mlp.)."""
    sd[m + "gate.weight"] = g.get(f"{b}.ffn_gate_inp.weight")
    for part in ("gate", "up", "down"):
        stacked = g.get(f"{b}.ffn_{part}_exps.weight")
        for e in range(stacked.shape[0]):
            sd[f"{m}experts.{e}.{part}_proj.weight"] = np.ascontiguousarray(stacked[e])
        sd[f"{m}shared_expert.{part}_proj.weight"] = g.get(f"{b}.ffn_{part}_shexp.weight")
    sd[m + "shared_expert_gate.weight"] = g.get(f"{b}.ffn_gate_inp_shexp.weight").reshape(1, H)


def hf_mtp_head(sd: dict, g: GGUFSource, n: int):
    """The nextn tensors of MTP block n back to mtp.fc and the three mtp norms."""
    sd["mtp.fc.weight"] = g.get(f"blk.{n}.nextn.eh_proj.weight")
    sd["mtp.pre_fc_norm_embedding.weight"] = minus1(g.get(f"blk.{n}.nextn.enorm.weight"))
    sd["mtp.pre_fc_norm_hidden.weight"] = minus1(g.get(f"blk.{n}.nextn.hnorm.weight"))
    sd["mtp.norm.weight"] = minus1(g.get(f"blk.{n}.nextn.shared_head_norm.weight"))


def write_hf(out_dir: Path, cfg: dict, sd: dict, g: GGUFSource) -> Path:
    """config.json, model.safetensors (as given) and the tokenizer files of a reverse conversion."""
    from safetensors.numpy import save_file
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(sd, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    _write_hf_tokenizer(g.md, out_dir, g.path, g.arch)
    return out_dir


def gguf_to_hf(gguf_path, out_dir) -> Path:
    """Write an HF checkpoint (config.json, model.safetensors in fp32, tokenizer.json and tokenizer_config.json
    when the tokenizer metadata is usable) equivalent to the GGUF: dequantized with gguf.quants.dequantize, with
    every conversion transform undone. `mtp.*` tensors are included when present. Qwen3-Next here; qwen35moe and
    qwen4exp files go to their modules (by general.architecture)."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    arch = _file_architecture(gguf_path)
    if arch in OTHER_ARCHS:
        return _other(arch).gguf_to_hf(gguf_path, out_dir)
    g = GGUFSource(gguf_path, ARCH)
    n_mtp = int(g.key("nextn_predict_layers", 0))
    n_layer = int(g.key("block_count")) - n_mtp
    if "blk.0.attn_norm.weight" not in g:
        raise ValueError(f"{gguf_path}: has no blk.0 tensors (an MTP-only GGUF cannot become a full HF model)")
    hp = g.hparams(n_layer)
    get = g.get
    sd: dict[str, np.ndarray] = {"model.embed_tokens.weight": get("token_embd.weight")}

    def block(bid: int, pre: str, full_attention: bool):
        b = f"blk.{bid}"
        sd[f"{pre}input_layernorm.weight"] = minus1(get(f"{b}.attn_norm.weight"))
        sd[f"{pre}post_attention_layernorm.weight"] = minus1(get(f"{b}.post_attention_norm.weight"))
        if full_attention:
            hf_attention(sd, g, b, pre)
        else:
            la = pre + "linear_attn."
            if f"{b}.attn_qkv.weight" in g:
                sd[la + "in_proj_qkvz.weight"] = merge_qkvz(get(f"{b}.attn_qkv.weight"),
                                                            get(f"{b}.attn_gate.weight"), hp)
            else:
                sd[la + "in_proj_qkvz.weight"] = get(f"{b}.ssm_in.weight")
            sd[la + "in_proj_ba.weight"] = get(f"{b}.ssm_ba.weight")
            sd[la + "conv1d.weight"] = get(f"{b}.ssm_conv1d.weight")[:, None, :]
            sd[la + "dt_bias"] = get(f"{b}.ssm_dt.bias")
            sd[la + "A_log"] = np.log(-get(f"{b}.ssm_a"))
            sd[la + "norm.weight"] = get(f"{b}.ssm_norm.weight")
            sd[la + "out_proj.weight"] = get(f"{b}.ssm_out.weight")
        hf_moe(sd, g, b, pre + "mlp.", hp.n_embd)

    for i in range(n_layer):
        block(i, f"model.layers.{i}.", hp.is_full_attention(i))
    if n_mtp:
        block(n_layer, "mtp.layers.0.", True)
        hf_mtp_head(sd, g, n_layer)
    sd["model.norm.weight"] = minus1(get("output_norm.weight"))
    if not hp.tie:
        sd["lm_head.weight"] = get("output.weight")

    cfg = {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "dtype": "float32",
        "vocab_size": hp.n_vocab, "hidden_size": hp.n_embd, "intermediate_size": hp.n_ff,
        "num_hidden_layers": n_layer, "num_attention_heads": hp.n_head, "num_key_value_heads": hp.n_head_kv,
        "head_dim": hp.head_dim, "hidden_act": "silu", "attention_bias": False,
        "max_position_embeddings": hp.n_ctx, "rms_norm_eps": hp.eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": hp.rope_theta,
                            "partial_rotary_factor": hp.rope_dim / hp.head_dim},
        "linear_conv_kernel_dim": hp.conv_kernel, "linear_key_head_dim": hp.dk, "linear_value_head_dim": hp.dv,
        "linear_num_key_heads": hp.nk, "linear_num_value_heads": hp.nv,
        "num_experts": hp.n_expert, "num_experts_per_tok": hp.n_expert_used, "norm_topk_prob": True,
        "moe_intermediate_size": hp.n_ff_exp, "shared_expert_intermediate_size": hp.n_ff_shexp,
        "decoder_sparse_step": 1, "mlp_only_layers": [],
        "layer_types": ["full_attention" if hp.is_full_attention(i) else "linear_attention" for i in range(n_layer)],
        "tie_word_embeddings": hp.tie,
        "bos_token_id": hp.bos_token_id, "eos_token_id": hp.eos_token_id, "pad_token_id": hp.pad_token_id,
    }
    if n_mtp:
        cfg["mtp_num_hidden_layers"] = n_mtp
    return write_hf(out_dir, cfg, sd, g)


def _write_hf_tokenizer(md: dict, out_dir: Path, gguf_path: Path, arch: str = ARCH):
    from .tokenizer import Tokenizer
    try:
        tok = Tokenizer.from_metadata(md)
    except ValueError as e:
        log.warning("%s: tokenizer not reconstructed: %s", gguf_path, e)
        return
    tok.hf_tokenizer.save(str(out_dir / "tokenizer.json"))
    tc: dict = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": tok.add_bos,
                "model_max_length": int(md.get(f"{arch}.context_length", 0)) or None}
    for kind, i in (("bos", tok.bos_id), ("eos", tok.eos_id), ("pad", tok.pad_id)):
        tc[f"{kind}_token"] = tok.tokens[i] if i is not None else None
    if "tokenizer.chat_template" in md:
        tc["chat_template"] = md["tokenizer.chat_template"]
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tc, indent=2, ensure_ascii=False) + "\n")


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m strata_py.convert",
                                 description="Convert a Hugging Face Qwen3-Next, Qwen3.5-MoE or Qwen4-Exp "
                                             "checkpoint to a qwen3next / qwen35moe / qwen4exp GGUF.")
    ap.add_argument("hf_dir", help="directory with config.json, *.safetensors and tokenizer.json")
    ap.add_argument("out", help="output .gguf path (written atomically)")
    ap.add_argument("--type", dest="out_type", choices=sorted(OUT_TYPES), default="f32",
                    help="type of >=2-D weight matrices (norms, routers, conv1d stay f32)")
    ap.add_argument("--layout", choices=LAYOUTS, default="current",
                    help="GDN input projection: attn_qkv+attn_gate (current) or raw ssm_in (legacy)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--no-mtp", action="store_true", help="drop the mtp.* tensors")
    g.add_argument("--mtp-only", action="store_true",
                   help="write only the MTP block (plus token_embd, output_norm, output), as llama.cpp's --mtp")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        convert(args.hf_dir, args.out, args.out_type, layout=args.layout, mtp=not args.no_mtp,
                mtp_only=args.mtp_only)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
