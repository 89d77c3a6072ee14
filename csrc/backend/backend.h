// The backend boundary (issue 19): the operations the model code needs from the machine it computes on,
// behind one small interface implemented per backend (cpu_backend.cpp: today's kernels; cuda_backend.cu: the
// GPU). A backend owns its memory: every pointer handed to an operation lies in that backend's memory
// (host memory for the CPU, the card for CUDA), placed there by alloc + upload; MatView::data likewise.
//
// Exactness contract (engine spec 2.5), the same for every backend: each output row is a function of its own
// input row(s) and the weights only, never of T, of the other rows of the window or of a thread or block
// partition, so a T-row call equals T one-row calls bit for bit (windows stay bit-identical to serial decoding on
// every backend). Products follow matmul.h's stated lane order (the CUDA kernels compute exactly those float32
// operations, so they equal the CPU's bit for bit); norms follow ops.h.
//
// Host-side descriptions (the DnRow array, AttendArgs, SamplingParams) live in host memory; the pointers inside them
// and every array argument (logits, tokens, sel / wt, out) are the backend's memory.
//
// Status (second milestone of issue 19): the CPU backend forwards every operation to the existing kernels, which
// the model code (csrc/model/*.cpp) still calls directly; the CUDA backend implements every operation with the
// CPU backend's results: products, norms, dn_rows and attend bit for bit (attend: attend_ref's order), moe_route
// bit for bit, sample_rows the same tokens (one stated bound, kernels/cuda/sample.cu).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/attend.h"
#include "kernels/matmul.h"
#include "sampling/sampler.h"
#include "state/deltanet_state.h"

namespace strata {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda:0 (NVIDIA H200)"

  // Memory this backend computes on. alloc of 0 bytes returns nullptr; release(nullptr) does nothing.
  virtual void* alloc(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void sync() = 0;  // wait until every operation issued so far has finished

  // T-row products, any T >= 1: y[t * ldy + r] = sum_c W[r][c] * x[t * ldx + c] (matmul.h).
  virtual void matmul(const MatView& W, const float* x, int64_t ldx, int T, float* y, int64_t ldy) = 0;
  // T rows of n: y[t] = (x[t] * rsqrt(mean(x[t]^2) + eps)) * w (ops.h rmsnorm, its 16-lane sum of squares).
  virtual void rmsnorm(const float* x, int64_t ldx, const float* w, int64_t n, int T, float eps, float* y,
                       int64_t ldy) = 0;
  // DeltaNet: one value head through a window's T rows, rows < n_src also updating S (deltanet_state.h dn_rows);
  // the fold replays kept rows through the same call.
  virtual void dn_rows(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv) = 0;
  // Causal attention of T rows x nh query heads over one KV head's cells (attend.h).
  virtual void attend(const AttendArgs& a) = 0;
  // MoE routing of T rows over E experts: softmax in fp32, top-k (ties: the lower id), weights renormalised over
  // the k (moe.cpp); sel[t * k + j], wt[t * k + j]. The expert union of the window is the set of sel's values.
  virtual void moe_route(const float* logits, int T, int64_t E, int k, int32_t* sel, float* wt) = 0;
  // The window finish (sampler.h sample_rows): logits[T][n_vocab] -> out[T].
  virtual void sample_rows(const float* logits, int T, int64_t n_vocab, const SamplingParams& p,
                           const int32_t* committed, int64_t n_committed, const int32_t* inputs, int64_t pos0,
                           int32_t* out) = 0;
};

// The CPU backend: host memory, the kernels of the active ISA (matmul.h, attend.h, ...) on `threads` threads.
std::unique_ptr<Backend> make_cpu_backend(int threads);
// The CUDA backend on device `device`; RuntimeError when strata was built without CUDA or no device is usable.
std::unique_ptr<Backend> make_cuda_backend(int device);

// Whether a CUDA device is usable (built with CUDA, a driver, at least one device); never throws.
bool cuda_available();
// One line per device ("0: NVIDIA H200, sm_90, 132 SMs, 140 GiB"), or why none is usable.
std::string cuda_info();

}  // namespace strata
