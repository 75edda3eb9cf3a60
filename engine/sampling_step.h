// The engine's step body: the model's forward, then device sampling of every logits row of the
// step, then the sampled tokens published where the next step and the host read them.
//
// Sampling parameters ride in the step image's aux section (one copy per step, no second upload):
// per request SamplingWords::kCount words. A kernel in the graph unpacks, for every logits row,
// its request's words into the sampler's per-row arrays; the row's RNG counter is the absolute
// position of the token it samples (the row's token position + 1), so a request's token depends
// only on its logits, parameters, seed and position. After sampling, a kernel writes
//   out[i] = token of logits row i, out[max_logit_rows] = the embedding's bad-token flag (one D2H
//   copy for the host), and feedback[slot] = the token of the request's last new row (what a
//   later step's kTokenFromDevice id reads).
#pragma once

#include <cuda_runtime.h>

#include <bit>
#include <cstdint>
#include <span>

#include "common/buffers.h"
#include "engine/llama_model.h"
#include "engine/model_step.h"
#include "engine/scheduler.h"

namespace graphdecode {

// Aux words of one request: what the sampler needs for its rows.
struct SamplingWords {
  static constexpr std::int32_t kTemperature = 0;  // float bits
  static constexpr std::int32_t kTopK = 1;
  static constexpr std::int32_t kTopP = 2;    // float bits
  static constexpr std::int32_t kSeedLo = 3;  // seed, low 32 bits
  static constexpr std::int32_t kSeedHi = 4;  // seed, high 32 bits
  static constexpr std::int32_t kCount = 5;

  // Writes the words of one request into `out` ([kCount]).
  static void write(const SamplingParams& p, std::span<std::int32_t> out) {
    out[kTemperature] = std::bit_cast<std::int32_t>(p.temperature);
    out[kTopK] = p.top_k;
    out[kTopP] = std::bit_cast<std::int32_t>(p.top_p);
    out[kSeedLo] = static_cast<std::int32_t>(static_cast<std::uint32_t>(p.seed));
    out[kSeedHi] = static_cast<std::int32_t>(static_cast<std::uint32_t>(p.seed >> 32));
  }
};

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
  std::int32_t max_rows_ = 0;                    // max_logit_rows
  DeviceBuffer<float> temperature_, top_p_;      // [max_rows]
  DeviceBuffer<std::int32_t> top_k_;             // [max_rows]
  DeviceBuffer<std::uint64_t> seed_, rng_step_;  // [max_rows]
  DeviceBuffer<std::int32_t> tokens_;            // [max_rows] sampler output
  DeviceBuffer<std::int32_t> feedback_;          // [max_slots]
  DeviceBuffer<std::int32_t> published_;         // [max_rows + 1]
};

}  // namespace graphdecode
