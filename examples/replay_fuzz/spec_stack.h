// The replay fuzzer's speculative step program: two synthetic attention stacks (attention_stack.h)
// on ONE StepContext, a "target" (model 0) and a "draft" (model 1), each with its own pools,
// layers, heads, window and dtype. A test fixture, not part of the library.
//
// A speculative key (StepMode::kSpeculative, k drafts; engine/spec/spec_rules.h), the same
// phases as engine/spec/spec_step.h with the models replaced by the synthetic stacks:
//   prep (every pool's commands; the draft-extend's metadata)  ->  SpecPrep (verify and draft
//   decodes 1 .. k - 1)  ->  draft stack over the draft-extend rows  ->  draft tokens d_1 (one per
//   request, from its last row)  ->  scatter_draft_tokens  ->  per draft decode j: draft stack
//   over its block, d_{j+1}, scatter  ->  target stack over the verify block (k + 1 rows).
// The synthetic stacks have no logits, so the draft "sampler" is synthetic::draft_token of the
// row's (slot, position, token id), which the host recomputes; acceptance is the host's (the
// fuzzer draws it). Every phase's output is kept, so replay and eager compare on all of them.
//
// Any other key (decode, verify, draft-extend-v2, extend): prep -> both stacks over the prep's
// block (the draft's cache follows the target's), outputs target_residual() and
// draft_residual().
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention_stack.h"
#include "common/buffers.h"
#include "engine/runtime/step_context.h"
#include "engine/spec/spec_prep.h"
#include "graphs/step_program.h"

namespace graphdecode::fuzz {

struct SpecStackConfig {
  AttentionStackConfig target;        // model 0; its options are the step's
  AttentionStackConfig draft;         // model 1; options must equal the target's
  std::int32_t max_draft_tokens = 4;  // K: speculative keys draft k in [0, K]
  std::int32_t vocab = 50001;         // draft tokens lie in [0, vocab)
  std::uint32_t draft_seed = 1;       // of synthetic::draft_token

  void validate() const;  // Error names the bad field
};

// Both stacks' pools (target first) and max_draft_tokens = K.
StepCapacity spec_step_capacity(const SpecStackConfig& config);

class SpecStack : public StepProgram {
 public:
  // `step` must have been built from spec_step_capacity(config) and outlive the stack. Allocates
  // every buffer on `stream`.
  SpecStack(const SpecStackConfig& config, StepContext& step, cudaStream_t stream);

  void enqueue(const StepShape& shape, cudaStream_t stream) override;

  AttentionStack& target() noexcept { return target_; }
  AttentionStack& draft() noexcept { return draft_; }
  const AttentionStack& target() const noexcept { return target_; }
  const AttentionStack& draft() const noexcept { return draft_; }
  const SpecStackConfig& config() const noexcept { return config_; }

  // Outputs of the last step, [rows][stack's row_elems()] float each:
  //   plain keys: target_residual() and draft_residual() over the step's rows;
  //   speculative: draft_residual() over the draft-extend rows, draft_decode_residual(j) over
  //   draft decode j's rows (one per request), target_residual() over the verify rows
  //   (k + 1 per request, request-major).
  const float* target_residual() const noexcept { return target_.residual(); }
  const float* draft_residual() const noexcept { return draft_.residual(); }
  const float* draft_decode_residual(std::int32_t j) const;  // 1 <= j < K
  // [max(1, K)][max_batch]: d_{j+1} of request r at [j][r], from phase j (0 = the draft-extend).
  const std::int32_t* drafts() const noexcept { return record_.data(); }
  std::int32_t max_batch() const noexcept { return max_batch_; }

 private:
  void plain(const StepShape& shape, cudaStream_t stream);
  void speculate(const StepShape& shape, cudaStream_t stream);
  // d_{j+1} of each live request of `meta` (its last row) into tokens_ and record_[j].
  void sample_drafts(const StepMetaView& meta, std::int32_t j, std::int32_t rows,
                     cudaStream_t stream);
  float* decode_out(std::int32_t j) const;  // draft decode j's residual

  SpecStackConfig config_;
  StepContext& step_;
  AttentionStack target_, draft_;
  std::int32_t max_batch_ = 0;
  SpecPrep spec_;
  DeviceBuffer<std::int32_t> tokens_;    // [max_batch] the last draft phase's tokens (scattered)
  DeviceBuffer<std::int32_t> record_;    // [max(1, K)][max_batch] every draft phase's tokens
  DeviceBuffer<float> decode_residual_;  // [max(1, K - 1)][max_batch][draft row_elems]
};

}  // namespace graphdecode::fuzz
