// EAGLE heads on the CPU: the tensors a head config needs, loading a head directory (config.json +
// safetensors) with every malformed input a named Error, the fit against a target, the seeded
// synthetic head; and where the head's rows sit (eagle_prep_host, the twin of the device kernel):
// hand-checked blocks of a prefill and a speculative step, and random batches against a direct
// enumeration of the pairs (token_q, h_{q-1}) at position q - 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/spec/eagle_prep.h"
#include "engine/spec/eagle_rules.h"
#include "engine/spec/eagle_weights.h"
#include "graphs/step_prep.h"
#include "safetensors_writer.h"
#include "support/field_of.h"

namespace graphdecode {
namespace {

using testing::SafetensorsWriter;
using testing::TempDir;
using testing::write_text;

// small_test_config's shape as an EAGLE head's config.json (one layer).
std::string head_json(const std::string& extra = "", int layers = 1) {
  return R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 512,
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": )" +
         std::to_string(layers) + R"(, "num_attention_heads": 4, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0)" +
         extra + "}";
}

// Writes a head directory from `w`, dropping names `drop` rejects and adding `extra` tensors.
void write_head(const TempDir& dir, const std::string& config, const EagleWeights& w,
                const std::function<bool(const std::string&)>& keep,
                const std::function<void(SafetensorsWriter&)>& extra = {}) {
  write_text(dir.file("config.json"), config);
  SafetensorsWriter out;
  for (const auto& [name, t] : w.tensors)
    if (keep(name)) out.add_bf16(name, t.shape, t.data);
  if (extra) extra(out);
  out.write(dir.file("model.safetensors"));
}

const auto keep_all = [](const std::string&) { return true; };

using testing::field_of;

TEST(EagleWeights, ExpectedTensorsFollowTheConfig) {
  EagleConfig c = eagle_config_from_json_text(head_json(), "head");
  EXPECT_TRUE(c.fc_bias);  // EAGLE's default
  std::vector<std::string> names;
  for (const TensorSpec& s : eagle_expected_tensors(c)) names.push_back(s.name);
  const std::vector<std::string> want = {"fc.weight",
                                         "fc.bias",
                                         "layers.0.self_attn.q_proj.weight",
                                         "layers.0.self_attn.k_proj.weight",
                                         "layers.0.self_attn.v_proj.weight",
                                         "layers.0.self_attn.o_proj.weight",
                                         "layers.0.post_attention_layernorm.weight",
                                         "layers.0.mlp.gate_proj.weight",
                                         "layers.0.mlp.up_proj.weight",
                                         "layers.0.mlp.down_proj.weight"};
  EXPECT_EQ(names, want);
  EXPECT_EQ(eagle_expected_tensors(c)[0].shape, (std::vector<std::int64_t>{256, 512}));
  c = eagle_config_from_json_text(head_json(R"(, "bias": false)"), "head");
  c.input_norm = c.own_embedding = true;
  names.clear();
  for (const TensorSpec& s : eagle_expected_tensors(c)) names.push_back(s.name);
  EXPECT_EQ(names.front(), "embed_tokens.weight");
  EXPECT_EQ(std::count(names.begin(), names.end(), "fc.bias"), 0);
  EXPECT_EQ(std::count(names.begin(), names.end(), "layers.0.input_layernorm.weight"), 1);
  c = eagle_config_from_json_text(head_json(R"(, "qkv_bias": true)"), "head");
  names.clear();
  for (const TensorSpec& s : eagle_expected_tensors(c)) names.push_back(s.name);
  EXPECT_EQ(std::count(names.begin(), names.end(), "layers.0.self_attn.k_proj.bias"), 1);
  EXPECT_EQ(std::count(names.begin(), names.end(), "layers.0.self_attn.o_proj.bias"), 0);
  // A converted head naming the draft class is read as its base family.
  std::string sglang = head_json();
  sglang.replace(sglang.find("LlamaForCausalLM"), 16, "LlamaForCausalLMEagle");
  EXPECT_EQ(eagle_config_from_json_text(sglang, "head").layer.family, ModelFamily::kLlama);
}

TEST(EagleWeights, ConfigErrorsNameTheField) {
  EXPECT_EQ(field_of([] { eagle_config_from_json_text(head_json("", 2), "head"); }),
            "num_hidden_layers");
  EXPECT_EQ(field_of([] {
              eagle_config_from_json_text(head_json(R"(, "draft_vocab_size": 32000)"), "head");
            }),
            "draft_vocab_size");
  EXPECT_EQ(field_of([] { eagle_config_from_json_text(head_json(R"(, "bias": 1)"), "head"); }),
            "bias");
  EXPECT_EQ(
      field_of([] { eagle_config_from_json_text(head_json(R"(, "qkv_bias": "yes")"), "head"); }),
      "qkv_bias");
  EXPECT_EQ(field_of([] { eagle_config_from_json_text("{", "head"); }), "json");
}

TEST(EagleWeights, LoadsAHeadDirectoryAndDetectsOptionalTensors) {
  const EagleWeights w = synthetic_eagle_weights(small_test_config(), 5);
  TempDir dir;
  HostTensor norm;
  norm.shape = {256};
  norm.data.assign(256, 0x3f80);
  HostTensor embed;
  embed.shape = {512, 256};
  embed.data.assign(512 * 256, 0x3c00);
  write_head(dir, head_json(), w, keep_all, [&](SafetensorsWriter& out) {
    out.add_bf16("layers.0.input_layernorm.weight", norm.shape, norm.data);
    out.add_bf16("embed_tokens.weight", embed.shape, embed.data);
    out.add_bf16("layers.0.self_attn.rotary_emb.inv_freq", {32}, std::vector<std::uint16_t>(32));
  });
  const EagleWeights got = load_eagle_head(dir.path());
  EXPECT_TRUE(got.config.input_norm);
  EXPECT_TRUE(got.config.own_embedding);
  EXPECT_TRUE(got.config.fc_bias);
  EXPECT_EQ(got.at("fc.weight").data, w.at("fc.weight").data);
  EXPECT_EQ(got.at("layers.0.mlp.down_proj.weight").data,
            w.at("layers.0.mlp.down_proj.weight").data);
  EXPECT_EQ(got.at("embed_tokens.weight").data, embed.data);
  EXPECT_EQ(got.tensors.size(), w.tensors.size() + 2);
  EXPECT_NO_THROW(check_eagle_fits(got.config, small_test_config()));
}

TEST(EagleWeights, MalformedHeadsAreNamedErrors) {
  const EagleWeights w = synthetic_eagle_weights(small_test_config(), 5);
  {  // a missing tensor
    TempDir dir;
    write_head(dir, head_json(), w, [](const std::string& n) { return n != "fc.weight"; });
    EXPECT_EQ(field_of([&] { load_eagle_head(dir.path()); }), "fc.weight");
  }
  {  // config says bias, the checkpoint has none
    TempDir dir;
    write_head(dir, head_json(R"(, "bias": true)"), w,
               [](const std::string& n) { return n != "fc.bias"; });
    EXPECT_EQ(field_of([&] { load_eagle_head(dir.path()); }), "fc.bias");
  }
  {  // fc over one hidden state, not two
    TempDir dir;
    write_head(
        dir, head_json(), w, [](const std::string& n) { return n != "fc.weight"; },
        [](SafetensorsWriter& out) {
          out.add_bf16("fc.weight", {256, 256}, std::vector<std::uint16_t>(256 * 256));
        });
    EXPECT_EQ(field_of([&] { load_eagle_head(dir.path()); }), "fc.weight");
  }
  {  // a tensor of another architecture
    TempDir dir;
    write_head(dir, head_json(), w, keep_all, [](SafetensorsWriter& out) {
      out.add_bf16("lm_head.weight", {512, 256}, std::vector<std::uint16_t>(512 * 256));
    });
    EXPECT_EQ(field_of([&] { load_eagle_head(dir.path()); }), "lm_head.weight");
  }
  {  // EAGLE-3's draft-to-target map
    TempDir dir;
    write_head(dir, head_json(), w, keep_all, [](SafetensorsWriter& out) {
      out.add_raw("d2t", "F32", {4}, std::vector<float>(4).data(), 16);
    });
    try {
      load_eagle_head(dir.path());
      ADD_FAILURE() << "an EAGLE-3 tensor was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), "d2t");
      EXPECT_NE(std::string(e.what()).find("EAGLE-3"), std::string::npos) << e.what();
    }
  }
  {  // no config
    TempDir dir;
    SafetensorsWriter().write(dir.file("model.safetensors"));
    EXPECT_EQ(field_of([&] { load_eagle_head(dir.path()); }), "path");
  }
  EXPECT_EQ(field_of([] { load_eagle_head("/nonexistent/eagle"); }), "path");
}

TEST(EagleWeights, TheHeadMustFitTheTarget) {
  const EagleConfig c = eagle_config_from_json_text(head_json(), "head");
  ModelConfig target = small_test_config();
  EXPECT_NO_THROW(check_eagle_fits(c, target));
  target.hidden_size = 512;
  EXPECT_EQ(field_of([&] { check_eagle_fits(c, target); }), "eagle.hidden_size");
  target = small_test_config();
  target.vocab_size = 1000;
  EXPECT_EQ(field_of([&] { check_eagle_fits(c, target); }), "eagle.vocab_size");
}

TEST(EagleWeights, SyntheticHeadsAreSeededAndComplete) {
  const ModelConfig target = small_test_config();  // has sliding layers; the head has none
  const EagleWeights a = synthetic_eagle_weights(target, 1);
  const EagleWeights b = synthetic_eagle_weights(target, 1);
  const EagleWeights c = synthetic_eagle_weights(target, 2);
  EXPECT_EQ(a.tensors.size(), eagle_expected_tensors(a.config).size());
  EXPECT_FALSE(a.config.layer.any_sliding());
  EXPECT_EQ(a.at("fc.weight").data, b.at("fc.weight").data);
  EXPECT_NE(a.at("fc.weight").data, c.at("fc.weight").data);
  EXPECT_NO_THROW(check_eagle_fits(a.config, target));
}

// ---- where the head's rows sit ------------------------------------------------------------------

StepCapacity capacity() {
  StepCapacity c;
  c.max_batch = 4;
  c.max_tokens = 16;
  c.max_slots = 9;
  c.max_kv_len = 256;
  c.max_logit_rows = 16;
  c.max_draft_tokens = 3;
  return c;
}

struct HeadBlocks {
  StepCapacity cap;
  StepMetaLayout layout;
  std::vector<std::int32_t> x, e, d1, d2, src;
  StepMetaView xv, ev, d1v, d2v;
  HeadBlocks(const StepCapacity& c, const StepDesc& d, std::int32_t carry_rows, std::int32_t k,
             std::span<const std::int32_t> starts_at_hit = {})
      : cap(c), layout(StepMetaLayout::compute(c)) {
    const StepImageWriter w(cap);
    std::vector<std::int32_t> image(w.layout().total_words, 0);
    w.write(d, image);
    for (auto* b : {&x, &e, &d1, &d2}) b->assign(layout.total_words, -99);
    src.assign(static_cast<std::size_t>(cap.max_tokens), -99);
    prep_step_host(StepInputView::over(image.data(), w.layout()), cap, x);
    xv = StepMetaView::over(x.data(), layout);
    ev = StepMetaView::over(e.data(), layout);
    d1v = StepMetaView::over(d1.data(), layout);
    d2v = StepMetaView::over(d2.data(), layout);
    const StepMetaView decodes[] = {d1v, d2v};
    eagle_prep_host(xv, cap, carry_rows, cap.max_draft_tokens + 1, k, ev, src, decodes,
                    starts_at_hit);
  }
};

std::vector<int> range(const std::int32_t* p, int n) {
  return std::vector<int>(p, p + n);
}

TEST(EaglePrep, PrefillChunksHandChecked) {
  // A one-token first chunk (slot 3), a first chunk of 4 (slot 5), a later chunk of 3 at 6
  // (slot 2). The first two lose their position-0 row; the third's row 0 reads the carry.
  StepDesc d;
  d.mode = StepMode::kExtend;
  const std::vector<StepRequest> req = {{3, 0, 1, 0}, {5, 0, 4, 0}, {2, 6, 3, 0}};
  const std::vector<std::int32_t> ids = {100, 200, 201, 202, 203, 300, 301, 302};
  d.requests = req;
  d.token_ids = ids;
  const HeadBlocks b(capacity(), d, 1, 0);
  const StepMetaView& e = b.ev;
  EXPECT_EQ(e.scalars[StepMetaLayout::kNumRequests], 3);
  EXPECT_EQ(e.scalars[StepMetaLayout::kNumTokens], 6);
  EXPECT_EQ(e.scalars[StepMetaLayout::kMaxQLen], 3);
  EXPECT_EQ(e.scalars[StepMetaLayout::kMaxKvLen], 8);
  EXPECT_EQ(e.scalars[StepMetaLayout::kTotalKv], 11);
  EXPECT_EQ(range(e.q_start, 5), (std::vector<int>{0, 0, 3, 6, 6}));
  EXPECT_EQ(range(e.kv_len, 4), (std::vector<int>{0, 3, 8, 0}));
  EXPECT_EQ(range(e.cu_seqlens_k, 5), (std::vector<int>{0, 0, 3, 11, 11}));
  EXPECT_EQ(range(e.slot, 4), (std::vector<int>{3, 5, 2, 0}));
  EXPECT_EQ(range(e.token_id, 7), (std::vector<int>{201, 202, 203, 300, 301, 302, 0}));
  EXPECT_EQ(range(e.token_position, 7), (std::vector<int>{0, 1, 2, 5, 6, 7, 0}));
  EXPECT_EQ(range(e.token_request, 7), (std::vector<int>{1, 1, 1, 2, 2, 2, -1}));
  EXPECT_EQ(range(e.token_slot, 7), (std::vector<int>{5, 5, 5, 2, 2, 2, 0}));
  // Hidden sources: the step rows before (1, 2, 3; 5, 6), slot 2's carry row 0 (code -1 - 2*4).
  EXPECT_EQ(range(b.src.data(), 7), (std::vector<int>{1, 2, 3, -9, 5, 6, 0}));
  EXPECT_EQ(range(e.logit_row, 3), (std::vector<int>{0, 2, 5}));
}

TEST(EaglePrep, ChunkAtAPrefixHitDropsRowZero) {
  // Slot 4 starts at its prefix hit 8 with a chunk of 3, slot 6 is a later chunk of 2 at 5 (not
  // a hit), slot 1 starts at its hit 4 with one token. The head holds position hit - 1 already
  // (a shared page): the hit requests lose row 0, and no row reads a carried state.
  StepDesc d;
  d.mode = StepMode::kExtend;
  const std::vector<StepRequest> req = {{4, 8, 3, 0}, {6, 5, 2, 0}, {1, 4, 1, 0}};
  const std::vector<std::int32_t> ids = {80, 81, 82, 50, 51, 40};
  d.requests = req;
  d.token_ids = ids;
  const std::vector<std::int32_t> at_hit = {1, 0, 1, 0};
  const HeadBlocks b(capacity(), d, 1, 0, at_hit);
  const StepMetaView& e = b.ev;
  EXPECT_EQ(e.scalars[StepMetaLayout::kNumRequests], 3);
  EXPECT_EQ(e.scalars[StepMetaLayout::kNumTokens], 4);
  EXPECT_EQ(e.scalars[StepMetaLayout::kMaxQLen], 2);
  EXPECT_EQ(range(e.q_start, 5), (std::vector<int>{0, 2, 4, 4, 4}));
  EXPECT_EQ(range(e.kv_len, 4), (std::vector<int>{10, 6, 4, 0}));  // positions [0, hit + c - 1)
  EXPECT_EQ(range(e.token_id, 5), (std::vector<int>{81, 82, 50, 51, 0}));
  EXPECT_EQ(range(e.token_position, 5), (std::vector<int>{8, 9, 4, 5, 0}));
  EXPECT_EQ(range(e.token_request, 5), (std::vector<int>{0, 0, 1, 1, -1}));
  // Slot 4's rows read the step rows before them (0, 1); slot 6's row 0 its carry (-1 - 6*4).
  EXPECT_EQ(range(b.src.data(), 5), (std::vector<int>{0, 1, -25, 3, 0}));
  // Slot 1 has no rows: no logit row of its own (the last row before it).
  EXPECT_EQ(range(e.logit_row, 3), (std::vector<int>{1, 3, 3}));
  // Without the marks the same block writes position hit - 1 (the control).
  const HeadBlocks plain(capacity(), d, 1, 0);
  EXPECT_EQ(plain.ev.scalars[StepMetaLayout::kNumTokens], 6);
  EXPECT_EQ(range(plain.ev.token_position, 3), (std::vector<int>{7, 8, 9}));
}

TEST(EaglePrep, SpeculativeStepHandChecked) {
  // Slots 7 and 2 committed 2 and 1 tokens; their last committed tokens sit at 11 and 4.
  StepDesc d;
  d.mode = StepMode::kSpeculative;
  d.tokens_per_request = 3;
  const std::vector<StepRequest> req = {{7, 10, 2, 0}, {2, 4, 1, 0}};
  const std::vector<std::int32_t> ids = {11, 12, 21};
  d.requests = req;
  d.token_ids = ids;
  const HeadBlocks b(capacity(), d, 4, 3);
  EXPECT_EQ(range(b.ev.kv_len, 3), (std::vector<int>{11, 4, 0}));
  EXPECT_EQ(range(b.ev.token_position, 4), (std::vector<int>{9, 10, 3, 0}));
  EXPECT_EQ(range(b.ev.token_id, 3), (std::vector<int>{11, 12, 21}));
  EXPECT_EQ(range(b.src.data(), 4), (std::vector<int>{-29, -30, -9, 0}));  // all carried
  EXPECT_EQ(range(b.ev.logit_row, 3), (std::vector<int>{1, 2, 0}));
  // Head decode j: d_j at P + j - 1, extent P + j.
  EXPECT_EQ(range(b.d1v.token_position, 3), (std::vector<int>{11, 4, 0}));
  EXPECT_EQ(range(b.d1v.kv_len, 3), (std::vector<int>{12, 5, 0}));
  EXPECT_EQ(range(b.d2v.token_position, 3), (std::vector<int>{12, 5, 0}));
  EXPECT_EQ(range(b.d2v.kv_len, 3), (std::vector<int>{13, 6, 0}));
  EXPECT_EQ(b.d2v.scalars[StepMetaLayout::kNumTokens], 2);
}

// Random prefill and speculative batches: the head's rows against a direct enumeration.
TEST(EaglePrep, RandomBatchesMatchADirectEnumeration) {
  std::mt19937_64 rng(11);
  StepCapacity cap = capacity();
  cap.max_batch = 6;
  cap.max_tokens = 40;
  cap.max_slots = 13;
  cap.max_logit_rows = 40;
  for (int trial = 0; trial < 200; ++trial) {
    const bool spec = trial % 2 == 1;
    const std::int32_t n = 1 + static_cast<std::int32_t>(rng() % 6);
    StepDesc d;
    d.mode = spec ? StepMode::kSpeculative : StepMode::kExtend;
    d.tokens_per_request = spec ? 2 : 0;
    std::vector<StepRequest> req;
    std::vector<std::int32_t> ids;
    for (std::int32_t r = 0; r < n; ++r) {
      const std::int32_t len = 1 + static_cast<std::int32_t>(rng() % (spec ? 4 : 6));
      const std::int32_t prefix = spec || rng() % 2 ? 1 + static_cast<std::int32_t>(rng() % 50) : 0;
      req.push_back({r + 1 + static_cast<std::int32_t>(rng() % 2) * 6, prefix, len, 0});
      for (std::int32_t i = 0; i < len; ++i) ids.push_back(1000 * r + i);
    }
    d.requests = req;
    d.token_ids = ids;
    const std::int32_t carry_rows = spec ? cap.max_draft_tokens + 1 : 1;
    const HeadBlocks b(cap, d, carry_rows, spec ? 2 : 0);
    // Direct: request r's rows q = prefix .. prefix + len - 1 with q >= 1 become head rows at
    // q - 1, in order; hidden: carry row i for i < carry_rows, else step row t - 1.
    std::int32_t h = 0, t = 0;
    for (std::int32_t r = 0; r < n; ++r) {
      const StepRequest& s = req[static_cast<std::size_t>(r)];
      EXPECT_EQ(b.ev.q_start[r], h) << trial;
      EXPECT_EQ(b.ev.kv_len[r], s.prefix_len + s.extend_len - 1) << trial;
      for (std::int32_t i = 0; i < s.extend_len; ++i, ++t) {
        if (s.prefix_len + i == 0) continue;
        EXPECT_EQ(b.ev.token_position[h], s.prefix_len + i - 1) << trial;
        EXPECT_EQ(b.ev.token_id[h], ids[static_cast<std::size_t>(t)]) << trial;
        EXPECT_EQ(b.ev.token_request[h], r) << trial;
        const std::int32_t want =
            i < carry_rows ? eagle_rules::carry_code(s.slot, i, cap.max_draft_tokens + 1) : t - 1;
        EXPECT_EQ(b.src[static_cast<std::size_t>(h)], want) << trial;
        ++h;
      }
    }
    EXPECT_EQ(b.ev.q_start[n], h) << trial;
    EXPECT_EQ(b.ev.scalars[StepMetaLayout::kNumTokens], h) << trial;
    for (std::int32_t r = 0; r < n; ++r)  // causal: keys before the first row are the prefix
      EXPECT_GE(b.ev.kv_len[r], b.ev.q_start[r + 1] - b.ev.q_start[r]) << trial;
    if (spec) {  // decode 1: one row at P, extent P + 1 (P = the last committed position)
      for (std::int32_t r = 0; r < n; ++r) {
        const StepRequest& s = req[static_cast<std::size_t>(r)];
        EXPECT_EQ(b.d1v.token_position[r], s.prefix_len + s.extend_len - 1) << trial;
        EXPECT_EQ(b.d1v.kv_len[r], s.prefix_len + s.extend_len) << trial;
      }
    }
  }
}

}  // namespace
}  // namespace graphdecode
