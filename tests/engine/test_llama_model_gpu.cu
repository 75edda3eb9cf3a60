// LlamaModel on the device: prefill + decode logits against the float64 CPU reference
// (llama_reference.h) on the same bf16 weights, and graph replay == eager (same shape) bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "common/stream.h"
#include "engine/generate.h"
#include "engine/llama_model.h"
#include "engine/weights.h"
#include "graphs/step_graphs.h"
#include "llama_reference.h"
#include "memory/page_allocator.h"
#include "memory/request_slots.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

class LlamaModelGpu : public testing::GpuTest {};

std::vector<std::vector<std::int32_t>> prompts_for(const ModelConfig& c) {
  std::vector<std::vector<std::int32_t>> p = {std::vector<std::int32_t>(5),
                                              std::vector<std::int32_t>(40)};
  for (std::size_t r = 0; r < p.size(); ++r)
    for (std::size_t i = 0; i < p[r].size(); ++i)
      p[r][i] = static_cast<std::int32_t>((r * 131 + i * 37 + 3) % c.vocab_size);
  return p;
}

TEST_F(LlamaModelGpu, PrefillAndDecodeMatchFloat64Reference) {
  const ModelConfig config = small_test_config();
  const HostWeights w = synthetic_weights(config, 7);
  const auto prompts = prompts_for(config);
  GenerateOptions opt;
  opt.new_tokens = 2;
  Stream stream;
  std::vector<std::vector<float>> logits;
  const GenerateResult r = generate_greedy(w, prompts, opt, stream.get(),
                                           [&](std::int32_t, std::span<const float> l, auto) {
                                             logits.emplace_back(l.begin(), l.end());
                                           });
  ASSERT_EQ(logits.size(), 2u);
  const auto V = static_cast<std::size_t>(config.vocab_size);
  for (std::size_t step = 0; step < 2; ++step) {
    for (std::size_t p = 0; p < prompts.size(); ++p) {
      std::vector<std::int32_t> seq = prompts[p];
      for (std::size_t s = 0; s < step; ++s) seq.push_back(r.tokens[p][s]);
      const std::vector<double> ref = testing::reference_last_logits(w, seq);
      double max_ref = 0, max_err = 0, err2 = 0, ref2 = 0;
      for (std::size_t i = 0; i < V; ++i) {
        const double got = logits[step][p * V + i];
        ASSERT_TRUE(std::isfinite(got)) << "step " << step << " prompt " << p << " vocab " << i;
        max_ref = std::max(max_ref, std::abs(ref[i]));
        max_err = std::max(max_err, std::abs(got - ref[i]));
        err2 += (got - ref[i]) * (got - ref[i]);
        ref2 += ref[i] * ref[i];
      }
      const double rel = std::sqrt(err2 / std::max(ref2, 1e-30));
      EXPECT_LT(rel, 0.03) << "step " << step << " prompt " << p << " max_err " << max_err
                           << " max_ref " << max_ref;
      EXPECT_LT(max_err, 0.05 * max_ref + 1e-4) << "step " << step << " prompt " << p;
    }
  }
}

// One decode step replayed from a graph, then the same step run eagerly with the same shape
// (tables already applied; the K/V it rewrites are the same values): logits bitwise equal.
TEST_F(LlamaModelGpu, GraphReplayEqualsEagerBitwise) {
  const ModelConfig config = small_test_config();
  const HostWeights w = synthetic_weights(config, 11);
  const auto prompts = prompts_for(config);
  GenerateOptions opt;
  opt.new_tokens = 2;
  const LlamaModelOptions mo = generation_model_options(prompts, opt);
  const StepCapacity cap = llama_step_capacity(config, mo);
  Stream stream;
  StepInput input(cap);
  LlamaModel model(w, mo, input, stream.get());
  StepGraphsConfig gc;
  gc.modes = {{StepMode::kDecode, 1}};
  StepGraphs graphs(input, model, gc);
  graphs.capture(stream.get());

  std::array<std::unique_ptr<PageAllocator>, kNumPoolKinds> alloc;
  std::array<std::unique_ptr<RequestSlots>, kNumPoolKinds> slots;
  std::array<std::unique_ptr<TableCommandBatch>, kNumPoolKinds> cmds;
  for (int k = 0; k < kNumPoolKinds; ++k) {
    if (!cap.pools[k].present) continue;
    alloc[k] = std::make_unique<PageAllocator>(cap.pools[k].geometry.num_pages);
    slots[k] = std::make_unique<RequestSlots>(cap.pools[k].geometry, *alloc[k]);
    cmds[k] =
        std::make_unique<TableCommandBatch>(cap.pools[k].max_commands, cap.pools[k].max_page_ids);
  }
  std::vector<StepRequest> req(prompts.size());
  std::vector<std::int32_t> ids;
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    for (int k = 0; k < kNumPoolKinds; ++k)
      if (slots[k]) req[p].slot = slots[k]->acquire();
    req[p].prefix_len = 0;
    req[p].extend_len = static_cast<std::int32_t>(prompts[p].size());
    for (int k = 0; k < kNumPoolKinds; ++k)
      if (slots[k]) slots[k]->extend(req[p].slot, req[p].extend_len, *cmds[k]);
    ids.insert(ids.end(), prompts[p].begin(), prompts[p].end());
  }
  StepDesc d;
  d.mode = StepMode::kExtend;
  d.requests = req;
  d.token_ids = ids;
  for (int k = 0; k < kNumPoolKinds; ++k) d.tables[k] = cmds[k].get();
  graphs.step(d, stream.get());
  for (auto& c : cmds)
    if (c) c->clear();

  ids.clear();
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    req[p].prefix_len = req[p].extend_len;
    req[p].extend_len = 1;
    ids.push_back(static_cast<std::int32_t>(p + 1));
    for (int k = 0; k < kNumPoolKinds; ++k)
      if (slots[k]) slots[k]->extend(req[p].slot, 1, *cmds[k]);
  }
  d.mode = StepMode::kDecode;
  d.tokens_per_request = 1;
  d.token_ids = ids;  // the span of the prefill step is stale after ids was refilled
  ASSERT_EQ(graphs.step(d, stream.get()), StepPath::kGraph);
  const std::size_t n = prompts.size() * static_cast<std::size_t>(config.vocab_size);
  std::vector<float> replay(n), eager(n);
  GD_CUDA(cudaMemcpyAsync(replay.data(), model.logits(), n * sizeof(float), cudaMemcpyDeviceToHost,
                          stream.get()));
  GD_CUDA(cudaStreamSynchronize(stream.get()));

  const GraphKey* key = graphs.find(StepMode::kDecode, 1, static_cast<std::int32_t>(req.size()));
  ASSERT_NE(key, nullptr);
  for (int k = 0; k < kNumPoolKinds; ++k) d.tables[k] = nullptr;  // already applied
  input.write(d);
  input.upload(stream.get());
  model.enqueue(StepShape{key->bucket, key_token_capacity(*key, cap.max_tokens)}, stream.get());
  GD_CUDA(cudaMemcpyAsync(eager.data(), model.logits(), n * sizeof(float), cudaMemcpyDeviceToHost,
                          stream.get()));
  GD_CUDA(cudaStreamSynchronize(stream.get()));
  EXPECT_EQ(std::memcmp(replay.data(), eager.data(), n * sizeof(float)), 0);
  for (float x : replay) ASSERT_TRUE(std::isfinite(x));
}

}  // namespace
}  // namespace graphdecode
