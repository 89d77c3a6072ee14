// The CUDA T-row products (matmul.h's contract on the card): y[t * ldy + r] = sum_c W[r][c] * x[t * ldx + c],
// W in its GGUF bytes in device memory, x and y device float32. Each output element is the same float32
// operations as the CPU's scalar twin (matmul_ref.cpp / kquants_ref.cpp): 16 threads per weight row hold the 16
// lanes, each lane accumulating its columns (int8-activation types: its per-block lane sums) in increasing order
// with fmaf, then the fixed tree of matmul.h through warp shuffles. No atomics, no reduction that depends on the
// launch shape, so a T-row call equals T one-row calls and the CPU result, bit for bit.
// Int8-activation types first quantize x on the card, exactly as the CPU does: per 256-block (quantize_act_ref) for
// the K and IQ quants, per 32-block (quantize_act32_ref) for Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4.
// Plain C++ header (no CUDA types): included by the backend and nothing else.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/matmul.h"

namespace strata::cuda {

void init_tables();  // the decoders' lookup tables onto the current device (once per device)
// Tests and benches: whether the IQ2_XXS products of min_rows or more rows (default 5) and the expert tiles take the
// int8 tensor cores (iq2_mma.cuh; default on, where the card has them: sm_80+) or the dp4a kernels. The same bits
// either way (tested).
void prefer_mma(bool on, int min_rows = 5);
bool mma_used();
// Tests and benches: whether kernels are launched with programmatic dependent launch (launch.cuh; default on, where
// the card has it: sm_90+), and with it whether the dense products prefetch their weights before pdl_wait (default
// on; the current device's setting). The same bits either way (tested).
// windows: PDL for the verify windows of 5..16 rows too (default off: launch.cuh pdl_launch).
void prefer_pdl(bool on, bool prefetch = true, bool windows = false);
bool pdl_on();
// The rows of the step whose operations are issued next (Backend::step_rows): its launches' PDL (pdl_launch).
void step_rows(int T);
// Activation rows already quantized for a product of their act_kind (k_quantize's layout for Q8_256,
// k_quantize32's for Q8_32): row t's int8 values at q + t * cols, its block scales at dx + t * (cols / block).
struct QRows {
  const int8_t* q = nullptr;
  const float* dx = nullptr;
};
// Where rows quantized into `base` (matmul's or a norm's) lie: `rows` rows of `cols`, the values, then the scales.
QRows qrows_at(const void* base, int64_t rows, int64_t cols);
// Bytes of those rows for activations of `kind` (0 for Float).
size_t act_bytes(ActKind kind, int64_t rows, int64_t cols);
// Bytes of scratch (device) that matmul() needs for T rows of `cols` columns of weight type `type`: its T rows
// quantized (qrows_at(scratch, T, cols) after the call).
size_t matmul_scratch_bytes(uint32_t type, int T, int64_t cols);
// Activation rows the kernels take per pass for `type` (16; 64 for IQ2_XXS on the tensor cores): longer T runs in
// passes over the rows quantized once.
int matmul_pass_rows(uint32_t type);
// Issued on `stream` (a cudaStream_t); returns at once. Throws std::invalid_argument for an unsupported type.
// pre: x's T rows already quantized for W.cols columns (an earlier product or norm of the same rows, the same
// act_kind): the quantization is not issued again.
void matmul(const MatView& W, const float* x, int64_t ldx, int T, float* y, int64_t ldy, void* scratch,
            void* stream, const QRows* pre = nullptr);
// Expert products over a device selection (backend.h matmul_sel): slot s < n: y[s] = W_{sel[s]} . x[s / xdiv].
// Scratch: matmul_sel_scratch_bytes(type, n, xdiv, cols) (the quantized rows, then the tiles: from 64 slots on the
// 256-block int8 types group the slots by expert on the card, each slot still the one-row product bit for bit).
// pre: the n_x = ceil(n / xdiv) rows of x already quantized (the scratch's first part is then unused).
size_t matmul_sel_scratch_bytes(uint32_t type, int n, int xdiv, int64_t cols);
void matmul_sel(const MatView& W0, size_t expert_bytes, const int32_t* sel, int n, int xdiv, const float* x,
                int64_t ldx, float* y, int64_t ldy, void* scratch, void* stream, const QRows* pre = nullptr);
// backend.h matmul_sel_swiglu in one kernel (gate and up rows of a slot by one warp, sharing the activation loads);
// false (nothing issued) where there is no such kernel (types other than IQ2_XXS, gate and up of different shapes).
bool matmul_sel_swiglu(const MatView& Wg, size_t gate_bytes, const MatView& Wu, size_t up_bytes, const int32_t* sel,
                       int n, int xdiv, const float* x, int64_t ldx, float* g, float* u, void* scratch, void* stream,
                       const QRows* pre = nullptr);
// T rows of n: ops.h rmsnorm. kind != Float and qdst: the output rows also quantized for products of that kind
// (qrows_at(qdst, T, n), exactly matmul's quantization of y), in the same kernel; returns whether they were (not
// for rows over its shared-memory stage, nor columns that are not whole blocks).
bool rmsnorm(const float* x, int64_t ldx, const float* w, int64_t n, int T, float eps, float* y, int64_t ldy,
             void* stream, ActKind kind = ActKind::Float, void* qdst = nullptr);
// x = x + y, then out = rmsnorm(x) (T rows of n, contiguous) in one kernel, and out quantized as rmsnorm's; false
// (nothing issued) if n is over its shared-memory row.
bool add_rmsnorm(float* x, const float* y, const float* w, int64_t n, int T, float eps, float* out, void* stream,
                 ActKind kind = ActKind::Float, void* qdst = nullptr);
// ops_cuda.h gated_norm of T rows of `heads` heads of n (x, z, y: [T][heads][n]), each row's heads * n outputs also
// quantized as rmsnorm's, in one kernel; false (nothing issued) where norm_quantizes(kind, heads * n) is not or the
// row's x and z do not fit the kernel's shared memory (2 heads n over 8192 floats).
bool gated_norm_q(const float* x, const float* w, const float* z, int64_t n, int heads, int T, float eps, bool sig,
                  float* y, void* stream, ActKind kind, void* qdst);
// Whether the norms above quantize rows of n for `kind`; tests and benches: prefer_norm_quant(false) leaves it to the
// products (default on). The same bits either way (tested).
bool norm_quantizes(ActKind kind, int64_t n);
void prefer_norm_quant(bool on);
// Tests and benches: the weight rows a warp of the IQ2_XXS T = 1 kernel takes (1, 2 or 4) in the dense products, in
// the experts' products and in the experts' fused gate / up (defaults 1, 4, 1). The same bits every way (tested).
void prefer_iq2_rows(int dense, int sel, int pair);
// Tests and benches: whether the dense IQ2_XXS windows of 2..4 rows (k_iq2xxs_warp) take 4 blocks of a weight row a
// step (default off: 2). The same bits either way (tested).
void prefer_iq2_window_u4(bool on);
// Tests and benches: whether the dense IQ2_XXS products of 32+ rows (prompt pieces) decode a block's weight rows once
// into shared memory (k_iq2xxs_panel, default on) or take k_mma<Iq2Mma>; the same bits either way.
void prefer_iq2_panel(bool on);
// Tests and benches: whether that panel's activation rows are staged in shared memory, 16 a warp (k_iq2xxs_panel_staged,
// default on) or read from L2 word by word, 8 a warp; the same bits either way.
void prefer_iq2_panel_staged(bool on);
// Tests and benches: whether small float matrices (the routers) over 17+ rows take blocks of 16 activation rows
// or a block per activation row (the default: faster); the same bits either way.
void prefer_row_groups(bool on);
// Tests and benches: float matrices of at most `bytes` (default 8 MiB; 0: none) take windows of 2..8 rows as the
// 1-row kernel per activation row rather than the T-row kernels; the same bits either way.
void prefer_float_split(int64_t bytes);
// Tests and benches: whether the int8-activation 32-value block types' small matrices take windows as the 1-row
// kernel per activation row (default on) or the T-row kernels; the same bits either way.
void prefer_b32q_split(bool on);
// Tests and benches: whether Q4_K's and Q6_K's one-row products (decode steps, the experts' slots, small matrices' row
// split) take k_kq_lanes (dp4a, the default) or k_int<D, 1>; the same bits either way.
void prefer_kq_lanes(bool on);
// Tests and benches: whether the experts' Q4_K / Q5_K / Q6_K gate / up / SwiGLU over a few slots (decode steps, verify windows:
// fewer than the tiles' 64) is one k_kq_lanes pair launch or (the default until it has run on a card) the two one-row
// products and silu_mul; the same bits either way.
void prefer_kq_pair(bool on);
// Tests and benches: whether Q5_K's one-row products take k_kq_lanes as Q4_K's do (with prefer_kq_lanes) or (the
// default until it has run on a card) k_int<Q5_K, 1>; the same bits either way.
void prefer_q5k_lanes(bool on);
// Tests and benches: whether small Q4_K / Q5_K / Q6_K matrices over a prompt piece (more than 16 rows) take the 16-row
// kernel in 256-thread blocks or (default) the 1-row kernel per activation row; the same bits either way.
void prefer_kquant_windows(bool on);
// Tests and benches: whether the IQ2_XXS expert tiles on the tensor cores prefetch each block's next tile's weights
// into L2 (default on); a hint, the same bits either way.
void prefer_tile_prefetch(bool on);
// Tests and benches: whether float products (F32 / F16 / BF16 / Q8_0) of min_rows+ activation rows (default 16) take
// k_float_tiles (blocks of 32 rows x 32 weight rows, default on) or k_float; under 32 rows only matrices of
// min_weight_rows+ rows (default 4096: the default model's 8192-row head, not its small in-layer products); the same
// bits either way.
void prefer_float_tiles(bool on, int min_rows, int64_t min_weight_rows);
// Tests and benches: whether the IQ2_XXS expert tiles on the tensor cores copy each tile's activation rows into shared
// memory first (default on) or read them from L2 word by word; the same bits either way.
void prefer_tile_stage(bool on);
bool matmul_supported(uint32_t type);
// backend.h embed_rows: out[t] = row ids[t] of table, dequantized as types.h does (the decoders' value(): F32, F16,
// BF16, Q8_0, the types embed_supported names). Returns at once.
bool embed_supported(uint32_t type);
void embed_rows(const MatView& table, const int32_t* ids, int T, float* out, void* stream);

}  // namespace strata::cuda
