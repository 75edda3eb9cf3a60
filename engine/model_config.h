// The model configuration of a Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, and the text
// decoder of Llama-3.2-Vision, Mllama), parsed from a Hugging Face config.json.
//
// Parsing resolves every HF convention once, here, so the model never looks at JSON again:
//   - per-layer attention kind and window: `layer_types` wins when present; otherwise Qwen2/Qwen3
//     make layers >= max_window_layers sliding when use_sliding_window; Mistral makes every layer
//     sliding when sliding_window is non-null (absent = HF's default 4096); Llama is all full.
//     HF sliding_window = W becomes window_left = W - 1 (common/request_rules.h). As in HF, a
//     layer marked sliding while the window is null (Qwen: use_sliding_window false) is full.
//   - attention biases: Llama/Qwen3 `attention_bias` puts a bias on q, k, v AND o (as HF does);
//     Qwen2 always has q/k/v biases and no o bias; Mistral has none.
//   - Qwen3 has per-head RMSNorms on q and k (q_norm / k_norm, [head_dim]).
//   - Mllama (model_type "mllama_text_model": MllamaForCausalLM; or "mllama":
//     MllamaForConditionalGeneration, whose text_config is read and whose vision tower is not
//     the engine's business): the layers in cross_attention_layers are gated cross-attention
//     blocks (kind kCross); head_dim is hidden_size / num_attention_heads (HF ignores a head_dim
//     field); the embedding has vocab_size + 8 rows (the <|image|> token and 7 reserved ids are
//     valid inputs, never outputs: lm_head has vocab_size rows), so tied embeddings are refused.
// Anything the engine cannot run exactly (other activations, MLP bias, unknown rope scaling,
// quantized checkpoints, ...) is refused with a graphdecode::Error naming the field and value,
// instead of being silently approximated.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/attention_kind.h"
#include "engine/rope_scaling.h"

namespace graphdecode {

enum class ModelFamily : std::uint8_t { kLlama, kMistral, kQwen2, kQwen3, kMllama };
std::string_view model_family_name(ModelFamily f);  // the HF model_type: "llama", ...

// One decoder layer's attention. window_left < 0 for full and cross attention.
struct LayerAttention {
  AttentionKind kind = AttentionKind::kFull;
  std::int32_t window_left = -1;  // keys strictly left of the query it may see (HF W - 1)
};

// The element type the checkpoint stores (config `torch_dtype` / `dtype`). The engine always
// runs bf16: float16 and float32 checkpoints are converted on load (engine/weights.h).
enum class CheckpointDType : std::uint8_t { kBF16, kF16, kF32 };

struct ModelConfig {
  ModelFamily family = ModelFamily::kLlama;
  std::string architecture;  // architectures[0], e.g. "LlamaForCausalLM"; may be empty

  std::int32_t vocab_size = 0;          // lm_head rows: the tokens the model can emit
  std::int32_t extra_input_tokens = 0;  // embedding rows past vocab_size (Mllama: 8)
  std::int32_t hidden_size = 0;
  std::int32_t intermediate_size = 0;
  std::int32_t num_hidden_layers = 0;
  std::int32_t num_attention_heads = 0;
  std::int32_t num_key_value_heads = 0;  // GQA; defaults to num_attention_heads
  std::int32_t head_dim = 0;             // defaults to hidden_size / num_attention_heads

  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  std::int64_t max_position_embeddings = 2048;

  bool tie_word_embeddings = false;  // lm_head shares model.embed_tokens.weight
  bool qkv_bias = false;             // q/k/v_proj.bias present
  bool o_bias = false;               // o_proj.bias present (Llama/Qwen3 attention_bias)
  bool qk_norm = false;              // Qwen3 self_attn.{q,k}_norm.weight [head_dim]
  CheckpointDType checkpoint_dtype = CheckpointDType::kBF16;

  std::vector<LayerAttention> layers;  // [num_hidden_layers]

  // Parses a config.json text; `source` names it in errors (a path or "config.json").
  static ModelConfig from_json_text(std::string_view text, std::string_view source = "config.json");
  static ModelConfig from_file(const std::string& path);

  // Checks the invariants the engine relies on (from_json_text calls it; call it again after
  // editing a config by hand). Throws graphdecode::Error naming the field.
  void validate() const;

  std::int32_t q_size() const { return num_attention_heads * head_dim; }   // q_proj rows
  std::int32_t kv_size() const { return num_key_value_heads * head_dim; }  // k/v_proj rows
  std::int32_t gqa_group() const { return num_attention_heads / num_key_value_heads; }
  // Embedding rows: the token ids a prompt may hold (vocab_size + extra_input_tokens).
  std::int32_t input_vocab_size() const { return vocab_size + extra_input_tokens; }
  bool any_sliding() const;
  bool any_cross() const;
  std::int32_t num_cross_layers() const;
};

// A tiny valid config (Llama family, 4 layers mixing full and sliding attention, head_dim 64,
// GQA 2:1, untied) for tests and examples that need no checkpoint.
ModelConfig small_test_config();

// The shape of Llama-3.2-1B (hidden 2048, 16 layers, 32 q / 8 kv heads of 64, SwiGLU 8192, vocab
// 128256, tied, rope theta 500000 with llama3 scaling x32): the 1B-class config of the decode
// example and benchmark, run on synthetic weights.
ModelConfig llama_1b_config();

// The shape of Llama-3.1-8B (hidden 4096, 32 layers, 32 q / 8 kv heads of 128, SwiGLU 14336, vocab
// 128256, untied, rope theta 500000 with llama3 scaling x8): the 8B-class config of the decode and
// prefill benchmarks, run on synthetic weights (8.03 B parameters, 16.1 GB bf16).
ModelConfig llama_8b_config();

// A tiny valid Mllama text decoder for tests and examples: small_test_config's shape (no sliding
// window) with 6 layers, layers 1 and 4 gated cross-attention blocks, vocab 512 + 8 input ids.
ModelConfig small_cross_test_config();

// The Llama-3.2-1B shape with 4 gated cross-attention layers inserted (20 layers: cross at 3, 8,
// 13, 18, as Llama-3.2-11B-Vision puts one after every 4 self layers), untied (Mllama's embedding
// has 8 more rows than lm_head). The 1B-class cross model of the cross bench and example.
ModelConfig mllama_1b_class_config();

// The text decoder of Llama-3.2-11B-Vision (hidden 4096, 40 layers, cross at 3, 8, ..., 38,
// 32 q / 8 kv heads of 128, SwiGLU 14336, vocab 128256 + 8, llama3 rope x8): 9.8 B parameters.
ModelConfig mllama_11b_text_config();

}  // namespace graphdecode
