#include "sampling/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "util/common.h"

namespace strata {

void token_logprobs(const float* logits, int64_t rows, int64_t n_vocab, const int32_t* tokens, int top_n, float* lp,
                    int32_t* top_ids, float* top_lp) {
  STRATA_CHECK(rows >= 0 && n_vocab >= 1, "token_logprobs: bad shape [", rows, ", ", n_vocab, "]");
  STRATA_CHECK(top_n >= 0 && top_n <= n_vocab, "token_logprobs: top_n = ", top_n, " outside 0..", n_vocab);
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<int32_t> idx;
  for (int64_t r = 0; r < rows; r++) {
    const float* x = logits + r * n_vocab;
    STRATA_CHECK(tokens[r] >= 0 && tokens[r] < n_vocab, "token_logprobs: token ", tokens[r], " at row ", r,
                 " is outside the vocabulary [0, ", n_vocab, ")");
    auto val = [&](int64_t i) { return std::isnan(x[i]) ? ninf : x[i]; };
    float mx = ninf;
    for (int64_t i = 0; i < n_vocab; i++) mx = std::max(mx, val(i));
    double sum = 0;
    if (mx > ninf)
      for (int64_t i = 0; i < n_vocab; i++) sum += std::exp((double)val(i) - (double)mx);
    // every logit -inf (or NaN): no distribution; every log-probability is -inf
    const double lse = mx > ninf ? (double)mx + std::log(sum) : std::numeric_limits<double>::infinity();
    auto logp = [&](int64_t i) { return (float)((double)val(i) - lse); };
    lp[r] = logp(tokens[r]);
    if (top_n == 0) continue;
    idx.resize((size_t)n_vocab);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + top_n, idx.end(), [&](int32_t a, int32_t b) {
      const float va = val(a), vb = val(b);
      return va > vb || (va == vb && a < b);
    });
    for (int j = 0; j < top_n; j++) {
      top_ids[r * top_n + j] = idx[j];
      top_lp[r * top_n + j] = logp(idx[j]);
    }
  }
}

}  // namespace strata
