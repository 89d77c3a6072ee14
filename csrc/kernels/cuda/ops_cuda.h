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

namespace strata {
struct DnHeads;
struct DnConv;
}

namespace strata::cuda {

// deltanet_state.h dn_rows (its scalar twin dn_rows_ref's operations, row by row): `rows` is a host array whose
// pointers are device memory. Returns at once.
void dn_rows(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv, void* stream);

// attend.h attend_ref: dot16 scores, max, exp_shift (rowops' exp_inl), a running sum in cell order, o accumulated
// over cells in order. `a` on the host, its pointers device memory; scratch: attend_scratch(a) floats (device).
// n_dev (device, optional): the cells row 0 sees, read on the card (a.n is then the most it can be: the launch
// shape and the scratch stride), so that a recorded step replays at any position.
void attend(const AttendArgs& a, float* scratch, void* stream, const int32_t* n_dev = nullptr);
// Tests and benches: whether attention over min_queries+ queries (T x nh) takes the tiled kernels (default on, from
// 1024 queries: prompt pieces); the same bits either way.
void prefer_attn_tiles(bool on, int64_t min_queries);

// The CPU backend's moe_route (moe.cpp's routing): softmax with exp_inl and a running sum, top-k by (p desc, id
// asc), weights renormalised over the k with a running sum.
void moe_route(const float* logits, int T, int64_t E, int k, int32_t* sel, float* wt, void* stream);

// sampler.h sample_rows. Device scratch: sample_scratch_bytes(T, n_vocab). status[T] (device) gets 0, or 1 where a
// row has no finite logit (the caller raises pick_token's error). Returns at once.
size_t sample_scratch_bytes(int T, int64_t n_vocab);
void sample_rows(const float* logits, int T, int64_t n_vocab, const SamplingParams& p, const int32_t* committed,
                 int64_t n_committed, const int32_t* inputs, int64_t pos0, int32_t* out, int32_t* status,
                 void* scratch, void* stream);

// backend.h argmax_rows (sampler.h argmax per row, `none` where it is -1): a block per row. Returns at once.
void argmax_rows(const float* logits, int T, int64_t n_vocab, int32_t none, int32_t* out, void* stream);

// The layer operations of backend.h (layers.cu, deltanet.cu), each with the CPU backend's results bit for bit.
// dn_gates: qscale = 1 / sqrt(dk) as the CPU computes it. moe_combine: sg is T floats of device scratch.
void dn_heads(float* S, float* S_work, const DnHeads& a, int T, int n_src, void* stream);
// Tests and benches: whether dk = 128 heads over 2+ rows take k_dn_heads_duo (a column's halves on two warps, a row's
// o chain interleaved with the next row's m; default on) or k_dn_heads_split; the same bits either way.
void prefer_dn_duo(bool on);
void add(float* x, const float* y, int64_t n, void* stream);
void conv_silu(const float* hist, const float* w_t, int T, int64_t n, int64_t ld, int K, float* out, void* stream);
void dn_gates(float* conv, int64_t ld, const float* ba, const float* ssm_a, const float* dt_bias, int T, int64_t nk,
              int64_t nv, int64_t dk, float qscale, float* eg, float* beta, void* stream);
// backend.h dn_conv_gates in one kernel (qscale as dn_gates'); false (nothing issued) where it does not take the
// call (more than 16 rows): the caller issues the default sequence.
bool dn_conv_gates(const DnConv& a, float qscale, void* stream);
void dn_untile(const float* rawf, float* raw, int64_t cd, int64_t key_dim, const float* fz, float* z, const float* fb,
               const float* fa, float* ba, const int32_t* fh, int T, int64_t nk, int64_t nv, int64_t dv, void* stream);
void dn_retile(const float* y, float* out, const int32_t* fh, int T, int64_t nv, int64_t dv, void* stream);
void gated_norm(const float* x, const float* w, const float* z, int64_t n, int rows, float eps, bool sig, float* y,
                void* stream);
void mul_sigmoid_rows(float* o, int64_t ldo, const float* g, int64_t ldg, int64_t n, int rows, void* stream);
void silu_mul(float* g, const float* u, int64_t n, void* stream);
void norm_rope(float* x, int64_t ldt, int64_t ldh, int T, int nh, const float* w, int64_t hd, float eps, const float* cs,
               const float* sn, int64_t n_rot, int64_t pos0, void* stream);
// norm_rope with the position pos0 read from device memory (*pos), for recorded steps.
void norm_rope_at(float* x, int64_t ldt, int64_t ldh, int T, int nh, const float* w, int64_t hd, float eps,
                  const float* cs, const float* sn, int64_t n_rot, const int32_t* pos, void* stream);
// Rows t < T of k and v ([T][width] each) into the KV cache rows *pos + t (pos: device memory).
void kv_store(const float* k, const float* v, int T, int64_t width, float* kc, float* vc, const int32_t* pos,
              void* stream);
void moe_combine(const float* yg, const float* wt, int T, int k, int64_t H, const float* sh, const float* gate_shexp,
                 const float* x, float* out, float* sg, void* stream,
                 bool gate_ready = false);
// moe_combine's shared-expert gates of T rows into sg[T] (device), ahead of it (then gate_ready = true there).
void shared_gate(const float* gate_shexp, const float* x, int T, int64_t H, float* sg, void* stream);

}  // namespace strata::cuda
