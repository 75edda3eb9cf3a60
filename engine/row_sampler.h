// Device sampling of one phase's logits rows: each row takes the sampling words of its request
// (SamplingWords, the step image's aux section) and, as its RNG counter, the absolute position of
// the token it samples (the row's token position + 1), so a request's token depends only on its
// logits, parameters, seed and position, never on the batch or the phase layout. Used by the
// engine's step (engine/sampling_step.h) and the speculative step (engine/spec/spec_step.h).
#pragma once

#include <cuda_runtime.h>

#include <bit>
#include <cstdint>
#include <span>

#include "common/buffers.h"
#include "engine/kernels/sampling.h"
#include "engine/scheduler.h"
#include "graphs/step_prep.h"

namespace graphdecode {

// Aux words of one request: what the sampler needs for its rows, and how many drafts a
// speculative step may accept for it.
struct SamplingWords {
  static constexpr std::int32_t kTemperature = 0;  // float bits
  static constexpr std::int32_t kTopK = 1;
  static constexpr std::int32_t kTopP = 2;         // float bits
  static constexpr std::int32_t kSeedLo = 3;       // seed, low 32 bits
  static constexpr std::int32_t kSeedHi = 4;       // seed, high 32 bits
  static constexpr std::int32_t kAcceptLimit = 5;  // drafts a speculative step may accept; < 0 all
  // 1: this prefill chunk starts at the request's prefix hit (an EAGLE head drops its row 0:
  // engine/spec/eagle_rules.h); written by the speculative runner, 0 otherwise.
  static constexpr std::int32_t kStartsAtHit = 6;
  static constexpr std::int32_t kCount = 7;

  // Writes the words of one request into `out` ([kCount]).
  static void write(const SamplingParams& p, std::int32_t accept_limit,
                    std::span<std::int32_t> out) {
    out[kTemperature] = std::bit_cast<std::int32_t>(p.temperature);
    out[kTopK] = p.top_k;
    out[kTopP] = std::bit_cast<std::int32_t>(p.top_p);
    out[kSeedLo] = static_cast<std::int32_t>(static_cast<std::uint32_t>(p.seed));
    out[kSeedHi] = static_cast<std::int32_t>(static_cast<std::uint32_t>(p.seed >> 32));
    out[kAcceptLimit] = accept_limit;
    out[kStartsAtHit] = 0;
  }
};

class RowSampler {
 public:
  // Per-row parameter arrays for up to `max_rows` rows of `vocab` logits.
  RowSampler(std::int32_t max_rows, std::int32_t vocab, cudaStream_t stream);

  // Capture-safe. tokens[i] = the token of logits row i of `meta` (rows below
  // meta.scalars[kNumLogitRows]; `grid_rows` >= that count sizes the grids), from `logits`
  // ([grid_rows][vocab] float) with the parameters in `aux` ([max_batch][SamplingWords::kCount]).
  // `stats` ([grid_rows], optional): each row's filtered distribution (SamplingRowStats), for
  // speculative acceptance.
  void enqueue(const StepMetaView& meta, const std::int32_t* aux, const float* logits,
               std::int32_t grid_rows, std::int32_t* tokens, cudaStream_t stream,
               SamplingRowStats* stats = nullptr) const;

  std::int32_t max_rows() const noexcept { return max_rows_; }

 private:
  std::int32_t max_rows_ = 0;
  std::int32_t vocab_ = 0;
  DeviceBuffer<float> temperature_, top_p_;      // [max_rows]
  DeviceBuffer<std::int32_t> top_k_;             // [max_rows]
  DeviceBuffer<std::uint64_t> seed_, rng_step_;  // [max_rows]
  DeviceBuffer<std::uint8_t> workspace_;         // sample()'s workspace, zeroed once
};

}  // namespace graphdecode
