// Kernel launches with programmatic dependent launch (PDL, sm_90+). Every kernel of csrc/kernels/cuda is launched
// by launch() and starts with pdl_wait(); tests/test_cuda_build.py checks both by reading the sources.
//
// With PDL a kernel's blocks may be scheduled while the kernel before it in the stream still runs, so its launch
// and ramp overlap the other's tail (a T = 1 step of the 80B file is ~1500 kernels of a few microseconds each:
// docs/BENCHMARKS.md, issue 19). pdl_wait() (griddepcontrol.wait) then holds every thread until the grids it
// depends on have completed and their writes are visible: nothing a kernel reads or writes in global memory is
// touched before it, except the L2 prefetch of weights (pdl_prefetch: a cache hint, never a value), so the order
// of every memory access and float operation is the one without PDL and the results are the same bits. The chain
// stays transitive: a kernel completes only after its own wait returned, i.e. after its predecessor completed.
// griddepcontrol.launch_dependents right after the wait lets the next kernel be scheduled once every block of this
// one has passed its wait: one kernel ahead at most, so waiting blocks never crowd out a running kernel's.
// On other archs both instructions compile to nothing and launches carry no attribute (pdl_on()).
// Verify windows of 5..16 rows launch without it (pdl_launch()): measured slower with it (the 80B file's T = 8
// 21.3 against 19.3 ms, the default model's T = 16 1.62 against 1.48 ms), where T <= 4 steps and prompt pieces were
// faster with it.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

namespace strata::cuda {

// Whether launches may carry the PDL attribute: the card is sm_90 or later (init_tables) and tests / benches have
// not turned it off (prefer_pdl, matmul_cuda.h).
bool pdl_on();
// Whether the launches issued now carry it: pdl_on(), and the step being issued is not a verify window of 5..16
// rows (step_rows; prefer_pdl's windows), where plain launches measured faster (docs/BENCHMARKS.md, issue 19's
// twelfth milestone).
bool pdl_launch();

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A hint that `bytes` bytes from p will be read soon (into L2; the TMA unit's bulk prefetch on sm_90+, by the
// calling thread). The range is shrunk to whole 16-byte units inside [p, p + bytes): nothing outside it is touched.
// Only for memory that no kernel of the step writes (weights): issued before pdl_wait, it overlaps the weights'
// DRAM latency with the kernel before.
__device__ __forceinline__ void pdl_prefetch(const void* p, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const size_t a = (reinterpret_cast<size_t>(p) + 15) & ~size_t(15);
  const size_t e = (reinterpret_cast<size_t>(p) + bytes) & ~size_t(15);
  for (size_t s = a; s < e; s += 65536) {  // bulk copies take sizes below 2^32: 64 KiB pieces
    const unsigned n = (unsigned)(e - s < 65536 ? e - s : 65536);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(s), "r"(n) : "memory");
  }
#else
  (void)p;
  (void)bytes;
#endif
}

// kern<<<grid, block, smem, st>>>(args...), with the PDL attribute where pdl_launch(). The arguments convert to the
// kernel's parameter types as in a <<<>>> launch.
template <class... P, class... A>
void launch(void (*kern)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, A&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_launch() ? 1 : 0;
  cudaLaunchKernelEx(&cfg, kern, std::forward<A>(args)...);  // an error is left for cudaGetLastError, as <<<>>>'s
}

}  // namespace strata::cuda
