// DRY penalty (see dry.h): llama.cpp's algorithm, step for step (breaker scan, reverse Z-algorithm, maximum
// repeat per following token, clamped exponent), over a contiguous history. tests/test_dry.py checks it against
// a brute-force reference (tests/dry_ref.py) on random token streams, and under speculation.
#include "sampling/dry.h"

#include <algorithm>
#include <cmath>

#include "util/common.h"

namespace strata {

DryPenalty DryPenalty::make(float multiplier, float base, int32_t allowed_length, int32_t last_n,
                            const std::vector<int32_t>& heads, const std::vector<std::vector<int32_t>>& tails,
                            int64_t n_vocab) {
  auto bad = [](const char* field, const auto& value, const char* rule) {
    fail<std::invalid_argument>("DRY ", field, " = ", value, ": must be ", rule);
  };
  if (!std::isfinite(multiplier) || multiplier < 0.f) bad("multiplier", multiplier, "finite and >= 0 (0 = off)");
  if (!std::isfinite(base) || base < 1.f) bad("base", base, "finite and >= 1");
  if (allowed_length < 0) bad("allowed_length", allowed_length, ">= 0");
  if (last_n < -1) bad("penalty_last_n", last_n, ">= -1 (-1 = the whole history, 0 = off)");
  STRATA_CHECK(heads.size() == tails.size(), "DRY: ", heads.size(), " breaker heads but ", tails.size(), " tails");
  STRATA_CHECK(n_vocab > 0, "DRY: n_vocab must be > 0, got ", n_vocab);
  DryPenalty d;
  d.multiplier = multiplier;
  d.base = base;
  d.allowed_length = allowed_length;
  d.last_n = last_n;
  d.single_breaker.assign((size_t)n_vocab, 0);
  for (size_t i = 0; i < heads.size(); i++) {
    auto check = [&](int32_t t) {
      if (t < 0 || t >= n_vocab)
        fail<std::invalid_argument>("DRY sequence breaker ", i, ": token id ", t, " is outside [0, ", n_vocab, ")");
    };
    check(heads[i]);
    for (int32_t t : tails[i]) check(t);
    STRATA_CHECK(tails[i].size() <= 20, "DRY sequence breaker ", i, ": a tail of ", tails[i].size(),
                 " tokens (at most 20, as llama.cpp clamps it)");
    if (tails[i].empty()) d.single_breaker[(size_t)heads[i]] = 1;
    d.breakers.emplace(heads[i], tails[i]);
  }
  return d;
}

void DryPenalty::penalties(const int32_t* h, int64_t n, std::vector<int32_t>& ids, std::vector<float>& amounts) const {
  ids.clear();
  amounts.clear();
  if (!active()) return;
  const int N = (int)window(n);
  if (N <= allowed_length) return;
  const int32_t* w = h + (n - N);                   // the window, oldest first
  auto rat = [&](int i) { return w[N - 1 - i]; };   // i-th token from the newest

  // 1. the most recent breaker caps the repeat length
  int rep_limit = N;
  for (int i = 0; i < N; ++i) {
    auto its = breakers.equal_range(rat(i));
    if (its.first == its.second) continue;
    int longest = -1;
    for (auto it = its.first; it != its.second; ++it) {
      const int len = (int)it->second.size();
      if (len > longest && len <= i) {
        bool match = true;
        for (int o = 0; o < len && match; ++o) match = it->second[(size_t)o] == rat(i - o - 1);
        if (match) longest = len;
      }
    }
    if (longest >= 0) {
      rep_limit = i - longest;
      break;
    }
  }
  if (rep_limit < allowed_length) return;

  // 2. reverse Z-algorithm: cnt[last - k] = common length of the suffix and the sequence ending k tokens earlier
  thread_local std::vector<int> cnt;
  cnt.assign((size_t)N, 0);
  const int last = N - 1;
  int rt = 0, lt = 0;
  for (int k = 1; k < N; ++k) {
    if (k > rt) {
      int m = 0;
      while (m + k < N && rat(m) == rat(m + k)) ++m;
      cnt[(size_t)(last - k)] = std::min(m, rep_limit);
      if (m > 0) {
        lt = k;
        rt = k + m - 1;
      }
    } else {
      const int p = k - lt;
      const int right = rt - k + 1;
      if (cnt[(size_t)(last - p)] < right) {
        cnt[(size_t)(last - k)] = std::min(cnt[(size_t)(last - p)], rep_limit);
      } else {
        int i = rt + 1;
        while (i < N && rat(i) == rat(i - k)) i += 1;
        cnt[(size_t)(last - k)] = std::min(i - k, rep_limit);
        lt = k;
        rt = i - 1;
      }
    }
  }

  // 3. the longest repeat each following token would extend
  thread_local std::unordered_map<int32_t, int> best;
  best.clear();
  for (int i = 0; i < N - 1; ++i) {
    const int len = cnt[(size_t)i];
    if (len < allowed_length) continue;
    const int32_t t = w[i + 1];
    auto it = best.find(t);
    if (it == best.end() || it->second < len) best[t] = len;
  }

  // 4. penalties: multiplier * base^(len - allowed), the exponent clamped against float overflow
  constexpr float kFloatMaxLog = 88.7228391f;
  int max_exp = 0;
  if (base > 1.000001f) max_exp = (int)(kFloatMaxLog / std::log(base));
  for (const auto& [t, len] : best) {
    (void)len;
    if (t >= 0 && (size_t)t < single_breaker.size() && single_breaker[(size_t)t]) continue;
    ids.push_back(t);
  }
  std::sort(ids.begin(), ids.end());
  amounts.reserve(ids.size());
  for (int32_t t : ids) {
    int e = best[t] - allowed_length;
    if (max_exp > 0 && e > max_exp) e = max_exp;
    amounts.push_back((float)((double)multiplier * std::pow((double)base, (double)e)));  // as std::pow(float, int)
  }
}

void apply_dry(float* logits, int64_t n_vocab, const DryPenalty& d, const int32_t* h, int64_t n) {
  thread_local std::vector<int32_t> ids;
  thread_local std::vector<float> amounts;
  d.penalties(h, n, ids, amounts);
  for (size_t j = 0; j < ids.size(); j++)
    if (ids[j] >= 0 && ids[j] < n_vocab) logits[ids[j]] -= amounts[j];
}

}  // namespace strata
