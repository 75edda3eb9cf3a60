// ModelConfig: parsing of real-world Hugging Face config.json shapes, per-layer attention kinds
// and windows, and a named Error for every unsupported field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "engine/model_config.h"
#include "engine/weights.h"
#include "safetensors_writer.h"

namespace graphdecode {
namespace {

using nlohmann::json;

// Llama-3.2-1B's config.json.
const char* kLlama3 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

// Mistral-7B-v0.1's config.json.
const char* kMistral = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 32000})";

// A small Qwen2 config (0.5B shapes, 6 layers) with the sliding window switched on.
const char* kQwen2 = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "hidden_act": "silu",
  "hidden_size": 896, "intermediate_size": 4864, "max_position_embeddings": 32768,
  "max_window_layers": 4, "model_type": "qwen2", "num_attention_heads": 14,
  "num_hidden_layers": 6, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 16, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "use_sliding_window": true, "vocab_size": 151936})";

ModelConfig parse(const json& j) {
  return ModelConfig::from_json_text(j.dump());
}
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
constexpr AttentionKind F = AttentionKind::kFull, S = AttentionKind::kSliding;

TEST(ModelConfig, Llama3WithRopeScalingAndTiedEmbeddings) {
  const ModelConfig c = ModelConfig::from_json_text(kLlama3);
  EXPECT_EQ(c.family, ModelFamily::kLlama);
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 8192);
  EXPECT_EQ(c.num_hidden_layers, 16);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.gqa_group(), 4);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.checkpoint_dtype, CheckpointDType::kBF16);
  ASSERT_EQ(c.layers.size(), 16u);
  for (const LayerAttention& l : c.layers) {
    EXPECT_EQ(l.kind, F);
    EXPECT_LT(l.window_left, 0);
  }
  EXPECT_FALSE(c.any_sliding());
}

// The 8B-class bench preset has Llama-3.1-8B's dimensions: its published parameter count.
TEST(ModelConfig, Llama8bPresetHasLlama31Dimensions) {
  const ModelConfig c = llama_8b_config();
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  std::int64_t params = 0;
  for (const TensorSpec& t : expected_tensors(c)) {
    std::int64_t n = 1;
    for (const std::int64_t d : t.shape) n *= d;
    params += n;
  }
  EXPECT_EQ(params, 8030261248);  // meta-llama/Llama-3.1-8B
}

TEST(ModelConfig, DefaultsForKvHeadsHeadDimAndRope) {
  const ModelConfig c = parse(patched(kLlama3, {{"num_key_value_heads", nullptr},
                                                {"head_dim", nullptr},
                                                {"rope_scaling", nullptr},
                                                {"rope_theta", nullptr},
                                                {"tie_word_embeddings", nullptr}}));
  EXPECT_EQ(c.num_key_value_heads, 32);
  EXPECT_EQ(c.head_dim, 2048 / 32);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  // An explicit JSON null is the same as absent (HF writes "head_dim": null at times).
  json j = json::parse(kLlama3);
  j["head_dim"] = nullptr;
  EXPECT_EQ(parse(j).head_dim, 64);
}

TEST(ModelConfig, LinearAndDefaultRopeAndLegacyTypeKey) {
  // merge_patch merges into the existing rope_scaling: null removes its keys.
  auto c = parse(patched(
      kLlama3, {{"rope_scaling", {{"rope_type", nullptr}, {"type", "linear"}, {"factor", 2.0}}}}));
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 2.0);
  c = parse(patched(kLlama3, {{"rope_scaling", {{"rope_type", "default"}}}}));
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kDefault);
}

TEST(ModelConfig, TransformersFiveRopeParametersAndDtypeKey) {
  json j = patched(kLlama3, {{"rope_scaling", nullptr},
                             {"rope_theta", nullptr},
                             {"torch_dtype", nullptr},
                             {"dtype", "float32"}});
  j["rope_parameters"] = json::parse(
      R"({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})");
  const ModelConfig c = parse(j);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.checkpoint_dtype, CheckpointDType::kF32);
}

TEST(ModelConfig, CheckpointDtypes) {
  EXPECT_EQ(parse(patched(kLlama3, {{"torch_dtype", "float16"}})).checkpoint_dtype,
            CheckpointDType::kF16);
  EXPECT_EQ(parse(patched(kLlama3, {{"torch_dtype", "float32"}})).checkpoint_dtype,
            CheckpointDType::kF32);
}

TEST(ModelConfig, MistralSlidingWindowOnEveryLayer) {
  const ModelConfig c = ModelConfig::from_json_text(kMistral);
  EXPECT_EQ(c.family, ModelFamily::kMistral);
  EXPECT_EQ(c.head_dim, 128);
  ASSERT_EQ(c.layers.size(), 32u);
  for (const LayerAttention& l : c.layers) {
    EXPECT_EQ(l.kind, S);
    EXPECT_EQ(l.window_left, 4095);  // HF W = 4096 keys including the query itself
  }
  // null: no window; absent: HF MistralConfig's default of 4096.
  json j = json::parse(kMistral);
  j["sliding_window"] = nullptr;
  EXPECT_FALSE(parse(j).any_sliding());
  j.erase("sliding_window");
  EXPECT_EQ(parse(j).layers[7].window_left, 4095);
  j["sliding_window"] = 8;
  EXPECT_EQ(parse(j).layers[0].window_left, 7);
}

TEST(ModelConfig, Qwen2SlidingFromMaxWindowLayers) {
  const ModelConfig c = ModelConfig::from_json_text(kQwen2);
  EXPECT_EQ(c.family, ModelFamily::kQwen2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_TRUE(c.qkv_bias);  // Qwen2 always has q/k/v biases, never an o bias
  EXPECT_FALSE(c.o_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(kinds(c), (std::vector<AttentionKind>{F, F, F, F, S, S}));
  EXPECT_EQ(c.layers[4].window_left, 15);
  EXPECT_EQ(c.layers[3].window_left, -1);
  // use_sliding_window false nulls the window: every layer full, whatever max_window_layers says.
  EXPECT_FALSE(parse(patched(kQwen2, {{"use_sliding_window", false}})).any_sliding());
  EXPECT_EQ(kinds(parse(patched(kQwen2, {{"max_window_layers", 0}}))),
            (std::vector<AttentionKind>(6, S)));
}

TEST(ModelConfig, LayerTypesTakePrecedence) {
  const json types = {"sliding_attention", "full_attention", "sliding_attention",
                      "full_attention",    "full_attention", "sliding_attention"};
  const ModelConfig c = parse(patched(kQwen2, {{"layer_types", types}}));
  EXPECT_EQ(kinds(c), (std::vector<AttentionKind>{S, F, S, F, F, S}));
  EXPECT_EQ(c.layers[0].window_left, 15);
  // Mistral and Llama follow layer_types too.
  json m = json::parse(kMistral);
  m["num_hidden_layers"] = 6;
  m["layer_types"] = types;
  EXPECT_EQ(kinds(parse(m)), (std::vector<AttentionKind>{S, F, S, F, F, S}));
  // As in HF, a sliding layer whose effective window is null runs full attention.
  EXPECT_FALSE(parse(patched(kQwen2, {{"layer_types", types}, {"use_sliding_window", false}}))
                   .any_sliding());
}

TEST(ModelConfig, Qwen3QkNormAndAttentionBias) {
  json j = patched(kQwen2, {{"model_type", "qwen3"},
                            {"architectures", {"Qwen3ForCausalLM"}},
                            {"head_dim", 128},
                            {"attention_bias", false}});
  ModelConfig c = parse(j);
  EXPECT_EQ(c.family, ModelFamily::kQwen3);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.head_dim, 128);  // Qwen3 sets head_dim independently of hidden / heads
  j["attention_bias"] = true;
  c = parse(j);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.o_bias);  // HF Qwen3/Llama attention_bias covers o_proj as well
  c = parse(patched(kLlama3, {{"attention_bias", true}}));
  EXPECT_TRUE(c.qkv_bias && c.o_bias);
}

struct BadCase {
  const char* base;
  json patch;
  const char* field;
  const char* value;  // substring of Error::value()
};

TEST(ModelConfig, UnsupportedFieldsNameFieldAndValue) {
  const std::vector<BadCase> cases = {
      {kLlama3, {{"hidden_act", "gelu"}}, "hidden_act", "gelu"},
      {kLlama3, {{"mlp_bias", true}}, "mlp_bias", "true"},
      {kLlama3, {{"head_dim", 96}}, "head_dim", "96"},
      {kLlama3, {{"num_key_value_heads", 5}}, "num_key_value_heads", "5"},
      {kLlama3,
       {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}},
       "rope_scaling.rope_type",
       "yarn"},
      {kLlama3,
       {{"rope_scaling", {{"rope_type", nullptr}, {"type", "dynamic"}}}},
       "rope_scaling.rope_type",
       "dynamic"},
      {kLlama3,
       {{"rope_scaling", {{"original_max_position_embeddings", nullptr}}}},
       "rope_scaling.original_max_position_embeddings",
       "missing"},
      {kLlama3, {{"torch_dtype", "float8_e4m3fn"}}, "torch_dtype", "float8_e4m3fn"},
      {kLlama3, {{"model_type", "gemma"}}, "model_type", "gemma"},
      {kLlama3, {{"model_type", nullptr}}, "model_type", "missing"},
      {kLlama3,
       {{"architectures", {"LlamaForSequenceClassification"}}},
       "architectures",
       "LlamaForSequenceClassification"},
      {kLlama3, {{"quantization_config", {{"quant_method", "awq"}}}}, "quantization_config", ""},
      {kLlama3, {{"partial_rotary_factor", 0.5}}, "partial_rotary_factor", "0.5"},
      {kLlama3, {{"vocab_size", nullptr}}, "vocab_size", "missing"},
      {kLlama3, {{"vocab_size", "big"}}, "vocab_size", "big"},
      {kLlama3, {{"num_hidden_layers", -2}}, "num_hidden_layers", "-2"},
      {kLlama3, {{"tie_word_embeddings", 1}}, "tie_word_embeddings", "1"},
      {kMistral, {{"sliding_window", 0}}, "sliding_window", "0"},
      {kMistral, {{"attention_bias", true}}, "attention_bias", "true"},
      {kQwen2, {{"layer_types", {"full_attention"}}}, "layer_types", "1 entries"},
      {kQwen2,
       {{"layer_types",
         {"full_attention", "full_attention", "chunked_attention", "full_attention",
          "full_attention", "full_attention"}}},
       "layer_types[2]",
       "chunked_attention"},
  };
  for (const BadCase& bc : cases) {
    const std::string text = patched(bc.base, bc.patch).dump();
    SCOPED_TRACE(text.substr(0, 200));
    try {
      ModelConfig::from_json_text(text, "cfg/config.json");
      ADD_FAILURE() << "no error for " << bc.field;
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), bc.field) << e.what();
      EXPECT_NE(e.value().find(bc.value), std::string::npos) << e.what();
      EXPECT_EQ(e.where(), "cfg/config.json") << e.what();
    }
  }
}

TEST(ModelConfig, BadJsonAndFiles) {
  try {
    ModelConfig::from_json_text("{\"model_type\": \"llama\",", "x.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "json");
    EXPECT_EQ(e.where(), "x.json");
  }
  EXPECT_THROW(ModelConfig::from_json_text("[1, 2]"), Error);
  try {
    ModelConfig::from_file("/nonexistent/config.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "path");
  }
  testing::TempDir dir;
  testing::write_text(dir.file("config.json"), kMistral);
  EXPECT_EQ(ModelConfig::from_file(dir.file("config.json")).num_hidden_layers, 32);
}

TEST(ModelConfig, SmallTestConfigAndValidate) {
  ModelConfig c = small_test_config();
  EXPECT_NO_THROW(c.validate());
  EXPECT_TRUE(c.any_sliding());
  EXPECT_EQ(c.layers[0].kind, F);
  EXPECT_EQ(c.layers[1].kind, S);
  EXPECT_EQ(c.layers[1].window_left, 31);
  c.num_key_value_heads = 3;
  try {
    c.validate();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "num_key_value_heads");
  }
  c = small_test_config();
  c.layers.pop_back();
  EXPECT_THROW(c.validate(), Error);
  c = small_test_config();
  c.layers[0].window_left = 5;  // full layer with a window
  EXPECT_THROW(c.validate(), Error);
}

}  // namespace
}  // namespace graphdecode
