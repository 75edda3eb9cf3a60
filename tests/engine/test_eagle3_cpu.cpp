// EAGLE-3 heads on the CPU: the config (detection by architectures, draft vocabulary, aux layer
// ids), the tensors it needs, loading a head directory with every malformed input a named Error
// (missing tensor, wrong shape, wrong dtype, d2t out of range or not one-to-one, draft vocabulary
// larger than the target's, unsupported configs), the capture layers against a target, the fit,
// and the seeded synthetic head.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/spec/eagle_weights.h"
#include "safetensors_writer.h"
#include "support/field_of.h"

namespace graphdecode {
namespace {

using testing::field_of;
using testing::SafetensorsWriter;
using testing::TempDir;
using testing::write_text;

// small_test_config's shape as an EAGLE-3 head's config.json (one layer, a draft vocabulary of
// 256 of the 512 ids), as SpecForge writes one.
std::string head3_json(const std::string& extra = "", const std::string& arch = "Eagle3") {
  return R"({"model_type": "llama", "architectures": ["LlamaForCausalLM)" + arch +
         R"("], "vocab_size": 512, "draft_vocab_size": 256, "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 1, "num_attention_heads": 4,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "tie_word_embeddings": false)" +
         extra + "}";
}

// The target of these heads: small_test_config with 8 layers (the default capture layers
// [2, 4, 5] need 7).
ModelConfig target8() {
  ModelConfig c = small_test_config();
  c.num_hidden_layers = 8;
  c.layers.assign(8, LayerAttention{});
  c.validate();
  return c;
}

// The d2t offsets of `w`'s map (target id - draft id), as the checkpoint stores them.
std::vector<std::int64_t> d2t_of(const EagleWeights& w) {
  std::vector<std::int64_t> d(w.draft_to_target.size());
  for (std::size_t i = 0; i < d.size(); ++i)
    d[i] = static_cast<std::int64_t>(w.draft_to_target[i]) - static_cast<std::int64_t>(i);
  return d;
}

// Writes a head directory from `w`: its float tensors `keep` accepts, d2t (unless `d2t` is
// empty: then `w`'s map), a t2d of the vocabulary, and `extra` tensors.
void write_head3(const TempDir& dir, const std::string& config, const EagleWeights& w,
                 const std::function<bool(const std::string&)>& keep,
                 const std::function<void(SafetensorsWriter&)>& extra = {},
                 std::vector<std::int64_t> d2t = {}) {
  write_text(dir.file("config.json"), config);
  SafetensorsWriter out;
  for (const auto& [name, t] : w.tensors)
    if (keep(name)) out.add_bf16(name, t.shape, t.data);
  if (d2t.empty()) d2t = d2t_of(w);
  if (keep("d2t"))
    out.add_raw("d2t", "I64", {static_cast<std::int64_t>(d2t.size())}, d2t.data(), d2t.size() * 8);
  if (keep("t2d")) {
    std::vector<std::uint8_t> t2d(512, 0);
    for (std::int32_t t : w.draft_to_target) t2d[static_cast<std::size_t>(t)] = 1;
    out.add_raw("t2d", "BOOL", {512}, t2d.data(), t2d.size());
  }
  if (extra) extra(out);
  out.write(dir.file("model.safetensors"));
}

const auto keep_all = [](const std::string&) { return true; };

EagleWeights head256() {
  return synthetic_eagle3_weights(target8(), 5, 256);
}

TEST(Eagle3Weights, ConfigIsDetectedByArchitectureOrDraftVocabulary) {
  const EagleConfig c = eagle_config_from_json_text(head3_json(), "head");
  EXPECT_TRUE(c.eagle3());
  EXPECT_EQ(c.layer.family, ModelFamily::kLlama);
  EXPECT_EQ(c.draft_vocab_size, 256);
  EXPECT_EQ(c.target_hidden_size, 256);
  EXPECT_EQ(c.state_width(), 768);
  EXPECT_FALSE(c.fc_bias);  // EAGLE-3's default
  EXPECT_TRUE(c.input_norm);
  EXPECT_TRUE(c.aux_layer_ids.empty());
  // Without the architecture suffix, draft_vocab_size alone marks an EAGLE-3 head.
  EXPECT_TRUE(eagle_config_from_json_text(head3_json("", ""), "head").eagle3());
  EXPECT_TRUE(is_eagle3_config_text(head3_json()));
  EXPECT_FALSE(is_eagle3_config_text(R"({"architectures": ["LlamaForCausalLMEagle"]})"));
  EXPECT_FALSE(is_eagle3_config_text("{"));
  // Aux layers from eagle_config (SGLang) or the top level (vLLM's speculators configs).
  EXPECT_EQ(
      eagle_config_from_json_text(head3_json(R"(, "eagle_config": {"use_aux_hidden_state": true,
            "eagle_aux_hidden_state_layer_ids": [1, 3, 5]})"),
                                  "head")
          .aux_layer_ids,
      (std::vector<std::int32_t>{1, 3, 5}));
  EXPECT_EQ(eagle_config_from_json_text(
                head3_json(R"(, "eagle_aux_hidden_state_layer_ids": [0, 2, 4])"), "head")
                .aux_layer_ids,
            (std::vector<std::int32_t>{0, 2, 4}));
  const EagleConfig t = eagle_config_from_json_text(
      head3_json(R"(, "target_hidden_size": 512, "bias": true)"), "head");
  EXPECT_EQ(t.state_width(), 1536);
  EXPECT_TRUE(t.fc_bias);
}

TEST(Eagle3Weights, UnsupportedConfigsNameTheField) {
  EXPECT_EQ(field_of([] {
              eagle_config_from_json_text(head3_json(R"(, "draft_vocab_size": 600)"), "head");
            }),
            "draft_vocab_size");  // more draft ids than the vocabulary
  EXPECT_EQ(field_of([] {
              eagle_config_from_json_text(head3_json(R"(, "draft_vocab_size": 0)"), "head");
            }),
            "draft_vocab_size");
  EXPECT_EQ(field_of([] {
              eagle_config_from_json_text(head3_json(R"(, "draft_vocab_size": "all")"), "head");
            }),
            "draft_vocab_size");
  EXPECT_EQ(field_of([] {
              eagle_config_from_json_text(
                  R"({"model_type": "llama", "architectures": ["LlamaForCausalLMEagle3"],
                      "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
                      "num_hidden_layers": 2, "num_attention_heads": 4})",
                  "head");
            }),
            "num_hidden_layers");
  EXPECT_EQ(field_of([] {
              eagle_config_from_json_text(
                  head3_json(R"(, "eagle_config": {"use_aux_hidden_state": false})"), "head");
            }),
            "eagle_config.use_aux_hidden_state");
  EXPECT_EQ(field_of([] {
              eagle_config_from_json_text(
                  head3_json(R"(, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2]})"),
                  "head");
            }),
            "eagle_aux_hidden_state_layer_ids");
  EXPECT_EQ(field_of([] {
              eagle_config_from_json_text(
                  head3_json(R"(, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
                    "eagle_aux_hidden_state_layer_ids": [1, 2, 4])"),
                  "head");
            }),
            "eagle_aux_hidden_state_layer_ids");
  EXPECT_EQ(field_of([] {
              eagle_config_from_json_text(head3_json(R"(, "attention_bias": true)"), "head");
            }),
            "attention_bias");
  EXPECT_EQ(field_of([] {
              eagle_config_from_json_text(head3_json(R"(, "target_hidden_size": 12)"), "head");
            }),
            "target_hidden_size");
  EXPECT_EQ(field_of([] { eagle_config_from_json_text(head3_json(R"(, "bias": 1)"), "head"); }),
            "bias");
}

TEST(Eagle3Weights, ExpectedTensorsFollowTheConfig) {
  EagleConfig c = eagle_config_from_json_text(head3_json(), "head");
  std::vector<std::string> names;
  for (const TensorSpec& s : eagle_expected_tensors(c)) names.push_back(s.name);
  const std::vector<std::string> want = {"fc.weight",
                                         "midlayer.input_layernorm.weight",
                                         "midlayer.hidden_norm.weight",
                                         "midlayer.self_attn.q_proj.weight",
                                         "midlayer.self_attn.k_proj.weight",
                                         "midlayer.self_attn.v_proj.weight",
                                         "midlayer.self_attn.o_proj.weight",
                                         "midlayer.post_attention_layernorm.weight",
                                         "midlayer.mlp.gate_proj.weight",
                                         "midlayer.mlp.up_proj.weight",
                                         "midlayer.mlp.down_proj.weight",
                                         "norm.weight",
                                         "lm_head.weight"};
  EXPECT_EQ(names, want);
  const auto shape = [&](const std::string& n) {
    for (const TensorSpec& s : eagle_expected_tensors(c))
      if (s.name == n) return s.shape;
    return std::vector<std::int64_t>{};
  };
  EXPECT_EQ(shape("fc.weight"), (std::vector<std::int64_t>{256, 768}));
  EXPECT_EQ(shape("midlayer.self_attn.q_proj.weight"), (std::vector<std::int64_t>{256, 512}));
  EXPECT_EQ(shape("midlayer.self_attn.k_proj.weight"), (std::vector<std::int64_t>{128, 512}));
  EXPECT_EQ(shape("lm_head.weight"), (std::vector<std::int64_t>{256, 256}));
  c.own_embedding = c.fc_bias = true;
  EXPECT_EQ(shape("embed_tokens.weight"), (std::vector<std::int64_t>{512, 256}));
  EXPECT_EQ(shape("fc.bias"), (std::vector<std::int64_t>{256}));
}

TEST(Eagle3Weights, LoadsAHeadDirectory) {
  const EagleWeights w = head256();
  TempDir dir;
  write_head3(dir, head3_json(), w, keep_all);
  const EagleWeights got = load_eagle_head(dir.path());
  EXPECT_TRUE(got.config.eagle3());
  EXPECT_FALSE(got.config.own_embedding);
  EXPECT_EQ(got.tensors.size(), w.tensors.size());
  EXPECT_EQ(got.at("fc.weight").data, w.at("fc.weight").data);
  EXPECT_EQ(got.at("lm_head.weight").data, w.at("lm_head.weight").data);
  EXPECT_EQ(got.draft_to_target, w.draft_to_target);
  EXPECT_NE(got.draft_to_target.back(), 255) << "the synthetic map is not the identity";
  EXPECT_NO_THROW(check_eagle_fits(got.config, target8()));
  // Its own embedding, and F32 weights (rounded to bf16 as the target's are).
  TempDir dir2;
  std::vector<float> embed(512 * 256, 0.5f);
  write_head3(
      dir2, head3_json(), w, [](const std::string& n) { return n != "norm.weight"; },
      [&](SafetensorsWriter& out) {
        out.add_raw("embed_tokens.weight", "F32", {512, 256}, embed.data(), embed.size() * 4);
        std::vector<float> norm(256, 2.0f);
        out.add_f32("norm.weight", {256}, norm);
      });
  const EagleWeights got2 = load_eagle_head(dir2.path());
  EXPECT_TRUE(got2.config.own_embedding);
  EXPECT_EQ(got2.at("embed_tokens.weight").data.front(), 0x3f00);  // 0.5 in bf16
  EXPECT_EQ(got2.at("norm.weight").data.front(), 0x4000);          // 2.0 in bf16
  // A head of the whole vocabulary may omit d2t: the identity.
  const EagleWeights full = synthetic_eagle3_weights(target8(), 6, 512);
  TempDir dir3;
  write_head3(dir3, head3_json(R"(, "draft_vocab_size": 512)"), full,
              [](const std::string& n) { return n != "d2t"; });
  const EagleWeights got3 = load_eagle_head(dir3.path());
  for (std::int32_t i = 0; i < 512; ++i)
    ASSERT_EQ(got3.draft_to_target[static_cast<std::size_t>(i)], i);
}

TEST(Eagle3Weights, MalformedHeadsAreNamedErrors) {
  const EagleWeights w = head256();
  const std::string cfg = head3_json();
  const auto load = [](const TempDir& dir) { return [&dir] { load_eagle_head(dir.path()); }; };
  {  // a missing tensor
    TempDir dir;
    write_head3(dir, cfg, w,
                [](const std::string& n) { return n != "midlayer.hidden_norm.weight"; });
    EXPECT_EQ(field_of(load(dir)), "midlayer.hidden_norm.weight");
  }
  {  // fc over two states, not three
    TempDir dir;
    write_head3(
        dir, cfg, w, [](const std::string& n) { return n != "fc.weight"; },
        [](SafetensorsWriter& out) {
          out.add_bf16("fc.weight", {256, 512}, std::vector<std::uint16_t>(256 * 512));
        });
    EXPECT_EQ(field_of(load(dir)), "fc.weight");
  }
  {  // q_proj over one hidden, not the 2 hidden of cat(embedding, state)
    TempDir dir;
    write_head3(
        dir, cfg, w, [](const std::string& n) { return n != "midlayer.self_attn.q_proj.weight"; },
        [](SafetensorsWriter& out) {
          out.add_bf16("midlayer.self_attn.q_proj.weight", {256, 256},
                       std::vector<std::uint16_t>(256 * 256));
        });
    EXPECT_EQ(field_of(load(dir)), "midlayer.self_attn.q_proj.weight");
  }
  {  // lm_head of the whole vocabulary while the config says 256 draft ids
    TempDir dir;
    write_head3(
        dir, cfg, w, [](const std::string& n) { return n != "lm_head.weight"; },
        [](SafetensorsWriter& out) {
          out.add_bf16("lm_head.weight", {512, 256}, std::vector<std::uint16_t>(512 * 256));
        });
    EXPECT_EQ(field_of(load(dir)), "lm_head.weight");
  }
  {  // an EAGLE-1/2 layer in an EAGLE-3 head
    TempDir dir;
    write_head3(dir, cfg, w, keep_all, [](SafetensorsWriter& out) {
      out.add_bf16("layers.0.mlp.up_proj.weight", {512, 256},
                   std::vector<std::uint16_t>(512 * 256));
    });
    EXPECT_EQ(field_of(load(dir)), "layers.0.mlp.up_proj.weight");
  }
  {  // d2t missing while the draft vocabulary is smaller than the vocabulary
    TempDir dir;
    write_head3(dir, cfg, w, [](const std::string& n) { return n != "d2t"; });
    EXPECT_EQ(field_of(load(dir)), "d2t");
  }
  {  // d2t of the wrong length, and of the wrong dtype
    TempDir dir;
    std::vector<std::int64_t> short_map(100, 0);
    write_head3(dir, cfg, w, keep_all, {}, short_map);
    EXPECT_EQ(field_of(load(dir)), "d2t");
    TempDir dir2;
    write_head3(
        dir2, cfg, w, [](const std::string& n) { return n != "d2t"; },
        [](SafetensorsWriter& out) {
          std::vector<float> f(256, 0.f);
          out.add_f32("d2t", {256}, f);
        });
    EXPECT_EQ(field_of(load(dir2)), "d2t");
  }
  {  // d2t mapping a draft id past the vocabulary, or below 0
    std::vector<std::int64_t> d = d2t_of(w);
    d[17] = 512;  // 17 + 512
    TempDir dir;
    write_head3(dir, cfg, w, keep_all, {}, d);
    EXPECT_EQ(field_of(load(dir)), "d2t[17]");
    d = d2t_of(w);
    d[3] = -4;
    TempDir dir2;
    write_head3(dir2, cfg, w, keep_all, {}, d);
    EXPECT_EQ(field_of(load(dir2)), "d2t[3]");
  }
  {  // two draft ids mapped to one target id
    std::vector<std::int64_t> d = d2t_of(w);
    d[9] = static_cast<std::int64_t>(w.draft_to_target[8]) - 9;
    TempDir dir;
    write_head3(dir, cfg, w, keep_all, {}, d);
    EXPECT_EQ(field_of(load(dir)), "d2t[9]");
  }
  {  // t2d of another vocabulary
    TempDir dir;
    write_head3(
        dir, cfg, w, [](const std::string& n) { return n != "t2d"; },
        [](SafetensorsWriter& out) {
          std::vector<std::uint8_t> t2d(1000, 0);
          out.add_raw("t2d", "BOOL", {1000}, t2d.data(), t2d.size());
        });
    EXPECT_EQ(field_of(load(dir)), "t2d");
  }
  {  // an integer tensor where a weight belongs
    TempDir dir;
    write_head3(
        dir, cfg, w, [](const std::string& n) { return n != "norm.weight"; },
        [](SafetensorsWriter& out) {
          std::vector<std::int64_t> v(256, 1);
          out.add_raw("norm.weight", "I64", {256}, v.data(), v.size() * 8);
        });
    EXPECT_EQ(field_of(load(dir)), "norm.weight");
  }
  {  // an EAGLE-3 config whose draft vocabulary exceeds the vocabulary
    TempDir dir;
    write_head3(dir, head3_json(R"(, "draft_vocab_size": 513)"), w, keep_all);
    EXPECT_EQ(field_of(load(dir)), "draft_vocab_size");
  }
}

TEST(Eagle3Weights, CaptureLayersArePinnedAndChecked) {
  EagleConfig c = eagle_config_from_json_text(head3_json(), "head");
  ModelConfig t = target8();
  // Default: the stream entering layers 2, L/2, L-3.
  EXPECT_EQ(eagle3_capture_layers(c, t), (std::array<std::int32_t, 3>{2, 4, 5}));
  t.num_hidden_layers = 32;
  t.layers.assign(32, LayerAttention{});
  EXPECT_EQ(eagle3_capture_layers(c, t), (std::array<std::int32_t, 3>{2, 16, 29}));
  // Config ids name layer outputs (SGLang's + 1), in any order: ascending capture points.
  c.aux_layer_ids = {30, 1, 15};
  EXPECT_EQ(eagle3_capture_layers(c, t), (std::array<std::int32_t, 3>{2, 16, 31}));
  c.aux_layer_ids = {1, 15, 31};  // the last layer's output: captured by neither engine
  EXPECT_EQ(field_of([&] { eagle3_capture_layers(c, t); }), "eagle.aux_layer_ids");
  c.aux_layer_ids = {1, 1, 5};
  EXPECT_EQ(field_of([&] { eagle3_capture_layers(c, t); }), "eagle.aux_layer_ids");
  c.aux_layer_ids.clear();
  EXPECT_EQ(field_of([&] { eagle3_capture_layers(c, small_test_config()); }),
            "eagle.aux_layer_ids");  // 4 layers: the default [2, 2, 1] is not three layers
}

TEST(Eagle3Weights, TheHeadMustFitTheTarget) {
  const EagleConfig c = eagle_config_from_json_text(head3_json(), "head");
  EXPECT_NO_THROW(check_eagle_fits(c, target8()));
  ModelConfig t = target8();
  t.vocab_size = 1000;
  EXPECT_EQ(field_of([&] { check_eagle_fits(c, t); }), "eagle.vocab_size");
  t = target8();
  t.hidden_size = 512;
  EXPECT_EQ(field_of([&] { check_eagle_fits(c, t); }), "eagle.target_hidden_size");
  // A target of another width with target_hidden_size set: the head needs its own embedding.
  EagleConfig wide =
      eagle_config_from_json_text(head3_json(R"(, "target_hidden_size": 512)"), "head");
  EXPECT_EQ(field_of([&] { check_eagle_fits(wide, t); }), "eagle.hidden_size");
  wide.own_embedding = true;
  t.intermediate_size = 1024;
  EXPECT_NO_THROW(check_eagle_fits(wide, t));
  EXPECT_EQ(field_of([&] { check_eagle_fits(c, small_test_config()); }), "eagle.aux_layer_ids");
}

TEST(Eagle3Weights, SyntheticHeadsAreSeededAndComplete) {
  const ModelConfig target = target8();
  const EagleWeights a = synthetic_eagle3_weights(target, 1);
  const EagleWeights b = synthetic_eagle3_weights(target, 1);
  const EagleWeights c = synthetic_eagle3_weights(target, 2);
  EXPECT_TRUE(a.config.eagle3());
  EXPECT_EQ(a.config.draft_vocab_size, 256);
  EXPECT_EQ(a.tensors.size(), eagle_expected_tensors(a.config).size());
  EXPECT_EQ(a.at("fc.weight").data, b.at("fc.weight").data);
  EXPECT_EQ(a.draft_to_target, b.draft_to_target);
  EXPECT_NE(a.at("fc.weight").data, c.at("fc.weight").data);
  EXPECT_NE(a.draft_to_target, c.draft_to_target);
  EXPECT_TRUE(std::is_sorted(a.draft_to_target.begin(), a.draft_to_target.end()));
  EXPECT_NO_THROW(check_eagle_fits(a.config, target));
  // A 4-layer target gets explicit capture layers that fit it.
  const EagleWeights small = synthetic_eagle3_weights(small_test_config(), 1);
  EXPECT_EQ(eagle3_capture_layers(small.config, small_test_config()),
            (std::array<std::int32_t, 3>{1, 2, 3}));
  EXPECT_NO_THROW(check_eagle_fits(small.config, small_test_config()));
}

}  // namespace
}  // namespace graphdecode
