// LL ("low latency") words: 32 bits of data beside a 32-bit tag, written in one 64-bit store, so
// a reader that sees the tag it expects holds the data of that same store (NCCL's LL protocol).
// The writer needs no fence and the reader no barrier or counter: a hand-off costs one L2 round
// trip from the store to a polling reader (bench/probes/pdl_hop.cu: 0.48 us inside a grid, 0.65
// across kernels, against ~1.05 for a PDL boundary and 1.15 for a release/acquire counter;
// bench/NOTES.md 112). For the layer kernel's small activations (engine/NOTES "Revised
// 2026-11-29"; act, q, the new K/V, the attention partials), where a grid barrier under a weight
// stream costs ~2 us (bench/NOTES.md 114).
//
// Tags: never 0 (zeroed memory is never ready) and different for every use of the same words, e.g.
// step epoch x layers + layer + 1, so a word left by an earlier step or replay is never taken for
// this one's. Only data that fits 32 bits per word (two bf16) travels this way, and only the
// word's own data: nothing else the writer stored before it is ordered by it (relaxed accesses).
#pragma once

#include <cstdint>

namespace graphdecode {

// One 64-bit word, 8-byte aligned: tag in the high half, data in the low half.
__device__ __forceinline__ void ll_store(unsigned long long* word, std::uint32_t data,
                                         std::uint32_t tag) {
  const unsigned long long v = (static_cast<unsigned long long>(tag) << 32) | data;
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(word), "l"(v) : "memory");
}

// Polls *word (at GPU scope: never an L1 copy) until its tag is `tag`, then sets `data` and
// returns true. After `max_polls` polls it gives up instead of hanging: ORs `stall_bit` into
// *stall_flag (when set) and returns false with `data` untouched.
__device__ __forceinline__ bool ll_poll(const unsigned long long* word, std::uint32_t tag,
                                        std::uint32_t& data, std::uint32_t max_polls,
                                        std::int32_t* stall_flag, std::int32_t stall_bit) {
  for (std::uint32_t polls = 0; polls < max_polls; ++polls) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(word) : "memory");
    if (static_cast<std::uint32_t>(v >> 32) == tag) {
      data = static_cast<std::uint32_t>(v);
      return true;
    }
  }
  if (stall_flag != nullptr) atomicOr(stall_flag, stall_bit);
  return false;
}

}  // namespace graphdecode
