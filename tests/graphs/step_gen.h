// Random step descriptions for the graphs/ tests: every mode, random batch sizes (so padding rows
// occur), random prefixes, encoder lengths and token ids, within a StepCapacity.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "graphs/step_input.h"

namespace graphdecode::testing {

struct GeneratedStep {
  StepMode mode = StepMode::kDecode;
  std::int32_t tokens_per_request = 0;
  LogitRows logits = LogitRows::kLastPerRequest;
  std::vector<StepRequest> requests;
  std::vector<std::int32_t> token_ids;

  StepDesc desc() const {
    StepDesc d;
    d.mode = mode;
    d.tokens_per_request = tokens_per_request;
    d.logits = logits;
    d.requests = requests;
    d.token_ids = token_ids;
    return d;
  }
};

inline StepCapacity small_capacity() {
  StepCapacity c;
  c.max_batch = 40;
  c.max_tokens = 300;
  c.max_slots = 64;
  c.max_kv_len = 4096;
  c.max_encoder_len = 600;
  c.max_logit_rows = 300;  // every row of any step may get logits
  c.max_draft_tokens = 7;
  return c;
}

// A valid random step of `mode` with `n` requests on distinct slots.
inline GeneratedStep random_step(std::mt19937& rng, const StepCapacity& cap, StepMode mode,
                                 std::int32_t n) {
  GeneratedStep s;
  s.mode = mode;
  s.logits = static_cast<LogitRows>(rng() % kNumLogitRows);
  const std::int32_t tokens_left = cap.max_tokens;
  const std::int32_t per = std::max<std::int32_t>(1, tokens_left / std::max(n, 1));
  std::uniform_int_distribution<std::int32_t> pick_n(1, std::min<std::int32_t>(8, per));
  s.tokens_per_request = mode == StepMode::kDecode   ? 1
                         : mode == StepMode::kExtend ? 0
                                                     : pick_n(rng);
  if (mode == StepMode::kSpeculative) {
    s.logits = LogitRows::kLastPerRequest;
    s.tokens_per_request = std::min<std::int32_t>(pick_n(rng) - 1, cap.max_draft_tokens);
  }
  std::vector<std::int32_t> slots(static_cast<std::size_t>(cap.max_slots - 1));
  std::iota(slots.begin(), slots.end(), 1);
  std::shuffle(slots.begin(), slots.end(), rng);
  for (std::int32_t r = 0; r < n; ++r) {
    StepRequest q;
    q.slot = slots[static_cast<std::size_t>(r)];
    switch (mode) {
      case StepMode::kDecode:
        q.extend_len = 1;
        break;
      case StepMode::kTargetVerify:
        q.extend_len = s.tokens_per_request;
        break;
      case StepMode::kDraftExtendV2:
        q.extend_len = std::uniform_int_distribution<std::int32_t>(1, s.tokens_per_request)(rng);
        break;
      case StepMode::kExtend:
        q.extend_len = std::uniform_int_distribution<std::int32_t>(1, per)(rng);
        break;
      case StepMode::kSpeculative:
        q.extend_len = std::uniform_int_distribution<std::int32_t>(
            1, std::min(per, cap.max_draft_tokens + 1))(rng);
        break;
    }
    const std::int32_t past = mode == StepMode::kSpeculative ? s.tokens_per_request : 0;
    q.prefix_len =
        std::uniform_int_distribution<std::int32_t>(0, cap.max_kv_len - q.extend_len - past)(rng);
    if (rng() % 4 == 0) q.prefix_len = static_cast<std::int32_t>(rng() % 3);  // short prefixes
    q.encoder_len = std::uniform_int_distribution<std::int32_t>(0, cap.max_encoder_len)(rng);
    s.requests.push_back(q);
    for (std::int32_t i = 0; i < q.extend_len; ++i) {
      s.token_ids.push_back(static_cast<std::int32_t>(rng() % 50000));
    }
  }
  return s;
}

}  // namespace graphdecode::testing
