// Device-side timing for the GPU benches (bench/bench_cuda.py): CUDA events around back-to-back launches on the
// backend's stream, after a warm-up. Every function needs the CUDA backend (RuntimeError otherwise).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

#include "backend/backend.h"

namespace strata {

struct CudaTiming {
  double median_s = 0, min_s = 0;  // per product (or per launch, per copy)
};
// One product per weight in turn over nmat weights stored back to back from w (device memory, each rows x cols of
// `type`), so that the 60 MB L2 does not flatter; median and min over `reps` passes of seconds per product.
CudaTiming cuda_time_matmul(Backend& cuda, uint32_t type, int64_t rows, int64_t cols, const uint8_t* w, int nmat,
                            const float* x, int T, float* y, int reps);
// An empty kernel launched back to back: seconds per launch (the floor of any one-kernel-per-op design).
CudaTiming cuda_time_launch(Backend& cuda, int reps);
// A device-to-device copy of `bytes`: seconds per copy (the bandwidth ceiling: 2 * bytes / s).
CudaTiming cuda_time_copy(Backend& cuda, size_t bytes, int reps);

// `one(i)` for i in [0, per_pass) per pass (anything issued on the CUDA backend's stream), `reps` passes after a
// warm-up pass: median and min seconds per call.
CudaTiming cuda_time_calls(Backend& cuda, int per_pass, int reps, const std::function<void(int)>& one);

// Tests and benches: cuda::prefer_mma (the IQ2_XXS tensor-core products, default on) and whether they are used now.
void cuda_prefer_mma(bool on, int min_rows);
bool cuda_mma_used();
// Tests and benches: cuda::prefer_pdl (programmatic dependent launch and the weight prefetch, default on) and whether
// launches carry it now.
void cuda_prefer_pdl(bool on, bool prefetch, bool windows);
bool cuda_pdl_used();
// Tests and benches: cuda::prefer_norm_quant (the norms quantize their rows for the products after them, default on).
void cuda_prefer_norm_quant(bool on);
// Tests and benches: cuda::prefer_iq2_rows (the weight rows a warp of the IQ2_XXS T = 1 kernel takes).
void cuda_prefer_iq2_rows(int dense, int sel, int pair);
// Tests and benches: cuda::prefer_iq2_panel (prompt pieces' dense IQ2_XXS products from shared memory, default on).
void cuda_prefer_iq2_panel(bool on);
// Tests and benches: cuda::prefer_iq2_panel_staged (that panel's activation rows staged in shared memory, default on).
void cuda_prefer_iq2_panel_staged(bool on);
// Tests and benches: cuda::prefer_iq2_window_u4 (dense IQ2_XXS windows of 2..4 rows 4 blocks a step, default off).
void cuda_prefer_iq2_window_u4(bool on);
// Tests and benches: cuda::prefer_dn_duo (dn_heads' kernel with a column's halves on two warps, pipelined, for 2+ rows;
// default on).
void cuda_prefer_dn_duo(bool on);
// Tests and benches: DeltaNet's conv, gates and conv-state copies in one kernel for windows of up to 16 rows (default
// on) or as the default sequence of copies and kernels (backend.h dn_conv_gates); the same bits either way.
void cuda_prefer_dn_conv_fused(bool on);
// Tests and benches: cuda::prefer_row_groups (small float matrices past 16 rows in blocks of 16 rows; slower on the
// H100, docs/BENCHMARKS.md), default off.
void cuda_prefer_row_groups(bool on);
// Tests and benches: cuda::prefer_float_split (float matrices of at most `bytes` take windows of 2..8 rows a block
// per activation row; default 8 MiB, 0: off).
void cuda_prefer_float_split(int64_t bytes);
// Tests and benches: cuda::prefer_b32q_split (the int8-activation 32-value block types' small matrices take windows
// as the 1-row kernel per activation row; default on).
void cuda_prefer_b32q_split(bool on);
// Tests and benches: cuda::prefer_kq_lanes (Q4_K's and Q6_K's one-row products on the dp4a lane kernel; default on).
void cuda_prefer_kq_lanes(bool on);
// Tests and benches: cuda::prefer_kq_pair (the experts' Q4_K / Q5_K / Q6_K gate / up / SwiGLU over a few slots in one lane
// kernel launch; default off until run on a card).
void cuda_prefer_kq_pair(bool on);
// Tests and benches: cuda::prefer_q5k_lanes (Q5_K's one-row products on the dp4a lane kernel; default off until run on
// a card).
void cuda_prefer_q5k_lanes(bool on);
// Tests and benches: cuda::prefer_kquant_windows (small K-quant matrices over prompt pieces on the 16-row kernel;
// default off).
void cuda_prefer_kquant_windows(bool on);
void cuda_prefer_attn_tiles(bool on, int64_t min_queries);
void cuda_prefer_tile_prefetch(bool on);
void cuda_prefer_float_tiles(bool on, int min_rows, int64_t min_weight_rows);
void cuda_prefer_tile_stage(bool on);
// Tests and benches: the rows of a prompt piece on the card (Backend::prompt_rows, default 512; sessions made
// after the call), and the current setting.
void cuda_prefer_prompt_rows(int rows);
int cuda_prompt_rows();

}  // namespace strata
