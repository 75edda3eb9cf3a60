// Host-side setup of the model (no GPU): weight arena layout and packing (fused qkv / gate_up),
// the attention layout of a config and the step capacity of one or two models, RoPE parameters,
// greedy argmax and generation options.
#include <gtest/gtest.h>

#include <vector>

#include "common/error.h"
#include "engine/device_weights.h"
#include "engine/generate.h"
#include "engine/llama_model.h"
#include "engine/weights.h"

namespace graphdecode {
namespace {

TEST(LlamaSetup, ArenaFusesQkvAndGateUp) {
  const ModelConfig c = small_test_config();
  const HostWeights w = synthetic_weights(c, 3);
  const WeightArenaLayout a = WeightArenaLayout::compute(c);
  ASSERT_EQ(a.layers.size(), static_cast<std::size_t>(c.num_hidden_layers));
  const std::vector<std::uint16_t> img = pack_weight_arena(w, a);
  ASSERT_EQ(img.size(), a.total_elems);
  const std::size_t h = static_cast<std::size_t>(c.hidden_size);
  const std::size_t q = static_cast<std::size_t>(c.q_size());
  const std::size_t kv = static_cast<std::size_t>(c.kv_size());
  const std::size_t inter = static_cast<std::size_t>(c.intermediate_size);
  const auto& L = a.layers[1];
  EXPECT_EQ(L.qkv % WeightArenaLayout::kAlignElems, 0u);
  const auto& wk = w.at("model.layers.1.self_attn.k_proj.weight").data;
  const auto& wv = w.at("model.layers.1.self_attn.v_proj.weight").data;
  const auto& wu = w.at("model.layers.1.mlp.up_proj.weight").data;
  EXPECT_EQ(img[L.qkv + q * h], wk[0]);
  EXPECT_EQ(img[L.qkv + (q + kv) * h + 5], wv[5]);
  EXPECT_EQ(img[L.gate_up + inter * h + 7], wu[7]);
  EXPECT_EQ(a.lm_head == a.embed, c.tie_word_embeddings);
}

TEST(LlamaSetup, TiedEmbeddingSharesTheArena) {
  ModelConfig c = small_test_config();
  c.tie_word_embeddings = true;
  const WeightArenaLayout a = WeightArenaLayout::compute(c);
  EXPECT_EQ(a.lm_head, a.embed);
}

TEST(LlamaSetup, AttentionLayoutFollowsLayerKinds) {
  const ModelConfig c = small_test_config();
  const AttentionLayout a = llama_attention_layout(c);
  ASSERT_EQ(a.layers.size(), c.layers.size());
  for (std::size_t l = 0; l < c.layers.size(); ++l) {
    EXPECT_EQ(a.layers[l], c.layers[l].kind);
    if (c.layers[l].kind == AttentionKind::kSliding)
      EXPECT_EQ(a.window_left, c.layers[l].window_left);
  }
  RuntimeOptions o;
  const StepCapacity cap = step_capacity(o, std::span<const AttentionLayout>(&a, 1));
  ASSERT_EQ(cap.num_pools(), 2);
  EXPECT_EQ(cap.pools[0].geometry.kind, AttentionKind::kFull);
  EXPECT_EQ(cap.pools[1].geometry.kind, AttentionKind::kSliding);
  EXPECT_EQ(cap.pools[1].geometry.window_left, a.window_left);
}

// A target and a draft in one step: the draft's pools follow the target's, owned by model 1.
TEST(LlamaSetup, TwoModelsInOneStepEachHaveTheirPools) {
  const AttentionLayout target = llama_attention_layout(small_test_config());
  AttentionLayout draft = target;
  draft.layers = {AttentionKind::kFull};
  RuntimeOptions o;
  const AttentionLayout models[] = {target, draft};
  const StepCapacity cap = step_capacity(o, models);
  ASSERT_EQ(cap.num_pools(), 3);
  EXPECT_EQ(cap.pools[2].geometry.kind, AttentionKind::kFull);
  EXPECT_EQ(cap.pools[2].model, 1);
  const std::vector<LedgerPool> pools = ledger_pools(cap, o);
  ASSERT_EQ(pools.size(), 3u);
  EXPECT_EQ(pools[2].group, 1);
  EXPECT_EQ(pool_config(draft, o, AttentionKind::kFull).shape.num_layers, 1);
}

TEST(LlamaSetup, DifferentWindowsAreRefused) {
  ModelConfig c = small_test_config();
  c.layers[0] = {AttentionKind::kSliding, 7};
  c.layers[1] = {AttentionKind::kSliding, 15};
  EXPECT_THROW(llama_attention_layout(c), Error);
}

TEST(LlamaSetup, RopeConfigCarriesLlama3Scaling) {
  ModelConfig c = small_test_config();
  c.rope_scaling.type = RopeScalingType::kLlama3;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.original_max_position_embeddings = 8192;
  const RopeConfig r = llama_rope_config(c);
  EXPECT_EQ(r.scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(r.scaling.factor, 8.0);
  EXPECT_EQ(r.scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(r.head_dim, c.head_dim);
}

TEST(LlamaSetup, ArgmaxTakesTheFirstMaximum) {
  const std::vector<float> v = {0.f, 3.f, 1.f, 3.f};
  EXPECT_EQ(argmax(v), 1);
}

TEST(LlamaSetup, GenerationOptionsFitThePrompts) {
  const std::vector<std::vector<std::int32_t>> p = {{1, 2, 3}, {4, 5, 6, 7, 8}};
  GenerateOptions g;
  g.new_tokens = 10;
  const RuntimeOptions o = generation_runtime_options(p, g);
  EXPECT_EQ(o.max_batch, 2);
  EXPECT_EQ(o.max_tokens, 8);
  EXPECT_EQ(o.max_kv_len, 15);
  EXPECT_EQ(o.max_new_tokens, 5);
}

}  // namespace
}  // namespace graphdecode
