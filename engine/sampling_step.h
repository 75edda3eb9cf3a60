// The engine's step body: the model's forward, then device sampling of every live request's last
// logits row, then the sampled tokens published where the next step and the host read them.
//
// Sampling parameters ride in the step image's aux section (one copy per step, no second upload):
// per request kSamplingWords words, see SamplingWords. A kernel in the graph unpacks them into the
// sampler's per-row arrays. After sampling, a kernel writes
//   feedback[slot[r]] = token[r]   (the token a later step's kTokenFromDevice id reads), and
//   out[r] = token[r], out[max_batch] = the embedding's bad-token flag (one D2H copy for the host).
#pragma once

#include <cuda_runtime.h>

#include <bit>
#include <cstdint>
#include <span>

#include "common/buffers.h"
#include "engine/llama_model.h"
#include "engine/scheduler.h"
#include "graphs/attention_stack.h"

namespace graphdecode {

// Aux words of one request: what the sampler needs for its row.
struct SamplingWords {
  static constexpr std::int32_t kTemperature = 0;  // float bits
  static constexpr std::int32_t kTopK = 1;
  static constexpr std::int32_t kTopP = 2;     // float bits
  static constexpr std::int32_t kSeedLo = 3;   // seed, low 32 bits
  static constexpr std::int32_t kSeedHi = 4;   // seed, high 32 bits
  static constexpr std::int32_t kRngStep = 5;  // absolute position of the sampled token
  static constexpr std::int32_t kCount = 6;

  // Writes the words of one request into `out` ([kCount]).
  static void write(const SamplingParams& p, std::int32_t position, std::span<std::int32_t> out) {
    out[kTemperature] = std::bit_cast<std::int32_t>(p.temperature);
    out[kTopK] = p.top_k;
    out[kTopP] = std::bit_cast<std::int32_t>(p.top_p);
    out[kSeedLo] = static_cast<std::int32_t>(static_cast<std::uint32_t>(p.seed));
    out[kSeedHi] = static_cast<std::int32_t>(static_cast<std::uint32_t>(p.seed >> 32));
    out[kRngStep] = position;
  }
};

class SamplingStep : public StepProgram {
 public:
  // `model` and `input` must outlive this object; input.capacity().aux_words must be
  // SamplingWords::kCount and token_feedback on. Points the model's prep at the feedback buffer.
  SamplingStep(LlamaModel& model, const StepInput& input, cudaStream_t stream);

  void enqueue(const StepShape& shape, cudaStream_t stream) override;

  // [max_batch + 1] device: tokens of the step's rows, then the bad-token flag.
  const std::int32_t* published() const noexcept { return published_.data(); }
  std::int32_t max_batch() const noexcept { return max_batch_; }

 private:
  LlamaModel& model_;
  const StepInput& input_;
  std::int32_t max_batch_ = 0;
  DeviceBuffer<float> temperature_, top_p_;      // [max_batch]
  DeviceBuffer<std::int32_t> top_k_;             // [max_batch]
  DeviceBuffer<std::uint64_t> seed_, rng_step_;  // [max_batch]
  DeviceBuffer<std::int32_t> tokens_;            // [max_batch] sampler output
  DeviceBuffer<std::int32_t> feedback_;          // [max_slots]
  DeviceBuffer<std::int32_t> published_;         // [max_batch + 1]
  DeviceBuffer<std::uint8_t> sampling_ws_;       // sample()'s workspace, zeroed once
};

}  // namespace graphdecode
