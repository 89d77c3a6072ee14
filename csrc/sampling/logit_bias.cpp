#include "sampling/logit_bias.h"

#include <cmath>
#include <unordered_set>

#include "util/common.h"

namespace strata {

LogitBias LogitBias::make(const std::vector<int32_t>& ids, const std::vector<float>& values, int64_t n_vocab) {
  STRATA_CHECK(ids.size() == values.size(), "logit_bias: ", ids.size(), " token ids but ", values.size(), " values");
  std::unordered_set<int32_t> seen;
  for (size_t i = 0; i < ids.size(); i++) {
    STRATA_CHECK(ids[i] >= 0 && ids[i] < n_vocab, "logit_bias: token id ", ids[i], " is outside the vocabulary [0, ",
                 n_vocab, ")");
    STRATA_CHECK(seen.insert(ids[i]).second, "logit_bias: token id ", ids[i], " appears twice");
    STRATA_CHECK(!std::isnan(values[i]) && values[i] != INFINITY, "logit_bias: bias ", values[i], " of token ", ids[i],
                 " must be finite or -inf");
  }
  return LogitBias{ids, values};
}

bool LogitBias::bans() const {
  for (float v : values)
    if (v == -INFINITY) return true;
  return false;
}

}  // namespace strata
