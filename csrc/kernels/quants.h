// K- and IQ-quant blocks (spec qwen3next.md 3.2) and the int8 activation rows their kernels multiply.
//
// Every 256-value block of Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M and
// IQ4_XS has an exact integer form
//   value v = d * w[v] - dmin * m[v / 32]        (w int16, m the 6-bit mins; dmin = 0 without mins)
//   (Q2_K: - dmin * m16[v / 16], a 4-bit min per 16 values)
//   Q2_K:      w = (sc & 15)*q, m16 = sc >> 4 (sc: the byte of the 16 values), d = fp16 d, dmin = fp16 dmin
//   Q4_K/Q5_K: w = sc[j]*q,  d = fp16 d,   dmin = fp16 dmin
//   Q3_K:      w = (sc[v/16]-32)*q, q = 2-bit code - (hmask bit ? 0 : 4),  d = fp16 d
//   Q6_K:      w = sc[v/16]*(q-32),        d = fp16 d
//   IQ2_XXS:   w = (2s+1)*grid*sign,       d = fp16 d / 8    (gguf: d*(0.5+s)*0.25)
//   IQ3_XXS:   w = (2s+1)*grid*sign,       d = fp16 d / 4    (gguf: d*(0.5+s)*0.5)
//   IQ4_XS:    w = (ls-32)*kvalues[q],     d = fp16 d        (ls: 6-bit sub-block scale, q: 4-bit code)
//   IQ2_XS, IQ2_S: w = (2s+1)*grid*sign,   d = fp16 d / 8    (s: 4-bit scale per 16 values)
//   IQ3_S:     w = (2s+1)*grid*sign,       d = fp16 d        (s: 4-bit scale per 32 values)
//   IQ1_S, IQ1_M: w = (2s+1)*(8*grid +- 1), d = fp16 d / 8   (grid in {-1, 0, 1}; gguf: d*(2s+1)*(grid +- 1/8))
// Each activation row is quantized per 256-block (Q8_K style, deterministic, per row):
//   amax = max|x|, iscale = 127/amax, q = round_half_even(iscale*x) in [-127, 127], dx = amax/127.
// So a block's dot product is integer: P = sum w*q (|lane sums| < 2^24, exact in float), M = sum m*bsum.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/act32.h"
#include "util/common.h"  // Align64

namespace strata {

constexpr int QK_K = 256;

// One block in integer form (the scalar twins and the tests use it; the SIMD kernels decode in registers).
struct IntBlock {
  float d = 0.f, dmin = 0.f;
  bool has_min = false;
  bool min16 = false;  // the mins are m16 (per 16 values), not m (per 32)
  int16_t w[QK_K];
  int16_t m[8];
  int16_t m16[16];
};
using IntDecodeFn = void (*)(const uint8_t* blk, IntBlock& out);
IntDecodeFn int_decoder(uint32_t type);  // nullptr for types with float activations
inline bool int_act_type(uint32_t type) { return int_decoder(type) != nullptr; }

// Scalar dequantizers, bit-exact with gguf.quants.dequantize (same float32 operations in the same order).
void dq_q2_k(const uint8_t* s, float* d, int64_t n);
void dq_q3_k(const uint8_t* s, float* d, int64_t n);
void dq_q4_k(const uint8_t* s, float* d, int64_t n);
void dq_q5_k(const uint8_t* s, float* d, int64_t n);
void dq_q6_k(const uint8_t* s, float* d, int64_t n);
void dq_iq2_xxs(const uint8_t* s, float* d, int64_t n);
void dq_iq3_xxs(const uint8_t* s, float* d, int64_t n);
void dq_iq4_xs(const uint8_t* s, float* d, int64_t n);
// iq_lowbit.cpp: the dequantizers and integer forms of IQ2_XS, IQ2_S, IQ3_S, IQ1_S, IQ1_M.
void dq_iq2_xs(const uint8_t* s, float* d, int64_t n);
void dq_iq2_s(const uint8_t* s, float* d, int64_t n);
void dq_iq3_s(const uint8_t* s, float* d, int64_t n);
void dq_iq1_s(const uint8_t* s, float* d, int64_t n);
void dq_iq1_m(const uint8_t* s, float* d, int64_t n);
void dec_iq2_xs(const uint8_t* b, IntBlock& o);
void dec_iq2_s(const uint8_t* b, IntBlock& o);
void dec_iq3_s(const uint8_t* b, IntBlock& o);
void dec_iq1_s(const uint8_t* b, IntBlock& o);
void dec_iq1_m(const uint8_t* b, IntBlock& o);
// IQ1_M's fp16 d, spread over the top nibbles of its four scale words (bytes 48-55).
inline uint16_t iq1m_d_bits(const uint8_t* b) {
  const uint16_t w0 = (uint16_t)(b[48] | b[49] << 8), w1 = (uint16_t)(b[50] | b[51] << 8);
  const uint16_t w2 = (uint16_t)(b[52] | b[53] << 8), w3 = (uint16_t)(b[54] | b[55] << 8);
  return (uint16_t)((w0 >> 12) | ((w1 >> 8) & 0x00F0) | ((w2 >> 4) & 0x0F00) | (w3 & 0xF000));
}

// Q2_K block (84 bytes): 16 scale bytes (low nibble: scale, high: min, each for 16 values), 64 bytes of 2-bit
// codes (value v = 128 h + 32 k + l: bits 2k of byte 16 + 32 h + l), fp16 d, fp16 dmin.
inline int q2k_code(const uint8_t* b, int v) { return (b[16 + 32 * (v / 128) + v % 32] >> (2 * ((v % 128) / 32))) & 3; }

// Q3_K block (110 bytes): hmask[32], qs[64], 12 bytes of 6-bit scales, fp16 d. The sixteen sub-block scales
// minus 32 (each covers 16 values): low 4 bits from bytes 0-7 (s < 8: low nibble of byte s, else high nibble of
// byte s - 8), high 2 bits from bytes 8-11 (bits 2 (s / 4) of byte 8 + s % 4).
inline void q3k_scales(const uint8_t* sc12, int8_t* out) {
  for (int s = 0; s < 16; s++) {
    const int lo = (sc12[s % 8] >> (4 * (s / 8))) & 0xF, hi = (sc12[8 + s % 4] >> (2 * (s / 4))) & 3;
    out[s] = (int8_t)((lo | hi << 4) - 32);
  }
}
// Q3_K code of value v (-4..3): half h = v / 128, k = (v % 128) / 32, l = v % 32.
inline int q3k_code(const uint8_t* b, int v) {
  const int h = v / 128, k = (v % 128) / 32, l = v % 32;
  const int ql = (b[32 + 32 * h + l] >> (2 * k)) & 3, qh = (b[l] >> (v / 32)) & 1;
  return ql - (qh ? 0 : 4);
}

// IQ4_NL / IQ4_XS: the 16 values a 4-bit code stands for (gguf-py IQ4_NL.kvalues; tested equal).
alignas(16) inline constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                      1,    13,   25,  38,  53,  69,  89,  113};
// IQ4_XS block (136 bytes): fp16 d, u16 scales_h, 4 bytes scales_l, 128 bytes of nibbles. Sub-block ib's scale
// ls (0..63) and value j's code (j < 16: low nibble of byte 16 ib + j, else the high nibble of byte j - 16).
inline int iq4xs_scale(const uint8_t* b, int ib) {
  const int hi = ((b[2] | b[3] << 8) >> (2 * ib)) & 3;
  return ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | hi << 4;
}

// Q4_K/Q5_K 6-bit scales and mins from the 12 packed bytes.
inline void k4_scale_min(const uint8_t* s, int j, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Quantized activation rows, T <= 8, cols % 256 == 0. Layouts chosen for the kernels' loads:
//   q[t*ldq + c]                      int8 values stored as int16 (multiplied with vpmaddwd / vpdpwssd)
//   d[b*8 + t]                        dx of block b of row t (rows >= T are 0)
//   bsum[(b*4 + p)*16 + 2*t + i]      sum of q over sub-block 2p+i (32 values) of block b, row t
//   q8[t*ldq + c]                     the same values as int8, for the AVX2 vpmaddubsw kernels (null unless
//                                     prepared for them: quantize_act_avx2, fill_q8)
struct QAct {
  int T = 0;
  int64_t cols = 0, nb = 0, ldq = 0;
  const int16_t* q = nullptr;
  const float* d = nullptr;
  const int16_t* bsum = nullptr;
  const int8_t* q8 = nullptr;
  // (with q8) 32 times each pair's sum, q8p[t * ldq / 2 + v / 2] = 32 * (q[v] + q[v + 1]) for even v: the AVX2
  // unsigned Q6_K kernel's correction (its codes are w + 32), in vpmaddubsw's lane order
  const int16_t* q8p = nullptr;
  // The AVX-512 byte kernels' rows (cpu/act8_avx512.h): int8, interleaved per 64 values, [T][cols]; with
  // il_offset stored as q + 128. Made once per prepared pass (prepare_act), not in every parallel chunk.
  const int8_t* il = nullptr;
  bool il_offset = false;
};
struct QActBuf {
  QAct32Buf b32;  // the 32-block rows (act32.h) when prepared for those types
  std::vector<int16_t, Align64<int16_t>> q, bsum;
  std::vector<float, Align64<float>> d;
  std::vector<int8_t, Align64<int8_t>> q8, il;
  std::vector<int16_t, Align64<int16_t>> q8p;
  QAct view(int T, int64_t cols);  // sizes the buffers, returns a view to fill
  // q8 from q (every |q| <= 127) and a.q8 pointing at it, unless a.q8 is set already (quantize_act_avx2 writes
  // it); with pairs also q8p / a.q8p (else a.q8p = nullptr)
  void fill_q8(QAct& a, bool pairs);
};
using QuantizeFn = void (*)(const float* x, int64_t ldx, int T, int64_t cols, QActBuf& buf, QAct& out);
// The portable quantizer; the per-ISA ones (quantize_act_avx2/avx512) produce identical bytes.
void quantize_act_ref(const float* x, int64_t ldx, int T, int64_t cols, QActBuf& buf, QAct& out);
void quantize_act_avx2(const float* x, int64_t ldx, int T, int64_t cols, QActBuf& buf, QAct& out);
void quantize_act_avx512(const float* x, int64_t ldx, int T, int64_t cols, QActBuf& buf, QAct& out);
// a.il from a.q for the AVX-512 byte kernels (cpu/kquants8_avx512.cpp; offset: as q + 128).
void interleave_act_avx512(QActBuf& buf, QAct& a, bool offset);

}  // namespace strata
