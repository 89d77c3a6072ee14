"""Synthetic Qwen3-Next GGUFs: random valid weights, deterministic from the seed, at named sizes.

    python -m strata_py.synth NAME OUT.gguf --type TYPE --seed S [--mtp] [--expert-gib G]

TYPE: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4, q2_k, q3_k, q4_k, q5_k, q6_k, iq1_s, iq1_m,
iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq4_xs, or q4_k_m (Q4_K with Q6_K for output, attn_v and every other
layer's ffn_down, like llama-quantize's Q4_K_M mix).

Sizes: `micro` (fuzzing seeds), `tiny` (tests), `bench` (hidden 1024, 24 layers 3:1, 128 experts top-8 + shared
expert), `stream` (the bench shape with as many experts as make `--expert-gib` GiB of expert weights), `80b`
(Qwen3-Next-80B-A3B's real dimensions: 48 layers, hidden 2048, 512 experts top-10, vocab 151 936; `--type q4_k_m`
~45 GB, `--type iq2_xxs_m` ~25 GB). `--layers N` / `--experts N` override a size's layer / expert count (e.g. a
4-layer real-dimension file). Tensors are generated while the file is written, a large one in slices
(lazy_tensor.py), so a file larger than memory never is in memory. Weights are drawn
directly as valid blocks of the target type (gguf-py has no K/IQ quantizer): a random fp16 scale and
random codes. For K, IQ and the 32-value block types every byte pattern of the scales/codes/grid indices/sign
bits is a valid block, so the bytes are uniform random and only the scales are chosen, with a magnitude of
about 1/sqrt(row length) so activations stay in range over many layers. Every file carries a valid
byte-level BPE tokenizer (256 byte tokens + `<|endoftext|>`, padded), so our CLI and llama.cpp
both load it. The file is written to OUT.tmp and renamed on success.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from . import convert as cv
from .lazy_tensor import LazyTensor

SIZES = {
    "tiny": dict(n_vocab=320, n_embd=256, n_layer=4, n_head=4, n_head_kv=2, head_dim=64, rope_dim=16,
                 n_expert=8, n_expert_used=2, n_ff_exp=256, n_ff_shexp=256, nk=2, nv=4, dk=64, dv=64, n_ctx=4096),
    "bench": dict(n_vocab=32768, n_embd=1024, n_layer=24, n_head=8, n_head_kv=2, head_dim=128, rope_dim=32,
                  n_expert=128, n_expert_used=8, n_ff_exp=256, n_ff_shexp=256, nk=8, nv=16, dk=128, dv=128,
                  n_ctx=32768),
    # Qwen3-Next-80B-A3B (spec qwen3next.md 1.1)
    "80b": dict(n_vocab=151936, n_embd=2048, n_layer=48, n_head=16, n_head_kv=2, head_dim=256, rope_dim=64,
                n_expert=512, n_expert_used=10, n_ff_exp=512, n_ff_shexp=512, nk=16, nv=32, dk=128, dv=128,
                n_ctx=262144),
}
SIZES["stream"] = dict(SIZES["bench"])
# the smallest file that still has every tensor kind (~50 KB at q8_0): seeds for the fuzzers (fuzz/)
SIZES["micro"] = dict(n_vocab=272, n_embd=32, n_layer=4, n_head=2, n_head_kv=1, head_dim=16, rope_dim=8, n_expert=4,
                      n_expert_used=2, n_ff_exp=32, n_ff_shexp=32, nk=1, nv=2, dk=16, dv=16, n_ctx=256)
# the types convert.py writes (float, Q8_0 and the other 32-value blocks), plus the K and IQ quants
TYPES = {**cv.OUT_TYPES, "q2_k": QT.Q2_K, "q3_k": QT.Q3_K, "q4_k": QT.Q4_K, "q5_k": QT.Q5_K, "q6_k": QT.Q6_K,
         "iq1_s": QT.IQ1_S, "iq1_m": QT.IQ1_M, "iq2_xxs": QT.IQ2_XXS, "iq2_xs": QT.IQ2_XS, "iq2_s": QT.IQ2_S,
         "iq3_xxs": QT.IQ3_XXS, "iq3_s": QT.IQ3_S, "iq4_xs": QT.IQ4_XS}
LFT = gguf.LlamaFileType
FILE_TYPES = {**cv.FILE_TYPES, "q2_k": LFT.MOSTLY_Q2_K, "q3_k": LFT.MOSTLY_Q3_K_S, "q4_k": LFT.MOSTLY_Q4_K_S,
              "q5_k": LFT.MOSTLY_Q5_K_S, "q6_k": LFT.MOSTLY_Q6_K, "iq1_s": LFT.MOSTLY_IQ1_S, "iq1_m": LFT.MOSTLY_IQ1_M,
              "iq2_xxs": LFT.MOSTLY_IQ2_XXS, "iq2_xs": LFT.MOSTLY_IQ2_XS, "iq2_s": LFT.MOSTLY_IQ2_S,
              "iq3_xxs": LFT.MOSTLY_IQ3_XXS, "iq3_s": LFT.MOSTLY_IQ3_S, "iq4_xs": LFT.MOSTLY_IQ4_XS,
              "q4_k_m": LFT.MOSTLY_Q4_K_M, "iq2_xxs_m": LFT.MOSTLY_IQ2_XXS}
# (main type, type for output / attn_v / every other ffn_down): Q4_K_M like llama-quantize's; iq2_xxs_m an
# IQ2_XXS file with Q4_K where llama-quantize and unsloth's low-bit mixes keep more bits (~25 GB at 80B)
MIXES = {"q4_k_m": (QT.Q4_K, QT.Q6_K), "iq2_xxs_m": (QT.IQ2_XXS, QT.Q4_K)}
# tensors larger than this are generated and written in slices along their first dimension (experts)
SLICE_BYTES = 256 * 2**20

# K/IQ blocks: (byte offsets of fp16 scales, 1/typical |code * sub-scale|) so that d = scale * k gives values
# of about `scale`; the remaining bytes are uniform random (always valid).
_KQ = {
    QT.Q2_K: ((80,), 1 / 12, {82: 1.5}),   # dmin = 1.5 d centres (sc & 15)*q - (dmin/d)*(sc >> 4)
    QT.Q3_K: ((108,), 1 / 40, {}),        # |sc - 32| ~ 16, |q| ~ 2.5
    QT.Q4_K: ((0,), 1 / 250, {2: 7.5}),      # dmin = 7.5 d centres sc*q - (dmin/d)*m
    QT.Q5_K: ((0,), 1 / 500, {2: 15.5}),
    QT.Q6_K: ((208,), 1 / 1370, {}),
    QT.IQ2_XXS: ((0,), 1 / 50, {}),
    QT.IQ3_XXS: ((0,), 1 / 130, {}),
    QT.IQ4_XS: ((0,), 1 / 1000, {}),     # |ls - 32| ~ 16, |kvalue| ~ 60
    QT.IQ2_XS: ((0,), 1 / 50, {}),
    QT.IQ2_S: ((0,), 1 / 50, {}),
    QT.IQ3_S: ((0,), 1 / 130, {}),
    QT.IQ1_S: ((0,), 1 / 6, {}),
    QT.IQ1_M: ((None,), 1 / 6, {}),        # d in the top nibbles of the four scale words (set_iq1m_d)
}


def set_iq1m_d(blocks: np.ndarray, d: np.ndarray) -> None:
    """Write fp16 scales d (n,) into IQ1_M blocks (n, 56): bits 4k..4k+3 of d are the top nibble of scale word k."""
    bits = d.astype(np.float16).view(np.uint16).astype(np.uint16)
    words = blocks[:, 48:56].copy().view(np.uint16)  # (n, 4)
    for k in range(4):
        words[:, k] = (words[:, k] & np.uint16(0x0FFF)) | (((bits >> np.uint16(4 * k)) & np.uint16(0xF)) << np.uint16(12))
    blocks[:, 48:56] = words.view(np.uint8)


# 32-value blocks with float scales (blocks32.h): (1/typical |value / d|, byte offset of an fp16 min or None);
# a min of -(code range)/2 * d centres Q4_1 / Q5_1. MXFP4's scale is a power of two (an e8m0 byte).
_B32 = {QT.Q4_0: (1 / 4.5, None), QT.Q4_1: (1 / 4.5, 2), QT.Q5_0: (1 / 9, None), QT.Q5_1: (1 / 9, 2),
        QT.IQ4_NL: (1 / 60, None), QT.MXFP4: (1 / 5, None)}


def random_blocks32(rng: np.random.Generator, qt: QT, n_blocks: int, scale: float) -> np.ndarray:
    """n_blocks random valid blocks of a 32-value type (any codes are valid), values of about `scale`."""
    size = gguf.GGML_QUANT_SIZES[qt][1]
    blocks = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    k, min_at = _B32[qt]
    d = scale * k * rng.uniform(0.5, 1.5, size=n_blocks)
    if qt == QT.MXFP4:  # 2^(e - 128)
        blocks[:, 0] = np.clip(np.round(np.log2(d)) + 128, 2, 254).astype(np.uint8)
        return blocks
    blocks[:, :2] = d.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    if min_at is not None:
        half_range = 7.5 if qt == QT.Q4_1 else 15.5
        blocks[:, min_at:min_at + 2] = (-half_range * d).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return blocks


def random_blocks(rng: np.random.Generator, qt: QT, n_blocks: int, scale: float) -> np.ndarray:
    """n_blocks random valid blocks of a K/IQ type, values of magnitude about `scale`: uint8 (n_blocks, type_size)."""
    size = gguf.GGML_QUANT_SIZES[qt][1]
    blocks = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    (d_off,), k, extra = _KQ[qt]
    d = (scale * k * rng.uniform(0.5, 1.5, size=n_blocks)).astype(np.float16)
    if d_off is None:
        set_iq1m_d(blocks, d)
    else:
        blocks[:, d_off:d_off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    for off, ratio in extra.items():  # dmin
        dm = (d.astype(np.float32) * ratio * rng.uniform(0.9, 1.1, size=n_blocks)).astype(np.float16)
        blocks[:, off:off + 2] = dm.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def hparams(name: str, expert_gib: float | None = None, n_layer: int | None = None,
            n_expert: int | None = None, n_ctx: int | None = None) -> cv.Hparams:
    if name not in SIZES:
        raise ValueError(f"unknown synthetic size {name!r} (known: {', '.join(SIZES)})")
    d = dict(SIZES[name])
    if n_layer is not None:
        if n_layer < 1:
            raise ValueError(f"bad option --layers {n_layer}: must be >= 1")
        d["n_layer"] = n_layer
    if n_expert is not None:
        if n_expert < d["n_expert_used"]:
            raise ValueError(f"bad option --experts {n_expert}: size {name!r} routes to {d['n_expert_used']} experts")
        d["n_expert"] = n_expert
    if n_ctx is not None:  # the context the file declares (metadata only: the weights stay the same)
        if n_ctx < 2:
            raise ValueError(f"bad option n_ctx {n_ctx}: must be >= 2")
        d["n_ctx"] = n_ctx
    if name == "stream":
        if not expert_gib or expert_gib <= 0:
            raise ValueError("size 'stream' needs --expert-gib > 0 (expert bytes to generate, in GiB)")
        per_expert = 3 * d["n_embd"] * d["n_ff_exp"] * 34 / 32  # Q8_0 bytes per expert per layer
        d["n_expert"] = max(d["n_expert_used"], int(expert_gib * 2**30 / (per_expert * d["n_layer"])))
    return cv.Hparams(n_ff=d["n_ff_exp"] * d["n_expert_used"], eps=1e-6, rope_theta=1e7, conv_kernel=4, interval=4,
                      tie=False, bos_token_id=None, eos_token_id=None, pad_token_id=None, **d)


def _corpus() -> list[str]:
    """A fixed training text for the synthetic tokenizer (stable across Python versions)."""
    import codecs
    import keyword
    import this  # noqa: F401  (prints the Zen once on first import; harmless)

    zen = codecs.decode(this.s, "rot13")
    code = "\n".join(f"def {k}_{i}(x, y=None):\n    return x + {i}\n" for i, k in enumerate(keyword.kwlist))
    return [zen, code] * 4


def _tokenizer_metadata(hp: cv.Hparams) -> dict:
    """A byte-level BPE: 256 byte symbols + merges learnt from a fixed text, `<|endoftext|>`, UNUSED padding."""
    import contextlib
    import io

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from tokenizers.pre_tokenizers import ByteLevel

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    size = min(hp.n_vocab, 1024)
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=["<|endoftext|>"], initial_alphabet=ByteLevel.alphabet(),
                                  show_progress=False)
    with contextlib.redirect_stdout(io.StringIO()):
        tok.train_from_iterator(_corpus(), trainer)
    with tempfile.TemporaryDirectory() as d:
        tok.save(os.path.join(d, "tokenizer.json"))
        eot = tok.token_to_id("<|endoftext|>")
        Path(d, "tokenizer_config.json").write_text(json.dumps(
            {"eos_token": "<|endoftext|>", "bos_token": None, "add_bos_token": False}))
        return cv.read_vocab(Path(d), dataclasses.replace(hp, eos_token_id=eot))


def _weight(rng: np.random.Generator, shape: tuple[int, ...], qt: QT) -> np.ndarray:
    """Random valid data of type qt for a tensor of numpy shape (..., rows, cols)."""
    cols = shape[-1]
    n = int(np.prod(shape))
    scale = 1.0 / np.sqrt(cols)
    if qt == QT.Q8_0:
        nb = n // 32
        blocks = np.empty((nb, 34), dtype=np.uint8)
        d = (scale * 1.7 / 127.0 * rng.uniform(0.5, 1.5, size=nb)).astype(np.float16)
        blocks[:, :2] = d.view(np.uint8).reshape(nb, 2)
        blocks[:, 2:] = rng.integers(-127, 128, size=(nb, 32), dtype=np.int8).view(np.uint8)
        return blocks.reshape(*shape[:-1], cols // 32 * 34)
    if qt in _KQ:
        size = gguf.GGML_QUANT_SIZES[qt][1]
        return random_blocks(rng, qt, n // 256, scale).reshape(*shape[:-1], cols // 256 * size)
    if qt in _B32:
        size = gguf.GGML_QUANT_SIZES[qt][1]
        return random_blocks32(rng, qt, n // 32, scale).reshape(*shape[:-1], cols // 32 * size)
    x = (rng.standard_normal(n, dtype=np.float32) * np.float32(scale)).reshape(shape)
    return gguf.quants.quantize(x, qt) if qt != QT.F32 else x


def _byte_shape(shape: tuple[int, ...], qt: QT) -> tuple[int, ...]:
    """The numpy uint8 shape of a tensor of type qt with value shape (..., cols) (floats: the value shape)."""
    if qt in (QT.F32, QT.F16, QT.BF16):
        return shape
    block, size = gguf.GGML_QUANT_SIZES[qt]
    return (*shape[:-1], shape[-1] // block * size)


def _lazy_weight(rng: np.random.Generator, shape: tuple[int, ...], qt: QT):
    """_weight's data, produced at write time: whole (the same rng draws, in the same order, as generating it
    at once), or in slices along the first dimension when larger than SLICE_BYTES."""
    probe = np.dtype(np.uint8 if qt not in (QT.F32, QT.F16, QT.BF16) else (np.float32 if qt == QT.F32 else np.float16))
    bshape = _byte_shape(shape, qt)
    if qt == QT.BF16:  # gguf-py returns BF16 as raw uint8 pairs (the writer's dtype must match)
        probe, bshape = np.dtype(np.uint8), (*shape[:-1], shape[-1] * 2)
    nbytes = int(np.prod(bshape)) * probe.itemsize
    per = nbytes // shape[0] if len(shape) > 1 else nbytes
    step = max(1, SLICE_BYTES // max(per, 1)) if nbytes > SLICE_BYTES and len(shape) > 1 else shape[0]

    def produce():
        for i in range(0, shape[0], step):
            yield _weight(rng, (min(step, shape[0] - i), *shape[1:]), qt)
    return LazyTensor(bshape, probe, produce)


def write(name: str, out_path, out_type: str = "q8_0", seed: int = 0, mtp: bool = False,
          expert_gib: float | None = None, n_layer: int | None = None, n_expert: int | None = None,
          n_ctx: int | None = None) -> Path:
    if out_type not in TYPES and out_type not in MIXES:
        raise ValueError(f"bad option --type {out_type!r} (supported here: {', '.join([*TYPES, *MIXES])})")
    hp = hparams(name, expert_gib, n_layer, n_expert, n_ctx)
    qt, qt_hi = MIXES[out_type] if out_type in MIXES else (TYPES[out_type], TYPES[out_type])
    rng = np.random.default_rng(seed)
    out_path = Path(out_path)
    tmp = out_path.with_name(out_path.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), cv.ARCH)
    n_mtp = 1 if mtp else 0
    md = cv.model_metadata(hp, "f32", f"strata-synth-{name}-s{seed}", n_mtp)
    md["general.file_type"] = int(FILE_TYPES[out_type])
    cv._add_metadata(w, md)
    cv._add_metadata(w, _tokenizer_metadata(hp))
    H, E = hp.n_embd, hp.n_expert

    # every tensor is generated when the writer reaches it (in the order added, so the rng draws are the same
    # as generating each one here); f32 takes a function of the rng
    def mat(tname, rows, cols, typ=qt):
        w.add_tensor(tname, _lazy_weight(rng, (rows, cols), typ), raw_dtype=typ)

    def f32(tname, shape, make):
        w.add_tensor(tname, LazyTensor(shape, np.float32, lambda: iter([np.asarray(make(), dtype=np.float32)])))

    def norm(tname, n):
        f32(tname, (n,), lambda: 1.0 + 0.1 * rng.standard_normal(n))

    def attention(p):
        mat(p + "attn_q.weight", hp.n_head * hp.head_dim * 2, H)
        mat(p + "attn_k.weight", hp.n_head_kv * hp.head_dim, H)
        mat(p + "attn_v.weight", hp.n_head_kv * hp.head_dim, H, qt_hi)
        mat(p + "attn_output.weight", H, hp.n_head * hp.head_dim)
        norm(p + "attn_q_norm.weight", hp.head_dim)
        norm(p + "attn_k_norm.weight", hp.head_dim)

    def moe(p, layer):
        f32(p + "ffn_gate_inp.weight", (E, H), lambda: rng.standard_normal((E, H)) / np.sqrt(H))
        for nm, rows, cols in (("gate", hp.n_ff_exp, H), ("up", hp.n_ff_exp, H), ("down", H, hp.n_ff_exp)):
            t = qt_hi if nm == "down" and layer % 2 == 0 else qt
            w.add_tensor(p + f"ffn_{nm}_exps.weight", _lazy_weight(rng, (E, rows, cols), t), raw_dtype=t)
        mat(p + "ffn_gate_shexp.weight", hp.n_ff_shexp, H)
        mat(p + "ffn_up_shexp.weight", hp.n_ff_shexp, H)
        mat(p + "ffn_down_shexp.weight", H, hp.n_ff_shexp)
        f32(p + "ffn_gate_inp_shexp.weight", (H,), lambda: rng.standard_normal(H) / np.sqrt(H))

    mat("token_embd.weight", hp.n_vocab, H)
    norm("output_norm.weight", H)
    mat("output.weight", hp.n_vocab, H, qt_hi)
    for i in range(hp.n_layer):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", H)
        norm(p + "post_attention_norm.weight", H)
        if hp.is_full_attention(i):
            attention(p)
        else:
            mat(p + "attn_qkv.weight", hp.conv_dim, H)
            mat(p + "attn_gate.weight", hp.value_dim, H)
            mat(p + "ssm_ba.weight", 2 * hp.nv, H)
            f32(p + "ssm_conv1d.weight", (hp.conv_dim, hp.conv_kernel),
                lambda: 0.5 * rng.standard_normal((hp.conv_dim, hp.conv_kernel)))
            f32(p + "ssm_dt.bias", (hp.nv,), lambda: rng.uniform(-1, 1, hp.nv))
            f32(p + "ssm_a", (hp.nv,), lambda: -np.exp(rng.uniform(-2, 1, hp.nv)))
            norm(p + "ssm_norm.weight", hp.dv)
            mat(p + "ssm_out.weight", H, hp.value_dim)
        moe(p, i)
    if mtp:
        p = f"blk.{hp.n_layer}."
        mat(p + "nextn.eh_proj.weight", H, 2 * H)
        norm(p + "nextn.enorm.weight", H)
        norm(p + "nextn.hnorm.weight", H)
        norm(p + "nextn.shared_head_norm.weight", H)
        norm(p + "attn_norm.weight", H)
        norm(p + "post_attention_norm.weight", H)
        attention(p)
        moe(p, hp.n_layer)
    def write():
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()

    cv.write_atomically(w, tmp, out_path, write)
    return out_path


def main(argv=None) -> int:
    # ---- issue 14: qwen35moe / qwen4exp files come from synth_next.py (its own sizes and options) ----
    from . import synth_next
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--arch", default="qwen3next")
    if pre.parse_known_args(argv)[0].arch != "qwen3next":
        return synth_next.main(argv)
    # ----
    ap = argparse.ArgumentParser(prog="python -m strata_py.synth", description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", choices=["qwen3next", *synth_next.ARCHS], default="qwen3next",
                    help="qwen35moe / qwen4exp: see synth_next.py (`--arch qwen4exp --help`)")
    ap.add_argument("name", choices=sorted(SIZES))
    ap.add_argument("out")
    ap.add_argument("--type", default="q8_0", choices=sorted([*TYPES, *MIXES]))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mtp", action="store_true", help="include an MTP block (blk.{n_layer}.nextn.*)")
    ap.add_argument("--expert-gib", type=float, default=None, help="stream size: GiB of expert weights")
    ap.add_argument("--layers", type=int, default=None, help="override the size's layer count")
    ap.add_argument("--experts", type=int, default=None, help="override the size's expert count")
    a = ap.parse_args(argv)
    try:
        p = write(a.name, a.out, a.type, a.seed, a.mtp, a.expert_gib, a.layers, a.experts)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {p} ({p.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
