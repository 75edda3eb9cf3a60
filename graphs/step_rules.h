// Per-step derivations, written once as __host__ __device__ functions: the host writer
// (step_input.cpp), the GPU prep kernel (step_prep.cu), the CPU prep path (step_prep_host.cpp) and
// the replay fuzzer's reference all call these. The per-request rules themselves (KV extent,
// positions, window) come from common/request_rules.h and are not restated here.
#pragma once

#include <cstdint>

#include "common/request_rules.h"
#include "graphs/step_mode.h"

namespace graphdecode::step_rules {

// Is `extend_len` allowed for a request of a step of `mode` whose key has N = tokens_per_request?
//   decode 1; verify exactly N; draft-extend-v2 1..N (the accepted count); extend >= 1;
//   speculative >= 1 (the tokens committed since the last speculative step).
GD_HD bool extend_len_allowed(StepMode mode, std::int32_t tokens_per_request,
                              std::int32_t extend_len) {
  switch (mode) {
    case StepMode::kDecode:
      return extend_len == 1;
    case StepMode::kTargetVerify:
      return extend_len == tokens_per_request;
    case StepMode::kDraftExtendV2:
      return extend_len >= 1 && extend_len <= tokens_per_request;
    case StepMode::kExtend:
    case StepMode::kSpeculative:  // the committed count, <= max_draft_tokens + 1 (the writer)
      return extend_len >= 1;
    default:
      return false;
  }
}

// Row r of a bucket is live when r < num_requests; rows past it are padding and take these inert
// values: slot kPaddingSlot (whose table row is all kReservedPage), no query, no key.
GD_HD bool row_live(std::int32_t row, std::int32_t num_requests) {
  return row < num_requests;
}
GD_HD std::int32_t row_slot(bool live, std::int32_t slot) {
  return live ? slot : kPaddingSlot;
}
GD_HD std::int32_t row_q_len(bool live, std::int32_t extend_len) {
  return live ? extend_len : 0;
}
// Self-attention keys of a row: the KV extent, prefix + extend (never prefix alone).
GD_HD std::int32_t row_self_kv_len(bool live, std::int32_t prefix_len, std::int32_t extend_len) {
  return live ? kv_extent(prefix_len, extend_len) : 0;
}
// Cross-attention keys of a row: that request's own encoder length.
GD_HD std::int32_t row_cross_kv_len(bool live, std::int32_t encoder_len) {
  return live ? encoder_len : 0;
}

// The request owning new token t, given cu_seqlens q_start[0..n] (q_start[0] = 0, strictly
// increasing because every live request adds >= 1 token): the last r < n with q_start[r] <= t.
// Caller guarantees 0 <= t < q_start[n].
GD_HD std::int32_t request_of_token(const std::int32_t* q_start, std::int32_t n, std::int32_t t) {
  std::int32_t lo = 0, hi = n;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const std::int32_t mid = lo + (hi - lo) / 2;
    if (q_start[mid] <= t)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// Inert values of a token row past num_tokens.
inline constexpr std::int32_t kPaddingTokenRequest = -1;
inline constexpr std::int32_t kPaddingTokenPosition = 0;
inline constexpr std::int32_t kPaddingTokenId = 0;

// A token id of kTokenFromDevice in the image means "the token the sampler left for this slot on
// the device" (the per-slot feedback buffer, StepPrep::set_token_feedback), so a decode step can
// be written before the host has read the previous step's tokens. Without a feedback buffer the
// prep substitutes kPaddingTokenId (the writer refuses the sentinel unless the capacity allows it).
inline constexpr std::int32_t kTokenFromDevice = -1;
GD_HD std::int32_t resolve_token_id(std::int32_t id, std::int32_t slot,
                                    const std::int32_t* feedback) {
  if (id != kTokenFromDevice) return id;
  return feedback != nullptr ? feedback[slot] : kPaddingTokenId;
}

// Logits rows (LogitRows): how many a step selects, and the token row of selected row i (i below
// that count). Padding logits rows (past the count, up to the graph's capacity) read token row
// kPaddingLogitRow, whose values nobody reads back.
inline constexpr std::int32_t kPaddingLogitRow = 0;
GD_HD std::int32_t num_logit_rows(LogitRows rows, std::int32_t num_requests,
                                  std::int32_t num_tokens, std::int32_t max_logit_rows) {
  const std::int32_t n = rows == LogitRows::kEveryRow ? num_tokens : num_requests;
  return n < max_logit_rows ? n : max_logit_rows;
}
// q_start [num_requests + 1] (cu_seqlens of the new tokens); chosen [num_requests] or nullptr.
GD_HD std::int32_t logit_token_row(LogitRows rows, std::int32_t i, const std::int32_t* q_start,
                                   const std::int32_t* chosen) {
  if (rows == LogitRows::kEveryRow) return i;
  const std::int32_t first = q_start[i], last = q_start[i + 1] - 1;
  if (rows != LogitRows::kChosenPerRequest || chosen == nullptr) return last;
  const std::int32_t row = first + chosen[i];
  return row < first ? first : row > last ? last : row;
}

}  // namespace graphdecode::step_rules
