"""Helpers of the converter tests (not a test module): the ggml shapes the spec gives the blocks every Qwen hybrid
architecture shares (written out here, independently of the converter), and the edit-a-checkpoint-and-expect-
a-refusal harness."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

import gguf_util  # noqa: F401  (sets sys.path)
from strata_py import convert as cv


def ne_attention(b: int, H: int, nh: int, nkv: int, hd: int) -> dict[str, list[int]]:
    """Gated attention of block b (qwen3next.md §2.2): attn_q holds per head [q | gate]."""
    return {f"blk.{b}.attn_q.weight": [H, 2 * nh * hd], f"blk.{b}.attn_k.weight": [H, nkv * hd],
            f"blk.{b}.attn_v.weight": [H, nkv * hd], f"blk.{b}.attn_output.weight": [nh * hd, H],
            f"blk.{b}.attn_q_norm.weight": [hd], f"blk.{b}.attn_k_norm.weight": [hd]}


def ne_moe(b: int, H: int, E: int, I: int, S: int) -> dict[str, list[int]]:  # noqa: E741
    """Router, stacked experts (ne2 = expert) and shared expert of block b."""
    return {f"blk.{b}.ffn_gate_inp.weight": [H, E], f"blk.{b}.ffn_gate_exps.weight": [H, I, E],
            f"blk.{b}.ffn_up_exps.weight": [H, I, E], f"blk.{b}.ffn_down_exps.weight": [I, H, E],
            f"blk.{b}.ffn_gate_inp_shexp.weight": [H, 1], f"blk.{b}.ffn_gate_shexp.weight": [H, S],
            f"blk.{b}.ffn_up_shexp.weight": [H, S], f"blk.{b}.ffn_down_shexp.weight": [S, H]}


def ne_qwen35_deltanet(b: int, H: int, nk: int, nv: int, dk: int, dv: int, K: int) -> dict[str, list[int]]:
    """The Qwen3.5 Gated DeltaNet of block b (qwen4exp.md §4.2), shared by qwen35moe and qwen4exp."""
    conv = 2 * nk * dk + nv * dv
    return {f"blk.{b}.attn_qkv.weight": [H, conv], f"blk.{b}.attn_gate.weight": [H, nv * dv],
            f"blk.{b}.ssm_beta.weight": [H, nv], f"blk.{b}.ssm_alpha.weight": [H, nv],
            f"blk.{b}.ssm_conv1d.weight": [K, conv], f"blk.{b}.ssm_dt.bias": [nv], f"blk.{b}.ssm_a": [nv],
            f"blk.{b}.ssm_norm.weight": [dv], f"blk.{b}.ssm_out.weight": [nv * dv, H]}


def assert_tensor_table(path, want: dict[str, list[int]], qtype) -> None:
    """The GGUF has exactly the tensors of `want` (name -> ne), each of that ne and of type qtype."""
    _, ts, _ = gguf_util.read_gguf(path)
    assert set(ts) == set(want)
    for name, ne in want.items():
        assert [int(x) for x in ts[name].shape] == ne, name
        assert ts[name].tensor_type == qtype, name


def copy_checkpoint(src: Path, dst: Path) -> Path:
    return Path(shutil.copytree(src, dst))


def edit_config(d: Path, fn) -> None:
    cfg = json.loads((d / "config.json").read_text())
    fn(cfg)
    (d / "config.json").write_text(json.dumps(cfg))


def edit_tensors(d: Path, fn) -> None:
    sd = load_file(str(d / "model.safetensors"))
    fn(sd)
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})


def assert_refused(d: Path, tmp_path: Path, match: str) -> None:
    """Converting d raises a ValueError matching `match` and leaves neither the output nor its .tmp."""
    out = tmp_path / "o.gguf"
    with pytest.raises(ValueError, match=match):
        cv.convert(d, out, "q8_0")
    assert not out.exists() and not out.with_name("o.gguf.tmp").exists()
