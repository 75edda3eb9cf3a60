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
// Tensor names are EAGLE's (no "model." prefix).
//
// An EAGLE-3 head (EagleVersion::kEagle3; config architectures ["LlamaForCausalLMEagle3"] or a
// draft_vocab_size; SGLang's and vLLM's llama_eagle3.py, SafeAILab/EAGLE's EAGLE-3 cnets.py) reads
// three of the target's residual-stream states a_t = cat(s_{p0}, s_{p1}, s_{p2}) of row t
// (eagle3_capture_layers) instead of h_t:
//   x = fc(a_t)                               first draft position (the target's states), or
//   x = the head's own previous output        later draft positions (no fc)
//   c = cat(input_layernorm(e), hidden_norm(x))  e = embed(token_{t+1}), 2 hidden wide
//   x += o_proj(attention(q/k/v_proj(c)))     the residual is the un-normed x
//   y = x + mlp(post_attention_layernorm(x))  y: the next position's hidden input
//   logits = lm_head(norm(y))                 [draft_vocab]; draft id i is target id i + d2t[i]
// Its tensors are fc.weight [hidden, 3 target_hidden] (fc.bias with config "bias", default
// false), midlayer.* (q/k/v_proj [*, 2 hidden]), norm.weight, lm_head.weight [draft_vocab,
// hidden], d2t [draft_vocab] I64, t2d [vocab] BOOL (ignored), embed_tokens.weight (optional).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model_config.h"
#include "engine/safetensors.h"
#include "engine/weights.h"

namespace graphdecode {

enum class EagleVersion : std::uint8_t {
  kEagle1 = 1,  // EAGLE-1/2: fc over cat(embedding, the target's final-normed state)
  kEagle3 = 3,  // EAGLE-3: fc over three target layers' states, a draft vocabulary (d2t)
};

struct EagleConfig {
  EagleVersion version = EagleVersion::kEagle1;
  // The head's decoder layer as a one-layer Llama-family config (config.json of the head:
  // hidden, heads, head_dim, intermediate, eps, rope, q/k/v biases, vocab_size = the target's
  // vocabulary, which the embedding covers).
  ModelConfig layer;
  bool fc_bias = true;         // config "bias" (EAGLE-1/2's default true, EAGLE-3's false)
  bool input_norm = false;     // layers.0.input_layernorm.weight present (EAGLE-3: always)
  bool own_embedding = false;  // embed_tokens.weight present (else the target's embedding)
  // EAGLE-3 only.
  std::int32_t draft_vocab_size = 0;    // lm_head rows (config draft_vocab_size, else vocab_size)
  std::int32_t target_hidden_size = 0;  // each target state's width (config target_hidden_size,
                                        // else hidden_size); fc reads 3 of them
  // eagle_config.eagle_aux_hidden_state_layer_ids (or the top-level key): the target layers
  // whose OUTPUT is read, as SGLang and SpecForge count them; empty: the default
  // (eagle3_capture_layers).
  std::vector<std::int32_t> aux_layer_ids;

  bool eagle3() const noexcept { return version == EagleVersion::kEagle3; }
  // Width of a row's hidden-state input as the target provides it (what fc reads, what the
  // proposer carries per row): hidden (EAGLE-1/2, fc's other half is the embedding) or
  // 3 target_hidden (EAGLE-3).
  std::int32_t state_width() const noexcept {
    return eagle3() ? 3 * target_hidden_size : layer.hidden_size;
  }
  void validate() const;  // Error names the field (one layer, no sliding window, no cross)
};

// Every float tensor the head needs. EAGLE-1/2: fc.weight, fc.bias (fc_bias), embed_tokens.weight
// (own_embedding), layers.0.* of a Llama decoder layer (input_layernorm only with input_norm).
// EAGLE-3: eagle3_expected_tensors (the d2t / t2d index tables are not in the list).
std::vector<TensorSpec> eagle_expected_tensors(const EagleConfig& config);
std::vector<TensorSpec> eagle3_expected_tensors(const EagleConfig& config);

struct EagleWeights {
  EagleConfig config;
  std::map<std::string, HostTensor> tensors;  // exactly eagle_expected_tensors(config)
  // EAGLE-3: [draft_vocab_size] the target id of each draft id (the checkpoint's d2t offsets
  // added: i + d2t[i]), distinct and inside the target's vocabulary. Empty for EAGLE-1/2.
  std::vector<std::int32_t> draft_to_target;

  const HostTensor& at(const std::string& name) const;  // Error naming `name` when absent
  const HostTensor* find(const std::string& name) const;
};

// The head's config.json text: ModelConfig fields plus EAGLE's "bias" (fc) and "qkv_bias" (q/k/v
// biases of the layer, as cnets1 reads them for its Qwen heads). An EAGLE-3 config (architectures
// [...Eagle3], draft_vocab_size or eagle_config) is read by eagle3_config_from_json_text. Error
// for more than one layer, sliding windows.
EagleConfig eagle_config_from_json_text(std::string_view text, std::string_view source);
// EAGLE-3 (engine/spec/eagle3_weights.cpp): draft_vocab_size in [1, vocab_size],
// target_hidden_size, "bias", eagle_config {use_aux_hidden_state must be true,
// eagle_aux_hidden_state_layer_ids: three ids >= 0}. Error for other families than Llama
// (biases, q/k norms), more than one layer, sliding windows.
EagleConfig eagle3_config_from_json_text(std::string_view text, std::string_view source);
// True when the config text is an EAGLE-3 head's (what eagle_config_from_json_text dispatches
// on): architectures[0] ending in "Eagle3", or a draft_vocab_size or eagle_config key.
bool is_eagle3_config_text(std::string_view text);

// Reads `dir`/config.json and `dir`/model.safetensors (or the sharded index), either version
// (the config decides). input_norm and own_embedding follow the checkpoint; every other expected
// tensor must be present with its shape ("missing tensor" / "shape mismatch" name it) and
// nothing else may be ("unexpected tensor"; EAGLE-3 tensors in an EAGLE-1/2 head are named as
// such). F32/F16 round to bf16. EAGLE-3: d2t must be I64 (absent only when the draft vocabulary
// is the whole vocabulary: the identity), every i + d2t[i] inside the vocabulary and distinct
// (field "d2t[i]"); t2d, when present, must be [vocab] and is not read.
EagleWeights load_eagle_head(const std::string& dir);
EagleWeights load_eagle_weights(EagleConfig config, const SafetensorsCheckpoint& checkpoint);
EagleWeights load_eagle3_weights(EagleConfig config, const SafetensorsCheckpoint& checkpoint);

// Throws Error unless the head fits `target`. EAGLE-1/2: the same hidden size (fc reads the
// target's hidden states) and vocabulary (it drafts through the target's lm_head). EAGLE-3: the
// target's hidden size is target_hidden_size, the vocabulary is the target's (draft_vocab_size
// <= it), the head's hidden size is the target's unless the head has its own embedding, and its
// capture layers exist in the target (eagle3_capture_layers).
void check_eagle_fits(const EagleConfig& head, const ModelConfig& target);

// EAGLE-3: the three target residual-stream states the head reads, as capture points p (the
// stream ENTERING target layer p, i.e. the output of layer p - 1; p = 0 is the embedding),
// ascending: the order fc's input concatenates them in. Pinned to SGLang (llama.py:
// set_eagle3_layers_to_capture, which captures `hidden_states + residual` before layer i) and
// vLLM (llama.py, the same capture before layer idx): by default p = 2, L / 2, L - 3 for a target
// of L layers (EAGLE's own modeling_llama_kv.py captures those three too); config layer ids are
// layer OUTPUTS, p = id + 1 (SGLang's "+ 1", which SpecForge-trained heads follow; vLLM reads the
// same key as capture points without the + 1). Error (field "eagle.aux_layer_ids") unless the
// three points are distinct and in [0, L - 1] (a point past the last layer is captured by
// neither engine).
std::array<std::int32_t, 3> eagle3_capture_layers(const EagleConfig& head,
                                                  const ModelConfig& target);

// A seeded random head for `target` (its hidden size, heads, intermediate size, vocabulary,
// rope): linear weights ~ N(0, 0.02^2), fc.bias too, norms 1, no input norm, the target's
// embedding. Deterministic for (target, seed).
EagleWeights synthetic_eagle_weights(const ModelConfig& target, std::uint64_t seed);
// A seeded random EAGLE-3 head for `target`: its hidden size, heads, intermediate size and rope;
// a draft vocabulary of `draft_vocab` ids (0: half the target's) mapped by d2t to a seeded random
// increasing subset of the target's ids; linear weights ~ N(0, 0.02^2), norms 1, no fc bias, the
// target's embedding; capture layers `aux_layer_ids` (empty: the default, which needs a target of
// at least 7 layers; eagle3_capture_layers).
EagleWeights synthetic_eagle3_weights(const ModelConfig& target, std::uint64_t seed,
                                      std::int32_t draft_vocab = 0,
                                      std::vector<std::int32_t> aux_layer_ids = {});

namespace eagle3_detail {
// EagleConfig::validate's and check_eagle_fits's EAGLE-3 parts (engine/spec/eagle3_weights.cpp).
void validate(const EagleConfig& config);
void check_fits(const EagleConfig& head, const ModelConfig& target);
// draft_to_target has draft_vocab_size distinct ids in [0, vocab) (field "d2t[i]").
void check_draft_to_target(const EagleWeights& weights, std::int32_t vocab);
// The synthetic heads' tensors (engine/spec/eagle_weights.cpp): norms 1, the rest seeded
// N(0, 0.02^2) values named `prefix` + the tensor's name.
void fill_synthetic_tensors(EagleWeights& weights, const std::vector<TensorSpec>& specs,
                            const std::string& prefix, std::uint64_t seed);
}  // namespace eagle3_detail

}  // namespace graphdecode
