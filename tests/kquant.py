"""A plain Q4_K quantizer for tests (gguf-py has none): per 32-value sub-block an affine min/scale, the 8 scales
and mins quantized to 6 bits under the block's fp16 d / dmin, packed exactly as ggml's block_q4_K (spec
qwen3next.md 3.2). Not llama.cpp's search-based quantizer: good enough to make a realistic Q4_K model whose
dequantization (gguf.quants, the reference) is the ground truth. Also q8_reference: the int8 activation
quantization of the K/IQ kernels, for references that compute what they compute."""
from __future__ import annotations

import numpy as np


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """x [rows, cols] float32, cols % 256 == 0 -> uint8 [rows, cols/256*144]."""
    rows, cols = x.shape
    b = x.reshape(-1, 8, 32).astype(np.float32)                       # [blocks, sub, 32]
    lo = np.minimum(b.min(-1), 0.0)                                   # [blocks, 8] (<= 0)
    hi = b.max(-1)
    scale = np.maximum(hi - lo, 1e-12) / 15.0
    d = (scale.max(-1) / 63.0).astype(np.float16)                     # [blocks]
    dmin = ((-lo).max(-1) / 63.0).astype(np.float16)
    df, dmf = d.astype(np.float32), dmin.astype(np.float32)
    sc = np.clip(np.round(scale / np.where(df > 0, df, 1)[:, None]), 1, 63).astype(np.uint8)
    mn = np.clip(np.round(-lo / np.where(dmf > 0, dmf, 1)[:, None]), 0, 63).astype(np.uint8)
    step = (df[:, None] * sc)[:, :, None]                             # value = step*q - dmin*mn
    off = (dmf[:, None] * mn)[:, :, None]
    q = np.clip(np.round((b + off) / step), 0, 15).astype(np.uint8)    # [blocks, 8, 32]
    s = np.zeros((b.shape[0], 12), np.uint8)
    for j in range(4):
        s[:, j] = (sc[:, j] & 63) | ((sc[:, j + 4] >> 4) << 6)
        s[:, j + 4] = (mn[:, j] & 63) | ((mn[:, j + 4] >> 4) << 6)
        s[:, j + 8] = (sc[:, j + 4] & 0xF) | ((mn[:, j + 4] & 0xF) << 4)
    qs = np.zeros((b.shape[0], 128), np.uint8)
    for c in range(4):  # chunk c: low nibbles = sub-block 2c, high nibbles = sub-block 2c+1
        qs[:, 32 * c:32 * c + 32] = q[:, 2 * c] | (q[:, 2 * c + 1] << 4)
    out = np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), s, qs], axis=1)
    return out.reshape(rows, cols // 256 * 144)


ACT32_TYPES = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "MXFP4"}  # int8 activations per 32 values (kernels/act32.h)


def act_block(typ: str) -> int:
    """The activation block a weight type's kernels quantize per: 256 (K and IQ quants), 32 (ACT32_TYPES), or 0
    (float activations: F32, F16, BF16, Q8_0)."""
    if typ in ACT32_TYPES:
        return 32
    return 256 if typ.endswith("_K") or typ.startswith("IQ") else 0


def q8_reference(x, block=256):
    """The activation quantization of csrc/kernels/quants.h (block 256) or act32.h (block 32) in numpy (float32
    steps as in quantize_act_ref): per row and block amax, iscale = 127/amax, q = round-half-even(iscale*x),
    dx = amax/127. Returns the dequantized activations dx*q in float64 and dx [rows, blocks]."""
    T, cols = x.shape
    xb = x.reshape(T, cols // block, block).astype(np.float32)
    amax = np.max(np.abs(xb), axis=-1)
    with np.errstate(divide="ignore"):
        iscale = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint((iscale[..., None] * xb).astype(np.float32))
    dx = (amax / np.float32(127)).astype(np.float32)
    return (q.astype(np.float64) * dx[..., None].astype(np.float64)).reshape(T, cols), dx.astype(np.float64)
