// The 32-value block types with float scales: Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4 (with Q8_0 the
// "legacy" ggml blocks; llama.cpp also falls back to IQ4_NL / Q5_0 / Q5_1 for rows that K-quants cannot
// split). Q8_0 multiplies float activations: every weight is decoded exactly, as gguf.quants.dequantize does, and
// the products are the canonical float32 ones. Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4 multiply their integer
// values by int8 activations quantized per 32 values (act32.h, matmul.h).
//
// A block's 32 values come from 4-bit codes, 16 bytes qs: value i < 16 is qs[i] & 15, value 16 + i is
// qs[i] >> 4. Q5_* add bit 4 of code i from a little-endian uint32 qh (bit i). Per block:
//   Q4_0   [d f16][qs 16]            w = d * (code - 8)                     18 bytes
//   Q4_1   [d f16][m f16][qs 16]     w = d * code + m                        20 bytes
//   Q5_0   [d f16][qh 4][qs 16]      w = d * (code5 - 16)                    22 bytes
//   Q5_1   [d f16][m f16][qh 4][qs 16] w = d * code5 + m                     24 bytes
//   IQ4_NL [d f16][qs 16]            w = d * kIq4Values[code]                18 bytes
//   MXFP4  [e u8][qs 16]             w = e8m0_half(e) * kMxfp4Values[code]   17 bytes
// Every product d * value is exact in float32 (an 11-bit or power-of-two scale times a value of at most
// 8 bits), so a decoder may form it any way; Q4_1 / Q5_1 then round once when adding m (a fused
// multiply-add gives the same float).
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/types.h"

namespace strata {

// The value each 4-bit code stands for, before the scale: Q4_0 code - 8, Q4_1 the code itself (m is added after
// scaling), IQ4_NL kIq4Values (quants.h), MXFP4 its e2m1 values doubled (gguf.quants.MXFP4.kvalues; the scale
// e8m0_half(e) halves them back).
alignas(16) inline constexpr int8_t kQ4_0Values[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
alignas(16) inline constexpr int8_t kQ4_1Values[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
alignas(16) inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// ggml_e8m0_to_fp32_half: 2^(e - 128) as float32 bits (e < 2: the subnormals 2^-129, 2^-128).
inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The integer form of the int8-activation types (act32_type): per block, 32 int8 values v, a scale s and a min m
// with weight i = s * v[i] + m (the dequantizer's value up to its one rounding of the sum; m = 0 where the type has
// none). Value order: 0-15 low nibbles, 16-31 high ones.
//   Q4_0   v = code - 8            s = fp16 d       m = 0
//   Q4_1   v = code                s = fp16 d       m = fp16 m
//   Q5_0   v = code5 - 16          s = fp16 d       m = 0
//   Q5_1   v = code5               s = fp16 d       m = fp16 m
//   IQ4_NL v = kIq4Values[code]    s = fp16 d       m = 0
//   MXFP4  v = kMxfp4Values[code]  s = e8m0_half(e) m = 0
bool act32_type(uint32_t type);
inline bool act32_has_min(uint32_t type) { return type == GGML_Q4_1 || type == GGML_Q5_1; }
float int_block32(uint32_t type, const uint8_t* blk, int8_t* v, float* m);  // fills v[32] and *m, returns s

void dq_q4_0(const uint8_t* s, float* d, int64_t n);
void dq_q4_1(const uint8_t* s, float* d, int64_t n);
void dq_q5_0(const uint8_t* s, float* d, int64_t n);
void dq_q5_1(const uint8_t* s, float* d, int64_t n);
void dq_iq4_nl(const uint8_t* s, float* d, int64_t n);
void dq_mxfp4(const uint8_t* s, float* d, int64_t n);

}  // namespace strata
