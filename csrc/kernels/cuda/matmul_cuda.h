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
void prefer_pdl(bool on, bool prefetch = true);
bool pdl_on();
// Bytes of scratch (device) that matmul() needs for T rows of `cols` columns of weight type `type`.
size_t matmul_scratch_bytes(uint32_t type, int T, int64_t cols);
// Activation rows matmul() takes per pass for `type` (16; 64 for IQ2_XXS on the tensor cores): longer T runs in
// passes, and the scratch then holds the last pass's quantization only.
int matmul_pass_rows(uint32_t type);
// Issued on `stream` (a cudaStream_t); returns at once. Throws std::invalid_argument for an unsupported type.
// quantized: scratch already holds x's T rows quantized for W.cols columns (an earlier product of the same rows and
// the same act_kind, T <= matmul_pass_rows(W.type)): the quantization is not issued again.
void matmul(const MatView& W, const float* x, int64_t ldx, int T, float* y, int64_t ldy, void* scratch,
            void* stream, bool quantized = false);
// Expert products over a device selection (backend.h matmul_sel): slot s < n: y[s] = W_{sel[s]} . x[s / xdiv].
// Scratch: matmul_sel_scratch_bytes(type, n, xdiv, cols) (the quantized rows, then the tiles: from 64 slots on the
// 256-block int8 types group the slots by expert on the card, each slot still the one-row product bit for bit).
size_t matmul_sel_scratch_bytes(uint32_t type, int n, int xdiv, int64_t cols);
void matmul_sel(const MatView& W0, size_t expert_bytes, const int32_t* sel, int n, int xdiv, const float* x,
                int64_t ldx, float* y, int64_t ldy, void* scratch, void* stream, bool quantized = false);
// backend.h matmul_sel_swiglu in one kernel (gate and up rows of a slot by one warp, sharing the activation loads);
// false (nothing issued) where there is no such kernel (types other than IQ2_XXS, gate and up of different shapes).
bool matmul_sel_swiglu(const MatView& Wg, size_t gate_bytes, const MatView& Wu, size_t up_bytes, const int32_t* sel,
                       int n, int xdiv, const float* x, int64_t ldx, float* g, float* u, void* scratch, void* stream,
                       bool quantized = false);
// T rows of n: ops.h rmsnorm.
void rmsnorm(const float* x, int64_t ldx, const float* w, int64_t n, int T, float eps, float* y, int64_t ldy,
             void* stream);
// x = x + y, then out = rmsnorm(x) (T rows of n, contiguous) in one kernel; false (nothing issued) if n is over its
// shared-memory row.
bool add_rmsnorm(float* x, const float* y, const float* w, int64_t n, int T, float eps, float* out, void* stream);
bool matmul_supported(uint32_t type);
// backend.h embed_rows: out[t] = row ids[t] of table, dequantized as types.h does (the decoders' value(): F32, F16,
// BF16, Q8_0, the types embed_supported names). Returns at once.
bool embed_supported(uint32_t type);
void embed_rows(const MatView& table, const int32_t* ids, int T, float* out, void* stream);

}  // namespace strata::cuda
