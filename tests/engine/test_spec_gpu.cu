// Speculative decoding on the device: the spec prep kernel word for word against its CPU twin;
// whole speculative steps of a target (full + sliding-window layers, prompts longer than the
// window) and a draft model, graphs on and off, k changing from step to step (0 included),
// against plain greedy decoding of the target: the same tokens, except where the target's own
// top-2 gap is within bf16 noise (reported, counted, and bounded). Drafts: the target itself
// (every draft accepted), the target with a noisy LM head (part accepted), an unrelated model
// (none accepted), prompt lookup. The prompt-lookup kernel against its CPU rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention/reference.h"
#include "attention_check.h"  // test_rng / seed_note / sanitize_mode
#include "common/stream.h"
#include "engine/generate.h"
#include "engine/llama_model.h"
#include "engine/row_sampler.h"
#include "engine/runtime/model_runtime.h"
#include "engine/runtime/step_context.h"
#include "engine/spec/proposer.h"
#include "engine/spec/spec_book.h"
#include "engine/spec/spec_prep.h"
#include "engine/spec/spec_rules.h"
#include "engine/spec/spec_step.h"
#include "engine/weights.h"
#include "engine_checks.h"
#include "graphs/step_graphs.h"
#include "llama_reference.h"
#include "spec_run.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

class SpecGpu : public testing::GpuTest {};

// ---- the spec prep kernel against its CPU twin --------------------------------------------------

TEST_F(SpecGpu, SpecPrepMatchesItsCpuTwin) {
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  StepCapacity cap;
  cap.max_batch = 24;
  cap.max_tokens = 240;
  cap.max_slots = 40;
  cap.max_kv_len = 4000;
  cap.max_encoder_len = 50;
  cap.max_logit_rows = 240;
  cap.max_draft_tokens = 7;
  Stream stream;
  StepInput input(cap);
  StepPrep prep(input);
  SpecPrep spec(prep, cap.max_draft_tokens);
  const StepMetaLayout& layout = prep.layout();
  for (int step = 0; step < 40; ++step) {
    const std::int32_t k = static_cast<std::int32_t>(rng() % 8);
    const std::int32_t n = 1 + static_cast<std::int32_t>(rng() % 24);
    std::vector<StepRequest> req;
    std::vector<std::int32_t> ids, slots(static_cast<std::size_t>(cap.max_slots - 1));
    std::iota(slots.begin(), slots.end(), 1);
    std::shuffle(slots.begin(), slots.end(), rng);
    for (std::int32_t r = 0; r < n; ++r) {
      const std::int32_t c = 1 + static_cast<std::int32_t>(rng() % 8);
      const std::int32_t prefix = static_cast<std::int32_t>(rng() % (cap.max_kv_len - c - k));
      req.push_back(
          {slots[static_cast<std::size_t>(r)], prefix, c, static_cast<std::int32_t>(rng() % 51)});
      for (std::int32_t i = 0; i < c; ++i) ids.push_back(static_cast<std::int32_t>(rng() % 1000));
    }
    StepDesc d;
    d.mode = StepMode::kSpeculative;
    d.tokens_per_request = k;
    d.requests = req;
    d.token_ids = ids;
    input.write(d);
    input.upload(stream);
    prep.enqueue(stream);
    spec.enqueue(k, stream);
    std::vector<std::int32_t> x(layout.total_words);
    prep.download(x, stream);
    std::vector<std::vector<std::int32_t>> want(static_cast<std::size_t>(std::max(1, k)),
                                                std::vector<std::int32_t>(layout.total_words, 0));
    std::vector<StepMetaView> decodes;
    for (std::int32_t j = 1; j < k; ++j)
      decodes.push_back(StepMetaView::over(want[static_cast<std::size_t>(j)].data(), layout));
    spec_prep_host(StepMetaView::over(x.data(), layout), cap, k,
                   StepMetaView::over(want[0].data(), layout), decodes);
    for (std::int32_t j = 0; j < std::max(1, k); ++j) {
      std::vector<std::int32_t> got(layout.total_words);
      spec.download(j, got, stream);
      // Words the kernel never writes (scalars past kLogitRows, alignment gaps) are zero on both.
      ASSERT_EQ(got, want[static_cast<std::size_t>(j)])
          << "step " << step << " k " << k << (j == 0 ? " verify" : " decode ") << j;
    }
  }
}

// ---- prompt lookup on the device against its CPU rule -------------------------------------------

TEST_F(SpecGpu, PromptLookupProposesWhatTheCpuRuleProposes) {
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  StepCapacity cap;
  cap.max_batch = 8;
  cap.max_tokens = 512;
  cap.max_slots = 10;
  cap.max_kv_len = 300;
  cap.max_logit_rows = 64;
  cap.max_draft_tokens = 7;
  Stream stream;
  StepInput input(cap);
  StepPrep prep(input);
  SpecPrep spec(prep, cap.max_draft_tokens);
  const NgramConfig ngram{4, 1};
  NgramProposer lookup(prep, ngram, stream.get());
  const StepMetaLayout& layout = prep.layout();
  for (int round = 0; round < 30; ++round) {
    // Histories with repeats: tokens from a small alphabet, sometimes a copied span.
    const std::int32_t n = 1 + static_cast<std::int32_t>(rng() % 8);
    const std::int32_t k = 1 + static_cast<std::int32_t>(rng() % 7);
    std::vector<std::vector<std::int32_t>> hist(static_cast<std::size_t>(n));
    std::vector<StepRequest> req;
    std::vector<std::int32_t> ids;
    for (std::int32_t r = 0; r < n; ++r) {
      const std::int32_t len = 1 + static_cast<std::int32_t>(rng() % 60);
      auto& h = hist[static_cast<std::size_t>(r)];
      for (std::int32_t i = 0; i < len; ++i)
        h.push_back(static_cast<std::int32_t>(rng() % (round % 3 == 0 ? 3 : 12)));
      if (len > 12 && rng() % 2) std::copy(h.begin(), h.begin() + 5, h.end() - 5);
      req.push_back({r + 1, 0, len, 0});  // the whole history in this step's rows
      ids.insert(ids.end(), h.begin(), h.end());
    }
    // Every history fits a prefill; the proposal comes from a speculative step with the last token.
    StepDesc pre;
    pre.mode = StepMode::kExtend;
    pre.requests = req;
    pre.token_ids = ids;
    input.write(pre);
    input.upload(stream.get());
    prep.enqueue(stream.get());
    lookup.prefill(prep.device(), StepShape{StepMode::kExtend, n, cap.max_tokens, n, 0},
                   stream.get());
    std::vector<StepRequest> last;
    std::vector<std::int32_t> last_ids;
    for (std::int32_t r = 0; r < n; ++r) {
      const auto& h = hist[static_cast<std::size_t>(r)];
      last.push_back({r + 1, static_cast<std::int32_t>(h.size()) - 1, 1, 0});
      last_ids.push_back(h.back());
    }
    StepDesc sd;
    sd.mode = StepMode::kSpeculative;
    sd.tokens_per_request = k;
    sd.requests = last;
    sd.token_ids = last_ids;
    input.write(sd);
    input.upload(stream.get());
    prep.enqueue(stream.get());
    spec.enqueue(k, stream.get());
    lookup.propose(spec, StepShape{StepMode::kSpeculative, n, n * 8, n, k}, k, stream.get());
    std::vector<std::int32_t> v(layout.total_words);
    spec.download(0, v, stream.get());
    const StepMetaView vv = StepMetaView::over(v.data(), layout);
    for (std::int32_t r = 0; r < n; ++r) {
      const auto& h = hist[static_cast<std::size_t>(r)];
      std::vector<std::int32_t> want(static_cast<std::size_t>(k));
      spec_rules::ngram_propose(h.data(), static_cast<std::int32_t>(h.size()) - 1, ngram.max_ngram,
                                ngram.min_ngram, k, want.data());
      const std::vector<std::int32_t> got(vv.token_id + r * (k + 1) + 1,
                                          vv.token_id + r * (k + 1) + 1 + k);
      ASSERT_EQ(got, want) << "round " << round << " request " << r << " k " << k;
    }
  }
}

// ---- whole speculative steps against plain greedy -----------------------------------------------

using testing::SpecRun;

class SpecGreedy : public SpecGpu, public ::testing::WithParamInterface<bool> {};

TEST_P(SpecGreedy, TokensEqualPlainGreedyDecoding) {
  const testing::ScopedGemvOff same_gemms;  // spec vs plain: the same GEMM kernels
  SCOPED_TRACE(testing::seed_note());
  testing::Rng rng = testing::test_rng();
  const ModelConfig config = small_test_config();  // full + sliding (window 32) layers
  const std::uint64_t seed = rng();
  const HostWeights target = synthetic_weights(config, seed);
  const auto prompts = testing::spec_prompts(config, rng);
  const std::int32_t new_tokens = testing::sanitize_mode() ? 12 : 64;
  Stream stream;
  GenerateOptions go;
  go.new_tokens = new_tokens;
  const GenerateResult plain = generate_greedy(target, prompts, go, stream.get());

  const bool graphs = GetParam();
  int near_ties = 0;
  {  // the target as its own draft: every draft should be accepted
    SpecRun run(target, &target, 4, 4, graphs);
    const auto spec = run.generate(prompts, new_tokens, [](std::int64_t) { return 4; });
    near_ties += testing::compare_with_plain(target, prompts, spec, plain.tokens, "own draft");
    const double rate = static_cast<double>(run.accepted) / static_cast<double>(run.drafted);
    std::printf("[ own draft ] %lld steps, acceptance %.3f (%lld of %lld drafts)\n",
                static_cast<long long>(run.steps), rate, static_cast<long long>(run.accepted),
                static_cast<long long>(run.drafted));
    EXPECT_GT(rate, 0.85) << "the target as its own draft";
    if (graphs) EXPECT_EQ(run.graph_steps, run.steps - 1);  // all but the prefill replayed
  }
  {  // the target with a noisy LM head as draft: it agrees where the target is decisive, so part
     // of the drafts is accepted; k cycling 0 .. 4
    HostWeights draft = target;
    testing::Rng noise(seed + 7);
    std::normal_distribution<float> n01(0.f, 0.01f);
    for (std::uint16_t& x : draft.tensors.at("lm_head.weight").data)
      x = reference::float_to_bf16(reference::bf16_to_float(x) + n01(noise));
    SpecRun run(target, &draft, 4, 4, graphs);
    const auto spec =
        run.generate(prompts, new_tokens, [](std::int64_t s) { return static_cast<int>(s % 5); });
    near_ties += testing::compare_with_plain(target, prompts, spec, plain.tokens, "noisy draft");
    std::printf("[ noisy draft ] %lld steps, %lld of %lld drafts accepted\n",
                static_cast<long long>(run.steps), static_cast<long long>(run.accepted),
                static_cast<long long>(run.drafted));
    EXPECT_GT(run.accepted, 0);
    EXPECT_LT(run.accepted, run.drafted);
  }
  {  // an unrelated model as draft: (nearly) every draft rejected, one token per step
    const HostWeights draft = synthetic_weights(config, seed + 1);
    SpecRun run(target, &draft, 4, 3, graphs);
    const auto spec = run.generate(prompts, new_tokens, [](std::int64_t) { return 3; });
    near_ties +=
        testing::compare_with_plain(target, prompts, spec, plain.tokens, "unrelated draft");
    std::printf("[ unrelated draft ] %lld steps, %lld of %lld drafts accepted\n",
                static_cast<long long>(run.steps), static_cast<long long>(run.accepted),
                static_cast<long long>(run.drafted));
  }
  {  // prompt lookup: drafts from the request's own tokens, on the device
    SpecRun run(target, nullptr, 4, 4, graphs);
    const auto spec = run.generate(prompts, new_tokens,
                                   [](std::int64_t s) { return 1 + static_cast<int>(s % 4); });
    near_ties += testing::compare_with_plain(target, prompts, spec, plain.tokens, "prompt lookup");
    std::printf("[ prompt lookup ] %lld steps, %lld of %lld drafts accepted\n",
                static_cast<long long>(run.steps), static_cast<long long>(run.accepted),
                static_cast<long long>(run.drafted));
  }
  EXPECT_LE(near_ties, 2) << "near-tie divergences of 16 request runs";
}

INSTANTIATE_TEST_SUITE_P(GraphsOnOff, SpecGreedy, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "graphs" : "eager"; });

}  // namespace
}  // namespace graphdecode
