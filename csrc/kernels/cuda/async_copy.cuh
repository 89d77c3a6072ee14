// Asynchronous copies from global into shared memory (cp.async, sm_80 and later), for the kernels that stage rows
// ahead of their use: no register holds the copied values, so no later instruction waits on them
// (deltanet.cu k_dn_heads_duo, iq2_mma.cuh k_iq2xxs_panel_staged). Compiled for an arch below sm_80 the helpers trap
// rather than copy nothing (the staged panel is launched only where mma_available(); the duo kernel on any card the
// build runs on: STRATA_CUDA_ARCHS 80 and later).
#pragma once
#include <cstdint>

namespace strata::cuda {

// 4 or 16 bytes (dst and src aligned to the size); .ca keeps the 4-byte rows in L1, .cg the 16-byte ones in L2 only.
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src)
               : "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src)
               : "memory");
#else
  __trap();
#endif
}
// The copies issued since the last commit, as one group.
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#else
  __trap();
#endif
}
// Waits until all but the N most recent groups of this thread are complete (other threads' copies: a barrier after).
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#else
  __trap();
#endif
}

}  // namespace strata::cuda
