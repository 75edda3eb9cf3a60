// The step program of speculative decoding: the target and a draft proposer (engine/spec/
// proposer.h: a draft model beside the target in the same step, each with its own pools, or
// prompt lookup on the device). What StepGraphs captures per (mode, bucket, k). Two kinds of step:
//   extend (prefill chunks): prep -> the target's plans and forward, the proposer keeps up with
//     the prompt (the draft model's forward over the same rows) -> the target's sample of each
//     request's last row, published as one committed token;
//   speculative (StepMode::kSpeculative, k drafts; engine/spec/spec_rules.h):
//     prep (every pool's commands, the draft-extend's metadata: the committed tokens) -> spec
//     prep (verify and draft decodes) -> the proposer's k drafts per request -> verify forward
//     (the target, logits for every row), the target's sample of every row -> accept:
//     speculative rejection sampling over the filtered distributions (engine/spec/
//     accept_sampled.h; for a greedy request exactly the greedy rule) -> published: per request
//     the committed count and tokens.
// One copy of the image in, one copy of the published words out, no host sync between phases.
// Sampling parameters: SamplingWords in the image's aux section (engine/row_sampler.h).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>

#include "common/buffers.h"
#include "common/stream.h"
#include "engine/llama_model.h"
#include "engine/row_sampler.h"
#include "engine/runtime/model_runtime.h"
#include "engine/spec/proposer.h"
#include "engine/spec/spec_prep.h"
#include "graphs/step_program.h"

namespace graphdecode {

// The phases of a speculative step whose device time SpecStep measures (events in the graph).
enum SpecPhase : int {
  kSpecPrep = 0,     // step prep (table commands, draft-extend metadata) + spec prep
  kSpecPropose = 1,  // the proposer's drafts (draft model forwards and sampling, or lookup)
  kSpecVerify = 2,   // the target's verify forward
  kSpecAccept = 3,   // the target's sampling of the verify rows + acceptance
  kNumSpecPhases = 4,
};

class SpecStep : public StepProgram {
 public:
  // The target's step context (its pools model 0, a draft model's model 1) has
  // max_draft_tokens >= 1, SamplingWords aux words, and logits rows for every verify row
  // (max_batch * (max_draft_tokens + 1)).
  // Error names what does not fit. The target and its runtime must outlive this object.
  SpecStep(ModelRuntime& target_runtime, LlamaModel& target, cudaStream_t stream);
  // The proposer of the drafts; set once, before capture.
  void set_proposer(DraftProposer& proposer) noexcept { proposer_ = &proposer; }

  void enqueue(const StepShape& shape, cudaStream_t stream) override;

  // [max_batch][stride()] then one word of error flags: per request, the committed count, then
  // the committed tokens.
  const std::int32_t* published() const noexcept { return published_.data(); }
  std::int32_t stride() const noexcept { return max_draft_ + 2; }
  std::int32_t max_draft_tokens() const noexcept { return max_draft_; }
  const SpecPrep& spec_prep() const noexcept { return spec_; }
  // Device microseconds of each phase (SpecPhase) of the last speculative step, once the host has
  // waited for that step (e.g. for its published tokens).
  std::array<float, kNumSpecPhases> phase_us() const;

 private:
  void prefill(const StepShape& shape, cudaStream_t stream);
  void speculate(const StepShape& shape, cudaStream_t stream);

  ModelRuntime& target_rt_;
  LlamaModel& target_;
  DraftProposer* proposer_ = nullptr;
  const StepInput& input_;
  std::int32_t max_batch_ = 0;
  std::int32_t max_draft_ = 0;
  SpecPrep spec_;
  RowSampler target_sampler_;
  DeviceBuffer<std::int32_t> picks_;      // [max_batch * (max_draft + 1)] the target's tokens
  DeviceBuffer<SamplingRowStats> stats_;  // [max_batch * (max_draft + 1)] their distributions
  DeviceBuffer<std::int32_t> published_;  // [max_batch * stride + 1]
  std::array<Event, kNumSpecPhases + 1> marks_;  // recorded between the phases
};

}  // namespace graphdecode
