// The EAGLE proposer (engine/spec/eagle_rules.h for where its rows sit): the head on its own
// runtime (model 1 of the target's step: its pool, the draft group of the ledger, so the draft
// model's book applies unchanged) reads the target's states, which the target writes for every
// row: EAGLE-1/2 the final-normed hidden state (LlamaModel::enable_hidden_states), EAGLE-3 the
// three captured residual-stream states (enable_aux_hidden_states; the carry is then 3 target
// hidden wide, and the draft logits are the head's draft vocabulary scattered through d2t to the
// target's ids, -inf elsewhere, so sampling and sampled acceptance see a distribution over the
// target's vocabulary with zero mass off the draft vocabulary). States the head needs in a
// later step are carried per slot on the device: after a prefill chunk its last row's state,
// after a verify every verify row's (the next step's extend reads the first committed-count of
// them).
//   prefill chunk:    head extend over the chunk one position earlier (hidden: the carried state
//                     for row 0, the chunk's own rows for the rest), cache only; carry the last.
//   speculative step: head extend over the pending tokens (hidden: carried), its last row's
//                     logits give d_1; head decodes j = 1 .. k - 1 feed the head's own output
//                     back, each sampled with the request's parameters (EAGLE-1/2 through the
//                     target's lm_head, EAGLE-3 its own); the drafts go into the verify's token
//                     ids.
//   after the verify: carry every verify row's state.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/buffers.h"
#include "engine/llama_model.h"
#include "engine/row_sampler.h"
#include "engine/runtime/model_runtime.h"
#include "engine/spec/eagle_head.h"
#include "engine/spec/eagle_prep.h"
#include "engine/spec/proposer.h"

namespace graphdecode {

// Start-up: makes `target` write the states `head` reads (enable_hidden_states, or
// enable_aux_hidden_states at eagle3_capture_layers), before any forward is captured.
void enable_eagle_states(LlamaModel& target, const EagleConfig& head, cudaStream_t stream);

class EagleProposer : public DraftProposer {
 public:
  // The head on `runtime` (model 1 of the target's step, a one-layer full-attention layout);
  // `target` must have enable_hidden_states() on (EAGLE-1/2) or enable_aux_hidden_states() with
  // eagle3_capture_layers (EAGLE-3). Both must outlive this object. Error when the head does not
  // fit the target.
  EagleProposer(ModelRuntime& runtime, const EagleWeights& head, const LlamaModel& target,
                const RuntimeOptions& options, cudaStream_t stream);
  void prefill(const StepMetaView& meta, const StepShape& shape, cudaStream_t stream) override;
  void propose(const SpecPrep& spec, const StepShape& shape, std::int32_t k,
               cudaStream_t stream) override;
  void verified(const SpecPrep& spec, const StepShape& shape, std::int32_t k,
                cudaStream_t stream) override;
  const std::int32_t* error_flag() const override { return head_.bad_token_flag(); }
  DraftKind draft_kind() const override { return DraftKind::kDistribution; }
  const float* draft_logits() const override { return logits_.data(); }
  const SamplingRowStats* draft_stats() const override { return stats_.data(); }
  std::int32_t draft_rows() const override { return max_batch_; }

  const EagleHead& head() const noexcept { return head_; }
  const EaglePrep& prep() const noexcept { return prep_; }
  // [max_slots][carry_stride][state_width] the carried target states.
  const std::uint16_t* carry() const noexcept { return carry_.data(); }
  // [max_tokens][state_width] the target's states the head reads (hidden or aux states).
  const std::uint16_t* target_states() const noexcept {
    return head_.config().eagle3() ? target_.aux_hidden_states() : target_.hidden_states();
  }

 private:
  // carry[slot][i] = the target's state of `meta`'s rows: every row of each request (last_only
  // false: a verify block) or its last row at i = 0.
  void save_carry(const StepMetaView& meta, bool last_only, cudaStream_t stream);

  ModelRuntime& runtime_;
  const LlamaModel& target_;
  std::int32_t max_batch_ = 0, carry_stride_ = 0;
  EagleHead head_;
  EaglePrep prep_;
  RowSampler sampler_;
  DeviceBuffer<std::uint16_t> carry_;     // [max_slots][carry_stride][state_width]
  DeviceBuffer<std::int32_t> tokens_;     // [max_batch] the last draft phase's tokens
  DeviceBuffer<float> logits_;            // [max_draft][max_batch][vocab] each phase's rows
  DeviceBuffer<SamplingRowStats> stats_;  // [max_draft][max_batch] their distributions
};

}  // namespace graphdecode
