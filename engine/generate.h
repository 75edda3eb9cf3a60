// Greedy generation for a fixed batch of prompts: one extend step prefills every prompt, then
// decode steps (graph replay through StepGraphs, or eager) produce the rest. The parity tool
// (examples/model_parity) and the model tests run on it; the continuous-batching loop comes later.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/llama_model.h"
#include "engine/weights.h"

namespace graphdecode {

struct GenerateOptions {
  std::int32_t new_tokens = 16;  // tokens generated per prompt (the prefill gives the first)
  bool use_graphs = true;        // decode steps by graph replay (false: eager)
  std::int32_t page_size = 16;
  bool deterministic = false;
};

// Called after every step: `logits` [batch][vocab] float (the last token of each request),
// `tokens` [batch] the greedy picks of this step.
using StepCallback = std::function<void(std::int32_t step, std::span<const float> logits,
                                        std::span<const std::int32_t> tokens)>;

struct GenerateResult {
  std::vector<std::vector<std::int32_t>> tokens;  // [batch][new_tokens]
  std::int64_t graph_steps = 0;
  std::int64_t eager_steps = 0;
};

// Index of the largest value, the first one on ties (torch.argmax).
std::int32_t argmax(std::span<const float> row);

// The runtime options that fit `prompts` and `options` (batch = prompts, one prefill step holds
// every prompt, KV extent = longest prompt + new_tokens).
RuntimeOptions generation_runtime_options(std::span<const std::vector<std::int32_t>> prompts,
                                          const GenerateOptions& options);

// Builds the model on `stream`, runs the steps, returns the tokens. Throws Error on a bad prompt
// (empty, token id outside the vocabulary) before any device work, or on a CUDA failure.
GenerateResult generate_greedy(const HostWeights& weights,
                               std::span<const std::vector<std::int32_t>> prompts,
                               const GenerateOptions& options, cudaStream_t stream,
                               const StepCallback& on_step = {});

}  // namespace graphdecode
