#include "engine/model_config.h"

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "common/error.h"
#include "common/request_rules.h"

namespace graphdecode {
namespace {

using nlohmann::json;

// Typed access to one JSON object with errors that name the config source and the field.
// A field that is absent or null takes its default, as in HF's config classes.
class Fields {
 public:
  Fields(const json& obj, std::string source, std::string prefix = {})
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& value,
                         const std::string& msg) const {
    throw Error(msg, source_, prefix_ + field, value);
  }
  const json* find(const std::string& field) const {
    auto it = obj_.find(field);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const std::string& field) const { return find(field) != nullptr; }

  std::int64_t integer(const std::string& field, std::optional<std::int64_t> def = {}) const {
    const json* v = find(field);
    if (!v) {
      if (!def) fail(field, "(missing)", "config field is required");
      return *def;
    }
    if (!v->is_number_integer()) fail(field, v->dump(), "config field must be an integer");
    return v->get<std::int64_t>();
  }
  std::int32_t int32(const std::string& field, std::optional<std::int64_t> def = {}) const {
    const std::int64_t x = integer(field, def);
    if (x < 0 || x > std::numeric_limits<std::int32_t>::max())
      fail(field, std::to_string(x), "config field out of range");
    return static_cast<std::int32_t>(x);
  }
  double number(const std::string& field, double def) const {
    const json* v = find(field);
    if (!v) return def;
    if (!v->is_number()) fail(field, v->dump(), "config field must be a number");
    return v->get<double>();
  }
  bool boolean(const std::string& field, bool def) const {
    const json* v = find(field);
    if (!v) return def;
    if (!v->is_boolean()) fail(field, v->dump(), "config field must be true or false");
    return v->get<bool>();
  }
  std::string string(const std::string& field, std::string def) const {
    const json* v = find(field);
    if (!v) return def;
    if (!v->is_string()) fail(field, v->dump(), "config field must be a string");
    return v->get<std::string>();
  }
  const std::string& source() const { return source_; }

 private:
  const json& obj_;
  std::string source_;
  std::string prefix_;
};

ModelFamily parse_family(const Fields& f) {
  const std::string t = f.string("model_type", "");
  if (t == "llama") return ModelFamily::kLlama;
  if (t == "mistral") return ModelFamily::kMistral;
  if (t == "qwen2") return ModelFamily::kQwen2;
  if (t == "qwen3") return ModelFamily::kQwen3;
  if (t == "mllama_text_model") return ModelFamily::kMllama;
  f.fail("model_type", t.empty() ? "(missing)" : t,
         "unsupported model_type (llama, mistral, qwen2, qwen3, mllama, mllama_text_model are "
         "supported)");
}

// architectures[0] must be the causal-LM head of the model family: another head (sequence
// classification, ...) has different weights and outputs.
std::string parse_architecture(const Fields& f, ModelFamily family) {
  const json* a = f.find("architectures");
  if (!a) return {};
  if (!a->is_array() || a->size() != 1 || !(*a)[0].is_string())
    f.fail("architectures", a->dump(), "architectures must list exactly one name");
  const std::string name = (*a)[0].get<std::string>();
  static constexpr const char* kExpected[] = {"LlamaForCausalLM", "MistralForCausalLM",
                                              "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                              "MllamaForCausalLM"};
  if (name != kExpected[static_cast<int>(family)])
    f.fail("architectures", name, "unsupported architecture for this model_type");
  return name;
}

CheckpointDType parse_dtype(const Fields& f) {
  // transformers >= 4.56 writes `dtype`; older versions `torch_dtype`.
  const std::string key = f.has("dtype") ? "dtype" : "torch_dtype";
  const std::string d = f.string(key, "bfloat16");
  if (d == "bfloat16") return CheckpointDType::kBF16;
  if (d == "float16") return CheckpointDType::kF16;
  if (d == "float32") return CheckpointDType::kF32;
  f.fail(key, d, "unsupported checkpoint dtype (bfloat16, float16, float32 are supported)");
}

// rope_scaling (or transformers 5's rope_parameters, which also carries rope_theta).
void parse_rope(const Fields& f, ModelConfig& c) {
  c.rope_theta = f.number("rope_theta", 10000.0);
  std::string key = "rope_scaling";
  const json* r = f.find(key);
  if (const json* p = f.find("rope_parameters")) {
    key = "rope_parameters";
    r = p;
  }
  if (!r) return;
  if (!r->is_object()) f.fail(key, r->dump(), "must be an object or null");
  const Fields rf(*r, f.source(), key + ".");
  if (key == "rope_parameters") c.rope_theta = rf.number("rope_theta", c.rope_theta);
  const std::string type_key = rf.has("rope_type") ? "rope_type" : "type";
  const std::string type = rf.string(type_key, "");
  if (type == "default") {
    c.rope_scaling.type = RopeScalingType::kDefault;
  } else if (type == "linear") {
    c.rope_scaling.type = RopeScalingType::kLinear;
    c.rope_scaling.factor = rf.number("factor", 1.0);
  } else if (type == "llama3") {
    c.rope_scaling.type = RopeScalingType::kLlama3;
    c.rope_scaling.factor = rf.number("factor", 0.0);
    c.rope_scaling.low_freq_factor = rf.number("low_freq_factor", 0.0);
    c.rope_scaling.high_freq_factor = rf.number("high_freq_factor", 0.0);
    c.rope_scaling.original_max_position_embeddings =
        rf.integer("original_max_position_embeddings");
  } else {
    // rope_type "type" alias still reports as rope_type: that is the field users look for.
    throw Error("unsupported rope scaling (default, linear, llama3 are supported)", f.source(),
                key + ".rope_type", type.empty() ? "(missing)" : type);
  }
}

// Fields that change the math in ways the engine does not implement.
void refuse_unsupported(const Fields& f, ModelFamily family) {
  const std::string act_key = f.has("hidden_act") ? "hidden_act" : "hidden_activation";
  const std::string act = f.string(act_key, "silu");
  if (act != "silu") f.fail(act_key, act, "unsupported activation (only silu)");
  if (f.boolean("mlp_bias", false)) f.fail("mlp_bias", "true", "MLP biases are not supported");
  if (f.has("quantization_config"))
    f.fail("quantization_config", "(present)", "quantized checkpoints are not supported");
  if (f.number("partial_rotary_factor", 1.0) != 1.0)
    f.fail("partial_rotary_factor", std::to_string(f.number("partial_rotary_factor", 1.0)),
           "partial rotary embeddings are not supported");
  if (family == ModelFamily::kMistral && f.boolean("attention_bias", false))
    f.fail("attention_bias", "true", "Mistral has no attention bias");
}

void parse_biases(const Fields& f, ModelConfig& c) {
  switch (c.family) {
    case ModelFamily::kQwen2:
      c.qkv_bias = true;  // Qwen2Attention hardcodes bias=True on q/k/v, False on o.
      c.o_bias = false;
      break;
    case ModelFamily::kLlama:
    case ModelFamily::kQwen3:
      c.qkv_bias = c.o_bias = f.boolean("attention_bias", false);
      break;
    case ModelFamily::kMistral:
    case ModelFamily::kMllama:  // MllamaTextSelfAttention / CrossAttention: bias=False
      c.qkv_bias = c.o_bias = false;
      break;
  }
  c.qk_norm = c.family == ModelFamily::kQwen3;
}

// Per-layer attention kind and window (see the header for the precedence). As in HF, a layer
// marked sliding while the effective sliding_window is null runs full attention.
void parse_layers(const Fields& f, ModelConfig& c) {
  const std::int32_t n = c.num_hidden_layers;
  const bool qwen = c.family == ModelFamily::kQwen2 || c.family == ModelFamily::kQwen3;
  // Qwen2/Qwen3 configs null the window unless use_sliding_window.
  const bool use_window = !qwen || f.boolean("use_sliding_window", false);
  std::int32_t window_left = -1;
  if (use_window && f.has("sliding_window")) {
    const std::int64_t w = f.integer("sliding_window");
    if (w <= 0 || w > std::numeric_limits<std::int32_t>::max())
      f.fail("sliding_window", std::to_string(w), "sliding_window must be > 0");
    window_left = window_left_from_hf_sliding_window(static_cast<std::int32_t>(w));
  }

  std::vector<bool> sliding(n, false);
  if (const json* lt = f.find("layer_types")) {
    if (!lt->is_array()) f.fail("layer_types", lt->dump(), "layer_types must be a list");
    if (static_cast<std::int64_t>(lt->size()) != n)
      f.fail("layer_types", std::to_string(lt->size()) + " entries",
             "layer_types must have num_hidden_layers entries");
    for (std::int32_t i = 0; i < n; ++i) {
      const json& t = (*lt)[i];
      if (t == "sliding_attention") {
        sliding[i] = true;
      } else if (t != "full_attention") {
        f.fail("layer_types[" + std::to_string(i) + "]", t.dump(),
               "unsupported layer type (full_attention, sliding_attention)");
      }
    }
  } else if (qwen) {
    const std::int32_t first = f.int32("max_window_layers", 28);
    for (std::int32_t i = first; i < n; ++i) sliding[i] = true;
  } else if (c.family == ModelFamily::kMistral) {
    sliding.assign(n, true);
  }

  c.layers.assign(n, LayerAttention{});
  for (std::int32_t i = 0; i < n; ++i)
    if (sliding[i] && window_left >= 0) c.layers[i] = {AttentionKind::kSliding, window_left};
}

// Mllama: the layers listed in cross_attention_layers are gated cross-attention blocks. Absent or
// null: HF's default list (MllamaTextConfig.__post_init__), which fits its 40-layer default.
void parse_cross_layers(const Fields& f, ModelConfig& c) {
  std::vector<std::int64_t> cross = {3, 8, 13, 18, 23, 28, 33, 38};
  if (const json* cl = f.find("cross_attention_layers")) {
    if (!cl->is_array()) f.fail("cross_attention_layers", cl->dump(), "must be a list of ints");
    cross.clear();
    for (const json& i : *cl) {
      if (!i.is_number_integer())
        f.fail("cross_attention_layers", i.dump(), "must be a list of layer indices");
      cross.push_back(i.get<std::int64_t>());
    }
  }
  for (const std::int64_t i : cross) {
    if (i < 0 || i >= c.num_hidden_layers)
      f.fail("cross_attention_layers", std::to_string(i),
             "layer index outside [0, num_hidden_layers = " + std::to_string(c.num_hidden_layers) +
                 ")");
    LayerAttention& l = c.layers[static_cast<std::size_t>(i)];
    if (l.kind == AttentionKind::kCross)
      f.fail("cross_attention_layers", std::to_string(i), "layer listed twice");
    l = {AttentionKind::kCross, -1};
  }
}

// Mllama's MllamaTextModel: embedding of vocab_size + 8 rows, head_dim from hidden / heads, no
// biases, no tying (lm_head has 8 rows fewer than the embedding it would share).
void parse_mllama(const Fields& f, ModelConfig& c) {
  c.extra_input_tokens = 8;
  if (c.num_attention_heads > 0) c.head_dim = c.hidden_size / c.num_attention_heads;
  if (c.tie_word_embeddings)
    f.fail("tie_word_embeddings", "true",
           "Mllama's embedding has vocab_size + 8 rows and lm_head vocab_size: they cannot be "
           "tied");
  parse_cross_layers(f, c);
}

// MllamaForConditionalGeneration's config.json: the text decoder is text_config (its
// model_type mllama_text_model); the vision tower's config is not read. Returns the text
// config object with the checkpoint dtype filled in from the top level when it has none.
json mllama_text_config(const json& root, const std::string& source) {
  const Fields top(root, source);
  const json* a = top.find("architectures");
  if (a && !(a->is_array() && a->size() == 1 && (*a)[0] == "MllamaForConditionalGeneration"))
    top.fail("architectures", a->dump(),
             "unsupported architecture for model_type mllama (MllamaForConditionalGeneration)");
  if (top.boolean("tie_word_embeddings", false))
    top.fail("tie_word_embeddings", "true",
             "Mllama's embedding has vocab_size + 8 rows and lm_head vocab_size: they cannot be "
             "tied");
  const json* tc = top.find("text_config");
  if (!tc || !tc->is_object())
    top.fail("text_config", tc ? tc->dump() : "(missing)",
             "model_type mllama needs the text decoder's config (an object)");
  json text = *tc;
  const json mt = text.value("model_type", json("mllama_text_model"));
  if (mt != "mllama_text_model")
    top.fail("text_config.model_type", mt.dump(), "must be mllama_text_model");
  text["model_type"] = "mllama_text_model";
  text.erase("architectures");  // MllamaForCausalLM or null; the top level named the model
  for (const char* key : {"dtype", "torch_dtype"}) {
    const bool has_dtype = (text.contains("dtype") && !text["dtype"].is_null()) ||
                           (text.contains("torch_dtype") && !text["torch_dtype"].is_null());
    if (!has_dtype && root.contains(key) && !root[key].is_null()) text[key] = root[key];
  }
  return text;
}

}  // namespace

std::string_view model_family_name(ModelFamily f) {
  switch (f) {
    case ModelFamily::kLlama:
      return "llama";
    case ModelFamily::kMistral:
      return "mistral";
    case ModelFamily::kQwen2:
      return "qwen2";
    case ModelFamily::kQwen3:
      return "qwen3";
    case ModelFamily::kMllama:
      return "mllama";
  }
  return "?";
}

bool ModelConfig::any_sliding() const {
  for (const LayerAttention& l : layers)
    if (l.kind == AttentionKind::kSliding) return true;
  return false;
}

bool ModelConfig::any_cross() const {
  return num_cross_layers() > 0;
}

std::int32_t ModelConfig::num_cross_layers() const {
  std::int32_t n = 0;
  for (const LayerAttention& l : layers) n += l.kind == AttentionKind::kCross;
  return n;
}

ModelConfig ModelConfig::from_json_text(std::string_view text, std::string_view source_view) {
  const std::string source(source_view);
  json root;
  try {
    root = json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    throw Error(std::string("config is not valid JSON: ") + e.what(), source, "json",
                "byte " + std::to_string(e.byte));
  }
  if (!root.is_object()) throw Error("config must be a JSON object", source, "json", "not object");
  // Mistral: an absent sliding_window means HF's class default 4096, a null means none.
  if (root.value("model_type", json()) == "mistral" && !root.contains("sliding_window"))
    root["sliding_window"] = 4096;
  // MllamaForConditionalGeneration: the text decoder's fields live in text_config.
  const bool conditional = root.value("model_type", json()) == "mllama";
  if (conditional) root = mllama_text_config(root, source);

  const Fields f(root, source, conditional ? "text_config." : "");
  ModelConfig c;
  c.family = parse_family(f);
  c.architecture =
      conditional ? std::string("MllamaForConditionalGeneration") : parse_architecture(f, c.family);
  refuse_unsupported(f, c.family);
  c.vocab_size = f.int32("vocab_size");
  c.hidden_size = f.int32("hidden_size");
  c.intermediate_size = f.int32("intermediate_size");
  c.num_hidden_layers = f.int32("num_hidden_layers");
  c.num_attention_heads = f.int32("num_attention_heads");
  c.num_key_value_heads = f.int32("num_key_value_heads", c.num_attention_heads);
  if (c.num_attention_heads <= 0)
    f.fail("num_attention_heads", std::to_string(c.num_attention_heads), "must be > 0");
  c.head_dim = f.int32("head_dim", c.hidden_size / c.num_attention_heads);
  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  c.max_position_embeddings = f.integer("max_position_embeddings", 2048);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.checkpoint_dtype = parse_dtype(f);
  parse_rope(f, c);
  parse_biases(f, c);
  parse_layers(f, c);
  if (c.family == ModelFamily::kMllama) parse_mllama(f, c);
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(e.message(), source, e.field(), e.value());  // name the config, not this file
  }
  return c;
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open model config", path, "path", path);
  std::ostringstream text;
  text << in.rdbuf();
  return from_json_text(text.str(), path);
}

void ModelConfig::validate() const {
  GD_REQUIRE(vocab_size > 0, "vocab_size", vocab_size, "must be > 0");
  GD_REQUIRE(extra_input_tokens >= 0 && extra_input_tokens <= 1024, "extra_input_tokens",
             extra_input_tokens, "in [0, 1024]");
  GD_REQUIRE(hidden_size > 0, "hidden_size", hidden_size, "must be > 0");
  GD_REQUIRE(intermediate_size > 0, "intermediate_size", intermediate_size, "must be > 0");
  GD_REQUIRE(num_hidden_layers > 0, "num_hidden_layers", num_hidden_layers, "must be > 0");
  GD_REQUIRE(num_attention_heads > 0, "num_attention_heads", num_attention_heads, "must be > 0");
  GD_REQUIRE(num_key_value_heads > 0, "num_key_value_heads", num_key_value_heads, "must be > 0");
  GD_REQUIRE(num_attention_heads % num_key_value_heads == 0, "num_key_value_heads",
             num_key_value_heads, "num_attention_heads must be a multiple of it");
  // The attention kernels are instantiated for these head dims only.
  GD_REQUIRE(head_dim == 64 || head_dim == 128 || head_dim == 256, "head_dim", head_dim,
             "unsupported head_dim (64, 128, 256 are supported)");
  GD_REQUIRE(rms_norm_eps > 0, "rms_norm_eps", rms_norm_eps, "must be > 0");
  GD_REQUIRE(rope_theta > 0, "rope_theta", rope_theta, "must be > 0");
  GD_REQUIRE(max_position_embeddings > 0, "max_position_embeddings", max_position_embeddings,
             "must be > 0");
  if (rope_scaling.type == RopeScalingType::kLinear ||
      rope_scaling.type == RopeScalingType::kLlama3)
    GD_REQUIRE(rope_scaling.factor > 0, "rope_scaling.factor", rope_scaling.factor, "must be > 0");
  if (rope_scaling.type == RopeScalingType::kLlama3) {
    // HF divides by (high - low) and by these factors.
    GD_REQUIRE(rope_scaling.low_freq_factor > 0, "rope_scaling.low_freq_factor",
               rope_scaling.low_freq_factor, "must be > 0");
    GD_REQUIRE(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor,
               "rope_scaling.high_freq_factor", rope_scaling.high_freq_factor,
               "must exceed low_freq_factor");
    GD_REQUIRE(rope_scaling.original_max_position_embeddings > 0,
               "rope_scaling.original_max_position_embeddings",
               rope_scaling.original_max_position_embeddings, "must be > 0");
  }
  GD_REQUIRE(static_cast<std::int64_t>(layers.size()) == num_hidden_layers, "layers", layers.size(),
             "must have num_hidden_layers entries");
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const LayerAttention& l = layers[i];
    const bool ok = l.kind == AttentionKind::kSliding ? l.window_left >= 0 : l.window_left < 0;
    GD_REQUIRE(ok, "layers[" + std::to_string(i) + "].window_left", l.window_left,
               "full and cross layers have window_left < 0, sliding layers >= 0");
    // A cross layer's weights are Mllama's (cross_attn.*, gates): no other family has them.
    GD_REQUIRE(l.kind != AttentionKind::kCross || family == ModelFamily::kMllama,
               "layers[" + std::to_string(i) + "].kind", "cross",
               "gated cross-attention layers belong to the mllama family");
  }
  GD_REQUIRE(!(family == ModelFamily::kMllama && tie_word_embeddings), "tie_word_embeddings",
             "true", "Mllama's embedding has vocab_size + extra_input_tokens rows: cannot tie");
  GD_REQUIRE(!tie_word_embeddings || extra_input_tokens == 0, "tie_word_embeddings", "true",
             "a tied lm_head has the embedding's rows: extra_input_tokens must be 0");
  GD_REQUIRE(!(o_bias && !qkv_bias), "o_bias", o_bias, "an o bias comes with q/k/v biases");
}

ModelConfig small_test_config() {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 1024;
  // Alternate full and sliding (window 32 keys) so tests exercise both kinds.
  c.layers.resize(c.num_hidden_layers);
  for (std::int32_t i = 1; i < c.num_hidden_layers; i += 2)
    c.layers[i] = {AttentionKind::kSliding, window_left_from_hf_sliding_window(32)};
  c.validate();
  return c;
}

ModelConfig small_cross_test_config() {
  ModelConfig c = small_test_config();
  c.family = ModelFamily::kMllama;
  c.architecture = "MllamaForCausalLM";
  c.extra_input_tokens = 8;
  c.num_hidden_layers = 6;
  c.layers.assign(static_cast<std::size_t>(c.num_hidden_layers), LayerAttention{});
  c.layers[1] = c.layers[4] = {AttentionKind::kCross, -1};
  c.validate();
  return c;
}

ModelConfig mllama_1b_class_config() {
  ModelConfig c = llama_1b_config();
  c.family = ModelFamily::kMllama;
  c.architecture = "MllamaForCausalLM";
  c.extra_input_tokens = 8;
  c.tie_word_embeddings = false;
  c.num_hidden_layers = 20;
  c.layers.assign(static_cast<std::size_t>(c.num_hidden_layers), LayerAttention{});
  for (std::size_t l = 3; l < c.layers.size(); l += 5) c.layers[l] = {AttentionKind::kCross, -1};
  c.validate();
  return c;
}

ModelConfig mllama_11b_text_config() {
  ModelConfig c;
  c.family = ModelFamily::kMllama;
  c.architecture = "MllamaForCausalLM";
  c.vocab_size = 128256;
  c.extra_input_tokens = 8;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_hidden_layers = 40;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.rope_scaling = {RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 8192};
  c.max_position_embeddings = 131072;
  c.layers.assign(static_cast<std::size_t>(c.num_hidden_layers), LayerAttention{});
  for (std::size_t l = 3; l < c.layers.size(); l += 5) c.layers[l] = {AttentionKind::kCross, -1};
  c.validate();
  return c;
}

ModelConfig llama_1b_config() {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 128256;
  c.hidden_size = 2048;
  c.intermediate_size = 8192;
  c.num_hidden_layers = 16;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 64;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.rope_scaling = {RopeScalingType::kLlama3, 32.0, 1.0, 4.0, 8192};
  c.max_position_embeddings = 131072;
  c.tie_word_embeddings = true;
  c.layers.assign(static_cast<std::size_t>(c.num_hidden_layers), LayerAttention{});
  c.validate();
  return c;
}

ModelConfig llama_8b_config() {
  ModelConfig c = llama_1b_config();
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_hidden_layers = 32;
  c.head_dim = 128;
  c.rope_scaling = {RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 8192};
  c.tie_word_embeddings = false;
  c.layers.assign(static_cast<std::size_t>(c.num_hidden_layers), LayerAttention{});
  c.validate();
  return c;
}

}  // namespace graphdecode
