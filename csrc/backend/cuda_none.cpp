// The CUDA entry points of a build without CUDA (STRATA_CUDA=OFF, cmake/strata_cuda.cmake): they say so.
#ifndef STRATA_HAS_CUDA
#include "backend/backend.h"
#include "backend/cuda_bench.h"
#include "util/common.h"

namespace strata {

namespace {
[[noreturn]] void no_cuda() {
  fail<std::runtime_error>("strata was built without CUDA: rebuild with -Cmake.define.STRATA_CUDA=ON (needs nvcc)");
}
}  // namespace

bool cuda_available() { return false; }
std::string cuda_info() { return "built without CUDA (STRATA_CUDA=OFF)"; }
std::unique_ptr<Backend> make_cuda_backend(int) { no_cuda(); }
CudaTiming cuda_time_matmul(Backend&, uint32_t, int64_t, int64_t, const uint8_t*, int, const float*, int, float*, int) {
  no_cuda();
}
CudaTiming cuda_time_launch(Backend&, int) { no_cuda(); }
CudaTiming cuda_time_copy(Backend&, size_t, int) { no_cuda(); }
CudaTiming cuda_time_calls(Backend&, int, int, const std::function<void(int)>&) { no_cuda(); }
void cuda_prefer_mma(bool, int) { no_cuda(); }
bool cuda_mma_used() { return false; }
void cuda_prefer_pdl(bool, bool, bool) { no_cuda(); }
bool cuda_pdl_used() { return false; }
void cuda_prefer_norm_quant(bool) { no_cuda(); }
void cuda_prefer_iq2_rows(int, int, int) { no_cuda(); }
void cuda_prefer_iq2_panel(bool) { no_cuda(); }
void cuda_prefer_iq2_panel_staged(bool) { no_cuda(); }
void cuda_prefer_iq2_window_u4(bool) { no_cuda(); }
void cuda_prefer_dn_duo(bool) { no_cuda(); }
void cuda_prefer_dn_conv_fused(bool) { no_cuda(); }
void cuda_prefer_row_groups(bool) { no_cuda(); }
void cuda_prefer_float_split(int64_t) { no_cuda(); }
void cuda_prefer_b32q_split(bool) { no_cuda(); }
void cuda_prefer_kq_lanes(bool) { no_cuda(); }
void cuda_prefer_kq_pair(bool) { no_cuda(); }
void cuda_prefer_q5k_lanes(bool) { no_cuda(); }
void cuda_prefer_kquant_windows(bool) { no_cuda(); }
void cuda_prefer_attn_tiles(bool, int64_t) { no_cuda(); }
void cuda_prefer_tile_prefetch(bool) { no_cuda(); }
void cuda_prefer_float_tiles(bool, int, int64_t) { no_cuda(); }
void cuda_prefer_tile_stage(bool) { no_cuda(); }
void cuda_prefer_prompt_rows(int) { no_cuda(); }
int cuda_prompt_rows() { no_cuda(); }

}  // namespace strata
#endif
