#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/kernels/sampling.h"
#include "engine/sampling_step.h"
#include "graphs/step_prep.h"

namespace graphdecode {
namespace {

constexpr int kThreads = 128;

struct UnpackParams {
  const std::int32_t* aux;           // [max_batch][SamplingWords::kCount] step image
  const std::int32_t* num_requests;  // [1] prep scalar
  float* temperature;
  std::int32_t* top_k;
  float* top_p;
  std::uint64_t* seed;
  std::uint64_t* rng_step;
  std::int32_t max_rows;
};

// Row r < live: the request's words; padding rows: greedy with fixed values (never read back).
__global__ void unpack_sampling_kernel(const __grid_constant__ UnpackParams p) {
  const std::int32_t r = static_cast<std::int32_t>(blockIdx.x * kThreads + threadIdx.x);
  if (r >= p.max_rows) return;
  if (r < *p.num_requests) {
    const std::int32_t* w = p.aux + static_cast<std::int64_t>(r) * SamplingWords::kCount;
    p.temperature[r] = __int_as_float(w[SamplingWords::kTemperature]);
    p.top_k[r] = w[SamplingWords::kTopK];
    p.top_p[r] = __int_as_float(w[SamplingWords::kTopP]);
    p.seed[r] =
        (static_cast<std::uint64_t>(static_cast<std::uint32_t>(w[SamplingWords::kSeedHi])) << 32) |
        static_cast<std::uint32_t>(w[SamplingWords::kSeedLo]);
    p.rng_step[r] = static_cast<std::uint32_t>(w[SamplingWords::kRngStep]);
  } else {
    p.temperature[r] = 0.f;
    p.top_k[r] = 0;
    p.top_p[r] = 1.f;
    p.seed[r] = 0;
    p.rng_step[r] = 0;
  }
}

struct PublishParams {
  const std::int32_t* tokens;        // [max_rows] sampler output
  const std::int32_t* slot;          // [max_batch] prep: slot per row
  const std::int32_t* num_requests;  // [1]
  const std::int32_t* bad_token;     // [1] embedding flag
  std::int32_t* feedback;            // [max_slots]
  std::int32_t* published;           // [max_batch + 1]
  std::int32_t max_rows;
  std::int32_t max_batch;
};

__global__ void publish_tokens_kernel(const __grid_constant__ PublishParams p) {
  const std::int32_t r = static_cast<std::int32_t>(blockIdx.x * kThreads + threadIdx.x);
  if (r == 0) p.published[p.max_batch] = *p.bad_token;
  if (r >= p.max_rows || r >= *p.num_requests) return;
  const std::int32_t t = p.tokens[r];
  p.published[r] = t;
  p.feedback[p.slot[r]] = t;
}

unsigned blocks_for(std::int32_t rows) {
  return static_cast<unsigned>(std::max(1, (rows + kThreads - 1) / kThreads));
}

}  // namespace

SamplingStep::SamplingStep(LlamaModel& model, const StepInput& input, cudaStream_t stream)
    : model_(model), input_(input), max_batch_(input.capacity().max_batch) {
  const StepCapacity& cap = input.capacity();
  GD_REQUIRE(cap.aux_words == SamplingWords::kCount, "input.aux_words", cap.aux_words,
             "the sampling step needs " + std::to_string(SamplingWords::kCount) +
                 " aux words per request");
  GD_REQUIRE(cap.token_feedback, "input.token_feedback", "off",
             "the sampling step feeds tokens back on the device");
  const auto b = static_cast<std::size_t>(max_batch_);
  temperature_ = DeviceBuffer<float>(b);
  top_p_ = DeviceBuffer<float>(b);
  top_k_ = DeviceBuffer<std::int32_t>(b);
  seed_ = DeviceBuffer<std::uint64_t>(b);
  rng_step_ = DeviceBuffer<std::uint64_t>(b);
  tokens_ = DeviceBuffer<std::int32_t>(b);
  feedback_ = DeviceBuffer<std::int32_t>(static_cast<std::size_t>(cap.max_slots));
  published_ = DeviceBuffer<std::int32_t>(b + 1);
  for (auto* buf : {&top_k_, &tokens_, &feedback_, &published_}) buf->fill_bytes(0, stream);
  sampling_ws_ = DeviceBuffer<std::uint8_t>(sampling_workspace_bytes(max_batch_, model_.vocab()));
  sampling_ws_.fill_bytes(0, stream);
  model_.set_token_feedback(feedback_.data());
}

void SamplingStep::enqueue(const StepShape& shape, cudaStream_t stream) {
  model_.enqueue(shape, stream);
  const std::int32_t rows = std::clamp(shape.bucket, 1, max_batch_);
  const StepMetaView& m = model_.prep().device();
  const std::int32_t* num_requests = m.scalars + StepMetaLayout::kNumRequests;

  UnpackParams u;
  u.aux = input_.device_view().aux;
  u.num_requests = num_requests;
  u.temperature = temperature_.data();
  u.top_k = top_k_.data();
  u.top_p = top_p_.data();
  u.seed = seed_.data();
  u.rng_step = rng_step_.data();
  u.max_rows = rows;
  unpack_sampling_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(u);
  GD_CHECK_LAUNCH();

  SamplingArgs a;
  a.logits = model_.logits();
  a.logits_type = LogitsType::kFloat32;
  a.temperature = temperature_.data();
  a.top_k = top_k_.data();
  a.top_p = top_p_.data();
  a.seed = seed_.data();
  a.step = rng_step_.data();
  a.tokens = tokens_.data();
  a.num_rows = num_requests;
  a.max_rows = rows;
  a.vocab = model_.vocab();
  a.workspace = sampling_ws_.data();
  a.workspace_bytes = sampling_ws_.bytes();
  sample(a, stream);

  PublishParams p;
  p.tokens = tokens_.data();
  p.slot = m.slot;
  p.num_requests = num_requests;
  p.bad_token = model_.bad_token_flag();
  p.feedback = feedback_.data();
  p.published = published_.data();
  p.max_rows = rows;
  p.max_batch = max_batch_;
  publish_tokens_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(p);
  GD_CHECK_LAUNCH();
}

}  // namespace graphdecode
