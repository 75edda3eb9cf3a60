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
  // Cross-attention models: encoder states of prompt r at [r] (length 0: text only), projected
  // into the cross pool before the prefill; empty = every prompt text only. Read during the call.
  std::span<const EncoderStatesView> encoders;
  // A control for tests and parity scripts, never for serving: every step tells the model that
  // every request has the encoder length of request `control_encoder_len_of` (the bug class of
  // an engine that takes request 0's length for the whole batch), while each request's cross K/V
  // hold its own states (cross pages are reserved for the longest, so every read stays inside
  // the request's pages). -1: off.
  std::int32_t control_encoder_len_of = -1;
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
// every prompt, KV extent = longest prompt + new_tokens, max_encoder_len = the longest encoder
// input, at least 1).
RuntimeOptions generation_runtime_options(std::span<const std::vector<std::int32_t>> prompts,
                                          const GenerateOptions& options);

// Builds the model on `stream`, runs the steps, returns the tokens. Throws Error on a bad prompt
// (empty, token id outside the input vocabulary) or bad encoder states (count, length, states on
// a model without cross layers) before any device work, or on a CUDA failure.
GenerateResult generate_greedy(const HostWeights& weights,
                               std::span<const std::vector<std::int32_t>> prompts,
                               const GenerateOptions& options, cudaStream_t stream,
                               const StepCallback& on_step = {});

}  // namespace graphdecode
