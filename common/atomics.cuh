// Device atomics with explicit memory-order semantics that CUDA's atomicAdd lacks.
#pragma once

#include <cstdint>

namespace graphdecode {

// Acquire-release atomic add at GPU scope (returns the old value). After a CTA barrier, one
// thread's call releases every thread's earlier writes (cumulativity over the barrier) and
// acquires what the other arrivals released: the last-arrival pattern without a full fence in
// every thread (bench/NOTES.md 79).
__device__ __forceinline__ int atomic_add_acq_rel_gpu(int* addr, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;"
               : "=r"(old)
               : "l"(addr), "r"(v)
               : "memory");
  return old;
}

__device__ __forceinline__ std::uint32_t atomic_add_acq_rel_gpu(std::uint32_t* addr,
                                                                std::uint32_t v) {
  std::uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;"
               : "=r"(old)
               : "l"(addr), "r"(v)
               : "memory");
  return old;
}

__device__ __forceinline__ unsigned long long atomic_add_acq_rel_gpu(unsigned long long* addr,
                                                                     unsigned long long v) {
  unsigned long long old;
  asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], %2;"
               : "=l"(old)
               : "l"(addr), "l"(v)
               : "memory");
  return old;
}

}  // namespace graphdecode
