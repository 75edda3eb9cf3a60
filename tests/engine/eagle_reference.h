// Float64 CPU reference of an EAGLE-1/2 head (engine/spec/eagle_weights.h) on bf16 weights, no
// intermediate rounding: for rows j = 0 .. n - 1 at positions 0 .. n - 1 (one request's head
// cache from its start),
//   x = fc(cat(embed(tokens[j]), hidden[j])) [+ fc.bias]; a = input_norm ? rmsnorm(x) : x
//   x += o_proj(causal attention of RoPE'd q/k/v over rows 0 .. j); y = x + mlp(rmsnorm(x))
//   logits = target lm_head(y)
// tokens[j] is token_{j+1} and hidden[j] the target's normed state h_j (or, for a draft decode
// row, the head's own y of the row before).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/spec/eagle_weights.h"
#include "engine/weights.h"

namespace graphdecode::testing {

struct EagleReferenceRow {
  std::vector<double> y;       // [hidden] the head's output
  std::vector<double> logits;  // [vocab]
};

// Rows first .. n - 1 of the head over `tokens` and `hidden` ([n][hidden]).
std::vector<EagleReferenceRow> reference_eagle(const EagleWeights& head, const HostWeights& target,
                                               std::span<const std::int32_t> tokens,
                                               const std::vector<std::vector<double>>& hidden,
                                               std::size_t first);

}  // namespace graphdecode::testing
