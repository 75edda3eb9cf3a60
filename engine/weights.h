// The weights of a Llama-family model on the host, in bf16, keyed by their Hugging Face names.
//
// expected_tensors() is the one list of what a config needs (names and shapes); both the
// checkpoint loader and the synthetic generator follow it, so a model built from either sees the
// same set. Uploading to the device is the model's job.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model_config.h"
#include "engine/safetensors.h"

namespace graphdecode {

struct TensorSpec {
  std::string name;                 // HF name, e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<std::int64_t> shape;  // HF layout: linear weights are [out_features, in_features]
};

// Every tensor `config` needs, in model order: embed_tokens [input_vocab_size, hidden]; per
// self-attention layer: input_layernorm [hidden], self_attn.q/k/v/o_proj weights ([q_size,
// hidden], [kv_size, hidden] x2, [hidden, q_size]) and biases when configured, Qwen3
// q_norm/k_norm [head_dim], post_attention_layernorm [hidden], gate/up_proj [inter, hidden],
// down_proj [hidden, inter]; per cross-attention layer (Mllama): input_layernorm,
// cross_attn.q/k/v/o_proj (k/v project the encoder states), cross_attn.q_norm/k_norm [head_dim],
// cross_attn_attn_gate [1], post_attention_layernorm, the MLP, cross_attn_mlp_gate [1];
// model.norm [hidden]; lm_head [vocab, hidden] unless tie_word_embeddings.
std::vector<TensorSpec> expected_tensors(const ModelConfig& config);

// ModelConfig::architecture of a vision-language Mllama checkpoint (its text decoder is loaded).
inline constexpr std::string_view kMllamaConditional = "MllamaForConditionalGeneration";

// Where a checkpoint stores the tensors expected_tensors() names. MllamaForConditionalGeneration
// checkpoints keep the text decoder under a prefix: "language_model." (the Hub's files and
// transformers' save_pretrained: language_model.model.layers.0..., language_model.lm_head.weight)
// or transformers 5's in-memory layout (model.language_model.layers.0..., lm_head.weight).
enum class CheckpointNaming : std::uint8_t { kPlain, kLanguageModel, kModelLanguageModel };
CheckpointNaming checkpoint_naming(const ModelConfig& config,
                                   const SafetensorsCheckpoint& checkpoint);
std::string checkpoint_name(const std::string& name, CheckpointNaming naming);

// Checkpoint tensors that carry no weights the engine needs and are skipped without complaint:
// RoPE inverse-frequency buffers, lm_head.weight when it is tied to the embedding, and a
// vision-language checkpoint's vision tower and projector (vision_model.*,
// multi_modal_projector.*, also under model.).
bool is_ignorable_tensor(const std::string& name, const ModelConfig& config);

struct HostTensor {
  std::vector<std::int64_t> shape;
  std::vector<std::uint16_t> data;  // bf16 bit patterns, row-major [numel]
  std::int64_t numel() const;
};

struct HostWeights {
  ModelConfig config;
  std::map<std::string, HostTensor> tensors;  // exactly expected_tensors(config)

  const HostTensor& at(const std::string& name) const;  // Error naming `name` when absent
  std::size_t total_bytes() const;
};

// A checkpoint tensor rounded to bf16 bit patterns (F32/F16 round to nearest even; BF16 is
// copied). Error naming `name` in `file` for an integer or boolean tensor (not a weight).
std::vector<std::uint16_t> tensor_to_bf16(const TensorInfo& t, const std::string& file,
                                          const std::string& name);

// Every spec's tensor present in `checkpoint` with its shape, all checked before any is converted:
// Error "shape mismatch" naming the first wrong one, or "missing tensor (N missing in all)" naming
// the first absent one. `stored` maps a spec to its name in the checkpoint (default: the name).
void require_tensor_shapes(const SafetensorsCheckpoint& checkpoint,
                           std::span<const TensorSpec> specs,
                           const std::function<std::string(const TensorSpec&)>& stored = {});

// Reads `dir`/config.json and the checkpoint (model.safetensors or the sharded index). Every
// expected tensor must be present with its shape ("missing tensor" / "shape mismatch" errors
// name it), and a tensor the model does not use is an error too ("unexpected tensor"), so a
// config/checkpoint mismatch never loads half a model. F32/F16 are rounded to bf16 (nearest even).
HostWeights load_checkpoint(const std::string& dir);

// The same checks and conversion for a config and an already opened checkpoint.
HostWeights load_weights(const ModelConfig& config, const SafetensorsCheckpoint& checkpoint);

// Seeded random weights: linear weights, embeddings and biases ~ N(0, 0.02^2), norm weights 1,
// cross-attention gates +-[0.5, 1) (tanh 0.46..0.76; HF starts them at 0, which would switch the
// cross layers off and leave nothing to test).
// Deterministic for (config, seed), independent of thread count; different seeds differ.
HostWeights synthetic_weights(const ModelConfig& config, std::uint64_t seed);

namespace synthetic {
// `numel` values ~ N(0, 0.02^2) in bf16, seeded from (seed, name) as synthetic_weights seeds a
// tensor (the same values for the same name), on the calling thread: for other seeded weights
// (draft heads).
std::vector<std::uint16_t> normal_values(const std::string& name, std::size_t numel,
                                         std::uint64_t seed);
}  // namespace synthetic

}  // namespace graphdecode
