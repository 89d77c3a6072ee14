// Logit bias: a fixed value added to chosen tokens' logits (-inf bans the token). Keeps no state.
#pragma once
#include <cstdint>
#include <vector>

namespace strata {

struct LogitBias {
  std::vector<int32_t> ids;   // [n] distinct, each in [0, n_vocab)
  std::vector<float> values;  // [n] finite or -inf

  // Validates ids (range, duplicates) and values (no NaN, no +inf); throws std::invalid_argument naming them.
  static LogitBias make(const std::vector<int32_t>& ids, const std::vector<float>& values, int64_t n_vocab);
  bool empty() const { return ids.empty(); }
  bool bans() const;  // any -inf
};

}  // namespace strata
