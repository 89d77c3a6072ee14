// Scalar K/IQ-quant code: the dequantizers (bit-exact with gguf-py), the integer block forms the `_ref`
// kernels use, and the portable activation quantizer. See quants.h for the formulas.
#include "kernels/quants.h"

#include <cmath>
#include <cstring>

#include "kernels/iq_tables.h"
#include "kernels/types.h"
#include "util/common.h"

namespace strata {

namespace {


// Q4_K/Q5_K code q of value v: chunk c = v/64 uses qs[32c..]; low nibbles are values 64c+0..31, high 64c+32..63.
inline int k4_code(const uint8_t* qs, int v) {
  const int c = v / 64, i = v % 32, hi = (v % 64) / 32;
  return (qs[32 * c + i] >> (4 * hi)) & 0xF;
}
// Q6_K code (0..63) of value v: half h = v/128, l = v%32, k = (v%128)/32.
inline int k6_code(const uint8_t* ql, const uint8_t* qh, int v) {
  const int h = v / 128, l = v % 32, k = (v % 128) / 32;
  const int lo = (ql[64 * h + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 0xF;
  const int hb = (qh[32 * h + l] >> (2 * k)) & 3;
  return lo | hb << 4;
}
// IQ grids: magnitude and sign of value e (0..31) of sub-block ib.
inline int iq2xxs_mag(const uint8_t* blk, int ib, int e, int* neg, int* s) {
  const uint8_t* q = blk + 2 + 8 * ib;
  const uint32_t aux1 = u32_at(q + 4);
  const int l = e / 8, j = e % 8;
  *s = (int)(aux1 >> 28);
  *neg = (kKsigns[(aux1 >> (7 * l)) & 127] >> j) & 1;
  return (int)((kIq2xxsGrid[q[l]] >> (8 * j)) & 0xFF);
}
inline int iq3xxs_mag(const uint8_t* blk, int ib, int e, int* neg, int* s) {
  const uint8_t* qs = blk + 2 + 8 * ib;
  const uint32_t aux = u32_at(blk + 2 + 64 + 4 * ib);
  const int l = e / 8, j = e % 8;
  *s = (int)(aux >> 28);
  *neg = (kKsigns[(aux >> (7 * l)) & 127] >> j) & 1;
  return (int)((kIq3xxsGrid[qs[2 * l + j / 4]] >> (8 * (j % 4))) & 0xFF);
}

void dec_q2_k(const uint8_t* b, IntBlock& o) {
  o.d = half_at(b + 80);
  o.dmin = half_at(b + 82);
  o.has_min = true;
  o.min16 = true;
  for (int v = 0; v < QK_K; v++) o.w[v] = (int16_t)((b[v / 16] & 0xF) * q2k_code(b, v));
  for (int j = 0; j < 8; j++) o.m[j] = 0;
  for (int s = 0; s < 16; s++) o.m16[s] = (int16_t)(b[s] >> 4);
}
void dec_q3_k(const uint8_t* b, IntBlock& o) {
  o.d = half_at(b + 108);
  o.dmin = 0.f;
  o.has_min = false;
  int8_t sc[16];
  q3k_scales(b + 96, sc);
  for (int v = 0; v < QK_K; v++) o.w[v] = (int16_t)(sc[v / 16] * q3k_code(b, v));
  for (int j = 0; j < 8; j++) o.m[j] = 0;
}
void dec_q4_k(const uint8_t* b, IntBlock& o) {
  o.d = half_at(b);
  o.dmin = half_at(b + 2);
  o.has_min = true;
  o.min16 = false;
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; j++) k4_scale_min(b + 4, j, &sc[j], &m[j]);
  for (int v = 0; v < QK_K; v++) o.w[v] = (int16_t)(sc[v / 32] * k4_code(b + 16, v));
  for (int j = 0; j < 8; j++) o.m[j] = m[j];
}
void dec_q5_k(const uint8_t* b, IntBlock& o) {
  o.d = half_at(b);
  o.dmin = half_at(b + 2);
  o.has_min = true;
  o.min16 = false;
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; j++) k4_scale_min(b + 4, j, &sc[j], &m[j]);
  const uint8_t* qh = b + 16;
  for (int v = 0; v < QK_K; v++) {
    const int j = v / 32, q = k4_code(b + 48, v) | ((qh[v % 32] >> j) & 1) << 4;
    o.w[v] = (int16_t)(sc[j] * q);
  }
  for (int j = 0; j < 8; j++) o.m[j] = m[j];
}
void dec_q6_k(const uint8_t* b, IntBlock& o) {
  o.d = half_at(b + 208);
  o.dmin = 0.f;
  o.has_min = false;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  for (int v = 0; v < QK_K; v++) o.w[v] = (int16_t)(sc[v / 16] * (k6_code(b, b + 128, v) - 32));
  for (int j = 0; j < 8; j++) o.m[j] = 0;
}
void dec_iq2_xxs(const uint8_t* b, IntBlock& o) {
  o.d = half_at(b) * 0.125f;  // exact: a power-of-two scaling of an fp16 value
  o.dmin = 0.f;
  o.has_min = false;
  for (int v = 0; v < QK_K; v++) {
    int neg, s;
    const int g = iq2xxs_mag(b, v / 32, v % 32, &neg, &s);
    o.w[v] = (int16_t)((2 * s + 1) * (neg ? -g : g));
  }
  for (int j = 0; j < 8; j++) o.m[j] = 0;
}
void dec_iq4_xs(const uint8_t* b, IntBlock& o) {
  o.d = half_at(b);
  o.dmin = 0.f;
  o.has_min = false;
  for (int v = 0; v < QK_K; v++) {
    const int ib = v / 32, j = v % 32;
    const int code = (b[8 + 16 * ib + j % 16] >> (4 * (j / 16))) & 0xF;
    o.w[v] = (int16_t)((iq4xs_scale(b, ib) - 32) * kIq4Values[code]);
  }
  for (int j = 0; j < 8; j++) o.m[j] = 0;
}
void dec_iq3_xxs(const uint8_t* b, IntBlock& o) {
  o.d = half_at(b) * 0.25f;
  o.dmin = 0.f;
  o.has_min = false;
  for (int v = 0; v < QK_K; v++) {
    int neg, s;
    const int g = iq3xxs_mag(b, v / 32, v % 32, &neg, &s);
    o.w[v] = (int16_t)((2 * s + 1) * (neg ? -g : g));
  }
  for (int j = 0; j < 8; j++) o.m[j] = 0;
}

}  // namespace

IntDecodeFn int_decoder(uint32_t type) {
  switch (type) {
    case GGML_Q2_K: return dec_q2_k;
    case GGML_Q3_K: return dec_q3_k;
    case GGML_Q4_K: return dec_q4_k;
    case GGML_Q5_K: return dec_q5_k;
    case GGML_Q6_K: return dec_q6_k;
    case GGML_IQ2_XXS: return dec_iq2_xxs;
    case GGML_IQ3_XXS: return dec_iq3_xxs;
    case GGML_IQ4_XS: return dec_iq4_xs;
    case GGML_IQ2_XS: return dec_iq2_xs;
    case GGML_IQ2_S: return dec_iq2_s;
    case GGML_IQ3_S: return dec_iq3_s;
    case GGML_IQ1_S: return dec_iq1_s;
    case GGML_IQ1_M: return dec_iq1_m;
    default: return nullptr;
  }
}

// gguf-py: dl = d*(sc & 15) and ml = dmin*(sc >> 4) rounded to float32, then dl*q - ml.
void dq_q2_k(const uint8_t* s, float* y, int64_t n) {
  for (int64_t bi = 0; bi < n / QK_K; bi++, y += QK_K) {
    const uint8_t* b = s + bi * 84;
    const float d = half_at(b + 80), dmin = half_at(b + 82);
    for (int v = 0; v < QK_K; v++) {
      const float dl = d * (float)(b[v / 16] & 0xF), ml = dmin * (float)(b[v / 16] >> 4);
      y[v] = dl * (float)q2k_code(b, v) - ml;
    }
  }
}
// gguf-py: dl = d*(sc-32) rounded to float32, then dl*q.
void dq_q3_k(const uint8_t* s, float* y, int64_t n) {
  for (int64_t bi = 0; bi < n / QK_K; bi++, y += QK_K) {
    const uint8_t* b = s + bi * 110;
    const float d = half_at(b + 108);
    int8_t sc[16];
    q3k_scales(b + 96, sc);
    for (int v = 0; v < QK_K; v++) y[v] = (d * (float)sc[v / 16]) * (float)q3k_code(b, v);
  }
}
// gguf-py: d*sc and dmin*m rounded to float32 first, then (d*sc)*q - dmin*m.
void dq_q4_k(const uint8_t* s, float* y, int64_t n) {
  for (int64_t bi = 0; bi < n / QK_K; bi++, y += QK_K) {
    const uint8_t* b = s + bi * 144;
    const float d = half_at(b), dmin = half_at(b + 2);
    for (int j = 0; j < 8; j++) {
      uint8_t sc, m;
      k4_scale_min(b + 4, j, &sc, &m);
      const float ds = d * (float)sc, dm = dmin * (float)m;
      for (int i = 0; i < 32; i++) y[32 * j + i] = ds * (float)k4_code(b + 16, 32 * j + i) - dm;
    }
  }
}
void dq_q5_k(const uint8_t* s, float* y, int64_t n) {
  for (int64_t bi = 0; bi < n / QK_K; bi++, y += QK_K) {
    const uint8_t* b = s + bi * 176;
    const float d = half_at(b), dmin = half_at(b + 2);
    for (int j = 0; j < 8; j++) {
      uint8_t sc, m;
      k4_scale_min(b + 4, j, &sc, &m);
      const float ds = d * (float)sc, dm = dmin * (float)m;
      for (int i = 0; i < 32; i++) {
        const int q = k4_code(b + 48, 32 * j + i) | ((b[16 + i] >> j) & 1) << 4;
        y[32 * j + i] = ds * (float)q - dm;
      }
    }
  }
}
// gguf-py: (d*sc) rounded, then times (q-32).
void dq_q6_k(const uint8_t* s, float* y, int64_t n) {
  for (int64_t bi = 0; bi < n / QK_K; bi++, y += QK_K) {
    const uint8_t* b = s + bi * 210;
    const float d = half_at(b + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    for (int v = 0; v < QK_K; v++) y[v] = (d * (float)sc[v / 16]) * (float)(k6_code(b, b + 128, v) - 32);
  }
}
// gguf-py: db = d*(0.5+s)*0.25 (IQ2_XXS) or *0.5 (IQ3_XXS), then (db*grid)*(+-1).
void dq_iq2_xxs(const uint8_t* s, float* y, int64_t n) {
  for (int64_t bi = 0; bi < n / QK_K; bi++, y += QK_K) {
    const uint8_t* b = s + bi * 66;
    const float d = half_at(b);
    for (int v = 0; v < QK_K; v++) {
      int neg, sc;
      const int g = iq2xxs_mag(b, v / 32, v % 32, &neg, &sc);
      const float db = d * (0.5f + (float)sc) * 0.25f;
      const float a = db * (float)g;
      y[v] = neg ? -a : a;
    }
  }
}
void dq_iq3_xxs(const uint8_t* s, float* y, int64_t n) {
  for (int64_t bi = 0; bi < n / QK_K; bi++, y += QK_K) {
    const uint8_t* b = s + bi * 98;
    const float d = half_at(b);
    for (int v = 0; v < QK_K; v++) {
      int neg, sc;
      const int g = iq3xxs_mag(b, v / 32, v % 32, &neg, &sc);
      const float db = d * (0.5f + (float)sc) * 0.5f;
      const float a = db * (float)g;
      y[v] = neg ? -a : a;
    }
  }
}

// gguf-py: dl = d*(ls-32) rounded to float32, then dl*kvalue.
void dq_iq4_xs(const uint8_t* s, float* y, int64_t n) {
  for (int64_t bi = 0; bi < n / QK_K; bi++, y += QK_K) {
    const uint8_t* b = s + bi * 136;
    const float d = half_at(b);
    for (int ib = 0; ib < 8; ib++) {
      const float dl = d * (float)(iq4xs_scale(b, ib) - 32);
      for (int j = 0; j < 32; j++) {
        const int code = (b[8 + 16 * ib + j % 16] >> (4 * (j / 16))) & 0xF;
        y[32 * ib + j] = dl * (float)kIq4Values[code];
      }
    }
  }
}

QAct QActBuf::view(int T, int64_t cols) {
  STRATA_CHECK(T >= 1 && T <= 8 && cols % QK_K == 0, "quantize_act: T = ", T, ", cols = ", cols);
  QAct a;
  a.T = T;
  a.cols = cols;
  a.nb = cols / QK_K;
  a.ldq = cols;
  if ((int64_t)q.size() < T * cols + 32) q.resize(T * cols + 32);
  if ((int64_t)d.size() < a.nb * 8) d.resize(a.nb * 8);
  if ((int64_t)bsum.size() < a.nb * 64) bsum.resize(a.nb * 64);
  std::memset(d.data(), 0, a.nb * 8 * sizeof(float));
  // zero past row T: the kernels read the pair sums of all 8 rows (cpu/kquants8_avx2.cpp mins_row0 gathers row 0's
  // by ORing loads that span rows 1..7 of a one-row QAct; test_rows_independent_of_T quantizes 8 rows, then 1)
  std::memset(bsum.data(), 0, a.nb * 64 * sizeof(int16_t));
  a.q = q.data();
  a.d = d.data();
  a.bsum = bsum.data();
  return a;
}

void QActBuf::fill_q8(QAct& a, bool pairs) {
  const int64_t n = (int64_t)a.T * a.ldq;
  if (!a.q8) {  // (quantize_act_avx2 writes it itself)
    if ((int64_t)q8.size() < n + 32) q8.resize(n + 32);
    for (int64_t i = 0; i < n; i++) q8[i] = (int8_t)q[i];
    a.q8 = q8.data();
  }
  a.q8p = nullptr;
  if (!pairs) return;
  if ((int64_t)q8p.size() < n / 2 + 16) q8p.resize(n / 2 + 16);
  for (int64_t i = 0; i < n / 2; i++) q8p[i] = (int16_t)(32 * (q[2 * i] + q[2 * i + 1]));  // |.| <= 8128
  a.q8p = q8p.data();
}

void quantize_act_ref(const float* x, int64_t ldx, int T, int64_t cols, QActBuf& buf, QAct& out) {
  out = buf.view(T, cols);
  for (int t = 0; t < T; t++)
    for (int64_t b = 0; b < out.nb; b++) {
      const float* xb = x + t * ldx + b * QK_K;
      int16_t* qb = buf.q.data() + t * out.ldq + b * QK_K;
      float amax = 0.f;
      for (int i = 0; i < QK_K; i++) amax = std::fmax(amax, std::fabs(xb[i]));
      const float iscale = amax > 0.f ? 127.f / amax : 0.f;
      for (int i = 0; i < QK_K; i++) qb[i] = (int16_t)std::nearbyint(iscale * xb[i]);
      buf.d[b * 8 + t] = amax / 127.f;
      for (int j = 0; j < 8; j++) {
        int s = 0;
        for (int i = 0; i < 32; i++) s += qb[32 * j + i];
        buf.bsum[(b * 4 + j / 2) * 16 + 2 * t + (j & 1)] = (int16_t)s;
      }
    }
}

}  // namespace strata
