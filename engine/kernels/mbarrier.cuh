// Shared-memory mbarriers for the kernels whose producer warp fills a ring of stages with bulk or
// tensor-map copies (stream_gemv.cu, wgmma_gemm.cu): init, arrive (with an expected byte count for
// the copies that complete it), and the wait on a phase's parity.
#pragma once

#include <cstdint>

namespace graphdecode::detail {

__device__ __forceinline__ std::uint32_t mbar_addr(const std::uint64_t* bar) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(bar));
}
__device__ __forceinline__ void mbar_init(std::uint64_t* bar, std::uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(mbar_addr(bar)), "r"(count));
}
// One arrival that also expects `bytes` of bulk copies before the phase completes.
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint64_t* bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mbar_addr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(mbar_addr(bar)) : "memory");
}
// Returns once the phase of `parity` has completed (parity 1 before any phase: at once).
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, std::uint32_t parity) {
  std::uint32_t done = 0;
  while (!done)
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, "
        "p; }"
        : "=r"(done)
        : "r"(mbar_addr(bar)), "r"(parity)
        : "memory");
}

}  // namespace graphdecode::detail
