// The CUDA twins of the backend's non-product operations (backend.h): DeltaNet rows, attention, MoE routing and
// the window's token choice. Each computes the same float32 (and, in sampling, float64) operations in the same
// order as its CPU reference, so results equal the CPU backend's bit for bit (sampling: the same tokens, see
// sample.cu for the one bound); each output row depends only on its own inputs, never on T or the launch shape.
// Every pointer is device memory unless said otherwise; every function issues on `stream` (a cudaStream_t).
// Plain C++ header (no CUDA types): included by the backend.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/attend.h"
#include "sampling/sampler.h"
#include "state/deltanet_state.h"

namespace strata::cuda {

// deltanet_state.h dn_rows (its scalar twin dn_rows_ref's operations, row by row): `rows` is a host array whose
// pointers are device memory. Returns at once.
void dn_rows(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv, void* stream);

// attend.h attend_ref: dot16 scores, max, exp_shift (rowops' exp_inl), a running sum in cell order, o accumulated
// over cells in order. `a` on the host, its pointers device memory; scratch: attend_scratch(a) floats (device).
void attend(const AttendArgs& a, float* scratch, void* stream);

// The CPU backend's moe_route (moe.cpp's routing): softmax with exp_inl and a running sum, top-k by (p desc, id
// asc), weights renormalised over the k with a running sum.
void moe_route(const float* logits, int T, int64_t E, int k, int32_t* sel, float* wt, void* stream);

// sampler.h sample_rows. Device scratch: sample_scratch_bytes(T, n_vocab). status[T] (device) gets 0, or 1 where a
// row has no finite logit (the caller raises pick_token's error). Returns at once.
size_t sample_scratch_bytes(int T, int64_t n_vocab);
void sample_rows(const float* logits, int T, int64_t n_vocab, const SamplingParams& p, const int32_t* committed,
                 int64_t n_committed, const int32_t* inputs, int64_t pos0, int32_t* out, int32_t* status,
                 void* scratch, void* stream);

}  // namespace strata::cuda
