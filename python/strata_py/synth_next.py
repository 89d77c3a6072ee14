"""Synthetic Qwen3.5-MoE (`qwen35moe`) and Qwen4-Exp (`qwen4exp`) GGUFs: random valid weights, deterministic from
the seed, in exactly the layout our converter (and llama.cpp's) writes: the same metadata functions
(convert_qwen35.trunk_metadata, convert_qwen4exp.model_metadata) and tensor names/shapes (spec qwen4exp.md §3-4).

    python -m strata_py.synth --arch qwen35moe|qwen4exp NAME OUT.gguf --type TYPE --seed S
                              [--experts N] [--ngram-vocab N] [--mtp]

NAME: `tiny` (tests), `bench` (hidden 1024, 24 layers 3:1, 128 experts top-8 + shared expert; qwen4exp: 4 HC
streams, QSA budget 2048 tokens in 4-token blocks, a PLE table of ~0.8 M rows x 64), `full` (the real dimensions
of the config classes' defaults: hidden 2048, 40 layers, 256 (qwen35moe) / 512 (qwen4exp) experts; [M] the QSA
and PLE sizes of the released Qwen4-Exp are not public, the ones here are plausible). --experts N sets the expert
count of any size (top-k is capped at N). --ngram-vocab N sets the PLE n-gram vocabulary base (each of the
(ngram_size-1) * heads_per_ngram heads has about N rows): the real model's 20,000,000 makes a ~43 GB Q8_0 table,
so `full` uses 1,000,000 unless asked, `bench` 50,000 (55 MiB Q8_0), `tiny` 1000.
TYPE: every type of synth.py (float, 32-value blocks, K and IQ quants, q4_k_m). A matrix whose rows are not a
multiple of the type's block (the HC up-projections of rank 320, the PLE table rows of 64 / 128) falls back to
Q8_0 (rows a multiple of 32) or F16, as llama-quantize does; norms, routers, shared-expert gates and both conv
weights stay F32. Tensors are generated and written one at a time (experts one expert at a time, the PLE table in
row blocks), so a `full` file needs memory for one tensor, not the model. Written to OUT.tmp, renamed on success.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from gguf import GGMLQuantizationType as QT

from . import convert as cv
from . import convert_qwen35 as q35
from . import convert_qwen4exp as q4x
from . import ple_constants
from . import synth

ARCHS = ("qwen35moe", "qwen4exp")

_TRUNK = {
    "tiny": dict(n_vocab=320, n_embd=256, n_layer=4, n_head=4, n_head_kv=2, head_dim=64, rope_dim=16,
                 mrope_sections=(4, 2, 2, 0), n_expert=8, n_expert_used=2, n_ff_exp=256, n_ff_shexp=256, nk=2, nv=4,
                 dk=64, dv=64, n_ctx=4096),
    "bench": dict(n_vocab=32768, n_embd=1024, n_layer=24, n_head=8, n_head_kv=2, head_dim=128, rope_dim=32,
                  mrope_sections=(6, 5, 5, 0), n_expert=128, n_expert_used=8, n_ff_exp=256, n_ff_shexp=256, nk=8,
                  nv=16, dk=128, dv=128, n_ctx=65536),
    "full": dict(n_vocab=248320, n_embd=2048, n_layer=40, n_head=16, n_head_kv=2, head_dim=256, rope_dim=64,
                 mrope_sections=(11, 11, 10, 0), n_expert=256, n_expert_used=8, n_ff_exp=512, n_ff_shexp=512, nk=16,
                 nv=32, dk=128, dv=128, n_ctx=262144),
    # the smallest files with every tensor kind (~0.1-0.3 MB): seeds for the fuzzers (fuzz/make_seeds.py)
    "micro": dict(n_vocab=272, n_embd=32, n_layer=4, n_head=2, n_head_kv=1, head_dim=16, rope_dim=8,
                  mrope_sections=(2, 1, 1, 0), n_expert=4, n_expert_used=2, n_ff_exp=32, n_ff_shexp=32, nk=1, nv=2,
                  dk=16, dv=16, n_ctx=256),
}
# what Qwen4-Exp adds per size (hc_lowrank, indexer, PLE); `full` has 512 experts top-10 like the config class
_Q4X = {
    "tiny": dict(hc=4, hc_rank=256, ni=8, di=64, budget=16, ratio=4, ple_layers=(1,), ngram=3, hpn=2, ple_base=1000),
    "bench": dict(hc=4, hc_rank=256, ni=8, di=128, budget=2048, ratio=4, ple_layers=(1,), ngram=3, hpn=8,
                  ple_base=50_000),
    "full": dict(hc=4, hc_rank=320, ni=16, di=128, budget=2048, ratio=4, ple_layers=(1,), ngram=3, hpn=8,
                 ple_base=1_000_000, n_expert=512, n_expert_used=10),
    "micro": dict(hc=2, hc_rank=32, ni=2, di=16, budget=8, ratio=4, ple_layers=(1,), ngram=3, hpn=2, ple_base=64),
}
SIZES = tuple(_TRUNK)


def hparams(arch: str, name: str, experts: int | None = None, ngram_vocab: int | None = None):
    """The Hparams (convert_qwen35.Hparams / convert_qwen4exp.Hparams) of a named synthetic size."""
    if arch not in ARCHS:
        raise ValueError(f"unknown synthetic architecture {arch!r} (known: {', '.join(ARCHS)})")
    if name not in _TRUNK:
        raise ValueError(f"unknown synthetic size {name!r} for {arch} (known: {', '.join(SIZES)})")
    d = dict(_TRUNK[name])
    if arch == "qwen4exp":
        d.update(_Q4X[name])
        if ngram_vocab is not None:
            if ngram_vocab < 2:
                raise ValueError(f"bad option --ngram-vocab {ngram_vocab}: need >= 2")
            d["ple_base"] = int(ngram_vocab)
    elif ngram_vocab is not None:
        raise ValueError("--ngram-vocab: only qwen4exp has a PLE table")
    if experts is not None:
        if experts < 1:
            raise ValueError(f"bad option --experts {experts}: need >= 1")
        d["n_expert"], d["n_expert_used"] = int(experts), min(d["n_expert_used"], int(experts))
    rec = tuple(bool((i + 1) % 4) for i in range(d["n_layer"]))
    common = dict(n_ff=0, eps=1e-6, rope_theta=1e7, conv_kernel=4, interval=4, tie=False, bos_token_id=None,
                  eos_token_id=None, pad_token_id=None, recurrent=rec)
    if arch == "qwen35moe":
        return q35.Hparams(**common, **d)
    return q4x.Hparams(**common, **d, ple_dim=d["n_embd"], ple_kernel=4, gate="sigmoid")


class _Tensors:
    """The output list: every tensor with a generator of its (already encoded) pieces, drawn from one RNG in
    file order when written."""

    def __init__(self, rng: np.random.Generator, qt: QT, qt_hi: QT):
        self.rng, self.qt, self.qt_hi = rng, qt, qt_hi
        self.outs: list[cv._Out] = []

    def _add(self, name: str, shape: tuple[int, ...], qt: QT, pieces: Callable[[], Iterator[np.ndarray]]):
        self.outs.append(cv._Out(name, tuple(shape), qt, None, "synth", chunks=pieces, raw=True))

    def fit(self, qt: QT, cols: int) -> QT:
        """qt, or Q8_0 / F16 when rows of `cols` values are not whole blocks of qt."""
        for t in (qt, QT.Q8_0, QT.F16):
            if cols % cv.gguf.GGML_QUANT_SIZES[t][0] == 0:
                return t
        return QT.F16

    def mat(self, name: str, rows: int, cols: int, hi: bool = False, step: int | None = None):
        """A random [rows, cols] matrix (GGUF ne [cols, rows]), generated `step` rows at a time."""
        qt = self.fit(self.qt_hi if hi else self.qt, cols)
        step = step or rows

        def pieces():
            for r0 in range(0, rows, step):
                yield synth._weight(self.rng, (min(step, rows - r0), cols), qt)
        self._add(name, (rows, cols), qt, pieces)

    def experts(self, name: str, n: int, rows: int, cols: int, hi: bool = False):
        qt = self.fit(self.qt_hi if hi else self.qt, cols)
        self._add(name, (n, rows, cols), qt, lambda: (synth._weight(self.rng, (1, rows, cols), qt) for _ in range(n)))

    def f32(self, name: str, shape: tuple[int, ...], make: Callable[[np.random.Generator], np.ndarray]):
        def pieces():
            a = np.ascontiguousarray(make(self.rng), dtype=np.float32)
            assert a.shape == shape, (name, a.shape, shape)
            yield a
        self._add(name, shape, QT.F32, pieces)

    def norm(self, name: str, n: int):  # stored as w + 1, about 1
        self.f32(name, (n,), lambda r: 1.0 + 0.1 * r.standard_normal(n))


def _attention(t: _Tensors, hp, p: str):
    H = hp.n_embd
    t.mat(p + "attn_q.weight", hp.n_head * hp.head_dim * 2, H)
    t.mat(p + "attn_k.weight", hp.n_head_kv * hp.head_dim, H)
    t.mat(p + "attn_v.weight", hp.n_head_kv * hp.head_dim, H, hi=True)
    t.mat(p + "attn_output.weight", H, hp.n_head * hp.head_dim)
    t.norm(p + "attn_q_norm.weight", hp.head_dim)
    t.norm(p + "attn_k_norm.weight", hp.head_dim)


def _deltanet(t: _Tensors, hp, p: str):
    H = hp.n_embd
    t.mat(p + "attn_qkv.weight", hp.conv_dim, H)
    t.mat(p + "attn_gate.weight", hp.value_dim, H)
    t.mat(p + "ssm_beta.weight", hp.nv, H)
    t.mat(p + "ssm_alpha.weight", hp.nv, H)
    t.f32(p + "ssm_conv1d.weight", (hp.conv_dim, hp.conv_kernel),
          lambda r: 0.5 * r.standard_normal((hp.conv_dim, hp.conv_kernel)))
    t.f32(p + "ssm_dt.bias", (hp.nv,), lambda r: r.uniform(-1, 1, hp.nv))
    t.f32(p + "ssm_a", (hp.nv,), lambda r: -np.exp(r.uniform(-2, 1, hp.nv)))
    t.f32(p + "ssm_norm.weight", (hp.dv,), lambda r: 1.0 + 0.1 * r.standard_normal(hp.dv))
    t.mat(p + "ssm_out.weight", H, hp.value_dim)


def _moe(t: _Tensors, hp, p: str, layer: int):
    H, E = hp.n_embd, hp.n_expert
    t.f32(p + "ffn_gate_inp.weight", (E, H), lambda r: r.standard_normal((E, H)) / np.sqrt(H))
    t.experts(p + "ffn_gate_exps.weight", E, hp.n_ff_exp, H)
    t.experts(p + "ffn_up_exps.weight", E, hp.n_ff_exp, H)
    t.experts(p + "ffn_down_exps.weight", E, H, hp.n_ff_exp, hi=layer % 2 == 0)
    t.mat(p + "ffn_gate_shexp.weight", hp.n_ff_shexp, H)
    t.mat(p + "ffn_up_shexp.weight", hp.n_ff_shexp, H)
    t.mat(p + "ffn_down_shexp.weight", H, hp.n_ff_shexp)
    t.f32(p + "ffn_gate_inp_shexp.weight", (1, H), lambda r: r.standard_normal((1, H)) / np.sqrt(H))


def _hc(t: _Tensors, hp, gg: str, inject: bool):
    t.norm(gg + "_norm.weight", hp.hc_dim)
    t.mat(gg + "_down.weight", hp.hc_rank, hp.hc_dim)
    t.mat(gg + "_up.weight", hp.hc_dim, hp.hc_rank)
    if inject:
        t.mat(gg + "_inject.weight", hp.hc, hp.hc_dim)


def _ple_block(t: _Tensors, hp, p: str):
    t.mat(p + "ple_key.weight", hp.hc_dim, hp.ple_dim)
    t.mat(p + "ple_value.weight", hp.n_embd, hp.ple_dim)
    for n in ("key", "query", "conv"):
        t.norm(f"{p}ple_norm_{n}.weight", hp.hc_dim)
    t.f32(p + "ple_conv1d.weight", (hp.hc_dim, hp.ple_kernel),
          lambda r: 0.5 * r.standard_normal((hp.hc_dim, hp.ple_kernel)))


def ple_arrays(hp) -> dict:
    """The u64 hash arrays and row count of the PLE layer (index 0 among ple_layers), as transformers derives them."""
    sizes = ple_constants.head_vocab_sizes(hp.ple_base, hp.ple_heads, 0)
    return {"layer_multipliers": cv.U64Array(ple_constants.layer_multipliers(hp.n_vocab, hp.ngram, 0, hp.ple_seed)),
            "head_offsets": cv.U64Array(ple_constants.head_offsets(sizes)), "head_vocab_sizes": cv.U64Array(sizes),
            "row": hp.ple_row, "rows": ple_constants.table_rows(sizes, 128)}


def plan(arch: str, hp, qt: QT, qt_hi: QT, rng: np.random.Generator, mtp: bool) -> tuple[list[cv._Out], dict | None]:
    t = _Tensors(rng, qt, qt_hi)
    H, V = hp.n_embd, hp.n_vocab
    t.mat("token_embd.weight", V, H, step=65536)
    ple = None
    for i in range(hp.n_layer):
        p = f"blk.{i}."
        if arch == "qwen4exp":
            if i in hp.ple_layers:
                _ple_block(t, hp, p)
            _hc(t, hp, p + "hc_attn", True)
        else:
            t.norm(p + "attn_norm.weight", H)
        if hp.is_full_attention(i):
            _attention(t, hp, p)
            if arch == "qwen4exp":
                t.mat(p + "indexer.q_proj.weight", hp.ni * hp.di, H)
                t.mat(p + "indexer.k_proj.weight", hp.di, H)
                t.norm(p + "indexer.q_norm.weight", hp.di)
                t.norm(p + "indexer.k_norm.weight", hp.di)
        else:
            _deltanet(t, hp, p)
        if arch == "qwen4exp":
            _hc(t, hp, p + "hc_ffn", True)
        else:
            t.norm(p + "post_attention_norm.weight", H)
        _moe(t, hp, p, i)
    if mtp:
        p = f"blk.{hp.n_layer}."
        t.mat(p + "nextn.eh_proj.weight", H, 2 * H)
        for n in ("enorm", "hnorm", "shared_head_norm"):
            t.norm(f"{p}nextn.{n}.weight", H)
        t.norm(p + "attn_norm.weight", H)
        t.norm(p + "post_attention_norm.weight", H)
        _attention(t, hp, p)
        _moe(t, hp, p, hp.n_layer)
    if arch == "qwen4exp":
        _hc(t, hp, "output_hc", False)
        ple = ple_arrays(hp)
        t.mat("per_layer_token_embd.weight", ple["rows"], hp.ple_row, step=1 << 16)
    else:
        t.norm("output_norm.weight", H)
    t.mat("output.weight", V, H, hi=True, step=65536)
    return t.outs, ple


def write(arch: str, name: str, out_path, out_type: str = "q8_0", seed: int = 0, mtp: bool = False,
          experts: int | None = None, ngram_vocab: int | None = None) -> Path:
    """Write a synthetic `arch` GGUF of size `name` to out_path (atomically); return the path."""
    if out_type not in synth.TYPES and out_type not in synth.MIXES:
        raise ValueError(f"bad option --type {out_type!r} (supported here: {', '.join([*synth.TYPES, *synth.MIXES])})")
    if mtp and arch != "qwen35moe":
        raise ValueError(f"--mtp: {arch} has no MTP block in GGUF")
    hp = hparams(arch, name, experts, ngram_vocab)
    qt, qt_hi = synth.MIXES[out_type] if out_type in synth.MIXES else (synth.TYPES[out_type],) * 2
    vocab = synth._tokenizer_metadata(hp)
    if arch == "qwen4exp":
        hp = dataclasses.replace(hp, ple_eos=int(vocab["tokenizer.ggml.eos_token_id"]))
    outs, ple = plan(arch, hp, qt, qt_hi, np.random.default_rng(seed), mtp)
    label = f"strata-synth-{arch}-{name}-s{seed}"
    if arch == "qwen4exp":
        md = q4x.model_metadata(hp, "f32", label, ple)
    else:
        md = q35.trunk_metadata(arch, hp, "f32", label, int(mtp))
    md["general.file_type"] = int(synth.FILE_TYPES[out_type])
    md.update(vocab)
    out_path = Path(out_path)
    cv.write_gguf(out_path, arch, md, outs)
    return out_path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m strata_py.synth --arch qwen35moe|qwen4exp",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", choices=ARCHS, required=True)
    ap.add_argument("name", choices=SIZES)
    ap.add_argument("out")
    ap.add_argument("--type", default="q8_0", choices=sorted([*synth.TYPES, *synth.MIXES]))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mtp", action="store_true", help="qwen35moe: include an MTP block (blk.{n_layer}.nextn.*)")
    ap.add_argument("--experts", type=int, default=None, help="number of routed experts (any size)")
    ap.add_argument("--ngram-vocab", type=int, default=None,
                    help="qwen4exp: PLE n-gram vocabulary base per head (real model: 20000000)")
    a = ap.parse_args(argv)
    try:
        p = write(a.arch, a.name, a.out, a.type, a.seed, a.mtp, a.experts, a.ngram_vocab)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {p} ({p.stat().st_size / 2**20:.1f} MiB)")
    return 0
