"""Hugging Face Qwen4-Exp / Qwen3.8-Flash-Next (`Qwen4ExpForCausalLM` / `...ForConditionalGeneration`) <-> GGUF
`qwen4exp` in llama.cpp's layout (spec qwen4exp.md §1, §3). Called by `convert.convert` / `convert.gguf_to_hf`.

On top of the Qwen3.5 trunk (convert_qwen35.py: DeltaNet projections, V-head reorder, mRoPE sections, experts):
  1. hyper-connections replace every norm: per block `hc_{attn,ffn}_{norm,down,up,inject}`, and the head mixer
     `output_hc_{norm,down,up}` replaces `output_norm`; the three hc norms get +1;
  2. QSA layers (`indexed_attention`; a real config.json says `full_attention`, both are read as QSA, since
     transformers runs QSA on every non-linear layer): the indexer's fused `index_qk_proj` is split into
     `indexer.q_proj` (rows [0, ni*di)) and `indexer.k_proj` (the last di rows); `indexer.{q,k}_norm` get +1;
     `attention.compress_ratios` holds the ratio on every QSA layer, 0 on the others. llama.cpp's converter
     writes all zeros here when the config says `indexed_attention` (spec §3.3), which makes llama.cpp run dense
     attention: this converter never writes an all-zero list for a model with QSA layers;
  3. PLE (one layer): the table shards `ngram_embedding.shard_{0..S-1}` are concatenated in index order into
     `per_layer_token_embd.weight` [dP, rows], streamed shard by shard (the real table is ~90 GiB); `ple_key`,
     `ple_value`, `ple_norm_{key,query,conv}` (+1), `ple_conv1d` (squeezed); the int64 buffers become the u64
     arrays `ple.{layer_multipliers,head_offsets,head_vocab_sizes}` bit for bit; `ple.eos_token_id` is the EOS
     the PLE hash resets on, which transformers takes as the FIRST entry of a list (llama.cpp's converter writes
     the last: spec §3.3); `ple.layers` is 0-based;
  4. `mtp.*` is dropped (llama.cpp has no MTP for qwen4exp).
Extension (not written by llama.cpp): when the GDN output gate is not sigmoid (`output_gate_type` unset means
`hidden_act`, silu), the file says so in `qwen4exp.ssm.output_gate_type`; llama.cpp ignores the key and always
computes sigmoid (spec §6), so such a file runs differently there. For sigmoid models the key is absent.
Refused because llama.cpp cannot load them: several PLE layers, ple_embed_dim != hidden_size, dk != dv,
indexer_kv_heads != 1, norm_topk_prob false.
"""
from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from . import convert as cv
from . import convert_qwen35 as q35
from . import ple_constants

log = logging.getLogger("strata.convert")

ARCH = "qwen4exp"
MODEL_TYPES = ("qwen4_exp_text", "qwen4_exp")
GATES = ("sigmoid", "silu")
_PLE_BUFFERS = ("layer_multipliers", "ngram_heads_offsets", "ngram_heads_vocab_sizes")


@dataclass(frozen=True)
class Hparams(q35.Hparams):
    """The Qwen3.5 trunk plus hyper-connections, the QSA indexer and PLE."""
    hc: int = 4                     # hc_count residual streams
    hc_rank: int = 320              # hc_lowrank
    ni: int = 0                     # indexer_n_heads
    di: int = 0                     # indexer_head_dim
    budget: int = 0                 # indexer_budget (tokens)
    ratio: int = 0                  # indexer_compress_ratio
    gate: str = "sigmoid"           # GDN output gate activation
    ple_layers: tuple[int, ...] = ()  # 0-based
    ngram: int = 3                  # ngram_size N (conv dilation)
    hpn: int = 8                    # heads_per_ngram
    ple_kernel: int = 4             # ple_conv_kernel_size
    ple_dim: int = 0                # ple_embed_dim P (= H)
    ple_eos: int | None = None      # the id the n-gram context resets on
    ple_shards: int = 512           # split_ngram_parts
    ple_base: int = 20_000_000      # ngram_vocab_size_base
    ple_seed: int = 1234            # seed
    image_token_id: int | None = None

    @property
    def hc_dim(self) -> int:
        return self.hc * self.n_embd

    @property
    def ple_heads(self) -> int:
        return (self.ngram - 1) * self.hpn

    @property
    def ple_row(self) -> int:
        return self.ple_dim // self.ple_heads

    def compress_ratios(self) -> list[int]:
        return [self.ratio if self.is_full_attention(i) else 0 for i in range(self.n_layer)]


def read_hparams(cfg: dict) -> Hparams:
    """Check a Qwen4-Exp config.json and extract what the converter needs; ValueError names the key and value.
    Defaults are the config class's (hc_count 4, hc_lowrank 320, ngram_size 3, heads_per_ngram 8, ...)."""
    top = cfg
    cfg = q35.text_config(cfg, MODEL_TYPES, "qwen4exp")
    c = q35._Config(cfg)
    c.want("norm_topk_prob", (True,), "only true is supported (llama.cpp always renormalises the top-k weights)")
    gate = cfg.get("output_gate_type") or cfg.get("hidden_act", "silu")
    if gate not in GATES:
        raise ValueError(f"config.json: output_gate_type={cfg.get('output_gate_type')!r} (hidden_act="
                         f"{cfg.get('hidden_act')!r}): the GDN output gate must be one of {', '.join(GATES)}")
    hc, rank = int(cfg.get("hc_count", 4)), int(cfg.get("hc_lowrank", 320))
    if hc <= 1:
        c.bad("hc_count", "must be > 1")
    if rank <= 0:
        c.bad("hc_lowrank", "must be > 0")

    # QSA: transformers builds an indexer on every attention layer, so all five fields are required
    qsa = {}
    for k in ("indexer_n_heads", "indexer_kv_heads", "indexer_head_dim", "indexer_budget", "indexer_compress_ratio"):
        if cfg.get(k) is None:
            raise ValueError(f"config.json: missing key {k!r} (every Qwen4-Exp attention layer runs QSA)")
        qsa[k] = int(cfg[k])
        if qsa[k] <= 0:
            c.bad(k, "must be > 0")
    if qsa["indexer_kv_heads"] != 1:
        c.bad("indexer_kv_heads", "must be 1 (one indexer key head)")
    if qsa["indexer_budget"] % qsa["indexer_compress_ratio"]:
        c.bad("indexer_budget", f"must be a multiple of indexer_compress_ratio={qsa['indexer_compress_ratio']}")

    ple_ids = sorted(set(int(x) for x in (cfg.get("ple_layer_ids") or [])))
    n_layer = int(c.req("num_hidden_layers"))
    extra = dict(hc=hc, hc_rank=rank, ni=qsa["indexer_n_heads"], di=qsa["indexer_head_dim"],
                 budget=qsa["indexer_budget"], ratio=qsa["indexer_compress_ratio"], gate=gate,
                 ngram=int(cfg.get("ngram_size", 3)), hpn=int(cfg.get("heads_per_ngram", 8)),
                 ple_kernel=int(cfg.get("ple_conv_kernel_size", 4)),
                 ple_dim=int(cfg.get("ple_embed_dim") or c.req("hidden_size")),
                 ple_shards=int(cfg.get("split_ngram_parts", 512)),
                 ple_base=int(cfg.get("ngram_vocab_size_base", 20_000_000)), ple_seed=int(cfg.get("seed", 1234)),
                 image_token_id=cv._first_id(top.get("image_token_id", cfg.get("image_token_id"))))
    hp = q35.read_trunk(cfg, "linear_attention", ("indexed_attention", "full_attention"), 1.0, cls=Hparams,
                        ple_layers=tuple(i - 1 for i in ple_ids), **extra)
    if hp.rope_dim > hp.di:
        c.bad("indexer_head_dim", f"must be >= the rotary dims {hp.rope_dim} (the indexer queries use the "
                                  f"attention's RoPE)")
    if not any(hp.is_full_attention(i) for i in range(n_layer)):
        c.bad("layer_types", "has no indexed_attention layer")
    if ple_ids:
        if len(ple_ids) > 1:
            c.bad("ple_layer_ids", "llama.cpp supports exactly one PLE layer")
        if not 1 <= ple_ids[0] <= n_layer or hp.is_full_attention(ple_ids[0] - 1):
            c.bad("ple_layer_ids", f"must name a linear_attention layer, 1-based in [1, {n_layer}]")
        if hp.ngram < 2 or hp.hpn < 1 or hp.ple_kernel < 1:
            raise ValueError(f"config.json: ngram_size={hp.ngram}, heads_per_ngram={hp.hpn}, "
                             f"ple_conv_kernel_size={hp.ple_kernel}: need >= 2, >= 1, >= 1")
        if hp.ple_dim != hp.n_embd:
            c.bad("ple_embed_dim", f"must equal hidden_size={hp.n_embd} (llama.cpp loads ple_key as [H, hc*H])")
        if hp.ple_dim % hp.ple_heads:
            c.bad("ple_embed_dim", f"must be a multiple of the {hp.ple_heads} n-gram heads")
        eos = cfg.get("eos_token_id")
        eos = eos[0] if isinstance(eos, list) and eos else eos  # transformers' PLE: the first entry
        if eos is None or isinstance(eos, list):
            c.bad("eos_token_id", "must be set when PLE is on (the n-gram context resets on it)")
        hp = dataclasses.replace(hp, ple_eos=int(eos))
    return hp


# ------------------------------------------------------------------------------------------------
# the PLE table and buffers
# ------------------------------------------------------------------------------------------------

def _load_i64(src: cv.SafetensorsSource, name: str) -> list[int]:
    """An int64 buffer read exactly (SafetensorsSource.load widens to float32, which would round the 45-bit
    and larger multipliers)."""
    path, dt, shape, b0, b1 = src.entries[name]
    if dt != "I64":
        raise ValueError(f"tensor {name!r} has dtype {dt}, expected I64 (the PLE hash constants are 64-bit integers)")
    with open(path, "rb") as f:
        f.seek(b0)
        a = np.frombuffer(f.read(b1 - b0), dtype="<i8")
    return [int(x) for x in a]


def _load_rows(src: cv.SafetensorsSource, name: str, r0: int, r1: int) -> np.ndarray:
    """Rows [r0, r1) of a 2-D float tensor as float32, read from its byte range only."""
    path, dt, shape, b0, _ = src.entries[name]
    item = np.dtype(cv._ST_DTYPES[dt]).itemsize
    row = shape[1] * item
    with open(path, "rb") as f:
        f.seek(b0 + r0 * row)
        a = np.frombuffer(f.read((r1 - r0) * row), dtype=cv._ST_DTYPES[dt]).reshape(r1 - r0, shape[1])
    if dt == "BF16":
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


class Planner(q35.Planner):
    """The qwen4exp tensor plan: hyper-connections, QSA, PLE, the Qwen3.5 DeltaNet and MoE."""

    def hc_module(self, gg: str, hf: str, inject: bool):
        hp, R = self.hp, self.hp.hc_rank
        self.norm(f"{gg}_norm.weight", f"{hf}.hc_norm.weight", hp.hc_dim)
        self.plain(f"{gg}_down.weight", f"{hf}.input_mix_weight_down.weight", (R, hp.hc_dim))
        self.plain(f"{gg}_up.weight", f"{hf}.input_mix_weight_up.weight", (hp.hc_dim, R))
        if inject:
            self.plain(f"{gg}_inject.weight", f"{hf}.block_inject_weight.weight", (hp.hc, hp.hc_dim))

    def qsa(self, b: str, pre: str):
        hp, H = self.hp, self.hp.n_embd
        self.attention(b, pre)
        qk, n_q = f"{pre}indexer.index_qk_proj.weight", hp.ni * hp.di
        self.need(qk, (n_q + hp.di, H), f"{b}.indexer.q_proj.weight")
        load = self.src.load
        self.add(f"{b}.indexer.q_proj.weight", (n_q, H), lambda: load(qk)[:n_q], qk)
        self.add(f"{b}.indexer.k_proj.weight", (hp.di, H), lambda: load(qk)[n_q:], qk)
        self.norm(f"{b}.indexer.q_norm.weight", f"{pre}indexer.q_layernorm.weight", hp.di)
        self.norm(f"{b}.indexer.k_norm.weight", f"{pre}indexer.k_layernorm.weight", hp.di)

    def ple(self, b: str, pre: str):
        hp = self.hp
        self.plain(f"{b}.ple_key.weight", f"{pre}key_proj.weight", (hp.hc_dim, hp.ple_dim))
        self.plain(f"{b}.ple_value.weight", f"{pre}value_proj.weight", (hp.n_embd, hp.ple_dim))
        for n in ("key", "query", "conv"):
            self.norm(f"{b}.ple_norm_{n}.weight", f"{pre}norm_{n}.weight", hp.hc_dim)
        K = hp.ple_kernel
        self.plain(f"{b}.ple_conv1d.weight", f"{pre}conv1d.weight", (hp.hc_dim, 1, K),
                   lambda w: w.reshape(hp.hc_dim, K), out_shape=(hp.hc_dim, K))

    def block(self, bid: int, pre: str, full_attention: bool):
        b = f"blk.{bid}"
        if bid in self.hp.ple_layers:
            self.ple(b, pre + "ple.")
        self.hc_module(f"{b}.hc_attn", pre + "attn_hyper_connection", inject=True)
        if full_attention:
            self.qsa(b, pre + "self_attn.")
        else:
            self.deltanet(b, pre + "linear_attn.")
        self.hc_module(f"{b}.hc_ffn", pre + "mlp_hyper_connection", inject=True)
        self.moe(b, pre + "mlp.")

    def ple_table(self, layer: int, pre: str) -> dict:
        """per_layer_token_embd.weight from the shards (or one unsharded table), streamed; returns the u64 arrays
        (and checks them against the table and the config)."""
        hp = self.hp
        emb = f"{pre}ple_embedding."
        bufs = {}
        for k in _PLE_BUFFERS:
            name = emb + k
            want = hp.ngram if k == "layer_multipliers" else hp.ple_heads
            self.need(name, (want,), "the PLE metadata")
            bufs[k] = _load_i64(self.src, name)
        sizes, offsets, mult = bufs["ngram_heads_vocab_sizes"], bufs["ngram_heads_offsets"], bufs["layer_multipliers"]
        if any(v <= 0 for v in sizes) or offsets != ple_constants.head_offsets(sizes):
            raise ValueError(f"{emb}ngram_heads_offsets={offsets} are not the running sums of "
                             f"ngram_heads_vocab_sizes={sizes}")
        bound = ((1 << 63) - 1) // hp.n_vocab
        if any(m <= 0 or m % 2 == 0 or m > bound for m in mult):
            raise ValueError(f"{emb}layer_multipliers={mult}: need odd values in [1, (2^63-1)//vocab_size={bound}]")
        k = hp.ple_layers.index(layer)
        for what, got, derived in (
                ("ngram_heads_vocab_sizes", sizes, ple_constants.head_vocab_sizes(hp.ple_base, hp.ple_heads, k)),
                ("layer_multipliers", mult, ple_constants.layer_multipliers(hp.n_vocab, hp.ngram, k, hp.ple_seed))):
            if got != derived:  # transformers computes the forward from the loaded buffers, so they are the truth
                log.warning("%s%s=%s differ from what config.json derives (%s); writing the checkpoint's",
                            emb, what, got, derived)

        dP = hp.ple_row
        single = emb + "ngram_embedding.weight"
        shards = sorted(((int(m.group(1)), n) for n in self.src.names()
                         if (m := re.fullmatch(re.escape(emb) + r"ngram_embedding\.shard_(\d+)\.weight", n))))
        if single in self.src:
            if shards:
                raise ValueError(f"{single!r} and {len(shards)} shards {shards[0][1]!r}, ... are both present")
            parts = [single]
        else:
            idx = [i for i, _ in shards]
            if idx != list(range(hp.ple_shards)):
                missing = sorted(set(range(hp.ple_shards)) - set(idx))
                raise ValueError(f"PLE table: found {len(idx)} shards {emb}ngram_embedding.shard_*.weight, config.json "
                                 f"split_ngram_parts={hp.ple_shards} needs shard_0..shard_{hp.ple_shards - 1}"
                                 + (f" (missing shard_{missing[0]})" if missing else
                                    f" (unexpected shard_{max(set(idx) - set(range(hp.ple_shards)))})"))
            parts = [n for _, n in shards]
        rows = 0
        for n in parts:
            s = self.src.shape(n)
            if len(s) != 2 or s[1] != dP:
                raise ValueError(f"tensor {n!r} has shape {list(s)}, expected [rows, {dP}] (ple_embed_dim / "
                                 f"{hp.ple_heads} n-gram heads)")
            rows += s[0]
            self.used.add(n)
        if rows < sum(sizes):
            raise ValueError(f"PLE table {emb}ngram_embedding has {rows} rows, fewer than the {sum(sizes)} the "
                             f"heads index (sum of ngram_heads_vocab_sizes)")
        src = self.src

        def chunks() -> Iterator[np.ndarray]:
            step = max(1, (1 << 26) // (4 * dP))  # 64 MiB of float32 at a time
            for n in parts:
                r = src.shape(n)[0]
                for r0 in range(0, r, step):
                    yield _load_rows(src, n, r0, min(r, r0 + step))

        o = cv._Out("per_layer_token_embd.weight", (rows, dP), cv.tensor_type("per_layer_token_embd.weight",
                    (rows, dP), self.out_type), None, f"{emb}ngram_embedding.*", chunks=chunks)
        self.outs.append(o)
        return {"layer_multipliers": cv.U64Array(mult), "head_offsets": cv.U64Array(offsets),
                "head_vocab_sizes": cv.U64Array(sizes), "row": dP}


def plan(src: cv.SafetensorsSource, hp: Hparams, out_type: str) -> tuple[list[cv._Out], dict | None]:
    """Every output tensor in file order and the PLE arrays (None without PLE). ValueError names a missing,
    misshapen or unmapped tensor."""
    if out_type not in cv.OUT_TYPES:
        raise ValueError(f"unknown output type {out_type!r} (choose from {', '.join(cv.OUT_TYPES)})")
    p = Planner(src, hp, out_type, "current")
    H, V = hp.n_embd, hp.n_vocab
    p.plain("token_embd.weight", "model.embed_tokens.weight", (V, H))
    ple = None
    for i in range(hp.n_layer):
        pre = f"model.layers.{i}."
        p.block(i, pre, hp.is_full_attention(i))
        if i in hp.ple_layers:
            ple = p.ple_table(i, pre + "ple.")
    p.hc_module("output_hc", "model.hyper_connection_mixer", inject=False)
    if hp.tie:
        p.used.add("lm_head.weight")
    else:
        p.plain("output.weight", "lm_head.weight", (V, H))
    mtp = {n for n in src.names() if n.startswith("mtp.")}
    if mtp:
        log.info("leaving out %d mtp.* tensors: llama.cpp's qwen4exp has no MTP block", len(mtp))
    extra = sorted(set(src.names()) - p.used - mtp)
    if extra:
        raise ValueError(f"unexpected tensor {extra[0]!r} ({len(extra)} unmapped in all); "
                         f"is this a Qwen4-Exp checkpoint matching config.json?")
    return p.outs, ple


def model_metadata(hp: Hparams, out_type: str, name: str, ple: dict | None) -> dict:
    """The qwen4exp keys (spec §3.1) in llama.cpp's order and types."""
    a = ARCH
    md = q35.trunk_metadata(a, hp, out_type, name, 0)
    qv = md.pop("general.quantization_version")  # llama.cpp writes it after the architecture's keys
    md.update({
        f"{a}.hyper_connection.count": hp.hc,
        f"{a}.hyper_connection.low_rank": hp.hc_rank,
        f"{a}.attention.indexer.head_count": hp.ni,
        f"{a}.attention.indexer.key_length": hp.di,
        f"{a}.attention.indexer.top_k": hp.budget,
        f"{a}.attention.compress_ratios": hp.compress_ratios(),
    })
    if ple is not None:
        md.update({
            f"{a}.ple.layers": list(hp.ple_layers),
            f"{a}.ple.ngram_size": hp.ngram,
            f"{a}.ple.heads_per_ngram": hp.hpn,
            f"{a}.ple.conv_kernel": hp.ple_kernel,
            f"{a}.ple.eos_token_id": hp.ple_eos,
        })
        if hp.image_token_id is not None:
            md[f"{a}.ple.image_token_id"] = hp.image_token_id
        md.update({
            f"{a}.embedding_length_per_layer_input": ple["row"],
            f"{a}.ple.layer_multipliers": ple["layer_multipliers"],
            f"{a}.ple.head_offsets": ple["head_offsets"],
            f"{a}.ple.head_vocab_sizes": ple["head_vocab_sizes"],
        })
    if hp.gate != "sigmoid":
        md[f"{a}.ssm.output_gate_type"] = hp.gate
    md["general.quantization_version"] = qv
    return md


def convert(hf_dir, out_path, out_type: str = "f32", mtp: bool = True, mtp_only: bool = False) -> Path:
    """Convert the HF Qwen4-Exp checkpoint in `hf_dir` into a `qwen4exp` GGUF at `out_path` (atomically).
    `mtp.*` tensors are always left out (mtp=False changes nothing); mtp_only is refused."""
    if mtp_only:
        raise ValueError("--mtp-only: a qwen4exp GGUF has no MTP block (llama.cpp drops Qwen4-Exp's mtp.*)")
    hf_dir, out_path = Path(hf_dir), Path(out_path)
    cfg = q35.read_config(hf_dir)
    hp = read_hparams(cfg)
    if hp.gate != "sigmoid":
        log.warning("output_gate_type=%r: written as %s.ssm.output_gate_type; llama.cpp ignores it and computes a "
                    "sigmoid gate", hp.gate, ARCH)
    src = q35.text_source(hf_dir)
    outs, ple = plan(src, hp, out_type)
    md = model_metadata(hp, out_type, q35.model_name(cfg, hf_dir, ARCH), ple)
    md.update(cv.read_vocab(hf_dir, hp))
    cv.write_gguf(out_path, ARCH, md, outs)
    log.info("wrote %s: %d tensors, %s", out_path, len(outs), out_type)
    return out_path


# ------------------------------------------------------------------------------------------------
# reverse: GGUF -> HF (for tests)
# ------------------------------------------------------------------------------------------------

def _hf_hc(sd: dict, g: cv.GGUFSource, gg: str, hf: str, inject: bool):
    sd[f"{hf}.hc_norm.weight"] = cv.minus1(g.get(f"{gg}_norm.weight"))
    sd[f"{hf}.input_mix_weight_down.weight"] = g.get(f"{gg}_down.weight")
    sd[f"{hf}.input_mix_weight_up.weight"] = g.get(f"{gg}_up.weight")
    if inject:
        sd[f"{hf}.block_inject_weight.weight"] = g.get(f"{gg}_inject.weight")


def gguf_to_hf(gguf_path, out_dir) -> Path:
    """Write an HF Qwen4-Exp checkpoint (`Qwen4ExpForCausalLM`, fp32) equivalent to the qwen4exp GGUF, every
    transform undone. The PLE table is written as one shard (`split_ngram_parts` = 1); the config fields the
    GGUF does not record are chosen so transformers rebuilds the same table shape: ngram_vocab_size_base = the
    first head's size (the same consecutive primes) and make_ngram_vocab_size_divisible_by = the table's rows;
    the hash constants are the file's u64 arrays, loaded as the int64 buffers."""
    g = cv.GGUFSource(gguf_path, ARCH)
    n_layer = int(g.key("block_count"))
    ratios = [int(x) for x in g.key("attention.compress_ratios")]
    ple_layers = tuple(int(x) for x in g.key("ple.layers", []))
    hp = q35.trunk_hparams(g, n_layer, Hparams, hc=int(g.key("hyper_connection.count")),
                           hc_rank=int(g.key("hyper_connection.low_rank")),
                           ni=int(g.key("attention.indexer.head_count")), di=int(g.key("attention.indexer.key_length")),
                           budget=int(g.key("attention.indexer.top_k")), gate=str(g.key("ssm.output_gate_type",
                                                                                        "sigmoid")),
                           ple_layers=ple_layers)
    qsa = [i for i in range(n_layer) if hp.is_full_attention(i)]
    if len(ratios) != n_layer or any(ratios[i] != 0 for i in range(n_layer) if i not in qsa):
        raise ValueError(f"{g.path}: {ARCH}.attention.compress_ratios={ratios}: need {n_layer} entries, 0 on "
                         f"every recurrent layer")
    got = {ratios[i] for i in qsa}
    if got == {0}:
        raise ValueError(f"{g.path}: {ARCH}.attention.compress_ratios are all 0 but the file has indexer tensors: "
                         f"llama.cpp's converter writes this for QSA models (spec 3.3); it means dense attention "
                         f"there, which transformers cannot express")
    if len(got) != 1:
        raise ValueError(f"{g.path}: {ARCH}.attention.compress_ratios={ratios}: transformers has one ratio for all "
                         f"QSA layers")
    hp = dataclasses.replace(hp, ratio=got.pop())
    get = g.get
    sd: dict[str, np.ndarray] = {"model.embed_tokens.weight": get("token_embd.weight")}
    ple_cfg = {}
    for i in range(n_layer):
        b, pre = f"blk.{i}", f"model.layers.{i}."
        if i in hp.ple_layers:
            p = pre + "ple."
            key = get(f"{b}.ple_key.weight")
            sd[p + "key_proj.weight"] = key
            sd[p + "value_proj.weight"] = get(f"{b}.ple_value.weight")
            for n in ("key", "query", "conv"):
                sd[f"{p}norm_{n}.weight"] = cv.minus1(get(f"{b}.ple_norm_{n}.weight"))
            sd[p + "conv1d.weight"] = get(f"{b}.ple_conv1d.weight")[:, None, :]
            table = get("per_layer_token_embd.weight")
            sd[p + "ple_embedding.ngram_embedding.shard_0.weight"] = table
            sizes = [int(x) for x in g.key("ple.head_vocab_sizes")]
            for k, gk in (("layer_multipliers", "ple.layer_multipliers"), ("ngram_heads_offsets", "ple.head_offsets"),
                          ("ngram_heads_vocab_sizes", "ple.head_vocab_sizes")):
                sd[f"{p}ple_embedding.{k}"] = np.array([int(x) for x in g.key(gk)], dtype=np.int64)
            ple_cfg = {"ple_layer_ids": [i + 1], "ple_embed_dim": int(key.shape[1]),
                       "ple_conv_kernel_size": int(g.key("ple.conv_kernel")),
                       "ngram_size": int(g.key("ple.ngram_size")),
                       "heads_per_ngram": int(g.key("ple.heads_per_ngram")), "ngram_vocab_size_base": sizes[0],
                       "make_ngram_vocab_size_divisible_by": int(table.shape[0]), "split_ngram_parts": 1}
            eos = int(g.key("ple.eos_token_id"))
        _hf_hc(sd, g, f"{b}.hc_attn", pre + "attn_hyper_connection", True)
        if hp.is_full_attention(i):
            a = pre + "self_attn."
            cv.hf_attention(sd, g, b, pre)
            sd[a + "indexer.index_qk_proj.weight"] = np.concatenate(
                [get(f"{b}.indexer.q_proj.weight"), get(f"{b}.indexer.k_proj.weight")], axis=0)
            sd[a + "indexer.q_layernorm.weight"] = cv.minus1(get(f"{b}.indexer.q_norm.weight"))
            sd[a + "indexer.k_layernorm.weight"] = cv.minus1(get(f"{b}.indexer.k_norm.weight"))
        else:
            q35.hf_deltanet(sd, g, b, pre + "linear_attn.", hp)
        _hf_hc(sd, g, f"{b}.hc_ffn", pre + "mlp_hyper_connection", True)
        cv.hf_moe(sd, g, b, pre + "mlp.", hp.n_embd)
    _hf_hc(sd, g, "output_hc", "model.hyper_connection_mixer", False)
    if not hp.tie:
        sd["lm_head.weight"] = get("output.weight")

    cfg = {"architectures": ["Qwen4ExpForCausalLM"], "model_type": "qwen4_exp_text",
           **q35.trunk_config(hp, ("linear_attention", "indexed_attention")),
           "hc_count": hp.hc, "hc_lowrank": hp.hc_rank, "indexer_n_heads": hp.ni, "indexer_kv_heads": 1,
           "indexer_head_dim": hp.di, "indexer_budget": hp.budget, "indexer_compress_ratio": hp.ratio,
           "norm_topk_prob": True, "output_gate_type": hp.gate, **ple_cfg}
    if ple_cfg:
        cfg["eos_token_id"] = eos  # the id HF's PLE resets on
    return cv.write_hf(Path(out_dir), cfg, sd, g)

