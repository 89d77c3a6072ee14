#!/usr/bin/env python3
"""Train strata's default model: a small Qwen3-Next (Gated DeltaNet + gated attention + MoE + MTP) for Python.

One call on one GPU does everything (issue 5):
  1. data       walk this machine's Python source (stdlib + every site-packages), dedupe, manifest, hold-out split
  2. tokenizer  byte-level BPE (GPT-2 regex via ByteLevel), `<|endoftext|>` = document separator and EOS
  3. model      Qwen3-Next math in plain torch; state-dict names/shapes are transformers' Qwen3NextForCausalLM
  4. MTP        `mtp.*` block of the real checkpoint layout, trained jointly to predict token t+2
  5. training   AdamW, cosine, bf16 autocast, sized to a wall-clock deadline
  6. eval       held-out loss/bpb/ppl/top-1, zlib -9, Kneser-Ney n-gram, MTP acceptance, samples
  7. export     bf16 safetensors shards (per-expert names, as the official checkpoint) + config + tokenizer

Usage (device):  PYTHONUNBUFFERED=1 python3 tools/train_default_model.py --out $OUT [--smoke]
The model classes are importable (tools/check_default_model.py uses them on the CPU); nothing runs on import.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import random
import shutil
import sys
import tarfile
import time
import zlib
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

EOS = "<|endoftext|>"
T0 = time.time()


def elapsed() -> float:
    return time.time() - T0


def say(*a):
    print(f"[{elapsed():7.1f}s]", *a, flush=True)


# =====================================================================================================
# 1. Model configuration (the HF Qwen3NextConfig fields we use)
# =====================================================================================================
@dataclass
class ModelConfig:
    vocab_size: int = 8192
    hidden_size: int = 256
    num_hidden_layers: int = 8
    full_attention_interval: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 128
    partial_rotary_factor: float = 0.25
    rope_theta: float = 1e7
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    num_experts: int = 32
    num_experts_per_tok: int = 4
    moe_intermediate_size: int = 64
    shared_expert_intermediate_size: int = 512
    norm_topk_prob: bool = True
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    initializer_range: float = 0.02
    mtp_num_hidden_layers: int = 1
    layer_types: list = field(default_factory=list)

    def __post_init__(self):
        if not self.layer_types:
            self.layer_types = ["full_attention" if (i + 1) % self.full_attention_interval == 0 else "linear_attention"
                                for i in range(self.num_hidden_layers)]
        assert len(self.layer_types) == self.num_hidden_layers, "layer_types length != num_hidden_layers"
        assert self.linear_num_value_heads % self.linear_num_key_heads == 0, "value heads must be a multiple of key heads"
        assert self.num_attention_heads % self.num_key_value_heads == 0, "heads must be a multiple of kv heads"
        assert self.linear_key_head_dim == self.linear_value_head_dim, "GGUF ssm.state_size is both dk and dv"
        for name in ("hidden_size", "head_dim", "linear_key_head_dim", "moe_intermediate_size",
                     "shared_expert_intermediate_size", "vocab_size"):
            assert getattr(self, name) % 32 == 0, f"{name}={getattr(self, name)} is not a multiple of 32 (Q8_0 rows)"

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_hf(cls, d: dict) -> "ModelConfig":
        rp = d.get("rope_parameters") or {}
        kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        kw["rope_theta"] = d.get("rope_theta", rp.get("rope_theta", 1e7))
        kw["partial_rotary_factor"] = d.get("partial_rotary_factor", rp.get("partial_rotary_factor", 0.25))
        kw["mtp_num_hidden_layers"] = d.get("mtp_num_hidden_layers", d.get("num_nextn_predict_layers", 1))
        return cls(**kw)

    def to_hf(self, eos_id: int) -> dict:
        """config.json for transformers' Qwen3NextForCausalLM (+ the MTP layer count that vLLM/llama.cpp read)."""
        return {
            "architectures": ["Qwen3NextForCausalLM"],
            "model_type": "qwen3_next",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.shared_expert_intermediate_size,  # unused: every layer is MoE
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "initializer_range": self.initializer_range,
            "rms_norm_eps": self.rms_norm_eps,
            "use_cache": True,
            "tie_word_embeddings": False,
            "rope_theta": self.rope_theta,
            "partial_rotary_factor": self.partial_rotary_factor,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta,
                                "partial_rotary_factor": self.partial_rotary_factor},
            "attention_bias": False,
            "attention_dropout": 0.0,
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "decoder_sparse_step": 1,
            "moe_intermediate_size": self.moe_intermediate_size,
            "shared_expert_intermediate_size": self.shared_expert_intermediate_size,
            "num_experts_per_tok": self.num_experts_per_tok,
            "num_experts": self.num_experts,
            "norm_topk_prob": self.norm_topk_prob,
            "output_router_logits": False,
            "router_aux_loss_coef": 0.001,
            "mlp_only_layers": [],
            "layer_types": list(self.layer_types),
            "full_attention_interval": self.full_attention_interval,
            "bos_token_id": eos_id,
            "eos_token_id": eos_id,
            "pad_token_id": None,
            "dtype": "bfloat16",
            "num_nextn_predict_layers": self.mtp_num_hidden_layers,
            "mtp_num_hidden_layers": self.mtp_num_hidden_layers,
        }


# =====================================================================================================
# 2. Model: the Qwen3-Next math (spec §1.2-1.8). Module paths == transformers' state-dict names.
# =====================================================================================================
class ZCRMSNorm(nn.Module):
    """Zero-centred RMSNorm: y = x * rsqrt(mean(x^2) + eps) * (1 + w), in fp32, then cast back (spec §1.2)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


class GatedRMSNorm(nn.Module):
    """linear_attn.norm: NOT zero-centred; norm, weight, then * silu(z) (spec §1.2)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x, z):
        dt = x.dtype
        xf = x.float()
        n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        n = self.weight * n.to(dt)
        return (n * F.silu(z.float())).to(dt)


def rope_cos_sin(cfg: ModelConfig, T: int, device, offset: int = 0):
    rd = cfg.rotary_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, rd, 2, dtype=torch.float32, device=device) / rd))
    pos = torch.arange(offset, offset + T, dtype=torch.float32, device=device)
    freqs = pos[:, None] * inv_freq[None, :]          # [T, rd/2]
    emb = torch.cat([freqs, freqs], dim=-1)            # [T, rd]  NeoX: dim i pairs with i + rd/2
    return emb.cos(), emb.sin()


def apply_partial_rope(x, cos, sin):
    """x: [B, h, T, d]; rotate the first rd dims NeoX-style (rotate_half), pass the rest through (spec §1.4.3)."""
    rd = cos.shape[-1]
    xr, xp = x[..., :rd], x[..., rd:]
    x1, x2 = xr[..., : rd // 2], xr[..., rd // 2:]
    rot = torch.cat([-x2, x1], dim=-1)
    xr = xr * cos.to(x.dtype) + rot * sin.to(x.dtype)
    return torch.cat([xr, xp], dim=-1)


class GatedAttention(nn.Module):
    """self_attn: q_proj emits [q | gate] interleaved per head; q/k ZC-norm before partial RoPE; sigmoid gate."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        H, nh, nkv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(H, nh * hd * 2, bias=False)
        self.k_proj = nn.Linear(H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.q_norm = ZCRMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = ZCRMSNorm(hd, cfg.rms_norm_eps)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        qg = self.q_proj(x).view(B, T, self.nh, 2 * self.hd)           # per head: [q(hd) | gate(hd)]
        q, gate = qg[..., : self.hd], qg[..., self.hd:]
        gate = gate.reshape(B, T, self.nh * self.hd)
        q = self.q_norm(q).transpose(1, 2)                             # [B, nh, T, hd]
        k = self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q, k = apply_partial_rope(q, cos, sin), apply_partial_rope(k, cos, sin)
        rep = self.nh // self.nkv                                       # query head h uses kv head h // rep
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.hd ** -0.5)
        o = o.transpose(1, 2).reshape(B, T, self.nh * self.hd)
        return self.o_proj(o * torch.sigmoid(gate))


def l2norm(x, eps: float = 1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gated_delta_rule_recurrent(q, k, v, g, beta):
    """Reference, token by token (spec §1.5 Step E). q,k: [B,T,h,dk] (l2-normed, q unscaled), v: [B,T,h,dv],
    g, beta: [B,T,h]. Returns [B,T,h,dv] in fp32."""
    B, T, h, dk = k.shape
    dv = v.shape[-1]
    q = q.float() * dk ** -0.5
    k, v, g, beta = k.float(), v.float(), g.float(), beta.float()
    S = torch.zeros(B, h, dk, dv, dtype=torch.float32, device=q.device)
    out = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        m = torch.einsum("bhkv,bhk->bhv", S, k[:, t])                   # memory read
        d = beta[:, t][..., None] * (v[:, t] - m)                        # delta
        S = S + k[:, t][..., :, None] * d[..., None, :]                  # rank-1 update
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    return torch.stack(out, dim=1)


def _unit_lower_inverse_doubling(A):
    """(I + A)^-1 for strictly-lower-triangular A [.., C, C] by (I+M)(I+M^2)(I+M^4)..., M = -A (nilpotent)."""
    C = A.shape[-1]
    M = -A
    inv = torch.eye(C, dtype=A.dtype, device=A.device) + M
    P = M
    n = 2
    while n < C:
        P = P @ P
        inv = inv + inv @ P
        n *= 2
    return inv


def gated_delta_rule_chunked(q, k, v, g, beta, chunk: int = 64, solver: str = "trsm"):
    """Chunked parallel form of the gated delta rule (WY / UT transform, same values as the recurrence).
    Shapes as gated_delta_rule_recurrent. All math in fp32 (autocast off). Tensors are laid out chunk-major
    [n, B, h, C, d] so that the sequential scan over chunks reads contiguous slices."""
    with torch.autocast(device_type=q.device.type, enabled=False):
        B, T, h, dk = k.shape
        dv = v.shape[-1]
        pad = (-T) % chunk
        n = (T + pad) // chunk

        def cm(x):  # [B,T,h,...] -> [n,B,h,C,...] fp32
            x = x.float()
            if pad:
                x = F.pad(x, (0, 0) * (x.ndim - 2) + (0, pad))
            x = x.reshape(B, n, chunk, h, *x.shape[3:])
            return x.permute(1, 0, 3, 2, *range(4, x.ndim)).contiguous()

        q, k, v, g, beta = cm(q) * dk ** -0.5, cm(k), cm(v), cm(g), cm(beta)   # q,k,v: [n,B,h,C,d]; g,beta: [n,B,h,C]
        gc = g.cumsum(-1)                                               # log decay from chunk start, inclusive
        incl = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
        D = (gc[..., :, None] - gc[..., None, :]).masked_fill(~incl, float("-inf")).exp()  # [n,B,h,C,C]
        kb = k * beta[..., None]
        A = ((kb @ k.transpose(-1, -2)) * D).tril(-1)                   # strictly lower: b_i k_i.k_j decay(i,j)
        rhs = torch.cat([v * beta[..., None], kb * gc.exp()[..., None]], dim=-1)   # [.., C, dv+dk]
        if solver == "trsm":
            eye = torch.eye(chunk, dtype=A.dtype, device=A.device)
            W = torch.linalg.solve_triangular(A + eye, rhs, upper=False, unitriangular=True)
        elif solver == "doubling":
            W = _unit_lower_inverse_doubling(A) @ rhs
        else:
            raise ValueError(f"unknown delta_solver {solver!r} (trsm | doubling)")
        u, w = W[..., :dv].contiguous(), W[..., dv:].contiguous()       # u: new values, w: decayed keys (WY)
        Pq = (q @ k.transpose(-1, -2)) * D                              # intra-chunk attention, diag included
        qd = q * gc.exp()[..., None]
        kdT = (k * (gc[..., -1:] - gc).exp()[..., None]).transpose(-1, -2).contiguous()   # [n,B,h,dk,C]
        cd = gc[..., -1].exp()[..., None, None]                         # [n,B,h,1,1]
        S = torch.zeros(B, h, dk, dv, dtype=torch.float32, device=q.device)
        outs = []
        for c in range(n):
            vn = u[c] - w[c] @ S                                        # [B,h,C,dv]
            outs.append(qd[c] @ S + Pq[c] @ vn)
            S = S * cd[c] + kdT[c] @ vn
        o = torch.stack(outs, dim=0)                                    # [n,B,h,C,dv]
        o = o.permute(1, 0, 3, 2, 4).reshape(B, n * chunk, h, dv)
        return o[:, :T]                                                 # [B,T,h,dv] fp32


def causal_depthwise_conv(x, w, impl: str = "shift"):
    """out[t,c] = sum_j w[c,j] x[t-K+1+j, c] (zeros before the start). x: [B,T,C], w: conv1d.weight [C,1,K]."""
    B, T, C = x.shape
    K = w.shape[-1]
    if impl == "cudnn":
        return F.conv1d(x.transpose(1, 2), w, padding=K - 1, groups=C)[..., :T].transpose(1, 2)
    w = w[:, 0, :].to(x.dtype)                                          # [C, K]
    xp = F.pad(x, (0, 0, K - 1, 0))                                     # [B, T+K-1, C]
    out = xp[:, K - 1:] * w[:, K - 1]
    for j in range(K - 1):
        out = out + xp[:, j: j + T] * w[:, j]
    return out


class GatedDeltaNet(nn.Module):
    """linear_attn (spec §1.5): per-key-head grouped in_proj_qkvz / in_proj_ba, causal depthwise conv + SiLU over
    q|k|v, l2norm, g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b), value head h reads key head h // r,
    delta rule, gated RMSNorm, out_proj."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        H = cfg.hidden_size
        self.nk, self.nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.r = self.nv // self.nk
        self.key_dim, self.value_dim = self.nk * self.dk, self.nv * self.dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.K = cfg.linear_conv_kernel_dim
        self.in_proj_qkvz = nn.Linear(H, 2 * self.key_dim + 2 * self.value_dim, bias=False)
        self.in_proj_ba = nn.Linear(H, 2 * self.nv, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.K, groups=self.conv_dim, bias=False,
                                padding=self.K - 1)
        self.dt_bias = nn.Parameter(torch.ones(self.nv))
        self.A_log = nn.Parameter(torch.zeros(self.nv))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, H, bias=False)
        self.chunk, self.solver, self.conv_impl = 64, "trsm", "shift"

    def forward(self, x):
        B, T, _ = x.shape
        nk, nv, dk, dv, r = self.nk, self.nv, self.dk, self.dv, self.r
        qkvz = self.in_proj_qkvz(x).view(B, T, nk, 2 * dk + 2 * r * dv)   # grouped per key head
        q, k, v, z = torch.split(qkvz, [dk, dk, r * dv, r * dv], dim=-1)
        ba = self.in_proj_ba(x).view(B, T, nk, 2 * r)
        b, a = ba[..., :r].reshape(B, T, nv), ba[..., r:].reshape(B, T, nv)  # value head = group*r + j
        v, z = v.reshape(B, T, nv, dv), z.reshape(B, T, nv, dv)
        mixed = torch.cat([q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1)], dim=-1)  # [B,T,conv]
        mixed = F.silu(causal_depthwise_conv(mixed, self.conv1d.weight, self.conv_impl))
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q, k, v = q.reshape(B, T, nk, dk), k.reshape(B, T, nk, dk), v.reshape(B, T, nv, dv)
        beta = torch.sigmoid(b)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        q, k = l2norm(q.float()), l2norm(k.float())
        q, k = q.repeat_interleave(r, dim=2), k.repeat_interleave(r, dim=2)   # value head h uses key head h // r
        o = gated_delta_rule_chunked(q, k, v, g, beta, self.chunk, self.solver).to(v.dtype)
        o = self.norm(o, z)                                                  # per value head
        return self.out_proj(o.reshape(B, T, self.value_dim))


class SwiGLU(nn.Module):
    def __init__(self, H: int, I: int):
        super().__init__()
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    def __init__(self, E: int, H: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(E, H))


class Experts(nn.Module):
    """transformers v5's in-memory layout: gate_up_proj [E, 2I, H] (gate rows first), down_proj [E, H, I].
    Exported per expert as mlp.experts.{e}.{gate,up,down}_proj.weight (the official checkpoint layout)."""

    def __init__(self, E: int, H: int, I: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * I, H))
        self.down_proj = nn.Parameter(torch.empty(E, H, I))


class SparseMoE(nn.Module):
    """softmax over all experts -> top-k -> renormalise; SwiGLU experts; + sigmoid-gated shared expert (spec §1.6).
    Computed dense-then-masked: every expert runs on every token as two big GEMMs and the routing weight (zero for
    unselected experts) scales its output. Same function as the sparse form; at this size it beats gather/scatter."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        H, E, I = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
        self.E, self.I, self.k, self.norm_topk = E, I, cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.gate = Router(E, H)
        self.experts = Experts(E, H, I)
        self.shared_expert = SwiGLU(H, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(H, 1, bias=False)

    def forward(self, x):
        shp = x.shape
        x = x.reshape(-1, shp[-1])                                        # [N, H]
        N, H = x.shape
        logits = F.linear(x, self.gate.weight)                            # [N, E]
        probs = torch.softmax(logits.float(), dim=-1)
        topv, topi = probs.topk(self.k, dim=-1)
        if self.norm_topk:
            topv = topv / topv.sum(-1, keepdim=True)
        dense_w = torch.zeros_like(probs).scatter(1, topi, topv)          # [N, E], zero off the top-k
        gu = F.linear(x, self.experts.gate_up_proj.reshape(self.E * 2 * self.I, H)).view(N, self.E, 2 * self.I)
        act = F.silu(gu[..., : self.I]) * gu[..., self.I:]                # [N, E, I]
        act = act * dense_w.to(act.dtype)[..., None]
        down = self.experts.down_proj.permute(1, 0, 2).reshape(H, self.E * self.I)
        y = F.linear(act.reshape(N, self.E * self.I), down)              # [N, H]
        y = y + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        # Switch-style balance statistic: E * sum_e (fraction of routed slots to e) * (mean prob of e); 1.0 = balanced
        frac = torch.zeros_like(probs[0]).index_add_(0, topi.reshape(-1), torch.ones_like(topv.reshape(-1)))
        aux = self.E * (frac / (N * self.k) * probs.mean(0)).sum()
        return y.reshape(shp), aux


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg)
        elif layer_type == "full_attention":
            self.self_attn = GatedAttention(cfg)
        else:
            raise ValueError(f"unknown layer type {layer_type!r}")
        self.mlp = SparseMoE(cfg)
        self.input_layernorm = ZCRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = ZCRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin):
        h = self.input_layernorm(x)
        h = self.linear_attn(h) if self.layer_type == "linear_attention" else self.self_attn(h, cos, sin)
        x = x + h
        h, aux = self.mlp(self.post_attention_layernorm(x))
        return x + h, aux


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, t) for t in cfg.layer_types])
        self.norm = ZCRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class MTP(nn.Module):
    """mtp.*: fc(cat[ZC(emb(t+1)), ZC(h_t post-final-norm)]) -> one full-attention + MoE layer -> mtp.norm (§1.8)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        H = cfg.hidden_size
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = ZCRMSNorm(H, cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = ZCRMSNorm(H, cfg.rms_norm_eps)
        self.layers = nn.ModuleList([DecoderLayer(cfg, "full_attention") for _ in range(cfg.mtp_num_hidden_layers)])
        self.norm = ZCRMSNorm(H, cfg.rms_norm_eps)


class Qwen3NextLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.mtp = MTP(cfg)

    def set_delta(self, chunk: int, solver: str, conv_impl: str = "shift"):
        for m in self.modules():
            if isinstance(m, GatedDeltaNet):
                m.chunk, m.solver, m.conv_impl = chunk, solver, conv_impl

    def init_weights(self, seed: int):
        cfg = self.cfg
        gen = torch.Generator().manual_seed(seed)
        std = cfg.initializer_range
        for name, p in self.named_parameters():
            if name.endswith("A_log"):
                # decay rates spread as in Mamba: A ~ U(1,16), dt ~ logU(1e-3, 1e-1); g = -A dt at a = 0
                p.data.copy_(torch.empty(p.shape).uniform_(1, 16, generator=gen).log())
            elif name.endswith("dt_bias"):
                dt = torch.exp(torch.rand(p.shape, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
                p.data.copy_(dt + torch.log(-torch.expm1(-dt)))           # inverse softplus
            elif name.endswith("conv1d.weight"):
                bound = 1.0 / math.sqrt(cfg.linear_conv_kernel_dim)
                p.data.copy_(torch.empty(p.shape).uniform_(-bound, bound, generator=gen))
            elif name.endswith("linear_attn.norm.weight"):
                p.data.fill_(1.0)
            elif p.ndim == 1:                                             # zero-centred norms: (1 + 0)
                p.data.zero_()
            else:
                p.data.copy_(torch.randn(p.shape, generator=gen) * std)
        # residual-branch outputs scaled down with depth (GPT-2 style)
        scale = 1.0 / math.sqrt(2 * (cfg.num_hidden_layers + cfg.mtp_num_hidden_layers))
        for name, p in self.named_parameters():
            if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight", "experts.down_proj")):
                p.data.mul_(scale)

    def backbone(self, ids):
        """ids [B,T] -> (post-final-norm hidden [B,T,H], summed MoE balance statistic)."""
        T = ids.shape[1]
        cos, sin = rope_cos_sin(self.cfg, T, ids.device)
        x = self.model.embed_tokens(ids)
        aux = 0.0
        for layer in self.model.layers:
            x, a = layer(x, cos, sin)
            aux = aux + a
        return self.model.norm(x), aux

    def mtp_hidden(self, h, next_ids):
        """h: main post-norm hidden at positions 0..T-1; next_ids: token at t+1 for each position. -> [B,T,H]."""
        T = h.shape[1]
        cos, sin = rope_cos_sin(self.cfg, T, h.device)               # positions are not shifted (§1.8)
        e = self.model.embed_tokens(next_ids)
        x = self.mtp.fc(torch.cat([self.mtp.pre_fc_norm_embedding(e), self.mtp.pre_fc_norm_hidden(h)], dim=-1))
        aux = 0.0
        for layer in self.mtp.layers:
            x, a = layer(x, cos, sin)
            aux = aux + a
        return self.mtp.norm(x), aux

    def forward(self, ids):
        h, _ = self.backbone(ids)
        return self.lm_head(h)


# ---- parameter accounting and (de)serialisation in the official checkpoint layout -------------------
def param_counts(model: Qwen3NextLM) -> dict:
    cfg = model.cfg
    tot = {"main": 0, "mtp": 0}
    routed = {"main": 0, "mtp": 0}
    for name, p in model.named_parameters():
        part = "mtp" if name.startswith("mtp.") else "main"
        tot[part] += p.numel()
        if ".experts." in name:
            routed[part] += p.numel()
    frac_active = cfg.num_experts_per_tok / cfg.num_experts
    emb = model.model.embed_tokens.weight.numel()
    active = {k: int(tot[k] - routed[k] * (1 - frac_active)) for k in tot}
    return {
        "total": tot["main"] + tot["mtp"], "main": tot["main"], "mtp": tot["mtp"],
        "routed_experts_main": routed["main"], "routed_experts_mtp": routed["mtp"],
        "embedding": emb, "lm_head": model.lm_head.weight.numel(),
        "active_per_token_main": active["main"],
        "active_per_token_main_excl_embedding": active["main"] - emb,
        "active_per_token_mtp": active["mtp"],
    }


def to_checkpoint_tensors(model: Qwen3NextLM, dtype=torch.bfloat16) -> dict:
    """State dict with experts split per expert: `...mlp.experts.{e}.{gate,up,down}_proj.weight` (spec §1.7)."""
    out = {}
    I = model.cfg.moe_intermediate_size
    for name, t in model.state_dict().items():
        t = t.detach().to("cpu", dtype)
        if name.endswith("mlp.experts.gate_up_proj"):
            pre = name[: -len("gate_up_proj")]
            for e in range(t.shape[0]):
                out[f"{pre}{e}.gate_proj.weight"] = t[e, :I].contiguous()
                out[f"{pre}{e}.up_proj.weight"] = t[e, I:].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            pre = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{pre}{e}.down_proj.weight"] = t[e].contiguous()
        else:
            out[name] = t.contiguous()
    return out


def from_checkpoint_tensors(model: Qwen3NextLM, tensors: dict):
    """Inverse of to_checkpoint_tensors (also accepts the fused v5 names). Strict: every parameter must be set."""
    E = model.cfg.num_experts
    sd = {}
    for name in model.state_dict():
        if name.endswith("mlp.experts.gate_up_proj"):
            pre = name[: -len("gate_up_proj")]
            if name in tensors:
                sd[name] = tensors[name]
            else:
                sd[name] = torch.stack([torch.cat([tensors[f"{pre}{e}.gate_proj.weight"],
                                                   tensors[f"{pre}{e}.up_proj.weight"]], 0) for e in range(E)])
        elif name.endswith("mlp.experts.down_proj"):
            pre = name[: -len("down_proj")]
            sd[name] = tensors[name] if name in tensors else torch.stack(
                [tensors[f"{pre}{e}.down_proj.weight"] for e in range(E)])
        else:
            if name not in tensors:
                raise KeyError(f"checkpoint lacks tensor {name}")
            sd[name] = tensors[name]
    model.load_state_dict(sd, strict=True)


def load_model_dir(path: str, device="cpu", dtype=torch.float32) -> Qwen3NextLM:
    from safetensors.torch import load_file
    with open(os.path.join(path, "config.json")) as f:
        cfg = ModelConfig.from_hf(json.load(f))
    model = Qwen3NextLM(cfg)
    tensors = {}
    for fn in sorted(os.listdir(path)):
        if fn.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(path, fn)))
    from_checkpoint_tensors(model, tensors)
    return model.to(device=device, dtype=dtype).eval()


# =====================================================================================================
# 3. Data: this machine's Python source
# =====================================================================================================
def _dist_license(md) -> str | None:
    lic = md.get("License-Expression") or md.get("License")
    if lic and lic.strip() and lic.strip().upper() != "UNKNOWN":
        lic = lic.strip().splitlines()[0][:120]
        return lic
    cls = [c.split("::")[-1].strip() for c in (md.get_all("Classifier") or []) if c.startswith("License ::")]
    return "; ".join(cls) if cls else None


def walk_corpus(dcfg: dict, seed: int):
    """Returns (docs, manifest, heldout). docs: list of dicts {text, pkg, split, path}."""
    import importlib.metadata as im
    import site
    import sysconfig

    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    site_dirs = []
    for d in list(site.getsitepackages()) + [site.getusersitepackages(), sysconfig.get_paths()["purelib"],
                                             sysconfig.get_paths()["platlib"]]:
        if d and os.path.isdir(d):
            rd = os.path.realpath(d)
            if rd not in site_dirs and rd != stdlib:  # the stdlib walk skips site-/dist-packages
                site_dirs.append(rd)
    site_dirs.sort()

    # file -> distribution, from each distribution's RECORD
    owner, dists = {}, {}
    for dist in im.distributions(path=site_dirs):
        name = dist.metadata["Name"]
        if not name or name in dists:
            continue
        dists[name] = {"version": dist.version, "license": _dist_license(dist.metadata)}
        for f in dist.files or []:
            if str(f).endswith(".py"):
                owner.setdefault(os.path.realpath(str(dist.locate_file(f))), name)

    files = []  # (kind, pkg, relpath, abspath)
    for root, dirs, fns in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages", "__pycache__"))
        for fn in sorted(fns):
            if fn.endswith(".py"):
                p = os.path.join(root, fn)
                files.append(("stdlib", "python-stdlib", os.path.relpath(p, stdlib), p))
    for sd in site_dirs:
        for root, dirs, fns in os.walk(sd):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for fn in sorted(fns):
                if fn.endswith(".py"):
                    p = os.path.join(root, fn)
                    rel = os.path.relpath(p, sd)
                    pkg = owner.get(os.path.realpath(p)) or ("unowned:" + rel.split(os.sep)[0].removesuffix(".py"))
                    files.append(("package", pkg, rel, p))

    seen = set()
    stats = {"files_seen": len(files), "non_utf8": 0, "too_large": 0, "duplicates": 0, "unreadable": 0, "empty": 0}
    docs = []
    for kind, pkg, rel, p in files:
        try:
            with open(p, "rb") as f:
                raw = f.read(dcfg["max_file_bytes"] + 1)
        except OSError:
            stats["unreadable"] += 1
            continue
        if len(raw) > dcfg["max_file_bytes"]:
            stats["too_large"] += 1
            continue
        if not raw.strip():
            stats["empty"] += 1
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            stats["non_utf8"] += 1
            continue
        if EOS in text:
            text = text.replace(EOS, "<|endof" + "text|>\u200b")  # never let data spell the control token
        h = hashlib.sha1(raw).digest()
        if h in seen:
            stats["duplicates"] += 1
            continue
        seen.add(h)
        docs.append({"kind": kind, "pkg": pkg, "path": rel, "text": text, "nbytes": len(raw)})

    # ---- per-package summary
    pk = {}
    for d in docs:
        e = pk.setdefault(d["pkg"], {"package": d["pkg"], "kind": d["kind"], "files": 0, "bytes": 0})
        e["files"] += 1
        e["bytes"] += d["nbytes"]
    for name, e in pk.items():
        meta = dists.get(name, {})
        e["version"] = meta.get("version") if e["kind"] == "package" else sys.version.split()[0]
        e["license"] = meta.get("license") if e["kind"] == "package" else "PSF-2.0"

    # ---- hold out whole mid-size packages that share little text with any other package
    packages = sorted(n for n, e in pk.items() if e["kind"] == "package")
    vendored = set()
    for d in docs:
        parts = d["path"].split(os.sep)
        for i, part in enumerate(parts[:-1]):
            if part in ("_vendor", "vendor", "_vendored", "extern", "_extern", "externals") and i + 1 < len(parts) - 1:
                vendored.add(parts[i + 1].lower().replace("_", "-"))
    line_sets = {}
    for d in docs:
        if d["kind"] != "package":
            continue
        s = line_sets.setdefault(d["pkg"], set())
        for ln in d["text"].splitlines():
            ln = ln.strip()
            if len(ln) >= 40:
                s.add(hash(ln))
    allh = np.concatenate([np.fromiter(s, dtype=np.int64, count=len(s)) for s in line_sets.values()]) \
        if line_sets else np.zeros(0, np.int64)
    uh, uc = np.unique(allh, return_counts=True)
    shared = uh[uc >= 2]

    def overlap(name):
        s = line_sets.get(name)
        if not s:
            return 1.0
        a = np.fromiter(s, dtype=np.int64, count=len(s))
        return float(np.isin(a, shared).mean())

    sizes = np.array([pk[n]["bytes"] for n in packages], dtype=np.float64)
    lo, hi = (np.quantile(sizes, q) for q in dcfg["holdout_size_quantiles"]) if len(sizes) else (0, 0)
    cands = [n for n in packages if lo <= pk[n]["bytes"] <= hi and pk[n]["files"] >= dcfg["holdout_min_files"]
             and not n.startswith("unowned:") and n.lower().replace("_", "-") not in vendored]
    rng = random.Random(seed)
    rng.shuffle(cands)
    target = max(dcfg["holdout_min_packages"], round(dcfg["holdout_package_fraction"] * len(packages)))
    held_pk, rejected = [], []
    for n in cands:
        if len(held_pk) >= target:
            break
        ov = overlap(n)
        if ov > dcfg["holdout_max_line_overlap"]:
            rejected.append({"package": n, "line_overlap": round(ov, 3)})
            continue
        held_pk.append({"package": n, "version": pk[n]["version"], "files": pk[n]["files"], "bytes": pk[n]["bytes"],
                        "line_overlap": round(ov, 3)})
    held_names = {e["package"] for e in held_pk}

    std_paths = sorted(d["path"] for d in docs if d["kind"] == "stdlib")
    rng2 = random.Random(seed + 1)
    held_std = set(rng2.sample(std_paths, round(dcfg["holdout_stdlib_fraction"] * len(std_paths)))) if std_paths else set()
    for d in docs:
        if d["kind"] == "package":
            d["split"] = "heldout_packages" if d["pkg"] in held_names else "train"
        else:
            d["split"] = "heldout_stdlib" if d["path"] in held_std else "train"
    for n, e in pk.items():
        e["split"] = "heldout" if n in held_names else "train"

    def tot(split):
        ds = [d for d in docs if d["split"] == split]
        return {"files": len(ds), "bytes": sum(d["nbytes"] for d in ds)}

    manifest = {
        "python": sys.version.split()[0], "stdlib_dir": stdlib, "site_dirs": site_dirs,
        "walk": stats, "kept_files": len(docs), "kept_bytes": sum(d["nbytes"] for d in docs),
        "splits": {s: tot(s) for s in ("train", "heldout_packages", "heldout_stdlib")},
        "packages": sorted(pk.values(), key=lambda e: (-e["bytes"], e["package"])),
    }
    heldout = {
        "seed": seed, "rule": (f"packages: {dcfg['holdout_package_fraction']:.0%} of the package count, drawn by seed "
                               f"among packages with size in quantiles {dcfg['holdout_size_quantiles']} and >= "
                               f"{dcfg['holdout_min_files']} files, not vendored elsewhere, long-line overlap with "
                               f"other packages <= {dcfg['holdout_max_line_overlap']}; stdlib: "
                               f"{dcfg['holdout_stdlib_fraction']:.0%} of files drawn by seed"),
        "packages": held_pk, "rejected_for_overlap": rejected, "stdlib_files": sorted(held_std),
        "package_fraction_of_count": len(held_pk) / max(1, len(packages)),
        "package_fraction_of_package_bytes": sum(e["bytes"] for e in held_pk) / max(1, sum(sizes)),
    }
    return docs, manifest, heldout


# =====================================================================================================
# 4. Tokenizer
# =====================================================================================================
def train_tokenizer(texts, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    assert tok.get_vocab_size() <= vocab_size, f"tokenizer has {tok.get_vocab_size()} > {vocab_size} tokens"
    return tok


def token_byte_lengths(tok, V: int) -> np.ndarray:
    """Bytes each token stands for (ByteLevel: one char of the token string = one byte); specials count 0."""
    inv = {i: s for s, i in tok.get_vocab().items()}
    special = {t.content for t in tok.get_added_tokens_decoder().values()}
    out = np.zeros(V, dtype=np.int64)
    for i in range(V):
        s = inv.get(i)
        out[i] = 0 if (s is None or s in special) else len(s)
    return out


def encode_docs(tok, texts, eos_id: int, batch: int = 4096) -> np.ndarray:
    """[EOS] doc0 [EOS] doc1 [EOS] ... as one uint16 stream (every document follows an EOS, as in training)."""
    parts = [np.array([eos_id], dtype=np.uint16)]
    for i in range(0, len(texts), batch):
        enc_fn = getattr(tok, "encode_batch_fast", tok.encode_batch)   # no offsets: ~2x faster
        for enc in enc_fn(texts[i: i + batch], add_special_tokens=False):
            parts.append(np.array(enc.ids, dtype=np.uint16))
            parts.append(np.array([eos_id], dtype=np.uint16))
    return np.concatenate(parts)


# =====================================================================================================
# 5. Training
# =====================================================================================================
class Log:
    def __init__(self, path: str | None):
        self.f = open(path, "a", buffering=1) if path else None

    def __call__(self, *a):
        msg = " ".join(str(x) for x in a)
        say(msg)
        if self.f:
            self.f.write(f"[{elapsed():7.1f}s] {msg}\n")


def lr_at(step: int, total: int, tc: dict) -> float:
    if step < tc["warmup_steps"]:
        return tc["lr"] * (step + 1) / tc["warmup_steps"]
    p = min(1.0, (step - tc["warmup_steps"]) / max(1, total - tc["warmup_steps"]))
    return tc["lr"] * (tc["min_lr_ratio"] + (1 - tc["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * p)))


def batch_loss(model: Qwen3NextLM, x, tc: dict):
    """x: [B, L+2] token windows. Main predicts x[:,1:L+1], MTP predicts x[:,2:L+2] from (h_t, x_{t+1})."""
    L = x.shape[1] - 2
    V = model.cfg.vocab_size
    h, aux = model.backbone(x[:, :L])
    loss_main = F.cross_entropy(model.lm_head(h).float().view(-1, V), x[:, 1:L + 1].reshape(-1))
    hm, aux_m = model.mtp_hidden(h, x[:, 1:L + 1])
    loss_mtp = F.cross_entropy(model.lm_head(hm).float().view(-1, V), x[:, 2:L + 2].reshape(-1))
    n_moe = model.cfg.num_hidden_layers + model.cfg.mtp_num_hidden_layers
    aux = (aux + aux_m) / n_moe
    loss = loss_main + tc["mtp_loss_weight"] * loss_mtp + tc["aux_loss_coef"] * aux
    return loss, loss_main.detach(), loss_mtp.detach(), aux.detach()


def train(model: Qwen3NextLM, tokens: torch.Tensor, tc: dict, log: Log, seed: int, device) -> dict:
    L, B = tc["seq_len"], tc["batch_size"]
    nwin = (tokens.numel() - 2) // L - 1
    assert nwin >= B, f"training stream too short: {nwin} windows of {L} < batch {B}"
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if (p.ndim >= 2 and "conv1d" not in n) else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tc["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=tc["lr"], betas=tuple(tc["betas"]), eps=1e-8,
                            fused=(device.type == "cuda"))
    gen = torch.Generator(device="cpu").manual_seed(seed)
    perm, pos, epoch = torch.randperm(nwin, generator=gen), 0, 0
    ar = torch.arange(L + 2, device=device)
    total = tc["max_steps"]
    sized = False
    t_probe = None
    hist = []
    acc = torch.zeros(4, device=device)
    n_acc = 0
    t_last, tok_last = time.time(), 0
    tokens_seen = 0
    step = 0
    stop_reason = "max_steps"
    compiled = [m for m in model.modules() if isinstance(m, (GatedDeltaNet, SparseMoE, GatedAttention))]
    if tc.get("compile") and device.type == "cuda":
        for m in compiled:                                           # ~50 s of compile for ~2.2x per step (smoke)
            m.compile()
    model.train()
    while step < total:
        if elapsed() > tc["train_deadline_s"]:
            stop_reason = "deadline"
            break
        if pos + B > nwin:
            perm, pos, epoch = torch.randperm(nwin, generator=gen), 0, epoch + 1
        starts = (perm[pos: pos + B] * L).to(device)
        pos += B
        x = tokens[starts[:, None] + ar[None, :]].long()             # [B, L+2]
        lr = lr_at(step, total, tc)
        for gr in opt.param_groups:
            gr["lr"] = lr
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=(device.type == "cuda")):
            loss, lm, lt, aux = batch_loss(model, x, tc)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), tc["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        acc += torch.stack([lm, lt, aux, gn.detach().float()])
        n_acc += 1
        step += 1
        tokens_seen += B * L
        # size the cosine schedule from the measured rate (steps 3..probe), so it ends before the deadline
        if not sized and step == 3:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t_probe = time.time()
        if not sized and step == tc["rate_probe_steps"] + 3:
            if device.type == "cuda":
                torch.cuda.synchronize()
            sps = tc["rate_probe_steps"] / (time.time() - t_probe)
            budget = tc["train_deadline_s"] - elapsed()
            total = min(tc["max_steps"], step + int(0.97 * budget * sps))
            total = max(total, step + 1)
            sized = True
            log(f"rate probe: {sps:.3f} steps/s = {sps * B * L:,.0f} tok/s; schedule sized to {total} steps "
                f"({total * B * L / 1e6:.1f}M tokens, {tokens.numel() / 1e6:.1f}M-token stream)")
        if step % tc["log_every"] == 0 or step == total:
            a = (acc / n_acc).tolist()
            now = time.time()
            tps = (tokens_seen - tok_last) / (now - t_last)
            t_last, tok_last = now, tokens_seen
            rec = {"step": step, "loss": round(a[0], 4), "mtp_loss": round(a[1], 4), "balance": round(a[2], 4),
                   "grad_norm": round(a[3], 3), "lr": round(lr, 7), "tok_s": round(tps), "epoch": epoch,
                   "tokens": tokens_seen, "t": round(elapsed(), 1)}
            hist.append(rec)
            log(json.dumps(rec))
            acc.zero_()
            n_acc = 0
    for m in compiled:                                               # evaluation runs eager (fp32)
        m._compiled_call_impl = None
    if step >= total:
        stop_reason = "schedule_done"
    return {"steps": step, "planned_steps": total, "tokens": tokens_seen, "epochs": tokens_seen / tokens.numel(),
            "stop_reason": stop_reason, "history": hist}


# =====================================================================================================
# 6. Evaluation
# =====================================================================================================
@torch.no_grad()
def eval_model(model: Qwen3NextLM, stream: np.ndarray, tok_bytes: np.ndarray, B: int, L: int, device) -> dict:
    """Loss/bpb/top-1 on a [EOS] doc [EOS] doc ... stream in chunks of L (fresh context per chunk), plus MTP:
    top-1 of the t+2 head against the data, and draft acceptance against the main model's greedy tokens."""
    n_pred = len(stream) - 1                                          # every token after the first EOS is predicted
    n_chunks = (n_pred + L - 1) // L
    padded = np.full(n_chunks * L + 2, 0, dtype=np.int64)
    padded[: len(stream)] = stream
    valid = np.zeros(n_chunks * L + 2, dtype=bool)
    valid[1: len(stream)] = True
    S = torch.from_numpy(padded).to(device)
    Vd = torch.from_numpy(valid).to(device)
    tb = torch.from_numpy(tok_bytes).to(device)
    z = lambda: torch.zeros((), dtype=torch.float64, device=device)  # noqa: E731
    nll, ntok, nbytes, top1 = z(), z(), z(), z()
    m_nll, m_n, m_top1 = z(), z(), z()
    acc_all, n_all, acc_c, n_c = z(), z(), z(), z()
    ar = torch.arange(L, device=device)
    for c0 in range(0, n_chunks, B):
        st = torch.arange(c0, min(n_chunks, c0 + B), device=device) * L
        idx = st[:, None] + ar[None, :]
        x, y1, y2 = S[idx], S[idx + 1], S[idx + 2]
        v1, v2 = Vd[idx + 1], Vd[idx + 2]
        h, _ = model.backbone(x)
        logits = model.lm_head(h).float()
        lp = torch.log_softmax(logits, -1)
        tnll = -lp.gather(-1, y1[..., None])[..., 0]
        greedy = logits.argmax(-1)                                    # main's token for position t+1
        nll += (tnll * v1).sum()
        ntok += v1.sum()
        nbytes += (tb[y1] * v1).sum()
        top1 += ((greedy == y1) & v1).sum()
        hm, _ = model.mtp_hidden(h, y1)
        ml = model.lm_head(hm).float()
        mlp_ = torch.log_softmax(ml, -1)
        draft = ml.argmax(-1)                                         # MTP's token for position t+2
        m_nll += (-mlp_.gather(-1, y2[..., None])[..., 0] * v2).sum()
        m_n += v2.sum()
        m_top1 += ((draft == y2) & v2).sum()
        # acceptance: draft at t vs the main model's greedy token at t+1 (given the real token t+1)
        ok = (draft[:, :-1] == greedy[:, 1:]) & v2[:, :-1]
        acc_all += ok.sum()
        n_all += v2[:, :-1].sum()
        cond = (greedy[:, :-1] == y1[:, :-1]) & v2[:, :-1]            # main's own token t+1 equals the data
        acc_c += (ok & cond).sum()
        n_c += cond.sum()
    nll_nats = nll.item() / ntok.item()
    bpb = nll.item() / math.log(2) / nbytes.item()
    return {
        "tokens": int(ntok.item()), "bytes": int(nbytes.item()), "bytes_per_token": nbytes.item() / ntok.item(),
        "loss_per_token_nats": nll_nats, "bits_per_token": nll_nats / math.log(2), "bits_per_byte": bpb,
        "perplexity": math.exp(nll_nats), "top1_acc": top1.item() / ntok.item(),
        "mtp_loss_per_token_nats": m_nll.item() / m_n.item(), "mtp_top1_acc_vs_data": m_top1.item() / m_n.item(),
        "mtp_accept_teacher_forced_all": acc_all.item() / max(1, n_all.item()),
        "mtp_accept_teacher_forced_when_main_correct": acc_c.item() / max(1, n_c.item()),
        "chunk_len": L,
    }


def zlib_bpb(texts) -> dict:
    raw = "".join(texts).encode("utf-8")
    whole = len(zlib.compress(raw, 9))
    per_file = sum(len(zlib.compress(t.encode("utf-8"), 9)) for t in texts)
    return {"bytes": len(raw), "zlib9_stream_bits_per_byte": 8 * whole / len(raw),
            "zlib9_per_file_bits_per_byte": 8 * per_file / len(raw)}


_NGRAM_CACHE: dict = {}


def _kn_tables(train_stream, N, SH, keys, device):
    t = torch.from_numpy(train_stream.astype(np.int64)).to(device)
    raw = {n: torch.unique(keys(t, n), return_counts=True) for n in range(1, N + 1)}
    del t
    tables = {}
    for n in range(1, N + 1):
        if n == N:
            k, c = raw[N]
        else:  # continuation counts: number of distinct left extensions
            k, c = torch.unique(raw[n + 1][0] & ((1 << (SH * n)) - 1), return_counts=True)
        c = c.double()
        n1, n2 = (c == 1).sum().item(), (c == 2).sum().item()
        D = n1 / (n1 + 2 * n2) if n1 + 2 * n2 > 0 else 0.5
        ent = {"keys": k, "c": c, "D": D}
        if n >= 2:
            ctx, inv, typ = torch.unique_consecutive(k >> SH, return_inverse=True, return_counts=True)
            ent["ctx"], ent["ctot"], ent["ctyp"] = ctx, torch.zeros(ctx.numel(), dtype=torch.float64,
                                                                    device=device).index_add_(0, inv, c), typ.double()
        else:
            ent["tot"], ent["typ"] = c.sum(), float(k.numel())
        tables[n] = ent
    return tables


@torch.no_grad()
def kn_ngram_bpb(train_stream: np.ndarray, eval_stream: np.ndarray, tok_bytes: np.ndarray, V: int, N: int,
                 device) -> dict:
    """Interpolated Kneser-Ney n-gram (orders 1..N, one discount per order D = n1/(n1+2 n2)), counts from the
    training token stream, scored on the same eval tokens as the model (the stream after its first EOS)."""
    SH = max(1, int(math.ceil(math.log2(V))))
    assert SH * N <= 62, f"{N}-grams over a {V}-token vocab do not fit an int64 key"
    def keys(s, n):
        k = s[: s.numel() - n + 1].clone()
        for j in range(1, n):
            k = (k << SH) | s[j: s.numel() - n + 1 + j]
        return k

    memo = (id(train_stream), N)
    if memo in _NGRAM_CACHE:
        tables = _NGRAM_CACHE[memo]
    else:
        tables = _NGRAM_CACHE[memo] = _kn_tables(train_stream, N, SH, keys, device)

    def look(kk, vv, q):
        i = torch.searchsorted(kk, q).clamp(max=kk.numel() - 1)
        return torch.where(kk[i] == q, vv[i], torch.zeros((), dtype=vv.dtype, device=device))

    e = torch.from_numpy(np.concatenate([np.zeros(N - 1, np.int64), eval_stream.astype(np.int64)])).to(device)
    w = e[N:]                                                        # predicted tokens (the stream after its first EOS)
    P = w.numel()
    hist = [e[N - 1 - j: N - 1 - j + P] for j in range(N - 1)]        # hist[j] = token j+1 steps back
    tb = torch.from_numpy(tok_bytes).to(device)[w].double()
    T1 = tables[1]
    p = (torch.clamp(look(T1["keys"], T1["c"], w) - T1["D"], min=0) + T1["D"] * T1["typ"] / V) / T1["tot"]
    for n in range(1, N + 1):
        if n >= 2:
            Tn = tables[n]
            h = torch.zeros_like(w)
            for j in range(n - 1, 0, -1):                              # oldest first
                h = (h << SH) | hist[j - 1]
            ctot = look(Tn["ctx"], Tn["ctot"], h)
            ctyp = look(Tn["ctx"], Tn["ctyp"], h)
            c = look(Tn["keys"], Tn["c"], (h << SH) | w)
            pn = (torch.clamp(c - Tn["D"], min=0) + Tn["D"] * ctyp * p) / ctot.clamp(min=1)
            p = torch.where(ctot > 0, pn, p)
    return {"order": N, "bits_per_byte": (-torch.log2(p)).sum().item() / tb.sum().item(),
            "bits_per_token": (-torch.log2(p)).mean().item(), "tokens": P, "train_tokens": int(len(train_stream)),
            "discounts": {n: round(tables[n]["D"], 4) for n in tables}}


@torch.no_grad()
def greedy_generate(model: Qwen3NextLM, prompt: torch.Tensor, n_new: int, eos_id: int | None = None):
    """No cache: re-run the whole prefix each step (the model is small). prompt [B,P] -> [B,P+n_new]."""
    seq = prompt
    for _ in range(n_new):
        nxt = model(seq)[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
        if eos_id is not None and seq.shape[0] == 1 and nxt.item() == eos_id:
            break
    return seq


@torch.no_grad()
def mtp_free_running(model: Qwen3NextLM, prompts: torch.Tensor, n_new: int) -> dict:
    """Greedy speculative decoding with 1 MTP draft, simulated exactly: the main model's greedy continuation is
    generated first; at committed position i the draft is argmax MTP(h_i, a_{i+1}) for i+2, accepted iff it equals
    the main model's greedy a_{i+2}; accepted -> next draft at i+2, else at i+1."""
    P = prompts.shape[1]
    seq = greedy_generate(model, prompts, n_new)
    h, _ = model.backbone(seq)
    draft = model.lm_head(model.mtp_hidden(h[:, :-1], seq[:, 1:])[0]).argmax(-1)   # draft[:, i] for seq[:, i+2]
    ok = (draft[:, :-1] == seq[:, 2:])                                # [B, P+n-2]
    okc = ok[:, P - 1:].cpu().numpy()                                 # positions whose t+1 is generated
    steps = acc = 0
    for row in okc:
        i = 0
        while i < len(row):
            steps += 1
            if row[i]:
                acc += 1
                i += 2
            else:
                i += 1
    return {"prompts": int(prompts.shape[0]), "prompt_tokens": P, "new_tokens": n_new,
            "accept_per_position": float(okc.mean()), "accept_per_draft_simulated": acc / max(1, steps),
            "tokens_per_step_simulated": (steps + acc) / max(1, steps)}


# =====================================================================================================
# 7. Export
# =====================================================================================================
def export_checkpoint(model: Qwen3NextLM, out_dir: str, shard_max: int, eos_id: int) -> dict:
    from safetensors.torch import save_file
    tensors = to_checkpoint_tensors(model, torch.bfloat16)
    shard_max -= 256 * 1024                                            # room for the safetensors JSON header
    shards, cur, cur_b = [], {}, 0
    for name, t in tensors.items():
        nb = t.numel() * t.element_size()
        assert nb <= shard_max, f"tensor {name} ({nb} B) exceeds the shard limit {shard_max}"
        if cur and cur_b + nb > shard_max:
            shards.append(cur)
            cur, cur_b = {}, 0
        cur[name] = t
        cur_b += nb
    if cur:
        shards.append(cur)
    wmap, files = {}, []
    for i, sh in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sh, os.path.join(out_dir, fn), metadata={"format": "pt"})
        files.append(fn)
        for n in sh:
            wmap[n] = fn
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": wmap}
    cfg_hf = model.cfg.to_hf(eos_id)
    gen_cfg = {"bos_token_id": eos_id, "eos_token_id": eos_id, "do_sample": False, "max_new_tokens": 256}
    return {"files": files, "index": index, "config": cfg_hf, "generation_config": gen_cfg,
            "tensor_count": len(tensors), "total_bytes": total}


def tokenizer_config(eos: str) -> dict:
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": eos, "pad_token": eos,
            "unk_token": None, "add_bos_token": False, "add_eos_token": False, "model_max_length": 4096,
            "clean_up_tokenization_spaces": False}


def write_bundle(path: str, members: dict):
    """members: name -> bytes|str|dict. Written to a temp file first, then renamed (a kill leaves the old one)."""
    tmp = "/tmp/_bundle.tar.gz"
    with tarfile.open(tmp, "w:gz") as tf:
        for name, data in members.items():
            if isinstance(data, (dict, list)):
                data = json.dumps(data, indent=1)
            if isinstance(data, str):
                data = data.encode()
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            ti.mtime = 0
            tf.addfile(ti, io.BytesIO(data))
    shutil.move(tmp, path)


# =====================================================================================================
# 8. Main
# =====================================================================================================
def deep_update(d: dict, u: dict) -> dict:
    for k, v in u.items():
        d[k] = deep_update(d.get(k, {}), v) if isinstance(v, dict) else v
    return d


def bench_delta_solvers(model: Qwen3NextLM, B: int, L: int, device, log: Log) -> dict:
    """fwd+bwd time of one GatedDeltaNet layer under each solver (smoke run: picks the full run's solver)."""
    layer = next(m for m in model.modules() if isinstance(m, GatedDeltaNet))
    x = torch.randn(B, L, model.cfg.hidden_size, device=device, requires_grad=True)
    res = {}
    for solver in ("trsm", "doubling"):
        layer.solver = solver
        ts = []
        for i in range(6):
            torch.cuda.synchronize()
            t = time.time()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = layer(x)
            y.float().square().mean().backward()
            torch.cuda.synchronize()
            ts.append(time.time() - t)
        res[solver] = round(float(np.median(ts[2:])) * 1e3, 2)
    layer.solver = "trsm"
    model.zero_grad(set_to_none=True)
    log(f"delta solver bench (one layer fwd+bwd, ms): {res}")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "default_model.json"))
    ap.add_argument("--out", default=os.environ.get("OUT", "out_default_model"))
    ap.add_argument("--smoke", action="store_true", help="short end-to-end run: few steps, small data and eval")
    ap.add_argument("--override", default="{}", help="JSON merged into the config (CPU tests)")
    ap.add_argument("--max-docs", type=int, default=0, help="CPU tests: keep only this many documents")
    args = ap.parse_args()

    cfg = json.load(open(args.config))
    if args.smoke:
        deep_update(cfg, {"data": {"tokenizer_train_bytes": 10_000_000, "eval_max_tokens_packages": 200_000,
                                   "eval_max_tokens_stdlib": 50_000},
                          "train": {"max_steps": 45, "train_deadline_s": 150, "hard_deadline_s": 170},
                          "eval": {"gen_new_tokens": 32, "mtp_gen_prompts": 16, "mtp_gen_new_tokens": 32}})
    deep_update(cfg, json.loads(args.override))
    seed, dc, tc, ec = cfg["seed"], cfg["data"], cfg["train"], cfg["eval"]
    os.makedirs(args.out, exist_ok=True)
    log = Log(os.path.join(args.out, "train.log"))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    import tokenizers
    import transformers
    env = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
           "tokenizers": tokenizers.__version__, "numpy": np.__version__, "device": str(device),
           "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None, "cpus": os.cpu_count(),
           "argv": sys.argv[1:]}
    log("env", json.dumps(env))
    log("config", json.dumps(cfg))
    metrics = {"env": env, "config": cfg, "timings": {}}
    tm = metrics["timings"]
    bundle = {"default_model.json": cfg}
    bundle_path = os.path.join(args.out, "bundle.tar.gz")

    def save_metrics():
        bundle["metrics.json"] = metrics
        with open(os.path.join(args.out, "metrics.json"), "w") as f:
            json.dump(metrics, f, indent=1)
        write_bundle(bundle_path, bundle)

    # ---- 1. data -------------------------------------------------------------------------------------
    docs, manifest, heldout = walk_corpus(dc, seed)
    if args.max_docs:
        random.Random(seed).shuffle(docs)
        docs = sorted(docs[: args.max_docs], key=lambda d: (d["kind"], d["pkg"], d["path"]))
    tm["walk_s"] = round(elapsed(), 1)
    bundle["manifest.json"], bundle["heldout.json"] = manifest, heldout
    log(f"walk: {manifest['kept_files']} files, {manifest['kept_bytes'] / 1e6:.1f} MB kept; {manifest['walk']}; "
        f"splits {manifest['splits']}; held-out packages {[e['package'] for e in heldout['packages']]}; "
        f"rejected for overlap {heldout['rejected_for_overlap']}")
    train_docs = [d for d in docs if d["split"] == "train"]
    random.Random(seed + 2).shuffle(train_docs)

    # ---- 2. tokenizer: training split only, a seeded sample of whole files ------------------------------
    t = time.time()
    sample, nb = [], 0
    for d in train_docs:
        if nb >= dc["tokenizer_train_bytes"]:
            break
        sample.append(d["text"])
        nb += d["nbytes"]
    V = cfg["model"]["vocab_size"]
    tok = train_tokenizer(sample, V)
    del sample
    eos_id = tok.token_to_id(EOS)
    tok_bytes = token_byte_lengths(tok, V)
    tm["tokenizer_s"] = round(time.time() - t, 1)
    log(f"tokenizer: {tok.get_vocab_size()} tokens trained on {nb / 1e6:.1f} MB in {tm['tokenizer_s']} s; "
        f"eos id {eos_id}")
    probe = train_docs[0]["text"][:4000]
    assert tok.decode(tok.encode(probe).ids) == probe, "tokenizer does not round-trip"
    bundle["tokenizer.json"] = tok.to_str()
    bundle["tokenizer_config.json"] = tokenizer_config(EOS)
    save_metrics()

    # ---- tokenize the training split ------------------------------------------------------------------
    t = time.time()
    texts = [d["text"] for d in train_docs]
    if args.smoke:  # tokenize a 60 MB slice: enough for the smoke steps, and it measures the rate
        cum = np.cumsum([d["nbytes"] for d in train_docs])
        texts = texts[: int(np.searchsorted(cum, 60_000_000)) + 1]
    train_stream = encode_docs(tok, texts, eos_id)
    tm["tokenize_s"] = round(time.time() - t, 1)
    enc_bytes = sum(len(s.encode()) for s in texts)
    metrics["train_stream"] = {"tokens": int(len(train_stream)), "bytes": enc_bytes, "docs": len(texts),
                               "bytes_per_token": enc_bytes / len(train_stream)}
    log(f"tokenized train: {len(train_stream) / 1e6:.2f}M tokens from {enc_bytes / 1e6:.1f} MB "
        f"({enc_bytes / len(train_stream):.2f} B/token) in {tm['tokenize_s']} s")
    del texts

    def eval_set(split, cap):
        ds = sorted((d for d in docs if d["split"] == split), key=lambda d: d["path"])
        random.Random(seed + 3).shuffle(ds)
        texts, parts, n = [], [np.array([eos_id], np.uint16)], 1
        for d in ds:
            if n >= cap:
                break
            ids = np.array(tok.encode(d["text"], add_special_tokens=False).ids, dtype=np.uint16)
            texts.append(d["text"])
            parts += [ids, np.array([eos_id], np.uint16)]
            n += len(ids) + 1
        return texts, np.concatenate(parts)

    evsets = {"heldout_packages": eval_set("heldout_packages", dc["eval_max_tokens_packages"]),
              "heldout_stdlib": eval_set("heldout_stdlib", dc["eval_max_tokens_stdlib"])}
    snippets = [s[:3000] for s in evsets["heldout_packages"][0][:4] if len(s) >= 500] or \
        [evsets["heldout_packages"][0][0][:3000]]
    bundle["heldout_snippets.json"] = snippets

    # ---- 3./4. model -----------------------------------------------------------------------------------
    mcfg = ModelConfig(**cfg["model"])
    model = Qwen3NextLM(mcfg)
    model.init_weights(seed)
    model.set_delta(tc["delta_chunk"], tc["delta_solver"])
    model.to(device)
    metrics["params"] = param_counts(model)
    log("params", json.dumps(metrics["params"]))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True                   # fp32 delta-rule matmuls in training
        torch.backends.cudnn.allow_tf32 = True
        if args.smoke:
            metrics["delta_solver_bench_ms"] = bench_delta_solvers(model, tc["batch_size"], tc["seq_len"], device, log)

    # ---- 5. training -----------------------------------------------------------------------------------
    tokens = torch.from_numpy(train_stream.astype(np.int32)).to(device)
    t = time.time()
    res = train(model, tokens, tc, log, seed, device)
    tm["train_s"] = round(time.time() - t, 1)
    metrics["train"] = res
    if device.type == "cuda":
        metrics["train"]["max_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 1)
    del tokens
    log(f"training: {res['steps']} steps ({res['stop_reason']}), {res['tokens'] / 1e6:.1f}M tokens, "
        f"{res['epochs']:.2f} epochs, {tm['train_s']} s")

    # ---- 7. export first (weights come back even if evaluation runs out of time) ------------------------
    model.eval()
    with torch.no_grad():
        for p in model.parameters():                                   # evaluate what ships: bf16 weights
            p.copy_(p.to(torch.bfloat16).float())
    ex = export_checkpoint(model, args.out, cfg["export"]["shard_max_bytes"], eos_id)
    bundle.update({"config.json": ex["config"], "generation_config.json": ex["generation_config"],
                   "model.safetensors.index.json": ex["index"]})
    metrics["export"] = {k: ex[k] for k in ("files", "tensor_count", "total_bytes")}
    save_metrics()
    log(f"exported {ex['tensor_count']} tensors, {ex['total_bytes'] / 2 ** 20:.1f} MiB bf16 in {ex['files']}")

    # ---- 6. evaluation (fp32, no TF32) -----------------------------------------------------------------
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    hard = tc["hard_deadline_s"]
    ev = metrics.setdefault("eval", {})

    def guarded(name, fn):
        if elapsed() > hard:
            ev[name] = {"skipped": f"time ({elapsed():.0f}s > {hard}s)"}
            log(f"skip {name}: out of time")
            return
        t0 = time.time()
        try:
            ev[name] = fn()
        except Exception as e:  # record, keep going: the other numbers still matter
            ev[name] = {"error": f"{type(e).__name__}: {e}"}
        tm[f"eval_{name}_s"] = round(time.time() - t0, 1)
        log(f"eval {name}: {json.dumps(ev[name])[:1500]}")
        save_metrics()

    for split, (texts, stream) in evsets.items():
        guarded(f"model_{split}", lambda s=stream: eval_model(model, s, tok_bytes, ec["batch_size"], tc["seq_len"],
                                                              device))
        guarded(f"zlib_{split}", lambda tx=texts: zlib_bpb(tx))
    guarded("samples", lambda: [{"prompt": pr, "completion": tok.decode(greedy_generate(
        model, torch.tensor([tok.encode(pr).ids], device=device), ec["gen_new_tokens"], eos_id)[0].tolist()[
        len(tok.encode(pr).ids):])} for pr in ec["gen_prompts"]])

    def mtp_run():
        stream = evsets["heldout_packages"][1]
        P, G, n = ec["mtp_gen_prompt_tokens"], ec["mtp_gen_new_tokens"], ec["mtp_gen_prompts"]
        rng = np.random.default_rng(seed + 4)
        starts = rng.integers(0, len(stream) - P, size=n)
        pr = torch.from_numpy(np.stack([stream[s: s + P].astype(np.int64) for s in starts])).to(device)
        return mtp_free_running(model, pr, G)
    guarded("mtp_free_running", mtp_run)
    for split, (texts, stream) in evsets.items():
        for order in (3, 4):
            guarded(f"ngram{order}_{split}", lambda s=stream, o=order: kn_ngram_bpb(train_stream, s, tok_bytes, V, o,
                                                                                 device))

    def hf_check():
        """transformers' Qwen3NextForCausalLM loads the exported checkpoint; logits match ours (fp32, CPU)."""
        from transformers import Qwen3NextForCausalLM
        d = "/tmp/hf_default_model"
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for fn in ex["files"]:
            shutil.copy(os.path.join(args.out, fn), d)
        for name in ("config.json", "generation_config.json", "model.safetensors.index.json"):
            json.dump(bundle[name], open(os.path.join(d, name), "w"), indent=1)
        hf, info = Qwen3NextForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True)
        ours = load_model_dir(d)
        ids = torch.tensor([tok.encode(snippets[0]).ids[:512]])
        with torch.no_grad():
            a, b = ours(ids), hf(ids).logits
        return {"transformers": transformers.__version__, "missing": sorted(info["missing_keys"]),
                "unexpected": sorted(info["unexpected_keys"])[:5], "tokens": ids.shape[1],
                "rel_err": ((a - b).norm() / b.norm()).item(), "max_abs": (a - b).abs().max().item()}
    guarded("hf_parity", hf_check)
    tm["total_s"] = round(elapsed(), 1)
    save_metrics()
    files = sorted(os.listdir(args.out))
    log(f"done in {tm['total_s']} s; {len(files)} files in out: {files}")
    if len(files) > 8:
        log("WARNING: more than 8 files in out; the run tool brings back at most 8")


if __name__ == "__main__":
    main()
