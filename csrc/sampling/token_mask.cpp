// Token-mask kernels: word at a time, skipping all-allowed words (apply) and all-disallowed ones (argmax);
// the _ref twins go bit by bit.
#include "sampling/token_mask.h"

#include <cmath>


namespace strata {

void apply_token_mask(float* logits, int64_t n_vocab, const uint32_t* mask) {
  const int64_t W = mask_words(n_vocab);
  for (int64_t w = 0; w < W; w++) {
    uint32_t m = mask[w];
    if (m == 0xffffffffu) continue;
    const int64_t base = w * 32, n = n_vocab - base < 32 ? n_vocab - base : 32;
    if (m == 0) {
      for (int64_t j = 0; j < n; j++) logits[base + j] = -INFINITY;
      continue;
    }
    for (int64_t j = 0; j < n; j++)
      if (!((m >> j) & 1u)) logits[base + j] = -INFINITY;
  }
}

void apply_token_mask_ref(float* logits, int64_t n_vocab, const uint32_t* mask) {
  for (int64_t t = 0; t < n_vocab; t++)
    if (!((mask[t / 32] >> (t % 32)) & 1u)) logits[t] = -INFINITY;
}

namespace {

// argmax over the allowed t of value(t) (lowest id among the largest non-NaN; -1 if none): the two kernels below.
template <class Value>
int32_t masked_argmax_of(const Value& value, int64_t n_vocab, const uint32_t* mask) {
  const int64_t W = mask_words(n_vocab);
  float bv = -INFINITY;
  int64_t bi = -1;
  for (int64_t w = 0; w < W; w++) {
    const uint32_t m = mask[w];
    if (m == 0) continue;
    const int64_t base = w * 32, n = n_vocab - base < 32 ? n_vocab - base : 32;
    if (m == 0xffffffffu && n == 32) {
      // lane-wise maxima first (16 independent lanes the compiler vectorises; NaN never wins a comparison),
      // then the word's first index holding the maximum, if it beats bv
      float l[16];
      for (int j = 0; j < 16; j++) {
        const float a = value(base + j), b = value(base + 16 + j);
        l[j] = -INFINITY;
        l[j] = a > l[j] ? a : l[j];
        l[j] = b > l[j] ? b : l[j];
      }
      float mx = -INFINITY;
      for (int j = 0; j < 16; j++) mx = l[j] > mx ? l[j] : mx;
      if (mx > bv) {
        for (int j = 0; j < 32; j++)
          if (value(base + j) == mx) {
            bv = mx;
            bi = base + j;
            break;
          }
      }
      continue;
    }
    for (uint32_t r = m; r; r &= r - 1) {
      const int j = __builtin_ctz(r);
      if (j >= n) break;
      const float v = value(base + j);
      if (v > bv) {
        bv = v;
        bi = base + j;
      }
    }
  }
  return (int32_t)bi;
}

}  // namespace

int32_t masked_argmax(const float* logits, int64_t n_vocab, const uint32_t* mask) {
  return masked_argmax_of([logits](int64_t t) { return logits[t]; }, n_vocab, mask);
}

int32_t masked_argmax_ref(const float* logits, int64_t n_vocab, const uint32_t* mask) {
  float bv = -INFINITY;
  int64_t bi = -1;
  for (int64_t t = 0; t < n_vocab; t++)
    if (((mask[t / 32] >> (t % 32)) & 1u) && logits[t] > bv) {
      bv = logits[t];
      bi = t;
    }
  return (int32_t)bi;
}

int32_t masked_argmax_sub(const float* x, const float* sub, int64_t n_vocab, const uint32_t* mask) {
  return masked_argmax_of([x, sub](int64_t t) { return x[t] - sub[t]; }, n_vocab, mask);
}

int32_t masked_argmax_sub_ref(const float* x, const float* sub, int64_t n_vocab, const uint32_t* mask) {
  float bv = -INFINITY;
  int64_t bi = -1;
  for (int64_t t = 0; t < n_vocab; t++) {
    const float d = x[t] - sub[t];
    if (((mask[t / 32] >> (t % 32)) & 1u) && d > bv) {
      bv = d;
      bi = t;
    }
  }
  return (int32_t)bi;
}

}  // namespace strata
