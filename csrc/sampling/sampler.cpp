// Logit processors and token choice (engine spec section 5). See sampler.h for the contract.
//
// Sampling semantics (temperature > 0), mirrored exactly by tests/test_sampling.py's numpy reference:
//   1. s_i = logits[i] / temperature in float32. NaN and -inf are never candidates.
//      m = max s_i (= max logit / temperature: correctly rounded division is monotone).
//      m == -inf or no non-NaN logit: error. m == +inf (tiny temperature overflowed): greedy.
//   2. Order: by s descending, ties by lower id. Every cut below keeps a prefix of this order, and the
//      inverse CDF walks it, so the result is a pure function of (logits, params, pos).
//   3. w_i = exp((double)s_i - (double)m), so the top token has w = 1 exactly.
//      Tail cut: tokens with w < 1e-12 are dropped (at most V * 1e-12 of the mass; it keeps the sort small).
//   4. top-k keeps the first k. top-p keeps the shortest prefix whose running sum (in order, in double)
//      reaches top_p * (sum of the set after top-k), at least one token. min-p keeps w >= min_p
//      (prob >= min_p * max prob, since the max has w = 1).
//   5. Inverse CDF: u = uniform_at(seed, pos); walk the kept prefix in order, summing w in double;
//      the first token whose running sum exceeds u * total wins (the last one if rounding runs out).
// Under a token mask (refused logits = -inf) that allows the best token, m is unchanged, so step 1's first cut
// (a comparison of (double)s - m with a floor: code steps 1-2) keeps exactly the unmasked candidates that the
// mask allows, in the same order; steps 3-5 see nothing else. So the masked choice is a function of those
// candidates' mask bits alone (PickTrace, repick: the same code, `choose`, finishes both).
#include "sampling/sampler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "util/common.h"

namespace strata {

namespace {

// Below this log-ratio a token's weight is certainly < 1e-12 (ln 1e-12 = -27.631); between it and the
// true bound we compute exp and test, so the cut is exactly "w < 1e-12".
constexpr double kTailCut = 1e-12;
constexpr double kTailCutLog = -27.7;

inline uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A candidate token: key orders by scaled logit s descending (see key_of), ties by lower id.
struct Cand {
  uint32_t key;
  int32_t id;
};
// The one total order used everywhere.
inline bool before(const Cand& a, const Cand& b) { return a.key < b.key || (a.key == b.key && a.id < b.id); }

// Order-reversing bijection between non-NaN floats and uint32 (-0 is first mapped to +0, as they compare equal).
inline uint32_t key_of(float s) {
  s += 0.f;
  uint32_t u;
  std::memcpy(&u, &s, 4);
  // ascending in s: negative -> ~u, else u | sign bit; without a branch (logits' signs are random: a branch on
  // them mispredicts about half the time over a whole row)
  u ^= (uint32_t)((int32_t)u >> 31) | 0x80000000u;
  return ~u;
}
inline float s_of(uint32_t key) {
  uint32_t u = ~key;
  u = (u & 0x80000000u) ? (u & 0x7fffffffu) : ~u;
  float s;
  std::memcpy(&s, &u, 4);
  return s;
}

// Sort into the order `before` when there are many candidates: a stable LSD radix sort on the key
// (11-bit digits, 3 passes). The candidates arrive in ascending id, so stability gives the id tie-break.
void radix_sort(std::vector<Cand>& a) {
  constexpr int kBits = 11, kBuckets = 1 << kBits;
  thread_local std::vector<Cand> tmp;
  thread_local std::vector<uint32_t> count;
  tmp.resize(a.size());
  count.assign(3 * kBuckets, 0);
  for (const Cand& c : a)
    for (int d = 0; d < 3; ++d) count[d * kBuckets + ((c.key >> (d * kBits)) & (kBuckets - 1))]++;
  for (int d = 0; d < 3; ++d) {
    uint32_t* cnt = count.data() + d * kBuckets;
    const int shift = d * kBits;
    if (cnt[(a[0].key >> shift) & (kBuckets - 1)] == a.size()) continue;  // one digit value: nothing to do
    uint32_t sum = 0;
    for (int b = 0; b < kBuckets; ++b) {
      const uint32_t c = cnt[b];
      cnt[b] = sum;
      sum += c;
    }
    for (const Cand& c : a) tmp[cnt[(c.key >> shift) & (kBuckets - 1)]++] = c;
    a.swap(tmp);
  }
}

// A logit bound x_lo under which no logit x passes (double)(x / T) - md >= floor_log, i.e. fl(x / T) >= c with
// c = md + floor_log (T > 0): fl(x / T) is monotone in x, and x < (c - d) T with d = 1e-4 (|c| + 1) gives
// x / T < c - d, so fl(x / T) <= fl(c - d) < c (float rounding moves a value by at most |c - d| 2^-24 < d).
// Rounded down to a float, so that the comparison x >= x_lo in float passes at least every such x.
float floor_logit(double c, float T) {
  const double b = (c - 1e-4 * (std::fabs(c) + 1.0)) * (double)T;
  if (!(b > -(double)FLT_MAX)) return -INFINITY;
  float f = (float)b;
  if ((double)f > b) f = std::nextafter(f, -INFINITY);
  return f;
}

// f(i) for each i in [0, n) ascending, skipping blocks of 16 logits that are all below x_lo (or NaN): one
// comparison each, in a loop the compiler vectorises. f may raise x_lo (read again at every block).
template <class F>
void for_blocks_above(const float* x, int64_t n, const float& x_lo, F&& f) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    int any = 0;
    for (int j = 0; j < 16; j++) any |= x[i + j] >= x_lo;
    if (!any) continue;
    for (int j = 0; j < 16; j++) f(i + j);
  }
  for (; i < n; i++) f(i);
}

void check_row(const float* logits, int64_t n_vocab, const char* fn) {
  STRATA_CHECK(n_vocab > 0 && n_vocab <= INT32_MAX, fn, ": n_vocab must be in [1, 2^31), got ", n_vocab);
  STRATA_CHECK(logits != nullptr, fn, ": logits is null");
}

}  // namespace

// Lowest id among the largest non-NaN logits; -1 if every logit is NaN or -inf. One pass the compiler vectorises:
// each of 16 lanes keeps its maximum and the first index holding it (NaN never wins a comparison, and a strict >
// never replaces an equal value, -0 and +0 included); the answer is the lowest such index among the lanes holding
// the maximum.
int32_t argmax(const float* logits, int64_t n_vocab) {
  float l[16];
  int32_t at[16];
  for (int j = 0; j < 16; j++) l[j] = -INFINITY, at[j] = -1;
  int64_t i = 0;
  for (; i + 16 <= n_vocab; i += 16)
    for (int j = 0; j < 16; j++) {
      const bool gt = logits[i + j] > l[j];
      l[j] = gt ? logits[i + j] : l[j];
      at[j] = gt ? (int32_t)(i + j) : at[j];
    }
  for (int j = 0; i < n_vocab; i++, j++)
    if (logits[i] > l[j]) l[j] = logits[i], at[j] = (int32_t)i;
  float bv = -INFINITY;
  for (int j = 0; j < 16; j++) bv = l[j] > bv ? l[j] : bv;
  if (bv == -INFINITY) return -1;
  int32_t best = INT32_MAX;
  for (int j = 0; j < 16; j++)
    if (l[j] == bv && at[j] < best) best = at[j];
  return best;
}

namespace {

int32_t argmax_or_throw(const float* logits, int64_t n_vocab, int64_t pos) {
  const int32_t best = argmax(logits, n_vocab);
  if (best < 0) fail("pick_token: no finite logit at position ", pos, " (all ", n_vocab, " are NaN or -inf)");
  return best;
}

}  // namespace

void SamplingParams::validate() const {
  auto bad = [](const char* field, const auto& value, const char* rule) {
    fail<std::invalid_argument>("SamplingParams.", field, " = ", value, ": must be ", rule);
  };
  if (!(temperature >= 0.f && std::isfinite(temperature))) bad("temperature", temperature, "finite and >= 0");
  if (top_k < 0) bad("top_k", top_k, ">= 0 (0 = off)");
  if (!(top_p > 0.f && top_p <= 1.f)) bad("top_p", top_p, "in (0, 1] (1 = off)");
  if (!(min_p >= 0.f && min_p < 1.f)) bad("min_p", min_p, "in [0, 1) (0 = off)");
  if (!(repetition_penalty > 0.f && std::isfinite(repetition_penalty)))
    bad("repetition_penalty", repetition_penalty, "finite and > 0 (1 = off)");
  if (!std::isfinite(presence_penalty)) bad("presence_penalty", presence_penalty, "finite");
  if (!std::isfinite(frequency_penalty)) bad("frequency_penalty", frequency_penalty, "finite");
  if (penalty_last_n < 0) bad("penalty_last_n", penalty_last_n, ">= 0 (0 = no penalty window)");
}

double uniform_at(uint64_t seed, int64_t pos) {
  const uint64_t z = splitmix64(seed ^ splitmix64((uint64_t)pos));
  return (double)(z >> 11) * 0x1.0p-53;  // top 53 bits: exactly representable, in [0, 1)
}

void apply_penalties(float* logits, int64_t n_vocab, const SamplingParams& p, const int32_t* hist, int64_t n_hist) {
  check_row(logits, n_vocab, "apply_penalties");
  p.validate();
  STRATA_CHECK(n_hist >= 0 && (n_hist == 0 || hist != nullptr), "apply_penalties: bad history (n_hist = ", n_hist, ")");
  if (!p.penalties_active() || n_hist == 0) return;
  const int64_t n = std::min<int64_t>(n_hist, p.penalty_last_n);
  // Count by sorting a copy of the window: O(n log n) in the window (n is small), never O(vocab).
  thread_local std::vector<int32_t> win;
  win.assign(hist + (n_hist - n), hist + n_hist);
  std::sort(win.begin(), win.end());
  for (size_t a = 0; a < win.size();) {
    size_t b = a;
    while (b < win.size() && win[b] == win[a]) ++b;
    const int32_t t = win[a];
    const float c = (float)(b - a);
    a = b;
    if (t < 0 || t >= n_vocab) continue;  // ids outside the vocabulary (e.g. padding) have no logit
    float l = logits[t];
    if (p.repetition_penalty != 1.f) l = l > 0.f ? l / p.repetition_penalty : l * p.repetition_penalty;
    l -= c * p.frequency_penalty + p.presence_penalty;  // llama.cpp's order
    logits[t] = l;
  }
}

namespace {

// Steps 3-5 over the ordered candidates (after top-k); shared by pick_token and repick.
int32_t choose(const std::vector<Cand>& cand, double md, const SamplingParams& p, int64_t pos) {
  thread_local std::vector<double> tls_w;
  std::vector<double>& w = tls_w;
  // 3. Weights along the order; the tail cut keeps a prefix (exp is monotone).
  w.clear();
  for (const Cand& c : cand) {
    const double x = std::exp((double)s_of(c.key) - md);
    if (x < kTailCut) break;
    w.push_back(x);
  }
  size_t n = w.size();  // >= 1: the top token has w = exp(0) = 1
  // 4. top-p over the set after top-k, then min-p.
  if (p.top_p < 1.f) {
    double total = 0;
    for (size_t j = 0; j < n; ++j) total += w[j];
    const double thr = (double)p.top_p * total;
    double cum = 0;
    for (size_t j = 0; j < n; ++j) {
      cum += w[j];
      if (cum >= thr) {
        n = j + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.f) {
    size_t j = 1;
    while (j < n && w[j] >= (double)p.min_p) ++j;
    n = j;
  }
  // 5. Inverse CDF over the kept prefix.
  double total = 0;
  for (size_t j = 0; j < n; ++j) total += w[j];
  const double target = uniform_at(p.seed, pos) * total;
  double cum = 0;
  for (size_t j = 0; j < n; ++j) {
    cum += w[j];
    if (cum > target) return cand[j].id;
  }
  return cand[n - 1].id;
}

// The trace of a sampled row (sampler.h PickTrace): complete unless top-k may have cut candidates.
void record(const std::vector<Cand>& cand, double md, const SamplingParams& p, int32_t cap, PickTrace& tr) {
  tr.md = md;
  tr.ids.clear();
  tr.keys.clear();
  if (cand.size() > (size_t)std::max(cap, 0)) {
    tr.kind = PickTrace::kOver;
    return;
  }
  // fewer than top_k candidates: every candidate of the first cut is here (both paths of step 2 agree)
  tr.kind = p.top_k == 0 || cand.size() < (size_t)p.top_k ? PickTrace::kComplete : PickTrace::kCheck;
  for (const Cand& c : cand) tr.ids.push_back(c.id);
  if (tr.kind == PickTrace::kComplete)
    for (const Cand& c : cand) tr.keys.push_back(c.key);
}

}  // namespace

int32_t pick_token(const float* logits, int64_t n_vocab, const SamplingParams& p, int64_t pos, PickTrace* trace,
                   int32_t cap) {
  check_row(logits, n_vocab, "pick_token");
  p.validate();
  const int32_t greedy = argmax_or_throw(logits, n_vocab, pos);
  if (trace) {  // greedy (below: also a +inf maximum): the choice stands under any mask that allows it
    trace->kind = PickTrace::kCheck;
    trace->ids.assign(1, greedy);
    trace->keys.clear();
    trace->md = 0;
    trace->pos = pos;
    trace->p = p;
  }
  if (p.temperature == 0.f) return greedy;

  const float T = p.temperature;
  const float m = logits[greedy] / T;
  if (std::isinf(m)) return greedy;  // +inf: the temperature is so small that it is greedy
  const double md = m;

  // 1. Candidates: tokens that may pass the tail cut (no exp yet): scaled s = logits[i] / T with
  //    (double)s - md >= floor_log. Without top-p every cut keeps a prefix of one order, so they commute and
  //    min-p may cut here too (conservatively in log space; the exact test w >= min_p is below).
  //    s is monotone in the logit, so the test passes only above some logit: blocks of logits all below x_lo
  //    (a bound under it, see floor_logit) are skipped without dividing; the rest take the exact test.
  double floor_log = kTailCutLog;
  if (p.top_p >= 1.f && p.min_p > 0.f) floor_log = std::max(floor_log, std::log((double)p.min_p) - 1e-6);
  const float x_lo = floor_logit(md + floor_log, T);
  constexpr size_t kSmall = 2048;
  thread_local std::vector<Cand> tls_cand;
  std::vector<Cand>& cand = tls_cand;
  cand.clear();
  if (p.top_k > 0 && (size_t)p.top_k <= kSmall) {
    // 2a. A small top-k: keep the best k seen so far in a heap whose front is the worst of them.
    //     `worst` (the front's s once the heap is full) rejects most tokens with one predictable compare, and
    //     its bound in logits (floor_logit: below it s < worst) skips most blocks without scaling them.
    const size_t k = (size_t)p.top_k;
    float worst = -INFINITY, thr = x_lo;
    for_blocks_above(logits, n_vocab, thr, [&](int64_t i) {
      const float s = logits[i] / T;
      if (!(s >= worst) || !((double)s - md >= floor_log)) return;  // NaN and -inf fail too
      const Cand c{key_of(s), (int32_t)i};
      if (cand.size() < k) {
        cand.push_back(c);
        std::push_heap(cand.begin(), cand.end(), before);
      } else if (before(c, cand.front())) {
        std::pop_heap(cand.begin(), cand.end(), before);
        cand.back() = c;
        std::push_heap(cand.begin(), cand.end(), before);
      } else {
        return;
      }
      if (cand.size() == k) {
        worst = s_of(cand.front().key);
        thr = std::max(x_lo, floor_logit((double)worst, T));
      }
    });
    std::sort(cand.begin(), cand.end(), before);
  } else {
    // 2b. The candidates in ascending id, then one sort, then top-k (if any) keeps the first k. Written
    //     branch-free into a scratch row that only grows (a resize of cand to n_vocab would zero it each time).
    thread_local std::vector<Cand> tls_all;
    if (tls_all.size() < (size_t)n_vocab) tls_all.resize((size_t)n_vocab);
    Cand* all = tls_all.data();
    size_t n = 0;
    for_blocks_above(logits, n_vocab, x_lo, [&](int64_t i) {  // branch-free: often half a block passes
      const float s = logits[i] / T;
      all[n] = {key_of(s), (int32_t)i};
      n += (double)s - md >= floor_log;  // NaN and -inf fail
    });
    cand.assign(all, all + n);
    if (cand.size() <= kSmall) std::sort(cand.begin(), cand.end(), before);
    else radix_sort(cand);
    if (p.top_k > 0 && (size_t)p.top_k < cand.size()) cand.resize(p.top_k);
  }
  if (trace) record(cand, md, p, cap, *trace);
  return choose(cand, md, p, pos);
}

int32_t repick(const PickTrace& tr, const uint8_t* allowed, int64_t n) {
  STRATA_CHECK(tr.kind == PickTrace::kComplete, "repick: the row's trace is not complete (kind ", (int)tr.kind, ")");
  STRATA_CHECK(n == (int64_t)tr.ids.size() && allowed != nullptr, "repick: ", n, " allowed flags for ", tr.ids.size(),
               " candidates");
  STRATA_CHECK(allowed[0], "repick: the mask refuses the row's best token ", tr.ids[0], " (it needs its full mask)");
  // The masked row's candidates: the allowed ones, in the same order (a mask only removes candidates).
  thread_local std::vector<Cand> cand;
  cand.clear();
  for (int64_t j = 0; j < n; j++)
    if (allowed[j]) cand.push_back({tr.keys[j], tr.ids[j]});
  if (tr.p.top_k > 0 && (size_t)tr.p.top_k < cand.size()) cand.resize(tr.p.top_k);
  return choose(cand, tr.md, tr.p, tr.pos);
}

void row_history(const int32_t* committed, int64_t n_committed, const int32_t* inputs, int row, int32_t last_n,
                 std::vector<int32_t>& hist) {
  // History of row i: committed ++ inputs[0..i]; only its last penalty_last_n tokens matter.
  const int64_t n_in = row + 1;
  const int64_t W = std::min<int64_t>(last_n, n_committed + n_in);
  const int64_t from_committed = std::max<int64_t>(0, W - n_in);
  hist.assign(committed + (n_committed - from_committed), committed + n_committed);
  hist.insert(hist.end(), inputs + (n_in - (W - from_committed)), inputs + n_in);
}

int sample_rows(const float* logits, int T, int64_t n_vocab, const SamplingParams& p, const int32_t* committed,
                int64_t n_committed, const int32_t* inputs, int64_t pos0, int32_t* out, bool verified_prefix) {
  STRATA_CHECK(T >= 0, "sample_rows: T must be >= 0, got ", T);
  if (T == 0) return 0;
  check_row(logits, n_vocab, "sample_rows");
  STRATA_CHECK(inputs != nullptr && out != nullptr, "sample_rows: inputs/out is null");
  STRATA_CHECK(n_committed >= 0 && (n_committed == 0 || committed != nullptr),
               "sample_rows: bad committed history (n_committed = ", n_committed, ")");
  p.validate();
  const bool pen = p.penalties_active();
  thread_local std::vector<float> row;
  thread_local std::vector<int32_t> hist;
  row.resize((size_t)n_vocab);
  for (int i = 0; i < T; ++i) {
    if (!pen) {  // pick_token reads the row in place
      out[i] = pick_token(logits + (int64_t)i * n_vocab, n_vocab, p, pos0 + i + 1);
    } else {
      std::copy(logits + (int64_t)i * n_vocab, logits + (int64_t)(i + 1) * n_vocab, row.begin());
      row_history(committed, n_committed, inputs, i, p.penalty_last_n, hist);
      apply_penalties(row.data(), n_vocab, p, hist.data(), (int64_t)hist.size());
      out[i] = pick_token(row.data(), n_vocab, p, pos0 + i + 1);
    }
    if (verified_prefix && i + 1 < T && out[i] != inputs[i + 1]) return i + 1;
  }
  return T;
}

}  // namespace strata
