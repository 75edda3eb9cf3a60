// Weights: the expected tensor list per config, load_checkpoint (single file, sharded, dtype
// conversion, missing / extra / mis-shaped tensors) and seeded synthetic weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "attention/reference.h"
#include "common/error.h"
#include "engine/weights.h"
#include "safetensors_writer.h"

namespace graphdecode {
namespace {

using testing::SafetensorsWriter;
using testing::TempDir;
using testing::write_text;
using testing::write_weights;

// A tiny Llama config: 2 layers, hidden 128, 2 heads of 64, 1 KV head, untied.
const char* kTinyLlama = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "vocab_size": 64, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
  "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-5,
  "hidden_act": "silu", "tie_word_embeddings": false, "torch_dtype": "bfloat16"})";

std::string with(const std::string& base, const std::string& extra) {
  return base.substr(0, base.rfind('}')) + ", " + extra + "}";
}

bool has(const std::vector<TensorSpec>& specs, const std::string& name) {
  for (const TensorSpec& s : specs)
    if (s.name == name) return true;
  return false;
}

TEST(Weights, ExpectedTensorsPerFamily) {
  const ModelConfig llama = ModelConfig::from_json_text(kTinyLlama);
  const auto specs = expected_tensors(llama);
  ASSERT_EQ(specs.size(), 2u * 9u + 3u);
  EXPECT_EQ(specs.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(specs.front().shape, (std::vector<std::int64_t>{64, 128}));
  EXPECT_EQ(specs[2].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(specs[2].shape, (std::vector<std::int64_t>{128, 128}));
  EXPECT_EQ(specs[3].shape, (std::vector<std::int64_t>{64, 128}));  // k: kv heads x hd
  EXPECT_EQ(specs[5].name, "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(specs[8].name, "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(specs[8].shape, (std::vector<std::int64_t>{256, 128}));
  EXPECT_EQ(specs[9].shape, (std::vector<std::int64_t>{128, 256}));  // down
  EXPECT_EQ(specs.back().name, "lm_head.weight");
  EXPECT_FALSE(has(specs, "model.layers.0.self_attn.q_proj.bias"));

  const auto tied = expected_tensors(
      ModelConfig::from_json_text(with(kTinyLlama, R"("tie_word_embeddings": true)")));
  EXPECT_FALSE(has(tied, "lm_head.weight"));

  const auto qwen2 = expected_tensors(ModelConfig::from_json_text(
      R"({"model_type": "qwen2", "vocab_size": 64, "hidden_size": 128, "intermediate_size": 256,
          "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1})"));
  EXPECT_TRUE(has(qwen2, "model.layers.0.self_attn.q_proj.bias"));
  EXPECT_TRUE(has(qwen2, "model.layers.0.self_attn.v_proj.bias"));
  EXPECT_FALSE(has(qwen2, "model.layers.0.self_attn.o_proj.bias"));
  EXPECT_EQ(qwen2.size(), 9u + 3u + 3u);

  const auto qwen3 = expected_tensors(ModelConfig::from_json_text(
      R"({"model_type": "qwen3", "vocab_size": 64, "hidden_size": 128, "intermediate_size": 256,
          "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 128, "attention_bias": false})"));
  ASSERT_TRUE(has(qwen3, "model.layers.0.self_attn.k_norm.weight"));
  for (const TensorSpec& s : qwen3)
    if (s.name.ends_with("q_norm.weight"))
      EXPECT_EQ(s.shape, (std::vector<std::int64_t>{128}));
    else if (s.name.ends_with("q_proj.weight"))
      EXPECT_EQ(s.shape, (std::vector<std::int64_t>{512, 128}));  // heads*hd != hidden
  EXPECT_EQ(qwen3.size(), 9u + 2u + 3u);
}

TEST(Weights, SyntheticDeterministicPerSeed) {
  const ModelConfig c = small_test_config();
  const HostWeights a = synthetic_weights(c, 7), b = synthetic_weights(c, 7);
  const HostWeights other = synthetic_weights(c, 8);
  const auto specs = expected_tensors(c);
  ASSERT_EQ(a.tensors.size(), specs.size());
  for (const TensorSpec& s : specs) {
    const HostTensor& t = a.at(s.name);
    EXPECT_EQ(t.shape, s.shape);
    EXPECT_EQ(static_cast<std::int64_t>(t.data.size()), t.numel());
    EXPECT_EQ(t.data, b.at(s.name).data) << s.name;
    if (s.name.ends_with("norm.weight")) {
      for (std::uint16_t v : t.data) ASSERT_EQ(v, 0x3f80) << s.name;  // 1.0 in bf16
      EXPECT_EQ(t.data, other.at(s.name).data);
    } else {
      EXPECT_NE(t.data, other.at(s.name).data) << s.name;
    }
  }
  // Scale: the embedding's standard deviation is close to 0.02 and its mean close to 0.
  const HostTensor& e = a.at("model.embed_tokens.weight");
  double sum = 0, sq = 0;
  for (std::uint16_t v : e.data) {
    const double x = reference::bf16_to_float(v);
    sum += x;
    sq += x * x;
  }
  const double n = static_cast<double>(e.data.size());
  EXPECT_NEAR(sum / n, 0.0, 1e-3);
  EXPECT_NEAR(std::sqrt(sq / n), 0.02, 1e-3);
  // Distinct tensors are not copies of each other.
  EXPECT_NE(a.at("model.layers.0.self_attn.k_proj.weight").data,
            a.at("model.layers.0.self_attn.v_proj.weight").data);
  EXPECT_EQ(a.total_bytes(), b.total_bytes());
  EXPECT_THROW(a.at("nope"), Error);
}

// A checkpoint directory for kTinyLlama from seeded weights; returns the weights.
HostWeights write_tiny(const TempDir& dir, std::uint64_t seed = 1) {
  const ModelConfig c = ModelConfig::from_json_text(kTinyLlama);
  HostWeights w = synthetic_weights(c, seed);
  write_text(dir.file("config.json"), kTinyLlama);
  write_weights(dir.file("model.safetensors"), w);
  return w;
}

TEST(Weights, LoadSingleFileCheckpoint) {
  TempDir dir;
  const HostWeights w = write_tiny(dir);
  const HostWeights loaded = load_checkpoint(dir.path());
  EXPECT_EQ(loaded.config.num_hidden_layers, 2);
  ASSERT_EQ(loaded.tensors.size(), w.tensors.size());
  for (const auto& [name, t] : w.tensors) {
    EXPECT_EQ(loaded.at(name).shape, t.shape);
    EXPECT_EQ(loaded.at(name).data, t.data) << name;
  }
}

TEST(Weights, LoadShardedCheckpoint) {
  TempDir dir;
  const HostWeights w = write_tiny(dir, 3);
  std::filesystem::remove(dir.file("model.safetensors"));
  // Layer 0 and the embedding in shard 1, the rest in shard 2.
  const auto in_first = [](const std::string& n) {
    return n.starts_with("model.layers.0.") || n == "model.embed_tokens.weight";
  };
  write_weights(dir.file("a.safetensors"), w, in_first);
  write_weights(dir.file("b.safetensors"), w, [&](const std::string& n) { return !in_first(n); });
  std::string index = R"({"metadata": {}, "weight_map": {)";
  bool first = true;
  for (const auto& [name, t] : w.tensors) {
    index +=
        (first ? "\"" : ",\"") + name + "\": \"" + (in_first(name) ? "a" : "b") + ".safetensors\"";
    first = false;
  }
  write_text(dir.file("model.safetensors.index.json"), index + "}}");
  const HostWeights loaded = load_checkpoint(dir.path());
  for (const auto& [name, t] : w.tensors) EXPECT_EQ(loaded.at(name).data, t.data) << name;
}

TEST(Weights, ConvertsF32AndF16ToBf16RoundToNearestEven) {
  TempDir dir;
  const HostWeights w = write_tiny(dir);
  // Rewrite with the embedding in F32 (including round-to-even ties) and lm_head in F16.
  SafetensorsWriter out;
  std::vector<float> emb(64 * 128);
  for (std::size_t i = 0; i < emb.size(); ++i)
    emb[i] = reference::bf16_to_float(w.at("model.embed_tokens.weight").data[i]);
  const auto bits = [](std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  emb[0] = bits(0x3f808000u);                         // tie, even below: -> 0x3f80
  emb[1] = bits(0x3f818000u);                         // tie, odd below: -> 0x3f82
  emb[2] = bits(0x3f808001u);                         // above the tie: -> 0x3f81
  std::vector<std::uint16_t> head(64 * 128, 0x3c00);  // fp16 1.0
  head[0] = 0x3555;                                   // fp16 0.33325195 -> bf16 0x3eab
  head[1] = 0xc000;                                   // -2.0
  for (const auto& [name, t] : w.tensors) {
    if (name == "model.embed_tokens.weight")
      out.add_f32(name, t.shape, emb);
    else if (name == "lm_head.weight")
      out.add_f16(name, t.shape, head);
    else
      out.add_bf16(name, t.shape, t.data);
  }
  out.write(dir.file("model.safetensors"));
  const HostWeights loaded = load_checkpoint(dir.path());
  const auto& e = loaded.at("model.embed_tokens.weight").data;
  EXPECT_EQ(e[0], 0x3f80);
  EXPECT_EQ(e[1], 0x3f82);
  EXPECT_EQ(e[2], 0x3f81);
  for (std::size_t i = 3; i < e.size(); ++i)
    ASSERT_EQ(e[i], w.at("model.embed_tokens.weight").data[i]);  // bf16 -> f32 -> bf16 exact
  const auto& h = loaded.at("lm_head.weight").data;
  EXPECT_EQ(h[0], 0x3eab);
  EXPECT_EQ(h[1], 0xc000);
  EXPECT_EQ(h[2], 0x3f80);
}

// Writes the tiny checkpoint through `edit` and expects load_checkpoint to name `field`.
template <typename Edit>
void expect_load_error(Edit edit, const std::string& field, const std::string& what) {
  TempDir dir;
  const HostWeights w = write_tiny(dir);
  SafetensorsWriter out;
  edit(w, out);
  out.write(dir.file("model.safetensors"));
  try {
    load_checkpoint(dir.path());
    ADD_FAILURE() << "no error for " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), field) << e.what();
    EXPECT_NE(e.message().find(what), std::string::npos) << e.what();
  }
}

TEST(Weights, MissingExtraAndMisShapedTensors) {
  const std::string k0 = "model.layers.1.self_attn.k_proj.weight";
  expect_load_error(
      [&](const HostWeights& w, SafetensorsWriter& out) {
        for (const auto& [n, t] : w.tensors)
          if (n != k0) out.add_bf16(n, t.shape, t.data);
      },
      k0, "missing tensor");
  expect_load_error(
      [&](const HostWeights& w, SafetensorsWriter& out) {
        for (const auto& [n, t] : w.tensors) out.add_bf16(n, t.shape, t.data);
        out.add_bf16("model.layers.2.mlp.up_proj.weight", {2}, {0, 0});
      },
      "model.layers.2.mlp.up_proj.weight", "unexpected tensor");
  expect_load_error(
      [&](const HostWeights& w, SafetensorsWriter& out) {
        for (const auto& [n, t] : w.tensors)
          out.add_bf16(n, n == k0 ? std::vector<std::int64_t>{128, 64} : t.shape, t.data);
      },
      k0, "shape mismatch");
  // Ignorable: RoPE inv_freq buffers.
  TempDir dir;
  const HostWeights w = write_tiny(dir);
  SafetensorsWriter out;
  for (const auto& [n, t] : w.tensors) out.add_bf16(n, t.shape, t.data);
  out.add_f32("model.layers.0.self_attn.rotary_emb.inv_freq", {32}, std::vector<float>(32, 1));
  out.write(dir.file("model.safetensors"));
  EXPECT_NO_THROW(load_checkpoint(dir.path()));
}

TEST(Weights, TiedCheckpointIgnoresSavedLmHead) {
  TempDir dir;
  const std::string cfg = R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 128,
      "intermediate_size": 256, "num_hidden_layers": 1, "num_attention_heads": 2,
      "tie_word_embeddings": true})";
  const HostWeights w = synthetic_weights(ModelConfig::from_json_text(cfg), 5);
  write_text(dir.file("config.json"), cfg);
  SafetensorsWriter out;
  for (const auto& [n, t] : w.tensors) out.add_bf16(n, t.shape, t.data);
  out.add_bf16("lm_head.weight", {64, 128}, w.at("model.embed_tokens.weight").data);
  out.write(dir.file("model.safetensors"));
  const HostWeights loaded = load_checkpoint(dir.path());
  EXPECT_EQ(loaded.tensors.count("lm_head.weight"), 0u);
  EXPECT_TRUE(loaded.config.tie_word_embeddings);
}

TEST(Weights, BadDirectoryAndConfig) {
  EXPECT_THROW(load_checkpoint("/nonexistent/ckpt"), Error);
  TempDir dir;
  write_tiny(dir);
  write_text(dir.file("config.json"), with(kTinyLlama, R"("mlp_bias": true)"));
  try {
    load_checkpoint(dir.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "mlp_bias");
    EXPECT_EQ(e.where(), dir.file("config.json"));
  }
}

}  // namespace
}  // namespace graphdecode
