#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/sampling_step.h"
#include "graphs/step_prep.h"

namespace graphdecode {
namespace {

constexpr int kThreads = 128;

struct PublishParams {
  const std::int32_t* tokens;     // [max_rows] sampler output
  StepMetaView meta;              // prep output
  const std::int32_t* bad_token;  // [1] embedding flag
  std::int32_t* feedback;         // [max_slots]
  std::int32_t* published;        // [max_logit_rows + 1]
  std::int32_t max_rows;          // grid rows
  std::int32_t max_logit_rows;
};

__global__ void publish_tokens_kernel(const __grid_constant__ PublishParams p) {
  const std::int32_t i = static_cast<std::int32_t>(blockIdx.x * kThreads + threadIdx.x);
  if (i == 0) p.published[p.max_logit_rows] = *p.bad_token;
  if (i >= p.max_rows || i >= p.meta.scalars[StepMetaLayout::kNumLogitRows]) return;
  const std::int32_t token = p.tokens[i];
  p.published[i] = token;
  // The next step's input of the request is the token of its last new row (one writer per slot).
  const std::int32_t t = p.meta.logit_row[i];
  const std::int32_t r = p.meta.token_request[t];
  const bool every_row =
      p.meta.scalars[StepMetaLayout::kLogitRows] == static_cast<std::int32_t>(LogitRows::kEveryRow);
  if (!every_row || t == p.meta.q_start[r + 1] - 1) p.feedback[p.meta.slot[r]] = token;
}

unsigned blocks_for(std::int32_t rows) {
  return static_cast<unsigned>(std::max(1, (rows + kThreads - 1) / kThreads));
}

}  // namespace

SamplingStep::SamplingStep(ModelRuntime& runtime, LlamaModel& model, cudaStream_t stream)
    : forward_(runtime, model),
      input_(runtime.step().input()),
      max_rows_(input_.capacity().resolved_max_logit_rows()),
      sampler_(max_rows_, model.vocab(), stream) {
  const StepCapacity& cap = input_.capacity();
  GD_REQUIRE(cap.aux_words == SamplingWords::kCount, "input.aux_words", cap.aux_words,
             "the sampling step needs " + std::to_string(SamplingWords::kCount) +
                 " aux words per request");
  GD_REQUIRE(cap.token_feedback, "input.token_feedback", "off",
             "the sampling step feeds tokens back on the device");
  const auto b = static_cast<std::size_t>(max_rows_);
  tokens_ = DeviceBuffer<std::int32_t>(b);
  feedback_ = DeviceBuffer<std::int32_t>(static_cast<std::size_t>(cap.max_slots));
  published_ = DeviceBuffer<std::int32_t>(b + 1);
  for (auto* buf : {&tokens_, &feedback_, &published_}) buf->fill_bytes(0, stream);
  runtime.step().prep().set_token_feedback(feedback_.data());
}

void SamplingStep::enqueue(const StepShape& shape, cudaStream_t stream) {
  forward_.enqueue(shape, stream);
  const LlamaModel& model = forward_.model();
  const std::int32_t rows = std::clamp(shape.logit_capacity, 1, max_rows_);
  const StepMetaView& m = forward_.runtime().meta();

  sampler_.enqueue(m, input_.device_view().aux, model.logits(), rows, tokens_.data(), stream);

  PublishParams p;
  p.tokens = tokens_.data();
  p.meta = m;
  p.bad_token = model.bad_token_flag();
  p.feedback = feedback_.data();
  p.published = published_.data();
  p.max_rows = rows;
  p.max_logit_rows = max_rows_;
  publish_tokens_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(p);
  GD_CHECK_LAUNCH();
}

}  // namespace graphdecode
