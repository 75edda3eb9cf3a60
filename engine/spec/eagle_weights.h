// An EAGLE-1/2 draft head on the host (SafeAILab/EAGLE, eagle/model/cnets1.py; the layout of
// e.g. yuhuili/EAGLE-LLaMA3-Instruct-8B): for a target position t, with e = embed(token_{t+1})
// and h_t the target's hidden state at t (its last layer's output AFTER the final norm: EAGLE's
// base model returns the normed `outputs[0]`),
//   x = fc(cat(e, h_t))                       fc.weight [hidden, 2 hidden] (+ fc.bias [hidden])
//   y = LlamaDecoderLayer(x)                  layers.0.*; EAGLE-1/2 checkpoints have no
//                                             input_layernorm (cnets1: layer 0 skips it); a head
//                                             that has one is normed as HF's layer does
//   logits = target.lm_head(y)                no final norm: y stands in for the next normed h
// and y is also the hidden state the head feeds itself at the next draft position. The token
// embedding is the head's embed_tokens.weight when the checkpoint has one, else the target's.
// Tensor names are EAGLE's (no "model." prefix). EAGLE-3 heads (fc over three target layers, a
// draft vocabulary with d2t) are refused with an Error naming what was found.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model_config.h"
#include "engine/safetensors.h"
#include "engine/weights.h"

namespace graphdecode {

struct EagleConfig {
  // The head's decoder layer as a one-layer Llama-family config (config.json of the head:
  // hidden, heads, head_dim, intermediate, eps, rope, q/k/v biases, vocab_size).
  ModelConfig layer;
  bool fc_bias = true;         // config "bias" (EAGLE's default true); else fc.bias present
  bool input_norm = false;     // layers.0.input_layernorm.weight present
  bool own_embedding = false;  // embed_tokens.weight present (else the target's embedding)

  void validate() const;  // Error names the field (one layer, no sliding window, no cross)
};

// Every tensor the head needs: fc.weight, fc.bias (fc_bias), embed_tokens.weight
// (own_embedding), layers.0.* of a Llama decoder layer (input_layernorm only with input_norm).
std::vector<TensorSpec> eagle_expected_tensors(const EagleConfig& config);

struct EagleWeights {
  EagleConfig config;
  std::map<std::string, HostTensor> tensors;  // exactly eagle_expected_tensors(config)

  const HostTensor& at(const std::string& name) const;  // Error naming `name` when absent
  const HostTensor* find(const std::string& name) const;
};

// The head's config.json text: ModelConfig fields plus EAGLE's "bias" (fc) and "qkv_bias" (q/k/v
// biases of the layer, as cnets1 reads them for its Qwen heads). Error for EAGLE-3 configs
// (draft_vocab_size, eagle_config), more than one layer, sliding windows.
EagleConfig eagle_config_from_json_text(std::string_view text, std::string_view source);

// Reads `dir`/config.json and `dir`/model.safetensors (or the sharded index). input_norm and
// own_embedding follow the checkpoint; every other expected tensor must be present with its
// shape ("missing tensor" / "shape mismatch" name it) and nothing else may be ("unexpected
// tensor"; EAGLE-3 tensors d2t/t2d/midlayer.* are named as such). F32/F16 round to bf16.
EagleWeights load_eagle_head(const std::string& dir);
EagleWeights load_eagle_weights(EagleConfig config, const SafetensorsCheckpoint& checkpoint);

// Throws Error unless the head fits `target`: the same hidden size (fc reads the target's hidden
// states) and vocabulary (it drafts through the target's lm_head).
void check_eagle_fits(const EagleConfig& head, const ModelConfig& target);

// A seeded random head for `target` (its hidden size, heads, intermediate size, vocabulary,
// rope): linear weights ~ N(0, 0.02^2), fc.bias too, norms 1, no input norm, the target's
// embedding. Deterministic for (target, seed).
EagleWeights synthetic_eagle_weights(const ModelConfig& target, std::uint64_t seed);

}  // namespace graphdecode
