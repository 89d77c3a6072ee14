// PLE conv history of the qwen4exp PLE layer (qwen4exp.md 1.7, 5): the last (Kp-1)*N rows of
// norm_conv(V') (hc*H values each), which the dilated causal conv reads; zero before the sequence start.
// The n-gram context (the N-1 ids before a position) is not state: it is read from the committed tokens.
//
// Rollback contract (like the DeltaNet conv history): a T = 1 step and a prompt window shift their rows
// into the history in the step ("in place"). A verify window reads the committed history and its own
// rows, never writes the history, and saves each row's normed V'; commit(keep) shifts in the first keep
// saved rows, so a rejected row leaves nothing behind.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace strata {

struct PleState {
  int64_t width = 0;    // hc * H
  int64_t history = 0;  // (Kp - 1) * N rows
  std::vector<float> conv;  // committed [history][width], oldest first
  std::vector<float> rows;  // the last verify window's normed rows [max_window][width]
  int64_t n_rows = 0;       // saved rows of the last verify window (0 after an in-place run)

  void init(int64_t w, int64_t hist, int max_window) {
    width = w;
    history = hist;
    conv.assign((size_t)hist * w, 0.f);
    rows.assign((size_t)max_window * w, 0.f);
    n_rows = 0;
  }
  bool active() const { return width > 0; }
  void reset() {
    std::fill(conv.begin(), conv.end(), 0.f);
    n_rows = 0;
  }
  // Shifts n rows [n][width] (oldest first) into the committed history.
  void push(const float* r, int64_t n) {
    if (history == 0) return;
    const int64_t keep_old = std::max<int64_t>(0, history - n);
    std::memmove(conv.data(), conv.data() + (size_t)(history - keep_old) * width, (size_t)keep_old * width * sizeof(float));
    const int64_t take = std::min(n, history);
    std::memcpy(conv.data() + (size_t)keep_old * width, r + (size_t)(n - take) * width, (size_t)take * width * sizeof(float));
  }
  // commit(keep) of a verify window: the first keep saved rows become history.
  void commit_rows(int64_t keep) {
    if (n_rows > 0) push(rows.data(), std::min(keep, n_rows));
    n_rows = 0;
  }
};

}  // namespace strata
