#include "engine/weights.h"

#include <cstring>
#include <filesystem>

#include "attention/reference.h"  // host bf16/fp16 conversions (round to nearest even)
#include "common/error.h"

namespace graphdecode {
namespace {

void add(std::vector<TensorSpec>& out, std::string name, std::vector<std::int64_t> shape) {
  out.push_back({std::move(name), std::move(shape)});
}

}  // namespace

std::vector<TensorSpec> expected_tensors(const ModelConfig& c) {
  const std::int64_t hidden = c.hidden_size, inter = c.intermediate_size, vocab = c.vocab_size;
  const std::int64_t q = c.q_size(), kv = c.kv_size(), hd = c.head_dim;
  std::vector<TensorSpec> out;
  add(out, "model.embed_tokens.weight", {c.input_vocab_size(), hidden});
  for (std::int32_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(out, p + "input_layernorm.weight", {hidden});
    if (c.layers[static_cast<std::size_t>(i)].kind == AttentionKind::kCross) {
      // MllamaCrossAttentionDecoderLayer: k/v project the encoder states, q/k per-head norms,
      // tanh gates on the attention and MLP outputs.
      add(out, p + "cross_attn.q_proj.weight", {q, hidden});
      add(out, p + "cross_attn.k_proj.weight", {kv, hidden});
      add(out, p + "cross_attn.v_proj.weight", {kv, hidden});
      add(out, p + "cross_attn.o_proj.weight", {hidden, q});
      add(out, p + "cross_attn.q_norm.weight", {hd});
      add(out, p + "cross_attn.k_norm.weight", {hd});
      add(out, p + "cross_attn_attn_gate", {1});
      add(out, p + "cross_attn_mlp_gate", {1});
      add(out, p + "post_attention_layernorm.weight", {hidden});
      add(out, p + "mlp.gate_proj.weight", {inter, hidden});
      add(out, p + "mlp.up_proj.weight", {inter, hidden});
      add(out, p + "mlp.down_proj.weight", {hidden, inter});
      continue;
    }
    add(out, p + "self_attn.q_proj.weight", {q, hidden});
    add(out, p + "self_attn.k_proj.weight", {kv, hidden});
    add(out, p + "self_attn.v_proj.weight", {kv, hidden});
    add(out, p + "self_attn.o_proj.weight", {hidden, q});
    if (c.qkv_bias) {
      add(out, p + "self_attn.q_proj.bias", {q});
      add(out, p + "self_attn.k_proj.bias", {kv});
      add(out, p + "self_attn.v_proj.bias", {kv});
    }
    if (c.o_bias) add(out, p + "self_attn.o_proj.bias", {hidden});
    if (c.qk_norm) {
      add(out, p + "self_attn.q_norm.weight", {hd});
      add(out, p + "self_attn.k_norm.weight", {hd});
    }
    add(out, p + "post_attention_layernorm.weight", {hidden});
    add(out, p + "mlp.gate_proj.weight", {inter, hidden});
    add(out, p + "mlp.up_proj.weight", {inter, hidden});
    add(out, p + "mlp.down_proj.weight", {hidden, inter});
  }
  add(out, "model.norm.weight", {hidden});
  if (!c.tie_word_embeddings) add(out, "lm_head.weight", {vocab, hidden});
  return out;
}

bool is_ignorable_tensor(const std::string& name, const ModelConfig& c) {
  static constexpr std::string_view kInvFreq = "rotary_emb.inv_freq";
  if (name.size() >= kInvFreq.size() && name.ends_with(kInvFreq)) return true;
  // The vision tower and projector of a vision-language checkpoint: the caller runs the encoder.
  if (c.architecture == kMllamaConditional) {
    for (std::string_view prefix : {"vision_model.", "multi_modal_projector.",
                                    "model.vision_model.", "model.multi_modal_projector."})
      if (name.starts_with(prefix)) return true;
  }
  // Tied: HF uses the embedding and ignores a saved lm_head copy.
  return c.tie_word_embeddings && name == "lm_head.weight";
}

std::int64_t HostTensor::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

const HostTensor& HostWeights::at(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) throw Error("no such weight", "HostWeights::at", "name", name);
  return it->second;
}

std::size_t HostWeights::total_bytes() const {
  std::size_t b = 0;
  for (const auto& [name, t] : tensors) b += t.data.size() * sizeof(std::uint16_t);
  return b;
}

CheckpointNaming checkpoint_naming(const ModelConfig& config,
                                   const SafetensorsCheckpoint& checkpoint) {
  if (config.architecture != kMllamaConditional) return CheckpointNaming::kPlain;
  if (checkpoint.find("model.language_model.embed_tokens.weight") != nullptr &&
      checkpoint.find("language_model.model.embed_tokens.weight") == nullptr)
    return CheckpointNaming::kModelLanguageModel;
  return CheckpointNaming::kLanguageModel;  // missing tensors are then named in this layout
}

std::string checkpoint_name(const std::string& name, CheckpointNaming naming) {
  switch (naming) {
    case CheckpointNaming::kPlain:
      break;
    case CheckpointNaming::kLanguageModel:
      return "language_model." + name;
    case CheckpointNaming::kModelLanguageModel:
      if (name.starts_with("model.")) return "model.language_model." + name.substr(6);
      break;
  }
  return name;
}

void require_tensor_shapes(const SafetensorsCheckpoint& ckpt, std::span<const TensorSpec> specs,
                           const std::function<std::string(const TensorSpec&)>& stored) {
  const auto name_of = [&](const TensorSpec& s) { return stored ? stored(s) : s.name; };
  std::size_t missing = 0;
  const TensorSpec* first_missing = nullptr;
  for (const TensorSpec& s : specs) {
    const TensorInfo* t = ckpt.find(name_of(s));
    if (!t) {
      if (!first_missing) first_missing = &s;
      ++missing;
      continue;
    }
    if (t->shape != s.shape)
      throw Error("shape mismatch", ckpt.file_of(name_of(s)), name_of(s),
                  "checkpoint " + shape_to_string(t->shape) + ", config expects " +
                      shape_to_string(s.shape));
  }
  if (first_missing)
    throw Error("missing tensor (" + std::to_string(missing) + " missing in all)", ckpt.source(),
                name_of(*first_missing), "expected " + shape_to_string(first_missing->shape));
}

HostWeights load_weights(const ModelConfig& config, const SafetensorsCheckpoint& ckpt) {
  config.validate();
  const std::vector<TensorSpec> specs = expected_tensors(config);
  const CheckpointNaming naming = checkpoint_naming(config, ckpt);
  const auto stored = [naming](const TensorSpec& s) { return checkpoint_name(s.name, naming); };

  // Check everything before converting anything: a mismatch should fail fast, not after
  // minutes of conversion.
  require_tensor_shapes(ckpt, specs, stored);
  std::map<std::string, const TensorSpec*> by_name;
  for (const TensorSpec& s : specs) by_name[stored(s)] = &s;
  for (const std::string& name : ckpt.names())
    if (!by_name.count(name) && !is_ignorable_tensor(name, config))
      throw Error("unexpected tensor (not used by this config)", ckpt.file_of(name), name,
                  shape_to_string(ckpt.find(name)->shape));

  HostWeights w;
  w.config = config;
  for (const TensorSpec& s : specs) {
    HostTensor& h = w.tensors[s.name];
    h.shape = s.shape;
    h.data = tensor_to_bf16(*ckpt.find(stored(s)), ckpt.file_of(stored(s)), stored(s));
  }
  return w;
}

std::vector<std::uint16_t> tensor_to_bf16(const TensorInfo& t, const std::string& file,
                                          const std::string& name) {
  const auto n = static_cast<std::size_t>(t.numel());
  std::vector<std::uint16_t> out(n);
  // Reads through memcpy: safetensors data need not be aligned for its element type.
  const std::byte* src = t.data.data();
  switch (t.dtype) {
    case TensorDType::kBF16:
      if (n) std::memcpy(out.data(), src, n * 2);
      break;
    case TensorDType::kF16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = reference::float_to_bf16(reference::fp16_to_float(h));
      }
      break;
    case TensorDType::kF32:
      for (std::size_t i = 0; i < n; ++i) {
        float f;
        std::memcpy(&f, src + 4 * i, 4);
        out[i] = reference::float_to_bf16(f);
      }
      break;
    case TensorDType::kI64:
    case TensorDType::kBool:
      throw Error("a weight must be a float tensor (BF16, F16 or F32)", file, name,
                  std::string(tensor_dtype_name(t.dtype)));
  }
  return out;
}

HostWeights load_checkpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) throw Error("checkpoint is not a directory", dir, "path", dir);
  const ModelConfig config = ModelConfig::from_file((fs::path(dir) / "config.json").string());
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open_dir(dir);
  return load_weights(config, ckpt);
}

}  // namespace graphdecode
