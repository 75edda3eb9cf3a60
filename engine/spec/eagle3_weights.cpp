// EAGLE-3 heads on the host: config, tensors, the d2t map, the fit against a target and the
// capture layers (engine/spec/eagle_weights.h has the head's definition and the sources).
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "common/error.h"
#include "engine/spec/eagle_weights.h"

namespace graphdecode {
namespace {

constexpr std::string_view kArchSuffix = "Eagle3";

std::string ids_text(const std::vector<std::int32_t>& ids) {
  std::string s = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

// A JSON integer that fits int32, or an Error naming `field`.
std::int32_t int_field(const nlohmann::json& v, const std::string& where,
                       const std::string& field) {
  if (!v.is_number_integer() || v.get<std::int64_t>() < INT32_MIN ||
      v.get<std::int64_t>() > INT32_MAX)
    throw Error("config field must be an integer", where, field, v.dump());
  return static_cast<std::int32_t>(v.get<std::int64_t>());
}

std::vector<std::int32_t> layer_ids(const nlohmann::json& v, const std::string& where,
                                    const std::string& field) {
  if (!v.is_array())
    throw Error("config field must be a list of layer ids", where, field, v.dump());
  std::vector<std::int32_t> ids;
  for (std::size_t i = 0; i < v.size(); ++i)
    ids.push_back(int_field(v[i], where, field + "[" + std::to_string(i) + "]"));
  return ids;
}

}  // namespace

bool is_eagle3_config_text(std::string_view text) {
  const nlohmann::json root = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!root.is_object()) return false;
  if (root.contains("draft_vocab_size") || root.contains("eagle_config")) return true;
  const auto a = root.find("architectures");
  return a != root.end() && a->is_array() && !a->empty() && (*a)[0].is_string() &&
         (*a)[0].get<std::string>().ends_with(kArchSuffix);
}

EagleConfig eagle3_config_from_json_text(std::string_view text, std::string_view source) {
  const std::string where(source);
  nlohmann::json root = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {  // ModelConfig names the JSON error
    static_cast<void>(ModelConfig::from_json_text(text, source));
    throw Error("config.json is not an object", where, "json", std::string(text.substr(0, 40)));
  }
  // The head's layer is its base family's: "LlamaForCausalLMEagle3" reads as LlamaForCausalLM.
  if (const auto a = root.find("architectures");
      a != root.end() && a->is_array() && a->size() == 1 && (*a)[0].is_string()) {
    const std::string arch = (*a)[0].get<std::string>();
    if (arch.ends_with(kArchSuffix)) (*a)[0] = arch.substr(0, arch.size() - kArchSuffix.size());
  }
  EagleConfig c;
  c.version = EagleVersion::kEagle3;
  c.fc_bias = false;  // SGLang / vLLM: Linear(3 target_hidden, hidden, bias=config.bias or False)
  c.input_norm = true;
  c.layer = ModelConfig::from_json_text(root.dump(), source);  // field errors named there
  c.draft_vocab_size = c.layer.vocab_size;
  c.target_hidden_size = c.layer.hidden_size;
  if (const auto it = root.find("draft_vocab_size"); it != root.end() && !it->is_null())
    c.draft_vocab_size = int_field(*it, where, "draft_vocab_size");
  if (const auto it = root.find("target_hidden_size"); it != root.end() && !it->is_null())
    c.target_hidden_size = int_field(*it, where, "target_hidden_size");
  if (const auto it = root.find("bias"); it != root.end() && !it->is_null()) {
    if (!it->is_boolean())
      throw Error("config field must be true or false", where, "bias", it->dump());
    c.fc_bias = it->get<bool>();
  }
  // SGLang reads eagle_config.eagle_aux_hidden_state_layer_ids, vLLM (speculators configs) the
  // top-level key: either, and they must agree when both are given.
  if (const auto ec = root.find("eagle_config"); ec != root.end() && !ec->is_null()) {
    if (!ec->is_object())
      throw Error("config field must be an object", where, "eagle_config", ec->dump());
    if (const auto u = ec->find("use_aux_hidden_state"); u != ec->end() && !u->is_null()) {
      if (!u->is_boolean() || !u->get<bool>())
        throw Error("unsupported EAGLE-3 config: the head must read the target's aux hidden states",
                    where, "eagle_config.use_aux_hidden_state", u->dump());
    }
    if (const auto ids = ec->find("eagle_aux_hidden_state_layer_ids");
        ids != ec->end() && !ids->is_null())
      c.aux_layer_ids = layer_ids(*ids, where, "eagle_config.eagle_aux_hidden_state_layer_ids");
  }
  if (const auto ids = root.find("eagle_aux_hidden_state_layer_ids");
      ids != root.end() && !ids->is_null()) {
    const auto top = layer_ids(*ids, where, "eagle_aux_hidden_state_layer_ids");
    if (!c.aux_layer_ids.empty() && top != c.aux_layer_ids)
      throw Error("eagle_aux_hidden_state_layer_ids differs from eagle_config's", where,
                  "eagle_aux_hidden_state_layer_ids", ids_text(top));
    c.aux_layer_ids = top;
  }
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(e.message(), where, e.field(), e.value());
  }
  return c;
}

std::vector<TensorSpec> eagle3_expected_tensors(const EagleConfig& c) {
  const std::int64_t h = c.layer.hidden_size, q = c.layer.q_size(), kv = c.layer.kv_size();
  const std::int64_t inter = c.layer.intermediate_size;
  std::vector<TensorSpec> out;
  if (c.own_embedding) out.push_back({"embed_tokens.weight", {c.layer.vocab_size, h}});
  out.push_back({"fc.weight", {h, 3 * static_cast<std::int64_t>(c.target_hidden_size)}});
  if (c.fc_bias) out.push_back({"fc.bias", {h}});
  out.push_back({"midlayer.input_layernorm.weight", {h}});
  out.push_back({"midlayer.hidden_norm.weight", {h}});
  out.push_back({"midlayer.self_attn.q_proj.weight", {q, 2 * h}});
  out.push_back({"midlayer.self_attn.k_proj.weight", {kv, 2 * h}});
  out.push_back({"midlayer.self_attn.v_proj.weight", {kv, 2 * h}});
  out.push_back({"midlayer.self_attn.o_proj.weight", {h, q}});
  out.push_back({"midlayer.post_attention_layernorm.weight", {h}});
  out.push_back({"midlayer.mlp.gate_proj.weight", {inter, h}});
  out.push_back({"midlayer.mlp.up_proj.weight", {inter, h}});
  out.push_back({"midlayer.mlp.down_proj.weight", {h, inter}});
  out.push_back({"norm.weight", {h}});
  out.push_back({"lm_head.weight", {c.draft_vocab_size, h}});
  return out;
}

namespace eagle3_detail {

void validate(const EagleConfig& c) {
  const ModelConfig& l = c.layer;
  GD_REQUIRE(l.family == ModelFamily::kLlama, "model_type", model_family_name(l.family),
             "EAGLE-3 heads are Llama decoder layers");
  GD_REQUIRE(!l.qkv_bias && !l.o_bias && !l.qk_norm, "attention_bias", "true",
             "EAGLE-3 heads have no attention biases or q/k norms");
  GD_REQUIRE(c.input_norm, "midlayer.input_layernorm", "absent",
             "an EAGLE-3 layer norms its embedding input");
  GD_REQUIRE(c.draft_vocab_size >= 1 && c.draft_vocab_size <= l.vocab_size, "draft_vocab_size",
             c.draft_vocab_size,
             "the draft vocabulary is a subset of the vocabulary (1 .. vocab_size = " +
                 std::to_string(l.vocab_size) + ")");
  GD_REQUIRE(c.target_hidden_size >= 8 && c.target_hidden_size % 8 == 0, "target_hidden_size",
             c.target_hidden_size, "must be a positive multiple of 8");
  GD_REQUIRE(c.aux_layer_ids.empty() || c.aux_layer_ids.size() == 3,
             "eagle_aux_hidden_state_layer_ids", ids_text(c.aux_layer_ids),
             "an EAGLE-3 head reads exactly three target layers");
  for (std::int32_t id : c.aux_layer_ids)
    GD_REQUIRE(id >= 0, "eagle_aux_hidden_state_layer_ids", ids_text(c.aux_layer_ids),
               "layer ids are >= 0");
}

void check_fits(const EagleConfig& head, const ModelConfig& target) {
  GD_REQUIRE(head.target_hidden_size == target.hidden_size, "eagle.target_hidden_size",
             head.target_hidden_size,
             "fc reads the target's states: target_hidden_size must be the target's hidden size (" +
                 std::to_string(target.hidden_size) + ")");
  GD_REQUIRE(head.layer.vocab_size == target.vocab_size, "eagle.vocab_size", head.layer.vocab_size,
             "the head's draft ids map into the target's vocabulary: its vocab_size must be the "
             "target's (" +
                 std::to_string(target.vocab_size) + ")");
  GD_REQUIRE(head.draft_vocab_size <= target.vocab_size, "eagle.draft_vocab_size",
             head.draft_vocab_size, "larger than the target's vocabulary");
  GD_REQUIRE(head.own_embedding || head.layer.hidden_size == target.hidden_size,
             "eagle.hidden_size", head.layer.hidden_size,
             "a head without embed_tokens reads the target's embedding: its hidden size must be "
             "the target's (" +
                 std::to_string(target.hidden_size) + ")");
  static_cast<void>(eagle3_capture_layers(head, target));
}

void check_draft_to_target(const EagleWeights& w, std::int32_t vocab) {
  const EagleConfig& c = w.config;
  GD_REQUIRE(static_cast<std::int64_t>(w.draft_to_target.size()) == c.draft_vocab_size,
             "eagle.draft_to_target", w.draft_to_target.size(),
             "needs one target id per draft id (" + std::to_string(c.draft_vocab_size) + ")");
  std::vector<bool> seen(static_cast<std::size_t>(vocab), false);
  for (std::size_t i = 0; i < w.draft_to_target.size(); ++i) {
    const std::int32_t t = w.draft_to_target[i];
    const std::string field = "d2t[" + std::to_string(i) + "]";
    GD_REQUIRE(t >= 0 && t < vocab, field, t,
               "maps a draft id outside the target vocabulary (" + std::to_string(vocab) + ")");
    GD_REQUIRE(!seen[static_cast<std::size_t>(t)], field, t, "maps two draft ids to one target id");
    seen[static_cast<std::size_t>(t)] = true;
  }
}

}  // namespace eagle3_detail

std::array<std::int32_t, 3> eagle3_capture_layers(const EagleConfig& head,
                                                  const ModelConfig& target) {
  const std::int32_t L = target.num_hidden_layers;
  const std::vector<std::int32_t>& ids = head.aux_layer_ids;
  std::array<std::int32_t, 3> p{2, L / 2, L - 3};
  if (ids.size() == 3) p = {ids[0] + 1, ids[1] + 1, ids[2] + 1};
  // Both engines append in the order of the layer loop, whatever the list's order.
  std::sort(p.begin(), p.end());
  const bool ok = p[0] >= 0 && p[0] < p[1] && p[1] < p[2] && p[2] <= L - 1;
  GD_REQUIRE(
      ok, "eagle.aux_layer_ids",
      ids.empty() ? "default [2, L/2, L-3] of " + std::to_string(L) + " layers" : ids_text(ids),
      "the three capture points (the stream entering layers " + std::to_string(p[0]) + ", " +
          std::to_string(p[1]) + ", " + std::to_string(p[2]) +
          ") must be distinct target layers 0 .. " + std::to_string(L - 1));
  return p;
}

EagleWeights load_eagle3_weights(EagleConfig config, const SafetensorsCheckpoint& ckpt) {
  config.own_embedding = ckpt.find("embed_tokens.weight") != nullptr;
  config.input_norm = true;
  config.validate();
  const std::vector<TensorSpec> specs = eagle3_expected_tensors(config);
  std::map<std::string, const TensorSpec*> by_name;
  for (const TensorSpec& s : specs) by_name[s.name] = &s;
  for (const std::string& name : ckpt.names()) {
    if (by_name.count(name) || name == "d2t" || name == "t2d" ||
        name.ends_with("rotary_emb.inv_freq"))
      continue;
    throw Error(name.starts_with("layers.")
                    ? "unexpected tensor (an EAGLE-1/2 layer in an EAGLE-3 head)"
                    : "unexpected tensor (not part of an EAGLE-3 head of this config)",
                ckpt.file_of(name), name, shape_to_string(ckpt.find(name)->shape));
  }
  require_tensor_shapes(ckpt, specs);
  const std::int32_t vocab = config.layer.vocab_size, draft = config.draft_vocab_size;
  if (const TensorInfo* t2d = ckpt.find("t2d");
      t2d != nullptr && t2d->shape != std::vector<std::int64_t>{vocab})
    throw Error("shape mismatch", ckpt.file_of("t2d"), "t2d",
                "checkpoint " + shape_to_string(t2d->shape) + ", config expects [" +
                    std::to_string(vocab) + "]");
  EagleWeights w;
  w.config = config;
  w.draft_to_target.resize(static_cast<std::size_t>(draft));
  const TensorInfo* d2t = ckpt.find("d2t");
  if (d2t == nullptr) {
    if (draft != vocab)
      throw Error("missing tensor (d2t maps the draft vocabulary into the target's)", ckpt.source(),
                  "d2t", "expected [" + std::to_string(draft) + "] I64");
    for (std::int32_t i = 0; i < draft; ++i) w.draft_to_target[static_cast<std::size_t>(i)] = i;
  } else {
    if (d2t->dtype != TensorDType::kI64)
      throw Error("d2t must be I64 (target id = draft id + d2t[draft id])", ckpt.file_of("d2t"),
                  "d2t", std::string(tensor_dtype_name(d2t->dtype)));
    if (d2t->shape != std::vector<std::int64_t>{draft})
      throw Error("shape mismatch", ckpt.file_of("d2t"), "d2t",
                  "checkpoint " + shape_to_string(d2t->shape) + ", config expects [" +
                      std::to_string(draft) + "]");
    for (std::int32_t i = 0; i < draft; ++i) {
      std::int64_t off;
      std::memcpy(&off, d2t->data.data() + 8 * static_cast<std::size_t>(i), 8);
      const std::int64_t t = i + off;
      if (t < 0 || t >= vocab)
        throw Error("d2t maps a draft id outside the target vocabulary", ckpt.file_of("d2t"),
                    "d2t[" + std::to_string(i) + "]",
                    std::to_string(off) + " (target id " + std::to_string(t) + ", vocab " +
                        std::to_string(vocab) + ")");
      w.draft_to_target[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(t);
    }
  }
  eagle3_detail::check_draft_to_target(w, vocab);
  for (const TensorSpec& s : specs) {
    HostTensor& h = w.tensors[s.name];
    h.shape = s.shape;
    h.data = tensor_to_bf16(*ckpt.find(s.name), ckpt.file_of(s.name), s.name);
  }
  return w;
}

EagleWeights synthetic_eagle3_weights(const ModelConfig& target, std::uint64_t seed,
                                      std::int32_t draft_vocab,
                                      std::vector<std::int32_t> aux_layer_ids) {
  EagleWeights w;
  EagleConfig& c = w.config;
  c.version = EagleVersion::kEagle3;
  c.layer = target;
  c.layer.family = ModelFamily::kLlama;
  c.layer.architecture = "LlamaForCausalLM";
  c.layer.num_hidden_layers = 1;
  c.layer.layers = {LayerAttention{}};
  c.layer.tie_word_embeddings = false;
  c.layer.qkv_bias = c.layer.o_bias = c.layer.qk_norm = false;
  c.layer.extra_input_tokens = 0;
  c.fc_bias = false;
  c.input_norm = true;
  c.draft_vocab_size = draft_vocab > 0 ? draft_vocab : std::max(1, target.vocab_size / 2);
  c.target_hidden_size = target.hidden_size;
  const std::int32_t L = target.num_hidden_layers;
  if (aux_layer_ids.empty() && L < 7 && L >= 4)  // the default [2, L/2, L-3] needs 7 layers
    aux_layer_ids = {0, L / 2 - 1, L - 2};
  c.aux_layer_ids = std::move(aux_layer_ids);
  c.validate();
  // The draft vocabulary: a seeded random increasing subset of the target's ids, as trained
  // heads keep their most frequent tokens in id order.
  std::vector<std::int32_t> ids(static_cast<std::size_t>(target.vocab_size));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i);
  std::mt19937_64 rng(seed ^ 0xe3a61e3d2b7cULL);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(static_cast<std::size_t>(c.draft_vocab_size));
  std::sort(ids.begin(), ids.end());
  w.draft_to_target = ids;
  eagle3_detail::fill_synthetic_tensors(w, eagle3_expected_tensors(c), "eagle3.", seed);
  return w;
}

}  // namespace graphdecode
