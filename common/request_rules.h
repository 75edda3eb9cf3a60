// The per-request rules of DESIGN.md, written once. The CPU tests, the device prep kernels, the
// attention kernels and the float64 reference all call these same functions.
//
//   prefix_len : tokens already in the KV cache before this step
//   extend_len : tokens this step adds (decode 1, verify N, draft-extend-v2 N, prefill any)
//   KV extent  : prefix_len + extend_len, always; new tokens sit at prefix_len .. extent-1
//   window_left: keys strictly left of the query it may see; < 0 means no window
//                (a Hugging Face `sliding_window = W` is window_left = W - 1)
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define GD_HD __host__ __device__ __forceinline__
#else
#define GD_HD inline
#endif

namespace graphdecode {

// Marker for a page-table entry that holds no page (never allocated, or released by the
// sliding-window pool). No kernel may dereference it.
inline constexpr std::int32_t kInvalidPage = -1;

// Slot 0 is reserved: padding rows of a graph bucket point at it and nothing live lives there.
inline constexpr std::int32_t kPaddingSlot = 0;

GD_HD std::int32_t kv_extent(std::int32_t prefix_len, std::int32_t extend_len) {
  return prefix_len + extend_len;
}

// Absolute position of the i-th new token of a step.
GD_HD std::int32_t new_token_position(std::int32_t prefix_len, std::int32_t i) {
  return prefix_len + i;
}

GD_HD std::int32_t window_left_from_hf_sliding_window(std::int32_t sliding_window) {
  return sliding_window > 0 ? sliding_window - 1 : -1;
}

// First key a query at absolute position `query_pos` may see (inclusive). Causal end: query_pos.
GD_HD std::int32_t first_visible_key(std::int32_t query_pos, std::int32_t window_left) {
  if (window_left < 0) return 0;
  const std::int32_t k = query_pos - window_left;
  return k > 0 ? k : 0;
}

// True when a query at `query_pos` attends to the key at `key_pos` (causal + window).
GD_HD bool key_visible(std::int32_t query_pos, std::int32_t key_pos, std::int32_t window_left) {
  return key_pos <= query_pos && key_pos >= first_visible_key(query_pos, window_left);
}

// First key any query of a step may see: the step's first query is the most restrictive one.
GD_HD std::int32_t step_first_key(std::int32_t prefix_len, std::int32_t window_left) {
  return first_visible_key(prefix_len, window_left);
}

GD_HD std::int32_t pages_for_tokens(std::int32_t tokens, std::int32_t page_size) {
  return (tokens + page_size - 1) / page_size;
}

// Sliding-window pool: logical pages [0, first_resident_page) of a request are never read again by
// a step that starts at prefix_len (nor by any later step) and may be returned to the allocator.
GD_HD std::int32_t swa_first_resident_page(std::int32_t prefix_len, std::int32_t window_left,
                                           std::int32_t page_size) {
  return step_first_key(prefix_len, window_left) / page_size;
}

}  // namespace graphdecode
