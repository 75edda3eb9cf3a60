// The step program of speculative decoding with a draft model (a Llama-family model of the
// target's vocabulary beside it in the same step, each with its own pools): what StepGraphs
// captures per (mode, bucket, k). Two kinds of step:
//   extend (prefill chunks): prep -> both models' plans -> target and draft forwards over the
//     same rows (the draft's cache follows the prompt) -> the target's sample of each request's
//     last row, published as one committed token;
//   speculative (StepMode::kSpeculative, k drafts; engine/spec/spec_rules.h):
//     prep (every pool's commands, the draft-extend's metadata) -> spec prep (verify and draft
//     decodes) -> draft-extend forward, sample d_1 -> draft decodes 1 .. k - 1, sample d_2 .. d_k
//     -> verify forward (the target, logits for every row), sample the target's picks -> accept
//     -> published: per request the committed count and tokens.
// One copy of the image in, one copy of the published words out, no host sync between phases.
// Sampling parameters: SamplingWords in the image's aux section (engine/row_sampler.h). Greedy
// acceptance: the speculative requests are greedy (the engine refuses others until sampled
// acceptance exists).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/buffers.h"
#include "engine/llama_model.h"
#include "engine/row_sampler.h"
#include "engine/runtime/model_runtime.h"
#include "engine/spec/spec_prep.h"
#include "graphs/step_program.h"

namespace graphdecode {

class SpecStep : public StepProgram {
 public:
  // The runtimes share one StepContext whose capacity lists the target's pools (model 0), then
  // the draft's (model 1), with max_draft_tokens >= 1, SamplingWords aux words, and logits rows
  // for every verify row (max_batch * (max_draft_tokens + 1)). Error names what does not fit
  // (e.g. the draft's vocabulary). All four must outlive this object.
  SpecStep(ModelRuntime& target_runtime, LlamaModel& target, ModelRuntime& draft_runtime,
           LlamaModel& draft, cudaStream_t stream);

  void enqueue(const StepShape& shape, cudaStream_t stream) override;

  // [max_batch][stride()] then one word of error flags: per request, the committed count, then
  // the committed tokens.
  const std::int32_t* published() const noexcept { return published_.data(); }
  std::int32_t stride() const noexcept { return max_draft_ + 2; }
  std::int32_t max_draft_tokens() const noexcept { return max_draft_; }
  const SpecPrep& spec_prep() const noexcept { return spec_; }

 private:
  void prefill(const StepShape& shape, cudaStream_t stream);
  void speculate(const StepShape& shape, cudaStream_t stream);

  ModelRuntime& target_rt_;
  LlamaModel& target_;
  ModelRuntime& draft_rt_;
  LlamaModel& draft_;
  const StepInput& input_;
  std::int32_t max_batch_ = 0;
  std::int32_t max_draft_ = 0;
  SpecPrep spec_;
  RowSampler draft_sampler_, target_sampler_;
  DeviceBuffer<std::int32_t> draft_tokens_;  // [max_batch] the last draft phase's tokens
  DeviceBuffer<std::int32_t> picks_;         // [max_batch * (max_draft + 1)] the target's tokens
  DeviceBuffer<std::int32_t> published_;     // [max_batch * stride + 1]
};

}  // namespace graphdecode
