// The replay fuzzer's drawn configuration: a target and a draft stack (spec_stack.h) of random
// layers, heads, windows (at and around page edges) and dtypes, and the fuzz's fixed sizes.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "spec_stack.h"

namespace graphdecode::fuzz {

inline constexpr std::int32_t kVerifyTokens = 4;  // N of the captured verify / draft-extend-v2
inline constexpr std::int32_t kMaxPrompt = 48;    // longest extend of one request in extend mode
inline constexpr std::int32_t kMaxDrafts = 5;     // K: speculative steps draft k in [0, K]
inline constexpr std::int32_t kCapturedK[] = {0, 1, 2, 4};  // speculative graphs; 3 and 5 eager
inline constexpr std::int32_t kUncapturedK[] = {3, 5};
inline constexpr std::int32_t kVocab = 50001;  // token ids (fresh and drafted) in [0, kVocab)

// Inclusive uniform draw in [lo, hi].
inline std::int32_t uniform(std::mt19937_64& rng, std::int32_t lo, std::int32_t hi) {
  return std::uniform_int_distribution<std::int32_t>(lo, hi)(rng);
}

SpecStackConfig draw_config(std::mt19937_64& rng, std::int32_t max_batch);
// One line: both stacks' layers (F/S/C), heads, dims, dtypes, windows; the page size and limits.
std::string describe(const SpecStackConfig& config);

}  // namespace graphdecode::fuzz
