#include "engine/spec/eagle_weights.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "attention/reference.h"  // host bf16 conversions
#include "common/error.h"

namespace graphdecode {
namespace {

constexpr std::string_view kLayerPrefix = "model.layers.0.";  // expected_tensors' naming
constexpr std::string_view kEagleLayerPrefix = "layers.0.";   // EAGLE's naming

// EAGLE-3 heads carry these; name them instead of calling them "unexpected".
bool is_eagle3_tensor(const std::string& name) {
  return name == "d2t" || name == "t2d" || name.starts_with("midlayer.") ||
         name.starts_with("model.midlayer.");
}

}  // namespace

void EagleConfig::validate() const {
  layer.validate();
  GD_REQUIRE(layer.num_hidden_layers == 1, "num_hidden_layers", layer.num_hidden_layers,
             "an EAGLE head has exactly one decoder layer");
  GD_REQUIRE(!layer.any_sliding() && !layer.any_cross(), "layers[0].kind", "sliding or cross",
             "an EAGLE head's layer attends over its whole cache");
  GD_REQUIRE(!layer.tie_word_embeddings, "tie_word_embeddings", "true",
             "an EAGLE head has no lm_head of the target's vocabulary to tie");
  if (eagle3()) eagle3_detail::validate(*this);
}

std::vector<TensorSpec> eagle_expected_tensors(const EagleConfig& c) {
  if (c.eagle3()) return eagle3_expected_tensors(c);
  const std::int64_t hidden = c.layer.hidden_size;
  std::vector<TensorSpec> out;
  if (c.own_embedding) out.push_back({"embed_tokens.weight", {c.layer.vocab_size, hidden}});
  out.push_back({"fc.weight", {hidden, 2 * hidden}});
  if (c.fc_bias) out.push_back({"fc.bias", {hidden}});
  for (const TensorSpec& s : expected_tensors(c.layer)) {
    if (!s.name.starts_with(kLayerPrefix)) continue;  // embedding, final norm, lm_head: none
    const std::string rest = s.name.substr(kLayerPrefix.size());
    if (rest == "input_layernorm.weight" && !c.input_norm) continue;
    out.push_back({std::string(kEagleLayerPrefix) + rest, s.shape});
  }
  return out;
}

const HostTensor* EagleWeights::find(const std::string& name) const {
  const auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

const HostTensor& EagleWeights::at(const std::string& name) const {
  const HostTensor* t = find(name);
  if (t == nullptr) throw Error("no such EAGLE head weight", "EagleWeights::at", "name", name);
  return *t;
}

EagleConfig eagle_config_from_json_text(std::string_view text, std::string_view source) {
  if (is_eagle3_config_text(text)) return eagle3_config_from_json_text(text, source);
  EagleConfig c;
  const std::string where(source);
  std::string body(text);
  try {
    // Converted heads may name the draft class (SGLang's "LlamaForCausalLMEagle"): the layer
    // is the base family's.
    nlohmann::json j = nlohmann::json::parse(body);
    if (j.is_object() && j.contains("architectures") && j["architectures"].is_array() &&
        j["architectures"].size() == 1 && j["architectures"][0].is_string()) {
      const std::string arch = j["architectures"][0].get<std::string>();
      if (arch.size() > 5 && arch.ends_with("Eagle")) {
        j["architectures"][0] = arch.substr(0, arch.size() - 5);
        body = j.dump();
      }
    }
  } catch (const nlohmann::json::exception&) {
    // ModelConfig::from_json_text names the JSON error below
  }
  c.layer = ModelConfig::from_json_text(body, source);  // JSON and field errors named there
  const nlohmann::json root = nlohmann::json::parse(body);
  if (const auto it = root.find("bias"); it != root.end() && !it->is_null()) {
    if (!it->is_boolean())
      throw Error("config field must be true or false", where, "bias", it->dump());
    c.fc_bias = it->get<bool>();
  }
  // EAGLE's cnets1 reads a non-HF "qkv_bias" key (its Qwen heads): biases on q/k/v, none on o.
  if (const auto it = root.find("qkv_bias"); it != root.end() && !it->is_null()) {
    if (!it->is_boolean())
      throw Error("config field must be true or false", where, "qkv_bias", it->dump());
    if (it->get<bool>()) c.layer.qkv_bias = true;
  }
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(e.message(), where, e.field(), e.value());
  }
  return c;
}

EagleWeights load_eagle_weights(EagleConfig config, const SafetensorsCheckpoint& ckpt) {
  if (config.eagle3()) return load_eagle3_weights(std::move(config), ckpt);
  config.input_norm = ckpt.find("layers.0.input_layernorm.weight") != nullptr;
  config.own_embedding = ckpt.find("embed_tokens.weight") != nullptr;
  config.validate();
  const std::vector<TensorSpec> specs = eagle_expected_tensors(config);
  std::map<std::string, const TensorSpec*> by_name;
  for (const TensorSpec& s : specs) by_name[s.name] = &s;
  // Names first: an EAGLE-3 head or a foreign checkpoint fails before any shape is compared.
  for (const std::string& name : ckpt.names()) {
    if (is_eagle3_tensor(name))
      throw Error(
          "EAGLE-3 tensor in an EAGLE-1/2 head (an EAGLE-3 config.json names "
          "LlamaForCausalLMEagle3 or draft_vocab_size)",
          ckpt.file_of(name), name, shape_to_string(ckpt.find(name)->shape));
    if (!by_name.count(name) && !name.ends_with("rotary_emb.inv_freq"))
      throw Error("unexpected tensor (not part of an EAGLE-1/2 head of this config)",
                  ckpt.file_of(name), name, shape_to_string(ckpt.find(name)->shape));
  }
  require_tensor_shapes(ckpt, specs);
  EagleWeights w;
  w.config = config;
  for (const TensorSpec& s : specs) {
    HostTensor& h = w.tensors[s.name];
    h.shape = s.shape;
    h.data = tensor_to_bf16(*ckpt.find(s.name), ckpt.file_of(s.name), s.name);
  }
  return w;
}

EagleWeights load_eagle_head(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) throw Error("EAGLE head is not a directory", dir, "path", dir);
  const std::string path = (fs::path(dir) / "config.json").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open the EAGLE head's config", path, "path", path);
  std::ostringstream text;
  text << in.rdbuf();
  const EagleConfig config = eagle_config_from_json_text(text.str(), path);
  return load_eagle_weights(config, SafetensorsCheckpoint::open_dir(dir));
}

void check_eagle_fits(const EagleConfig& head, const ModelConfig& target) {
  if (head.eagle3()) {
    eagle3_detail::check_fits(head, target);
    return;
  }
  GD_REQUIRE(head.layer.hidden_size == target.hidden_size, "eagle.hidden_size",
             head.layer.hidden_size,
             "the head reads the target's hidden states: its hidden size must be the target's (" +
                 std::to_string(target.hidden_size) + ")");
  GD_REQUIRE(head.layer.vocab_size == target.vocab_size, "eagle.vocab_size", head.layer.vocab_size,
             "the head drafts through the target's lm_head: its vocabulary must be the target's (" +
                 std::to_string(target.vocab_size) + ")");
}

EagleWeights synthetic_eagle_weights(const ModelConfig& target, std::uint64_t seed) {
  EagleWeights w;
  EagleConfig& c = w.config;
  c.layer = target;
  c.layer.num_hidden_layers = 1;
  c.layer.layers = {LayerAttention{}};
  c.layer.tie_word_embeddings = false;
  c.fc_bias = true;
  c.validate();
  eagle3_detail::fill_synthetic_tensors(w, eagle_expected_tensors(c), "eagle.", seed);
  return w;
}

namespace eagle3_detail {

void fill_synthetic_tensors(EagleWeights& w, const std::vector<TensorSpec>& specs,
                            const std::string& prefix, std::uint64_t seed) {
  const std::uint16_t one = reference::float_to_bf16(1.0f);
  for (const TensorSpec& s : specs) {
    HostTensor& t = w.tensors[s.name];
    t.shape = s.shape;
    const auto n = static_cast<std::size_t>(t.numel());
    if (s.name.ends_with("norm.weight")) {
      t.data.assign(n, one);
    } else {
      t.data = synthetic::normal_values(prefix + s.name, n, seed);
    }
  }
}

}  // namespace eagle3_detail

}  // namespace graphdecode
