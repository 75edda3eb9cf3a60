// Mllama's text decoder on the CPU: config.json parsing (MllamaForCausalLM, and the text_config of
// MllamaForConditionalGeneration), the weight names and shapes of cross layers, loading both
// checkpoint layouts with the vision tower ignored, the arena and attention layout, and the
// scheduler's encoder states (validation by name, cross pages reserved and returned).
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attention/reference.h"
#include "common/error.h"
#include "engine/device_weights.h"
#include "engine/llama_model.h"
#include "engine/model_config.h"
#include "engine/scheduler.h"
#include "engine/weights.h"
#include "memory/kv_ledger.h"
#include "safetensors_writer.h"
#include "support/field_of.h"

namespace graphdecode {
namespace {

using nlohmann::json;
using testing::SafetensorsWriter;
using testing::TempDir;
using testing::write_text;

constexpr AttentionKind F = AttentionKind::kFull, C = AttentionKind::kCross;

// The config.json transformers 5 writes for a small MllamaForCausalLM.
const char* kCausal = R"({
  "architectures": ["MllamaForCausalLM"], "bos_token_id": 1, "cross_attention_layers": [1, 3],
  "dropout": 0.0, "dtype": "float32", "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 128, "initializer_range": 0.02, "intermediate_size": 256,
  "max_position_embeddings": 131072, "model_type": "mllama_text_model",
  "num_attention_heads": 2, "num_hidden_layers": 4, "num_key_value_heads": 1,
  "pad_token_id": 3, "rms_norm_eps": 1e-05,
  "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
  "tie_word_embeddings": false, "transformers_version": "5.24.0", "use_cache": true,
  "vocab_size": 256})";

// Llama-3.2-11B-Vision's config.json (transformers 4.45), vision_config abridged: the text
// decoder's fields live in text_config, the dtype at the top level too.
const char* kVision11B = R"({
  "architectures": ["MllamaForConditionalGeneration"], "image_token_index": 128256,
  "model_type": "mllama",
  "text_config": {
    "_name_or_path": "", "add_cross_attention": false, "architectures": null,
    "bos_token_id": 128000, "cross_attention_hidden_size": null,
    "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38], "dropout": 0,
    "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "is_decoder": false,
    "max_position_embeddings": 131072, "model_type": "mllama_text_model",
    "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8,
    "pad_token_id": 128004, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "vocab_size": 128256},
  "torch_dtype": "bfloat16", "transformers_version": "4.45.0.dev0",
  "vision_config": {"hidden_size": 1280, "image_size": 560, "max_num_tiles": 4,
                    "model_type": "mllama_vision_model", "num_hidden_layers": 32,
                    "patch_size": 14, "vision_output_dim": 7680}})";

json patched(const char* base, const json& patch) {
  json j = json::parse(base);
  j.merge_patch(patch);  // a null value removes the key
  return j;
}

std::vector<AttentionKind> kinds(const ModelConfig& c) {
  std::vector<AttentionKind> k;
  for (const LayerAttention& l : c.layers) k.push_back(l.kind);
  return k;
}

using testing::field_of;

TEST(MllamaConfig, CausalLmConfig) {
  const ModelConfig c = ModelConfig::from_json_text(kCausal);
  EXPECT_EQ(c.family, ModelFamily::kMllama);
  EXPECT_EQ(c.architecture, "MllamaForCausalLM");
  EXPECT_EQ(c.vocab_size, 256);
  EXPECT_EQ(c.extra_input_tokens, 8);
  EXPECT_EQ(c.input_vocab_size(), 264);
  EXPECT_EQ(c.head_dim, 64);  // hidden / heads
  EXPECT_EQ(kinds(c), (std::vector<AttentionKind>{F, C, F, C}));
  EXPECT_EQ(c.num_cross_layers(), 2);
  EXPECT_TRUE(c.any_cross());
  EXPECT_FALSE(c.any_sliding());
  EXPECT_FALSE(c.qkv_bias || c.o_bias || c.qk_norm);
  EXPECT_EQ(c.checkpoint_dtype, CheckpointDType::kF32);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  // HF ignores a head_dim field for Mllama (hidden / heads always).
  EXPECT_EQ(ModelConfig::from_json_text(patched(kCausal, {{"head_dim", 128}}).dump()).head_dim, 64);
}

TEST(MllamaConfig, VisionLanguageConfigReadsTextConfig) {
  const ModelConfig c = ModelConfig::from_json_text(kVision11B);
  EXPECT_EQ(c.family, ModelFamily::kMllama);
  EXPECT_EQ(c.architecture, "MllamaForConditionalGeneration");
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_hidden_layers, 40);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.input_vocab_size(), 128264);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.checkpoint_dtype, CheckpointDType::kBF16);
  EXPECT_EQ(c.num_cross_layers(), 8);
  for (std::int32_t l = 0; l < 40; ++l)
    EXPECT_EQ(c.layers[l].kind, l % 5 == 3 ? C : F) << "layer " << l;
  // The same shape as the built-in config of the bench.
  const ModelConfig ref = mllama_11b_text_config();
  EXPECT_EQ(kinds(ref), kinds(c));
  EXPECT_EQ(ref.intermediate_size, c.intermediate_size);
  // The dtype may be only at the top level; the text config's own dtype wins.
  json j = json::parse(kVision11B);
  j["text_config"].erase("torch_dtype");
  j["torch_dtype"] = "float16";
  EXPECT_EQ(ModelConfig::from_json_text(j.dump()).checkpoint_dtype, CheckpointDType::kF16);
  // Absent cross_attention_layers: HF's default list.
  j = json::parse(kVision11B);
  j["text_config"].erase("cross_attention_layers");
  EXPECT_EQ(kinds(ModelConfig::from_json_text(j.dump())), kinds(c));
}

TEST(MllamaConfig, BadConfigsNameTheField) {
  struct Case {
    json config;
    const char* field;
  };
  const std::vector<Case> cases = {
      {patched(kCausal, {{"tie_word_embeddings", true}}), "tie_word_embeddings"},
      {patched(kCausal, {{"cross_attention_layers", {1, 4}}}), "cross_attention_layers"},
      {patched(kCausal, {{"cross_attention_layers", {1, 1}}}), "cross_attention_layers"},
      {patched(kCausal, {{"cross_attention_layers", {-1}}}), "cross_attention_layers"},
      {patched(kCausal, {{"cross_attention_layers", "3"}}), "cross_attention_layers"},
      {patched(kCausal, {{"architectures", {"MllamaForConditionalGeneration"}}}), "architectures"},
      {patched(kCausal, {{"hidden_act", "gelu"}}), "hidden_act"},
      {patched(kVision11B, {{"text_config", nullptr}}), "text_config"},
      {patched(kVision11B, {{"text_config", {{"model_type", "llama"}}}}), "text_config.model_type"},
      {patched(kVision11B, {{"architectures", {"MllamaForCausalLM"}}}), "architectures"},
      {patched(kVision11B, {{"tie_word_embeddings", true}}), "tie_word_embeddings"},
      {patched(kVision11B, {{"text_config", {{"tie_word_embeddings", true}}}}),
       "text_config.tie_word_embeddings"},
      {patched(kVision11B, {{"text_config", {{"cross_attention_layers", {40}}}}}),
       "text_config.cross_attention_layers"},
      {patched(kVision11B, {{"text_config", {{"vocab_size", nullptr}}}}), "text_config.vocab_size"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.config.dump().substr(0, 160));
    EXPECT_EQ(field_of([&] { ModelConfig::from_json_text(c.config.dump()); }), c.field);
  }
  // Cross layers belong to the mllama family.
  ModelConfig llama = small_test_config();
  llama.layers[0] = {C, -1};
  EXPECT_EQ(field_of([&] { llama.validate(); }), "layers[0].kind");
  ModelConfig cross = small_cross_test_config();
  cross.layers[1].window_left = 7;
  EXPECT_EQ(field_of([&] { cross.validate(); }), "layers[1].window_left");
}

bool has(const std::vector<TensorSpec>& specs, const std::string& name,
         std::vector<std::int64_t> shape) {
  for (const TensorSpec& s : specs)
    if (s.name == name) return s.shape == shape;
  return false;
}

TEST(MllamaWeights, CrossLayerTensorNamesAndShapes) {
  const ModelConfig c = ModelConfig::from_json_text(kCausal);
  const auto specs = expected_tensors(c);
  EXPECT_EQ(specs.size(), 1u + 2u * 9u + 2u * 13u + 2u);
  EXPECT_TRUE(has(specs, "model.embed_tokens.weight", {264, 128}));
  EXPECT_TRUE(has(specs, "lm_head.weight", {256, 128}));
  EXPECT_TRUE(has(specs, "model.layers.0.self_attn.q_proj.weight", {128, 128}));
  const std::string p = "model.layers.1.";
  EXPECT_TRUE(has(specs, p + "cross_attn.q_proj.weight", {128, 128}));
  EXPECT_TRUE(has(specs, p + "cross_attn.k_proj.weight", {64, 128}));
  EXPECT_TRUE(has(specs, p + "cross_attn.v_proj.weight", {64, 128}));
  EXPECT_TRUE(has(specs, p + "cross_attn.o_proj.weight", {128, 128}));
  EXPECT_TRUE(has(specs, p + "cross_attn.q_norm.weight", {64}));
  EXPECT_TRUE(has(specs, p + "cross_attn.k_norm.weight", {64}));
  EXPECT_TRUE(has(specs, p + "cross_attn_attn_gate", {1}));
  EXPECT_TRUE(has(specs, p + "cross_attn_mlp_gate", {1}));
  EXPECT_TRUE(has(specs, p + "input_layernorm.weight", {128}));
  EXPECT_TRUE(has(specs, p + "post_attention_layernorm.weight", {128}));
  EXPECT_TRUE(has(specs, p + "mlp.down_proj.weight", {128, 256}));
  EXPECT_FALSE(has(specs, p + "self_attn.q_proj.weight", {128, 128}));

  // Synthetic gates are decisive (|g| in [0.5, 1)), norms 1.
  const HostWeights w = synthetic_weights(c, 3);
  for (const std::string g : {"cross_attn_attn_gate", "cross_attn_mlp_gate"}) {
    const double v = reference::bf16_to_float(w.at(p + g).data.at(0));
    EXPECT_GE(std::abs(v), 0.49) << g;
    EXPECT_LT(std::abs(v), 1.0) << g;
  }
  EXPECT_EQ(w.at(p + "cross_attn.k_norm.weight").data.at(0), 0x3f80);
}

// A vision-language checkpoint of `config` with the text decoder under `prefix_of(name)`, plus a
// vision tower and projector the engine must skip.
void write_vl_checkpoint(const TempDir& dir, const HostWeights& w, const std::string& config,
                         const std::function<std::string(const std::string&)>& stored,
                         const std::string& tower_prefix) {
  write_text(dir.file("config.json"), config);
  SafetensorsWriter out;
  for (const auto& [n, t] : w.tensors) out.add_bf16(stored(n), t.shape, t.data);
  out.add_bf16(tower_prefix + "vision_model.class_embedding", {4}, {0, 0, 0, 0});
  out.add_bf16(tower_prefix + "multi_modal_projector.bias", {2}, {0, 0});
  out.write(dir.file("model.safetensors"));
}

std::string vl_config() {
  json j = json::parse(kVision11B);
  j["text_config"] = json::parse(kCausal);
  return j.dump();
}

TEST(MllamaWeights, LoadsBothVisionLanguageLayoutsAndSkipsTheTower) {
  const ModelConfig c = ModelConfig::from_json_text(vl_config());
  ASSERT_EQ(c.architecture, "MllamaForConditionalGeneration");
  const HostWeights w = synthetic_weights(c, 9);
  // The Hub's files / save_pretrained: language_model.model.*, language_model.lm_head.weight.
  {
    TempDir dir;
    write_vl_checkpoint(
        dir, w, vl_config(), [](const std::string& n) { return "language_model." + n; }, "");
    const HostWeights loaded = load_checkpoint(dir.path());
    ASSERT_EQ(loaded.tensors.size(), w.tensors.size());
    for (const auto& [n, t] : w.tensors) EXPECT_EQ(loaded.at(n).data, t.data) << n;
  }
  // transformers 5's in-memory names: model.language_model.*, lm_head.weight.
  {
    TempDir dir;
    write_vl_checkpoint(
        dir, w, vl_config(),
        [](const std::string& n) {
          return n.starts_with("model.") ? "model.language_model." + n.substr(6) : n;
        },
        "model.");
    const HostWeights loaded = load_checkpoint(dir.path());
    for (const auto& [n, t] : w.tensors) EXPECT_EQ(loaded.at(n).data, t.data) << n;
  }
  // A missing cross tensor is named as the checkpoint stores it.
  {
    TempDir dir;
    HostWeights partial = w;
    partial.tensors.erase("model.layers.3.cross_attn_mlp_gate");
    write_vl_checkpoint(
        dir, partial, vl_config(), [](const std::string& n) { return "language_model." + n; }, "");
    EXPECT_EQ(field_of([&] { load_checkpoint(dir.path()); }),
              "language_model.model.layers.3.cross_attn_mlp_gate");
  }
  // A causal-LM checkpoint keeps the plain names; a vision tensor there is unexpected.
  {
    TempDir dir;
    const ModelConfig cc = ModelConfig::from_json_text(kCausal);
    const HostWeights wc = synthetic_weights(cc, 9);
    write_vl_checkpoint(
        dir, wc, kCausal, [](const std::string& n) { return n; }, "");
    EXPECT_EQ(field_of([&] { load_checkpoint(dir.path()); }), "multi_modal_projector.bias");
  }
}

TEST(MllamaSetup, ArenaLayoutAndAttentionLayoutOfCrossLayers) {
  const ModelConfig c = small_cross_test_config();
  const WeightArenaLayout a = WeightArenaLayout::compute(c);
  ASSERT_EQ(a.layers.size(), 6u);
  const auto& self = a.layers[0];
  const auto& cross = a.layers[1];
  EXPECT_EQ(self.cross_kv, WeightArenaLayout::kNone);
  EXPECT_EQ(self.attn_gate, WeightArenaLayout::kNone);
  EXPECT_NE(cross.cross_kv, WeightArenaLayout::kNone);
  EXPECT_NE(cross.attn_gate, WeightArenaLayout::kNone);
  EXPECT_NE(cross.mlp_gate, WeightArenaLayout::kNone);
  EXPECT_NE(cross.q_norm, WeightArenaLayout::kNone);
  // Cross q is q_proj alone; k/v follow it as one [2 kv, hidden] block.
  EXPECT_GE(cross.cross_kv - cross.qkv, static_cast<std::size_t>(c.q_size() * c.hidden_size));
  EXPECT_NE(a.lm_head, a.embed);
  // The packed arena holds every tensor where the layout says.
  const HostWeights w = synthetic_weights(c, 4);
  const std::vector<std::uint16_t> img = pack_weight_arena(w, a);
  EXPECT_EQ(img[cross.attn_gate], w.at("model.layers.1.cross_attn_attn_gate").data[0]);
  EXPECT_EQ(img[cross.mlp_gate], w.at("model.layers.1.cross_attn_mlp_gate").data[0]);
  const auto& v = w.at("model.layers.1.cross_attn.v_proj.weight").data;
  EXPECT_EQ(img[cross.cross_kv + static_cast<std::size_t>(c.kv_size() * c.hidden_size)], v[0]);
  const auto& e = w.at("model.embed_tokens.weight").data;
  EXPECT_EQ(e.size(), static_cast<std::size_t>(c.input_vocab_size() * c.hidden_size));
  EXPECT_EQ(img[a.embed + e.size() - 1], e.back());

  const AttentionLayout layout = llama_attention_layout(c);
  EXPECT_EQ(layout.layers, (std::vector<AttentionKind>{F, C, F, F, C, F}));
  EXPECT_EQ(layout.count(C), 2);
  RuntimeOptions o;
  o.max_encoder_len = 100;
  const StepCapacity cap = step_capacity(o, std::span<const AttentionLayout>(&layout, 1));
  ASSERT_EQ(cap.num_pools(), 2);
  EXPECT_EQ(cap.pools[1].geometry.kind, C);
  EXPECT_EQ(cap.pools[1].geometry.max_pages_per_slot, 7);  // ceil(100 / 16)
  EXPECT_EQ(cap.max_encoder_len, 100);
  // A cross model needs encoder room.
  o.max_encoder_len = 0;
  EXPECT_EQ(field_of([&] { step_capacity(o, std::span<const AttentionLayout>(&layout, 1)); }),
            "max_encoder_len");
}

// A scheduler over a full pool and a cross pool of 16-token pages, as the engine builds them.
struct CrossSetup {
  std::vector<LedgerPool> pools;
  KvLedger ledger;
  Scheduler s;
  static std::vector<LedgerPool> make(std::int32_t cross_pages) {
    std::vector<LedgerPool> p(2);
    for (LedgerPool& l : p) {
      l.geometry.page_size = 16;
      l.geometry.max_slots = 9;
      l.max_commands = 64;
      l.max_page_ids = 256;
      l.max_step_tokens = 32;
    }
    p[0].geometry.kind = F;
    p[0].geometry.num_pages = 65;
    p[0].geometry.max_pages_per_slot = 16;
    p[1].geometry.kind = C;
    p[1].geometry.num_pages = cross_pages + 1;
    p[1].geometry.max_pages_per_slot = 13;  // 200 keys
    return p;
  }
  static SchedulerConfig config(std::int32_t max_encoder_len) {
    SchedulerConfig c;
    c.max_batch = 4;
    c.max_step_tokens = 32;
    c.max_context = 256;
    c.vocab_size = 100;
    c.input_vocab_size = 108;
    c.max_encoder_len = max_encoder_len;
    c.encoder_width = 8;
    return c;
  }
  explicit CrossSetup(std::int32_t cross_pages = 20, std::int32_t max_encoder_len = 200)
      : pools(make(cross_pages)), ledger(pools), s(config(max_encoder_len), ledger) {}
};

RequestSpec with_encoder(const std::vector<std::uint16_t>& states, std::int32_t length) {
  RequestSpec s;
  s.prompt = {1, 2, 3};
  s.max_new_tokens = 4;
  s.encoder = {states.data(), length, 8, false};
  return s;
}

TEST(CrossScheduler, BadEncoderStatesNameTheFieldAndChangeNothing) {
  CrossSetup cs;
  const std::vector<std::uint16_t> states(8 * 300, 0x3f80);
  RequestSpec s = with_encoder(states, 10);
  s.encoder.width = 16;
  EXPECT_EQ(field_of([&] { cs.s.submit(s); }), "encoder.width");
  EXPECT_EQ(field_of([&] { cs.s.submit(with_encoder(states, 201)); }), "encoder.length");
  EXPECT_EQ(field_of([&] { cs.s.submit(with_encoder(states, -1)); }), "encoder.length");
  s = with_encoder(states, 10);
  s.encoder.data = nullptr;
  EXPECT_EQ(field_of([&] { cs.s.submit(s); }), "encoder.data");
  // The first image position is a prompt position (the prompt here has 3 tokens).
  s = with_encoder(states, 10);
  s.encoder.first_position = 3;
  EXPECT_EQ(field_of([&] { cs.s.submit(s); }), "encoder.first_position");
  s.encoder.first_position = -1;
  EXPECT_EQ(field_of([&] { cs.s.submit(s); }), "encoder.first_position");
  // Never fits the cross pool of 20 pages (320 keys at most... 200 here, so shrink the pool).
  CrossSetup small(5);
  EXPECT_EQ(field_of([&] { small.s.submit(with_encoder(states, 100)); }), "kv_pages_needed");
  // A model without cross layers refuses encoder states, even of length 0 with data.
  LedgerPool full = cs.pools[0];
  KvLedger plain_ledger(std::span<const LedgerPool>(&full, 1));
  Scheduler plain(CrossSetup::config(0), plain_ledger);
  EXPECT_EQ(field_of([&] { plain.submit(with_encoder(states, 10)); }), "encoder");
  EXPECT_EQ(field_of([&] { plain.submit(with_encoder(states, 0)); }), "encoder");
  RequestSpec text_only;
  text_only.prompt = {1, 2};
  EXPECT_EQ(field_of([&] { plain.submit(text_only); }), "<no error>");
  // Input ids past vocab_size (the image token) are prompt tokens; stop tokens are not.
  RequestSpec image_token = with_encoder(states, 4);
  image_token.prompt = {107, 5};
  EXPECT_EQ(field_of([&] { cs.s.submit(image_token); }), "<no error>");
  image_token.prompt = {4, 107, 5};  // text before the image: rows 0 see no image
  image_token.encoder.first_position = 1;
  EXPECT_EQ(field_of([&] { cs.s.submit(image_token); }), "<no error>");
  image_token.encoder.first_position = 0;
  image_token.prompt = {108};
  EXPECT_EQ(field_of([&] { cs.s.submit(image_token); }), "prompt[0]");
  image_token.prompt = {5};
  image_token.stop_tokens = {100};
  EXPECT_EQ(field_of([&] { cs.s.submit(image_token); }), "stop_tokens");
  EXPECT_EQ(cs.s.waiting(), 2);
}

TEST(CrossScheduler, EncoderPagesAreReservedCopiedAndReturned) {
  CrossSetup cs(10);  // 10 cross pages: 160 keys reserved at once
  std::vector<std::uint16_t> states(8 * 150);
  for (std::size_t i = 0; i < states.size(); ++i) states[i] = static_cast<std::uint16_t>(i);
  const std::vector<std::uint16_t> expect = states;
  const RequestId a = cs.s.submit(with_encoder(states, 100));  // 7 pages
  const RequestId b = cs.s.submit(with_encoder(states, 60));   // 4 pages: waits for a
  const RequestId c = cs.s.submit(with_encoder(states, 0));    // text only: 0 cross pages
  states.assign(states.size(), 0);  // the caller's buffer is free after submit
  StepPlan plan = cs.s.next_step();
  EXPECT_EQ(plan.admitted, (std::vector<RequestId>{a}));
  EXPECT_EQ(cs.ledger.reserved_pages(1), 7);
  const EncoderStates ea = cs.s.encoder(a);
  ASSERT_NE(ea.data, nullptr);
  EXPECT_EQ(ea.length, 100);
  EXPECT_TRUE(std::equal(ea.data, ea.data + 800, expect.begin())) << "the submit-time copy";
  ASSERT_EQ(plan.requests.size(), 1u);
  EXPECT_EQ(plan.requests[0].encoder_len, 100);
  cs.s.drop_encoder_states(a);
  EXPECT_EQ(cs.s.encoder(a).data, nullptr);
  EXPECT_EQ(cs.s.encoder(a).length, 100);
  // Run a to the end: its cross pages come back and b, c get in.
  std::vector<TokenEvent> ev;
  for (int guard = 0; guard < 16 && cs.s.running() > 0; ++guard) {
    for (const PlannedRequest& p : plan.requests)
      if (p.id == a) cs.ledger.extend(p.slot, p.extend_len);
    cs.s.on_step_done(plan, std::vector<std::int32_t>(plan.requests.size(), 7), ev);
    cs.ledger.clear_commands();
    if (cs.s.running() > 0) plan = cs.s.next_step();
  }
  plan = cs.s.next_step();
  EXPECT_EQ(plan.admitted, (std::vector<RequestId>{b, c}));
  EXPECT_EQ(cs.ledger.reserved_pages(1), 4);
  for (const PlannedRequest& p : plan.requests)
    EXPECT_EQ(p.encoder_len, p.id == b ? 60 : 0) << "request " << p.id;
  EXPECT_EQ(cs.s.encoder(c).data, nullptr);
  EXPECT_EQ(cs.s.encoder(c).length, 0);
  // set_encoder within the reservation takes the pages; release returns them.
  cs.ledger.set_encoder(cs.s.slot(b), 60);
  EXPECT_EQ(cs.ledger.pages_held(1, cs.s.slot(b)), 4);
  cs.s.cancel(b);
  EXPECT_EQ(cs.ledger.free_pages(1), cs.ledger.usable_pages(1));
  EXPECT_EQ(cs.ledger.reserved_pages(1), 0);
}

}  // namespace
}  // namespace graphdecode
