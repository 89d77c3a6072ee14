// The grid-codebook IQ types beyond IQ2_XXS / IQ3_XXS: IQ2_XS, IQ2_S, IQ3_S, IQ1_S, IQ1_M (quants.h gives
// their integer forms). One function per type says what value v of a block is (grid byte, sign, scale); the
// dequantizer (bit-exact with gguf.quants) and the integer form are both written from it.
#include <cstring>

#include "kernels/iq_tables.h"
#include "kernels/quants.h"
#include "util/common.h"

namespace strata {

namespace {

struct IqValue {
  int g;      // grid byte (IQ1: -1, 0 or 1)
  bool neg;   // IQ2/IQ3: the sign bit; IQ1: the sign of the +-1/8 shift
  int s;      // the 3- or 4-bit scale of the value's 16 or 32 values
};

inline int grid_byte(uint64_t e, int j) { return (int)(int8_t)((e >> (8 * j)) & 0xFF); }

// IQ2_XS, 74 bytes: fp16 d; qs u16[32] (one per 8 values: grid index 9 bits, ksigns index 7 bits); 8 scale
// bytes (a nibble per 16 values).
inline IqValue iq2xs_value(const uint8_t* b, int v) {
  const uint32_t q = b[2 + 2 * (v / 8)] | b[3 + 2 * (v / 8)] << 8;
  return {grid_byte(kIq2xsGrid[q & 511], v % 8), ((kKsigns[q >> 9] >> (v % 8)) & 1) != 0,
          (b[66 + v / 32] >> (4 * ((v / 16) % 2))) & 15};
}
// IQ2_S, 82 bytes: fp16 d; qs[32] (grid index low 8 bits per 8 values); signs[32] (a bit per value); qh[8]
// (2 high index bits per 8 values); 8 scale bytes (a nibble per 16 values).
inline IqValue iq2s_value(const uint8_t* b, int v) {
  const int g = v / 8;
  const int idx = b[2 + g] | ((b[66 + g / 4] >> (2 * (g % 4))) & 3) << 8;
  return {grid_byte(kIq2sGrid[idx], v % 8), ((b[34 + g] >> (v % 8)) & 1) != 0, (b[74 + v / 32] >> (4 * ((v / 16) % 2))) & 15};
}
// IQ3_S, 110 bytes: fp16 d; qs[64] (grid index low 8 bits per 4 values); qh[8] (the 9th bit per 4 values);
// signs[32] (a bit per value); 4 scale bytes (a nibble per 32 values).
inline IqValue iq3s_value(const uint8_t* b, int v) {
  const int g = v / 4;
  const int idx = b[2 + g] | ((b[66 + g / 8] >> (g % 8)) & 1) << 8;
  const uint32_t e = kIq3sGrid[idx];
  return {(int)((e >> (8 * (v % 4))) & 0xFF), ((b[74 + v / 8] >> (v % 8)) & 1) != 0, (b[106 + v / 64] >> (4 * ((v / 32) % 2))) & 15};
}
// IQ1_S, 50 bytes: fp16 d; qs[32] (grid index low 8 bits per 8 values); qh u16[8], one per 32 values: bits
// 3l..3l+2 the high index bits of its group l, bits 12-14 the scale, bit 15 the sign of the shift.
inline IqValue iq1s_value(const uint8_t* b, int v) {
  const int ib = v / 32, l = (v % 32) / 8;
  const uint32_t qh = b[34 + 2 * ib] | b[35 + 2 * ib] << 8;
  const int idx = b[2 + 4 * ib + l] | ((qh >> (3 * l)) & 7) << 8;
  return {grid_byte(kIq1sGrid[idx], v % 8), (qh & 0x8000) != 0, (int)((qh >> 12) & 7)};
}
// IQ1_M, 56 bytes: qs[32]; qh[16] (a nibble per 8 values: 3 high index bits, the shift's sign); 4 u16 scale
// words: 3-bit scales (one per 16 values, 4 per word) in bits 0-11, the fp16 d in the four top nibbles.
inline IqValue iq1m_value(const uint8_t* b, int v) {
  const int g = v / 8, k = v / 16;
  const int nib = (b[32 + g / 2] >> (4 * (g % 2))) & 15;
  const int idx = b[g] | (nib & 7) << 8;
  const uint32_t sw = b[48 + 2 * (k / 4)] | b[49 + 2 * (k / 4)] << 8;
  return {grid_byte(kIq1sGrid[idx], v % 8), (nib & 8) != 0, (int)((sw >> (3 * (k % 4))) & 7)};
}

template <class V>
void dq_iq2(const uint8_t* s, float* y, int64_t n, int bytes, V value) {  // db = d*(0.5+s)*0.25; (db*g)*(+-1)
  for (int64_t bi = 0; bi < n / QK_K; bi++, y += QK_K) {
    const uint8_t* b = s + bi * bytes;
    const float d = half_at(b);
    for (int v = 0; v < QK_K; v++) {
      const IqValue e = value(b, v);
      const float a = (d * (0.5f + (float)e.s) * 0.25f) * (float)e.g;
      y[v] = e.neg ? -a : a;
    }
  }
}
template <class V>
void dq_iq1(const uint8_t* s, float* y, int64_t n, int bytes, V value, float (*dfn)(const uint8_t*)) {
  for (int64_t bi = 0; bi < n / QK_K; bi++, y += QK_K) {  // dl = d*(2s+1); dl*(g +- 1/8), both exact
    const uint8_t* b = s + bi * bytes;
    const float d = dfn(b);
    for (int v = 0; v < QK_K; v++) {
      const IqValue e = value(b, v);
      y[v] = (d * (float)(2 * e.s + 1)) * ((float)e.g + (e.neg ? -0.125f : 0.125f));
    }
  }
}
float d_at0(const uint8_t* b) { return half_at(b); }
float iq1m_d(const uint8_t* b) { return fp16_to_f32(iq1m_d_bits(b)); }

// Integer forms: IQ2 w = (2s+1)*(+-g), d/8; IQ3_S w = (2s+1)*(+-g), d; IQ1 (kShifted) w = (2s+1)*(8g +- 1), d/8.
template <bool kShifted, class V>
void dec_iq(const uint8_t* b, IntBlock& o, float d, V value) {
  o.d = d;
  o.dmin = 0.f;
  o.has_min = false;
  o.min16 = false;
  for (int v = 0; v < QK_K; v++) {
    const IqValue e = value(b, v);
    const int q = kShifted ? 8 * e.g + (e.neg ? -1 : 1) : (e.neg ? -e.g : e.g);
    o.w[v] = (int16_t)((2 * e.s + 1) * q);
  }
  for (int j = 0; j < 8; j++) o.m[j] = 0;
}

}  // namespace

void dq_iq2_xs(const uint8_t* s, float* y, int64_t n) { dq_iq2(s, y, n, 74, iq2xs_value); }
void dq_iq2_s(const uint8_t* s, float* y, int64_t n) { dq_iq2(s, y, n, 82, iq2s_value); }
void dq_iq3_s(const uint8_t* s, float* y, int64_t n) {  // db = d*(1+2s); (db*g)*(+-1)
  for (int64_t bi = 0; bi < n / QK_K; bi++, y += QK_K) {
    const uint8_t* b = s + bi * 110;
    const float d = half_at(b);
    for (int v = 0; v < QK_K; v++) {
      const IqValue e = iq3s_value(b, v);
      const float a = (d * (float)(1 + 2 * e.s)) * (float)e.g;
      y[v] = e.neg ? -a : a;
    }
  }
}
void dq_iq1_s(const uint8_t* s, float* y, int64_t n) { dq_iq1(s, y, n, 50, iq1s_value, d_at0); }
void dq_iq1_m(const uint8_t* s, float* y, int64_t n) { dq_iq1(s, y, n, 56, iq1m_value, iq1m_d); }

void dec_iq2_xs(const uint8_t* b, IntBlock& o) { dec_iq<false>(b, o, half_at(b) * 0.125f, iq2xs_value); }
void dec_iq2_s(const uint8_t* b, IntBlock& o) { dec_iq<false>(b, o, half_at(b) * 0.125f, iq2s_value); }
void dec_iq3_s(const uint8_t* b, IntBlock& o) { dec_iq<false>(b, o, half_at(b), iq3s_value); }
void dec_iq1_s(const uint8_t* b, IntBlock& o) { dec_iq<true>(b, o, half_at(b) * 0.125f, iq1s_value); }
void dec_iq1_m(const uint8_t* b, IntBlock& o) { dec_iq<true>(b, o, iq1m_d(b) * 0.125f, iq1m_value); }

}  // namespace strata
