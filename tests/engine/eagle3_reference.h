// Float64 CPU reference of an EAGLE-3 head (engine/spec/eagle_weights.h) on bf16 weights, no
// intermediate rounding: for rows j = 0 .. n - 1 at positions 0 .. n - 1 (one request's head
// cache from its start),
//   x = in[j].own ? in[j].state : fc(in[j].state) [+ fc.bias]
//   c = cat(rmsnorm(embed(tokens[j]); input_layernorm), rmsnorm(x; hidden_norm))
//   x += o_proj(causal attention of RoPE'd q/k/v_proj(c) over rows 0 .. j)
//   y = x + mlp(rmsnorm(x; post_attention_layernorm))
//   draft logits = lm_head(rmsnorm(y; norm)) [draft_vocab]; token = draft_to_target[argmax]
// tokens[j] is token_{j+1}; in[j].state the target's three captured states of row j
// ([3 target_hidden], own = false) or, for a draft decode row, the head's own y of the row before
// ([hidden], own = true).
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "engine/spec/eagle_weights.h"
#include "engine/weights.h"

namespace graphdecode::testing {

struct Eagle3Input {
  std::vector<double> state;  // [3 target_hidden] (own false) or [hidden] (own true)
  bool own = false;
};

struct Eagle3ReferenceRow {
  std::vector<double> y;             // [hidden] the head's output before its final norm
  std::vector<double> draft_logits;  // [draft_vocab]
  std::int32_t draft_id = -1;        // argmax of draft_logits (lowest on ties)
  std::int32_t token = -1;           // its target id
};

// Rows first .. n - 1 of the head over `tokens` and `in` (n each). `target` supplies the
// embedding unless the head has its own.
std::vector<Eagle3ReferenceRow> reference_eagle3(const EagleWeights& head,
                                                 const HostWeights& target,
                                                 std::span<const std::int32_t> tokens,
                                                 const std::vector<Eagle3Input>& in,
                                                 std::size_t first);

// Draft logits over the target's vocabulary: draft id i at draft_to_target[i], -inf elsewhere
// (the distribution the proposer samples and sampled acceptance reads as q).
std::vector<double> scatter_draft_logits(const EagleWeights& head,
                                         const std::vector<double>& draft_logits,
                                         std::int32_t vocab);

}  // namespace graphdecode::testing
