// Float64 CPU reference of the Llama-family forward on bf16 weights (no intermediate rounding):
// embedding, RMSNorm, q/k/v (+bias), Qwen3 q/k norm, RoPE (engine/kernels/rope_freqs.h inverse
// frequencies), causal attention with each layer's window, SwiGLU MLP, final norm, lm_head; and
// Mllama's gated cross-attention layers over a request's encoder states (HF's
// MllamaCrossAttentionDecoderLayer; skipped, as HF skips them, for a request without states).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/weights.h"

namespace graphdecode::testing {

// One request's encoder states: bf16 bits [length][hidden] (length 0: a text-only request).
struct ReferenceEncoder {
  std::span<const std::uint16_t> states;
  std::int32_t length = 0;
  std::int32_t first_position = 0;  // positions before it skip the cross MLP (EncoderStates)
};

// Logits [vocab] of the LAST token of `tokens` (the whole sequence is run from scratch).
std::vector<double> reference_last_logits(const HostWeights& weights,
                                          std::span<const std::int32_t> tokens,
                                          const ReferenceEncoder& encoder = {});

// Logits [L - first][vocab] of the tokens at positions first .. L-1 of `tokens` (one forward).
std::vector<std::vector<double>> reference_logits(const HostWeights& weights,
                                                  std::span<const std::int32_t> tokens,
                                                  std::size_t first,
                                                  const ReferenceEncoder& encoder = {});

// The residual stream ENTERING each layer of `layers` (layer 0: the embedding) for every token of
// `tokens` (one forward): [layers.size()][L][hidden]. What an EAGLE-3 head reads of its target.
std::vector<std::vector<std::vector<double>>> reference_residual_streams(
    const HostWeights& weights, std::span<const std::int32_t> tokens,
    std::span<const std::int32_t> layers);

}  // namespace graphdecode::testing
