// AVX2 attention (attend.h), the AVX-512 kernel's structure at 8 lanes: all rows and heads of one KV head at
// once, so that each block of cells is read once for every query; scores 8 cells at a time (one 8-lane FMA
// accumulator per cell over the head dimension, then a transposing reduction whose tree is the same for
// every cell), softmax with exp_shift (rowops.h), then o accumulated over cells in increasing order, 32
// cells per block and 64 columns of o in registers at a time (o carried in memory between blocks). Its
// summation order is its own (attend.h: paths may differ in the last bits); within the path every output
// depends only on its own query and cells.
//
// The blocked path (the default) runs groups of kG = 3 consecutive queries together (12 accumulators: 3
// queries x 4 cells of scores, 3 queries x 4 vectors of o; with the 3 query vectors or probabilities and the
// one key or value vector, all 16 registers) so that each key and value vector loaded feeds 3 FMAs and 12
// FMA chains keep both FMA pipes busy (with 2 queries, 8 chains for two pipes of 4-cycle latency; 3 ran
// ~1.6x faster on a Zen 3, docs/BENCHMARKS.md issue 17 session 14); the softmax sums of 8 queries run side by
// side. Every score, sum and output goes through exactly the operations of the one-query path (attend_one,
// the kernel before blocking) in the same order, so the two give the same bits
// (tests/test_attention_blocked.py).
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/attend.h"
#include "kernels/rowops.h"

namespace strata {

namespace {

// Levels 1-2 of the 8-cell reduction on cells 4g..4g+3 (v[0..3]): lane j of 128-bit half H is cell 4g+j's
// sum over half H, ((e0+e2)+(e1+e3)).
inline __m256 reduce4(const __m256* v) {
  const __m256 a = _mm256_add_ps(_mm256_unpacklo_ps(v[0], v[1]), _mm256_unpackhi_ps(v[0], v[1]));
  const __m256 b = _mm256_add_ps(_mm256_unpacklo_ps(v[2], v[3]), _mm256_unpackhi_ps(v[2], v[3]));
  const __m256d ad = _mm256_castps_pd(a), bd = _mm256_castps_pd(b);
  return _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(ad, bd)), _mm256_castpd_ps(_mm256_unpackhi_pd(ad, bd)));
}

// The last level on the two groups' reduce4: lane c = cell c's sum, low half + high half.
inline __m256 reduce_groups(const __m256* r2) {
  return _mm256_add_ps(_mm256_permute2f128_ps(r2[0], r2[1], 0x20), _mm256_permute2f128_ps(r2[0], r2[1], 0x31));
}

// out lane c = sum of v[c]'s 8 lanes, by the same tree for every c: ((e0+e2)+(e1+e3)) within each 128-bit
// half, then low half + high half.
inline __m256 reduce8x8(const __m256* v) {
  const __m256 r2[2] = {reduce4(v), reduce4(v + 4)};
  return reduce_groups(r2);
}

alignas(32) const float kZeroCell[256] = {};  // stands in for cells past the last one

// The largest of s[0..n) (n >= 1). Only the value matters and max is exact, so any order gives it, up to
// the sign of a zero maximum, which exp_shift's s - mx cannot see (x - (+0) == x - (-0) for x != 0, and
// exp of +-0 is 1). NaN scores are skipped, as by the one-query path's s > mx ? s : mx.
inline float row_max(const float* s, int64_t n) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) m = _mm256_max_ps(_mm256_loadu_ps(s + c), m);  // NaN in s: m kept
  alignas(32) float l[8];
  _mm256_store_ps(l, m);
  float mx = l[0];
  for (int i = 1; i < 8; i++) mx = l[i] > mx ? l[i] : mx;
  for (; c < n; c++) mx = s[c] > mx ? s[c] : mx;
  return mx;
}

// ---- the one-query path: one query at a time through each block (tests and benches: the blocked path's twin)

template <int NC, bool kCells>  // NC = hd / 8; kCells: the attended cells are a.cells[0..n)
void attend_one(const AttendArgs& args, float* sc) {
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

// ---- the blocked path

constexpr int kG = 3;         // queries per group
constexpr int64_t kB = 32;    // cells per block of the p.V pass

// reduce4 of the score accumulators of G queries (q[i]) on the 4 cells whose keys are kc[0..4): per cell
// the FMA chain over the head dimension in order from zero. Each key vector loaded feeds G FMAs, each query
// vector 4; the head dimension is a loop (not unrolled), so that its 4 x G accumulators stay in registers.
template <int NC, int G>
__attribute__((always_inline)) inline void cells4(const float* const* q, const float* const* kc, __m256* r) {
  __m256 acc[G][4];
#pragma GCC unroll 4
  for (int i = 0; i < G; i++)
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) acc[i][j] = _mm256_setzero_ps();
#pragma GCC unroll 1
  for (int d = 0; d < NC; d++) {
    __m256 qv[G];
#pragma GCC unroll 4
    for (int i = 0; i < G; i++) qv[i] = _mm256_loadu_ps(q[i] + 8 * d);
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
      __m256 kv = _mm256_loadu_ps(kc[j] + 8 * d);
      asm("" : "+x"(kv));  // one load in a register for the G FMAs (the compiler would load it G times)
#pragma GCC unroll 4
      for (int i = 0; i < G; i++) acc[i][j] = _mm256_fmadd_ps(qv[i], kv, acc[i][j]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < G; i++) r[i] = reduce4(acc[i]);
}

// Scores of G queries (q[i]) on the 8 cells whose keys are kc[0..8), stored to out[i][0..8): reduce8x8's
// tree on the FMA chains of cells4, then * scale, as in attend_one.
template <int NC, int G>
inline void scores_group(const float* const* q, float* const* out, const float* const* kc, __m256 scale) {
  __m256 r2[2][G];  // reduce4 of cells 0-3 and 4-7, per query
  cells4<NC, G>(q, kc, r2[0]);
  cells4<NC, G>(q, kc + 4, r2[1]);
#pragma GCC unroll 4
  for (int i = 0; i < G; i++) {
    const __m256 h[2] = {r2[0][i], r2[1][i]};
    _mm256_storeu_ps(out[i], _mm256_mul_ps(reduce_groups(h), scale));
  }
}

// o[i] += p v over cells c0..c1 in increasing order for G queries (p of query i at s[i][c]), kO vectors of
// o at a time: each value vector loaded feeds G FMAs. Per output lane the FMA chain of attend_one.
template <int NC, int G, bool kCells>
inline void pv_group(const float* const* s, float* const* o, const AttendArgs& a, int64_t c0, int64_t c1) {
  constexpr int kO = G == 1 ? (NC < 8 ? NC : 8) : 4;
  for (int d0 = 0; d0 < NC; d0 += kO) {
    __m256 acc[G][kO];
#pragma GCC unroll 4
    for (int i = 0; i < G; i++)
#pragma GCC unroll 8
      for (int d = 0; d < kO; d++) acc[i][d] = _mm256_loadu_ps(o[i] + 8 * (d0 + d));
    for (int64_t c = c0; c < c1; c++) {
      __m256 p[G];
#pragma GCC unroll 4
      for (int i = 0; i < G; i++) p[i] = _mm256_set1_ps(s[i][c]);
      const float* vp = a.v + (kCells ? (int64_t)a.cells[c] : c) * a.ldkv + 8 * d0;
#pragma GCC unroll 8
      for (int d = 0; d < kO; d++) {
        __m256 vv = _mm256_loadu_ps(vp + 8 * d);
        asm("" : "+x"(vv));  // one load in a register for the G FMAs
#pragma GCC unroll 4
        for (int i = 0; i < G; i++) acc[i][d] = _mm256_fmadd_ps(p[i], vv, acc[i][d]);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < G; i++)
#pragma GCC unroll 8
      for (int d = 0; d < kO; d++) _mm256_storeu_ps(o[i] + 8 * (d0 + d), acc[i][d]);
  }
}

// sum[i] = s[i][0] + s[i][1] + ... + s[i][n[i]-1] in that order from 0, for G rows side by side (the chains
// are independent: G additions in flight instead of one).
template <int G>
inline void row_sums(float* const* s, const int64_t* n, float* sum) {
  float acc[G];
  int64_t nlo = n[0];
  for (int i = 0; i < G; i++) acc[i] = 0.f, nlo = std::min(nlo, n[i]);
  for (int64_t c = 0; c < nlo; c++)
#pragma GCC unroll 8
    for (int i = 0; i < G; i++) acc[i] += s[i][c];
  for (int i = 0; i < G; i++) {
    for (int64_t c = nlo; c < n[i]; c++) acc[i] += s[i][c];
    sum[i] = acc[i];
  }
}

template <int NC, bool kCells>
void attend_blocked(const AttendArgs& args, float* sc) {
  const AttendArgs a = args;
  const int nq = a.T * a.nh;
  const int64_t nmax = a.n + a.T - 1, ld_sc = nmax + 16;
  auto qp = [&](int i) { return a.q + (i / a.nh) * a.ldq_t + (i % a.nh) * a.ldq_h; };
  auto op = [&](int i) { return a.o + (i / a.nh) * a.ldo_t + (i % a.nh) * a.ldo_h; };
  auto ncells = [&](int i) { return a.n + i / a.nh; };  // nondecreasing in i
  // scores: per block of 8 cells, every group with a query that sees any of them (its other queries'
  // scores past their own cells are written and never read, as in attend_one)
  const __m256 scale = _mm256_set1_ps(a.scale);
  for (int64_t c0 = 0; c0 < nmax; c0 += 8) {
    const float* kc[8];
    for (int j = 0; j < 8; j++)
      kc[j] = c0 + j < nmax ? a.k + (kCells ? (int64_t)a.cells[c0 + j] : c0 + j) * a.ldkv : kZeroCell;
    for (int i0 = 0; i0 < nq; i0 += kG) {
      const int g = std::min(kG, nq - i0);
      if (c0 >= ncells(i0 + g - 1)) continue;
      const float* q[kG];
      float* out[kG];
      for (int i = 0; i < g; i++) q[i] = qp(i0 + i), out[i] = sc + (i0 + i) * ld_sc + c0;
      if (g == 3) scores_group<NC, 3>(q, out, kc, scale);
      else if (g == 2) scores_group<NC, 2>(q, out, kc, scale);
      else scores_group<NC, 1>(q, out, kc, scale);
    }
  }
  // softmax per query over its own cells; the sums 8 rows side by side
  for (int i0 = 0; i0 < nq; i0 += 8) {
    const int g = std::min(8, nq - i0);
    float* s[8];
    int64_t n[8];
    float sum[8];
    for (int i = 0; i < g; i++) {
      s[i] = sc + (i0 + i) * ld_sc;
      n[i] = ncells(i0 + i);
      exp_shift(s[i], row_max(s[i], n[i]), n[i]);
    }
    switch (g) {
      case 8: row_sums<8>(s, n, sum); break;
      case 7: row_sums<7>(s, n, sum); break;
      case 6: row_sums<6>(s, n, sum); break;
      case 5: row_sums<5>(s, n, sum); break;
      case 4: row_sums<4>(s, n, sum); break;
      case 3: row_sums<3>(s, n, sum); break;
      case 2: row_sums<2>(s, n, sum); break;
      default: row_sums<1>(s, n, sum); break;
    }
    for (int i = 0; i < g; i++) {
      const float inv = 1.f / sum[i];
      for (int64_t c = 0; c < n[i]; c++) s[i][c] = s[i][c] * inv;
      float* o = op(i0 + i);
      for (int d = 0; d < NC; d++) _mm256_storeu_ps(o + 8 * d, _mm256_setzero_ps());
    }
  }
  // o += p v over cells in increasing order, a block of cells at a time for every group: the cells all of
  // a group's queries see together, then each query's remaining cells of the block alone
  for (int64_t c0 = 0; c0 < nmax; c0 += kB) {
    for (int i0 = 0; i0 < nq; i0 += kG) {
      const int g = std::min(kG, nq - i0);
      if (c0 >= ncells(i0 + g - 1)) continue;
      const float* s[kG];
      float* o[kG];
      for (int i = 0; i < g; i++) s[i] = sc + (i0 + i) * ld_sc, o[i] = op(i0 + i);
      const int64_t ce = std::max(c0, std::min(c0 + kB, ncells(i0)));  // ncells(i0): the group's fewest
      if (c0 < ce) {
        if (g == 3) pv_group<NC, 3, kCells>(s, o, a, c0, ce);
        else if (g == 2) pv_group<NC, 2, kCells>(s, o, a, c0, ce);
        else pv_group<NC, 1, kCells>(s, o, a, c0, ce);
      }
      for (int i = 0; i < g; i++) {
        const int64_t c1 = std::min(c0 + kB, ncells(i0 + i));
        if (ce < c1) pv_group<NC, 1, kCells>(s + i, o + i, a, ce, c1);
      }
    }
  }
}

template <bool kCells>
void attend_hd(const AttendArgs& a, float* sc, bool one_query) {
  switch (a.hd) {
    case 64: return one_query ? attend_one<8, kCells>(a, sc) : attend_blocked<8, kCells>(a, sc);
    case 128: return one_query ? attend_one<16, kCells>(a, sc) : attend_blocked<16, kCells>(a, sc);
    case 256: return one_query ? attend_one<32, kCells>(a, sc) : attend_blocked<32, kCells>(a, sc);  // Qwen3-Next's
    default: return attend_ref(a, sc);
  }
}

}  // namespace

void attend_avx2(const AttendArgs& a, float* sc, bool one_query) {
  if (a.cells) attend_hd<true>(a, sc, one_query);
  else attend_hd<false>(a, sc, one_query);
}

}  // namespace strata
