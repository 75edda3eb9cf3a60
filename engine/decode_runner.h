// Plain decoding: one model, prefill chunks (eager) and decode steps of one token per request
// (graph replay), device sampling in the graph (engine/sampling_step.h). The decode rows take
// their input token from the device (the token the slot sampled last step), so the host writes
// a step before it has read the previous one's tokens. A cross-attention model's requests carry
// their encoder length in every step; their cross K/V are projected when they are admitted
// (eagerly, before the step's graph), into cross pages the scheduler reserved.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <memory>
#include <vector>

#include "common/buffers.h"
#include "common/stream.h"
#include "engine/runtime/model_runtime.h"
#include "engine/runtime/step_context.h"
#include "engine/sampling_step.h"
#include "engine/step_runner.h"

namespace graphdecode {

class DecodeRunner : public StepRunner {
 public:
  // Builds the model on its runtime and captures the decode graphs on `stream`.
  DecodeRunner(const HostWeights& weights, const RuntimeOptions& options, bool use_graphs,
               cudaStream_t stream);

  void run(const StepPlan& plan, const Scheduler& scheduler, StepResult& out) override;
  // Pipelining: a decode step is launched while the one before runs (its rows read their input
  // token from the device feedback), so the staging of a step is double-buffered: the pinned
  // image (StepInput's ring of two), the pinned token read-back and its event.
  bool pipelines() const override { return true; }
  void launch(const StepPlan& plan, const Scheduler& scheduler) override;
  void collect(const StepPlan& plan, StepResult& out) override;
  // The cross model's admitted requests: encoder pages in the ledger, the cross table updated
  // now, their encoder states projected into it. Nothing for a model without cross layers.
  void admit_encoders(const StepPlan& plan, const Scheduler& scheduler);
  KvLedger& ledger() override { return step_->ledger(); }
  const StepGraphs& graphs() const override { return *graphs_; }
  const LlamaModel& model() const override { return *model_; }
  const ModelRuntime& runtime(std::int32_t model) const override {
    GD_REQUIRE(model == 0, "model", model, "plain decoding runs one model (0)");
    return *runtime_;
  }

 private:
  cudaStream_t stream_;
  std::unique_ptr<StepContext> step_;
  std::unique_ptr<ModelRuntime> runtime_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<SamplingStep> program_;
  std::unique_ptr<StepGraphs> graphs_;
  // Per-step host staging, sized at start-up.
  std::vector<StepRequest> requests_;
  std::vector<std::int32_t> token_ids_, aux_;
  // Token read-back, one per step in flight: [max_logit_rows + 1] each, and its copy's event.
  std::array<PinnedBuffer<std::int32_t>, 2> published_;
  // Timing events: before the image copy, after the read-back (the collect() wait's event).
  std::array<Event, 2> started_{Event(0), Event(0)};
  std::array<Event, 2> copied_{Event(0), Event(0)};
  std::array<StepPath, 2> path_{};
  std::int64_t launched_ = 0, collected_ = 0;  // steps launched / collected; buffer = count % 2
};

}  // namespace graphdecode
