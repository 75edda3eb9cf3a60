// Speculative decoding (engine/spec/spec_step.h) with a draft model, prompt lookup
// (engine/spec/proposer.h) or an EAGLE head (engine/spec/eagle_proposer.h): prefill chunks run the
// target and keep the proposer up with the prompt (the draft model's forward over it); decode steps
// are speculative steps of k drafts, k chosen per step from the batch size (a full batch gains
// little from drafting; k = 0 still keeps the draft's cache current). The host book of each request
// (engine/spec/spec_book.h) gives every step exactly the pages it touches and rolls rejected rows
// back after it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "common/buffers.h"
#include "common/stream.h"
#include "engine/runtime/model_runtime.h"
#include "engine/runtime/step_context.h"
#include "engine/spec/eagle_weights.h"
#include "engine/spec/spec_book.h"
#include "engine/spec/spec_step.h"
#include "engine/step_runner.h"

namespace graphdecode {

// Draft tokens of a step by its batch: the first rule whose max_batch >= the batch; past the
// last rule, 0.
struct SpecKRule {
  std::int32_t max_batch = 0;
  std::int32_t k = 0;
};

enum class SpecProposer : std::uint8_t {
  kDraftModel = 0,  // a Llama-family draft model of the target's vocabulary
  kNgram = 1,       // prompt lookup in the request's own tokens, on the device
  kEagle = 2,       // an EAGLE head (eagle_proposer.h): EAGLE-1/2 over the target's final
                    // hidden states, or EAGLE-3 over three of its layers (the head's version,
                    // from its config.json architectures, decides)
};

struct SpecRunnerConfig {
  SpecProposer proposer = SpecProposer::kDraftModel;
  std::int32_t max_draft_tokens = 4;  // k at most (1 .. kMaxSpecDrafts)
  std::vector<SpecKRule> k_by_batch;  // empty: default_k_rules(max_draft_tokens)
  NgramConfig ngram;
  bool use_graphs = true;
};

// k_max up to batch 8, min(k_max, 3) up to 32, 1 up to 64, then 0: a 1B-class decode step is
// bound by its weight bytes until the verify's rows make it compute-bound.
std::vector<SpecKRule> default_k_rules(std::int32_t max_draft_tokens);
std::int32_t k_for_batch(const std::vector<SpecKRule>& rules, std::int32_t batch);

class SpecRunner : public StepRunner {
 public:
  // The target and the proposer on one step context (the target's pools, then a draft model's
  // or an EAGLE head's), the speculative graphs of every k the rules use captured on `stream`.
  // `draft`: the draft model's weights (kDraftModel only); `eagle`: the head (kEagle only).
  // Error names what does not fit (the draft's vocabulary, the head's hidden size or
  // vocabulary, k out of range, a missing or unneeded draft or head).
  SpecRunner(const HostWeights& target, const HostWeights* draft, const RuntimeOptions& options,
             const SpecRunnerConfig& config, cudaStream_t stream,
             const EagleWeights* eagle = nullptr);

  void run(const StepPlan& plan, const Scheduler& scheduler, StepResult& out) override;
  void retire(std::span<const TokenEvent> events) override;
  std::int32_t reserve_slack() const override { return config_.max_draft_tokens; }
  KvLedger& ledger() override { return step_->ledger(); }
  const StepGraphs& graphs() const override { return *graphs_; }
  const LlamaModel& model() const override { return *target_; }
  const ModelRuntime& runtime(std::int32_t model) const override {
    GD_REQUIRE(model == 0 || (model == 1 && draft_rt_), "model", model,
               "0 (the target) or 1 (the draft or EAGLE head; prompt lookup has none)");
    return model == 0 ? *target_rt_ : *draft_rt_;
  }
  const SpecRunnerConfig& config() const noexcept { return config_; }

 private:
  void write_aux(const Scheduler& scheduler, const PlannedRequest& p, bool prefill);

  SpecRunnerConfig config_;
  cudaStream_t stream_;
  std::unique_ptr<StepContext> step_;
  std::unique_ptr<ModelRuntime> target_rt_, draft_rt_;
  std::unique_ptr<LlamaModel> target_, draft_;
  std::unique_ptr<SpecStep> program_;
  std::unique_ptr<DraftProposer> proposer_;
  std::unique_ptr<StepGraphs> graphs_;
  std::unordered_map<RequestId, SpecRequestState> state_;  // requests past their prefill
  // Per-step host staging, sized at start-up.
  std::vector<StepRequest> requests_;
  std::vector<std::int32_t> token_ids_, aux_;
  PinnedBuffer<std::int32_t> published_;  // [max_batch * stride + 1]
  Event copied_{cudaEventDisableTiming};
};

}  // namespace graphdecode
