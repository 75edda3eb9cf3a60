// The engine's step body: the model's forward, then device sampling of every logits row of the
// step, then the sampled tokens published where the next step and the host read them.
//
// Sampling parameters ride in the step image's aux section (one copy per step, no second upload):
// per request SamplingWords::kCount words, which the RowSampler (engine/row_sampler.h) applies to
// every logits row of the step. After sampling, a kernel writes
//   out[i] = token of logits row i, out[max_logit_rows] = the embedding's bad-token flag (one D2H
//   copy for the host), and feedback[slot] = the token of the request's last new row (what a
//   later step's kTokenFromDevice id reads).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/buffers.h"
#include "engine/llama_model.h"
#include "engine/model_step.h"
#include "engine/row_sampler.h"

namespace graphdecode {

class SamplingStep : public StepProgram {
 public:
  // `runtime` and `model` must outlive this object; the step's capacity must carry
  // SamplingWords::kCount aux words and token_feedback. Points the step's prep at the feedback
  // buffer.
  SamplingStep(ModelRuntime& runtime, LlamaModel& model, cudaStream_t stream);

  void enqueue(const StepShape& shape, cudaStream_t stream) override;

  // [max_logit_rows + 1] device: the token of each logits row, then the bad-token flag.
  const std::int32_t* published() const noexcept { return published_.data(); }
  std::int32_t max_rows() const noexcept { return max_rows_; }

 private:
  ModelStep forward_;
  const StepInput& input_;
  std::int32_t max_rows_ = 0;  // max_logit_rows
  RowSampler sampler_;
  DeviceBuffer<std::int32_t> tokens_;     // [max_rows] sampler output
  DeviceBuffer<std::int32_t> feedback_;   // [max_slots]
  DeviceBuffer<std::int32_t> published_;  // [max_rows + 1]
};

}  // namespace graphdecode
