// AVX2 attention (attend.h), the AVX-512 kernel's structure at 8 lanes: all rows and heads of one KV head at
// once, so that each block of cells is read once for every query; scores 8 cells at a time (one 8-lane FMA
// accumulator per cell over the head dimension, then a transposing reduction whose tree is the same for
// every cell), softmax with exp_shift (rowops.h), then o accumulated over cells in increasing order, 32
// cells per block and 64 columns of o in registers at a time (o carried in memory between blocks). Its
// summation order is its own (attend.h: paths may differ in the last bits); within the path every output
// depends only on its own query and cells.
#include <immintrin.h>

#include <cmath>

#include "kernels/attend.h"
#include "kernels/rowops.h"

namespace strata {

namespace {

// out lane c = sum of v[c]'s 8 lanes, by the same tree for every c: ((e0+e2)+(e1+e3)) within each 128-bit
// half, then low half + high half.
inline __m256 reduce8x8(const __m256* v) {
  __m256 r1[4], r2[2];
  for (int i = 0; i < 4; i++)
    r1[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 2; i++) {
    const __m256d a = _mm256_castps_pd(r1[2 * i]), b = _mm256_castps_pd(r1[2 * i + 1]);
    r2[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
  }
  return _mm256_add_ps(_mm256_permute2f128_ps(r2[0], r2[1], 0x20), _mm256_permute2f128_ps(r2[0], r2[1], 0x31));
}

alignas(32) const float kZeroCell[256] = {};  // stands in for cells past the last one

template <int NC, bool kCells>  // NC = hd / 8; kCells: the attended cells are a.cells[0..n)
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
  // scores: per block of 8 cells (fixed multiples of 8), every query that sees any of them
  const __m256 scale = _mm256_set1_ps(a.scale);
  for (int64_t c0 = 0; c0 < nmax; c0 += 8) {
    for (int i = 0; i < nq; i++) {
      if (c0 >= ncells(i)) continue;
      const float* q = qp(i);
      __m256 acc[8];
      for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
      // the head dimension in parts of 4 vectors (8 accumulators + 4 query vectors in registers), each
      // cell's sum still taking the parts in order
      constexpr int kPart = NC < 4 ? NC : 4;
      for (int d0 = 0; d0 < NC; d0 += kPart) {
        __m256 qv[kPart];
        for (int d = 0; d < kPart; d++) qv[d] = _mm256_loadu_ps(q + 8 * (d0 + d));
        for (int j = 0; j < 8; j++) {
          const float* kj = (c0 + j < nmax ? a.k + cell(c0 + j) * a.ldkv : kZeroCell) + 8 * d0;
          __m256 s = acc[j];
          for (int d = 0; d < kPart; d++) s = _mm256_fmadd_ps(qv[d], _mm256_loadu_ps(kj + 8 * d), s);
          acc[j] = s;
        }
      }
      _mm256_storeu_ps(sc + i * ld_sc + c0, _mm256_mul_ps(reduce8x8(acc), scale));
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
    for (int d = 0; d < NC; d++) _mm256_storeu_ps(o + 8 * d, _mm256_setzero_ps());
  }
  // o += p v over cells in increasing order, a block of cells at a time for every query
  constexpr int64_t kB = 32;
  constexpr int kO = NC < 8 ? NC : 8;  // o vectors in registers per pass over a block
  for (int64_t c0 = 0; c0 < nmax; c0 += kB) {
    for (int i = 0; i < nq; i++) {
      const int64_t n = ncells(i);
      if (c0 >= n) continue;
      const int64_t c1 = c0 + kB < n ? c0 + kB : n;
      const float* s = sc + i * ld_sc;
      float* o = op(i);
      for (int d0 = 0; d0 < NC; d0 += kO) {
        __m256 acc[kO];
        for (int d = 0; d < kO; d++) acc[d] = _mm256_loadu_ps(o + 8 * (d0 + d));
        for (int64_t c = c0; c < c1; c++) {
          const __m256 p = _mm256_set1_ps(s[c]);
          const float* vp = a.v + cell(c) * a.ldkv + 8 * d0;
          for (int d = 0; d < kO; d++) acc[d] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vp + 8 * d), acc[d]);
        }
        for (int d = 0; d < kO; d++) _mm256_storeu_ps(o + 8 * (d0 + d), acc[d]);
      }
    }
  }
}

template <bool kCells>
void attend_hd(const AttendArgs& a, float* sc) {
  switch (a.hd) {
    case 64: return attend_t<8, kCells>(a, sc);
    case 128: return attend_t<16, kCells>(a, sc);
    case 256: return attend_t<32, kCells>(a, sc);  // Qwen3-Next's head size
    default: return attend_ref(a, sc);
  }
}

}  // namespace

void attend_avx2(const AttendArgs& a, float* sc) {
  if (a.cells) attend_hd<true>(a, sc);
  else attend_hd<false>(a, sc);
}

}  // namespace strata
