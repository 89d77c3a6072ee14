// AVX-512 attention (attend.h) for all rows and heads of one KV head at once, so that each block of
// cells is read once for every query: scores 16 cells at a time (one 16-lane FMA accumulator per cell,
// then a transposing reduction whose tree is the same for every cell), softmax with exp_shift
// (rowops.h), then o accumulated over cells in increasing order, 32 cells per block, o held in registers
// within a block and carried in memory between blocks.
#include <immintrin.h>

#include <cmath>

#include "kernels/attend.h"
#include "kernels/rowops.h"

namespace strata {

namespace {

// out lane c = sum of v[c]'s 16 lanes, by the same tree for every c:
// ((e0+e2)+(e1+e3)) within each 128-bit quarter L, then (L0+L1)+(L2+L3).
inline __m512 reduce16x16(__m512* v) {
  __m512 r1[8], r2[4], r3[2];
  for (int i = 0; i < 8; i++)
    r1[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; i++) {
    const __m512d a = _mm512_castps_pd(r1[2 * i]), b = _mm512_castps_pd(r1[2 * i + 1]);
    r2[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  for (int i = 0; i < 2; i++)
    r3[i] = _mm512_add_ps(_mm512_shuffle_f32x4(r2[2 * i], r2[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_f32x4(r2[2 * i], r2[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(r3[0], r3[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(r3[0], r3[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

alignas(64) const float kZeroCell[256] = {};  // stands in for cells past the last one

template <int NC, bool kCells>  // NC = hd / 16; kCells: the attended cells are a.cells[0..n)
void attend_t(const AttendArgs& args, float* sc) {
  const AttendArgs a = args;  // a copy: the stores below must not make the compiler reload the fields
  auto cell = [&](int64_t c) -> int64_t {
    if constexpr (kCells) return a.cells[c];
    else return c;
  };
  const int nq = a.T * a.nh;
  const int64_t nmax = a.n + a.T - 1, ld_sc = nmax + 16;
  auto qp = [&](int i) { return a.q + (i / a.nh) * a.ldq_t + (i % a.nh) * a.ldq_h; };
  auto op = [&](int i) { return a.o + (i / a.nh) * a.ldo_t + (i % a.nh) * a.ldo_h; };
  auto ncells = [&](int i) { return a.n + i / a.nh; };
  // scores: per block of 16 cells (fixed multiples of 16), every query that sees any of them
  const __m512 scale = _mm512_set1_ps(a.scale);
  for (int64_t c0 = 0; c0 < nmax; c0 += 16) {
    for (int i = 0; i < nq; i++) {
      if (c0 >= ncells(i)) continue;
      const float* q = qp(i);
      __m512 acc[16];
      for (int j = 0; j < 16; j++) acc[j] = _mm512_setzero_ps();
      // the head dimension in parts of at most 8 vectors (16 accumulators + 8 query vectors in registers),
      // each cell's sum still taking the parts in order
      constexpr int kPart = NC < 8 ? NC : 8;
      for (int d0 = 0; d0 < NC; d0 += kPart) {
        __m512 qv[kPart];
        for (int d = 0; d < kPart; d++) qv[d] = _mm512_loadu_ps(q + 16 * (d0 + d));
        for (int j = 0; j < 16; j++) {
          const float* kj = (c0 + j < nmax ? a.k + cell(c0 + j) * a.ldkv : kZeroCell) + 16 * d0;
          __m512 s = acc[j];
          for (int d = 0; d < kPart; d++) s = _mm512_fmadd_ps(qv[d], _mm512_loadu_ps(kj + 16 * d), s);
          acc[j] = s;
        }
      }
      _mm512_storeu_ps(sc + i * ld_sc + c0, _mm512_mul_ps(reduce16x16(acc), scale));
    }
  }
  // softmax per query over its own cells
  for (int i = 0; i < nq; i++) {
    float* s = sc + i * ld_sc;
    const int64_t n = ncells(i);
    float mx = -INFINITY;
    for (int64_t c = 0; c < n; c++) mx = s[c] > mx ? s[c] : mx;
    exp_shift(s, mx, n);
    float sum = 0.f;
    for (int64_t c = 0; c < n; c++) sum += s[c];
    const float inv = 1.f / sum;
    for (int64_t c = 0; c < n; c++) s[c] = s[c] * inv;
    float* o = op(i);
    for (int d = 0; d < NC; d++) _mm512_storeu_ps(o + 16 * d, _mm512_setzero_ps());
  }
  // o += p v over cells in increasing order, a block of cells at a time for every query
  constexpr int64_t kB = 32;
  for (int64_t c0 = 0; c0 < nmax; c0 += kB) {
    for (int i = 0; i < nq; i++) {
      const int64_t n = ncells(i);
      if (c0 >= n) continue;
      const int64_t c1 = c0 + kB < n ? c0 + kB : n;
      const float* s = sc + i * ld_sc;
      float* o = op(i);
      __m512 acc[NC];
      for (int d = 0; d < NC; d++) acc[d] = _mm512_loadu_ps(o + 16 * d);
      for (int64_t c = c0; c < c1; c++) {
        const __m512 p = _mm512_set1_ps(s[c]);
        const float* vp = a.v + cell(c) * a.ldkv;
        for (int d = 0; d < NC; d++) acc[d] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vp + 16 * d), acc[d]);
      }
      for (int d = 0; d < NC; d++) _mm512_storeu_ps(o + 16 * d, acc[d]);
    }
  }
}

template <bool kCells>
void attend_hd(const AttendArgs& a, float* sc) {
  switch (a.hd) {
    case 64: return attend_t<4, kCells>(a, sc);
    case 128: return attend_t<8, kCells>(a, sc);
    case 256: return attend_t<16, kCells>(a, sc);  // Qwen3-Next's head size
    default: return attend_ref(a, sc);
  }
}

}  // namespace

void attend_avx512(const AttendArgs& a, float* sc) {
  if (a.cells) attend_hd<true>(a, sc);
  else attend_hd<false>(a, sc);
}

}  // namespace strata
