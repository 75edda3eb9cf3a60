// model_parity --eagle: greedy speculative decoding with an EAGLE head, step by step, recording
// every step's drafts so scripts/hf_eagle_parity.py can check them against a PyTorch EAGLE head
// run from the same target state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/spec/eagle_weights.h"
#include "engine/weights.h"

namespace graphdecode {

// All prompts in one batch: a prefill, then speculative steps of k drafts until every request has
// new_tokens. Writes PREFIX.json: {"batch", "k", "graph_steps", "eager_steps", "drafted",
// "accepted", "tokens": [[...]] (new_tokens per prompt), "steps": [{"drafts": [[k per prompt]],
// "committed": [[...]]}]} (the first committed token of a prompt is the prefill's).
int run_eagle_steps(const HostWeights& target, const EagleWeights& head,
                    const std::vector<std::vector<std::int32_t>>& prompts, std::int32_t new_tokens,
                    std::int32_t k, bool graphs, const std::string& out);

}  // namespace graphdecode
