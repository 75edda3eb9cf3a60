// What proposes a speculative step's k drafts per request (engine/spec/spec_step.h runs the
// target's verify and acceptance around it). An EAGLE head (engine/spec/eagle_proposer.h) and two
// proposers here: a draft model beside the target
// (DraftModelProposer: its draft-extend over the committed tokens, then k - 1 decodes, each
// sampled) and prompt lookup on the device (NgramProposer: the longest suffix of the request's
// own tokens that occurred before proposes what followed it). Both are capture-safe and write
// the drafts into the verify block's token ids (rows r(k+1) + 1 .. r(k+1) + k).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/buffers.h"
#include "engine/kernels/sampling.h"
#include "engine/llama_model.h"
#include "engine/row_sampler.h"
#include "engine/runtime/model_runtime.h"
#include "engine/spec/accept_sampled.h"
#include "engine/spec/spec_prep.h"
#include "graphs/step_program.h"

namespace graphdecode {

class DraftProposer {
 public:
  virtual ~DraftProposer() = default;
  // A prefill chunk whose metadata is `meta` (the step prep's block): keep up with the prompt.
  virtual void prefill(const StepMetaView& meta, const StepShape& shape, cudaStream_t stream) = 0;
  // The drafts of a speculative step of k: from the draft-extend (the step prep's block, the
  // committed tokens) and the spec prep's blocks, into spec.verify()'s token ids.
  virtual void propose(const SpecPrep& spec, const StepShape& shape, std::int32_t k,
                       cudaStream_t stream) = 0;
  // After the target's verify forward of a speculative step of k (its hidden states of the verify
  // rows are then current): what the proposer keeps of them for the next step (EAGLE).
  virtual void verified(const SpecPrep& spec, const StepShape& shape, std::int32_t k,
                        cudaStream_t stream) {
    static_cast<void>(spec), static_cast<void>(shape), static_cast<void>(k),
        static_cast<void>(stream);
  }
  // [1] sticky device error flag (a bad token id), or nullptr.
  virtual const std::int32_t* error_flag() const { return nullptr; }
  // The distributions the drafts were drawn from, for sampled acceptance (accept_sampled.h):
  // draft i of request r from logits row i * draft_rows() + r and its stats; a proposer without
  // distributions (prompt lookup) is a point mass at each draft.
  virtual DraftKind draft_kind() const { return DraftKind::kPointMass; }
  virtual const float* draft_logits() const { return nullptr; }
  virtual const SamplingRowStats* draft_stats() const { return nullptr; }
  virtual std::int32_t draft_rows() const { return 0; }
};

class DraftModelProposer : public DraftProposer {
 public:
  // The draft model on its runtime (model 1 of the target's step). Both must outlive this.
  DraftModelProposer(ModelRuntime& runtime, LlamaModel& model, cudaStream_t stream);
  void prefill(const StepMetaView& meta, const StepShape& shape, cudaStream_t stream) override;
  void propose(const SpecPrep& spec, const StepShape& shape, std::int32_t k,
               cudaStream_t stream) override;
  const std::int32_t* error_flag() const override { return model_.bad_token_flag(); }
  DraftKind draft_kind() const override { return DraftKind::kDistribution; }
  const float* draft_logits() const override { return logits_.data(); }
  const SamplingRowStats* draft_stats() const override { return stats_.data(); }
  std::int32_t draft_rows() const override { return max_batch_; }

 private:
  ModelRuntime& runtime_;
  LlamaModel& model_;
  std::int32_t max_batch_ = 0;
  RowSampler sampler_;
  DeviceBuffer<std::int32_t> tokens_;     // [max_batch] the last draft phase's tokens
  DeviceBuffer<float> logits_;            // [max_draft][max_batch][vocab] each phase's rows
  DeviceBuffer<SamplingRowStats> stats_;  // [max_draft][max_batch] their distributions
};

struct NgramConfig {
  std::int32_t max_ngram = 4;  // longest suffix looked up
  std::int32_t min_ngram = 1;  // shortest suffix that may propose
};

class NgramProposer : public DraftProposer {
 public:
  // A device history of every slot's tokens ([max_slots][max_kv_len]), written from the step
  // prep's token rows (prompt chunks, then each step's committed tokens).
  //
  // With the prefix cache a request starts at a hit whose tokens no step row carries. So, given
  // the target's full pool (`pages`, else nullptr: the engine then serves lookup without the
  // cache), every recorded token is also kept beside its K/V, in a token array of the pool's
  // pages ([num_pages][page_size], written through the slot's page-table row), and a prefill
  // chunk marked as starting at its hit (SamplingWords::kStartsAtHit in the step's aux) copies
  // its shared pages' tokens into the slot's history first. A published page is never written
  // again (its positions are committed), so the tokens it holds are its prefix's.
  NgramProposer(const StepPrep& prep, const NgramConfig& config, cudaStream_t stream,
                const KvPool* pages = nullptr);
  void prefill(const StepMetaView& meta, const StepShape& shape, cudaStream_t stream) override;
  void propose(const SpecPrep& spec, const StepShape& shape, std::int32_t k,
               cudaStream_t stream) override;

 private:
  void record(const StepMetaView& meta, std::int32_t token_capacity, cudaStream_t stream);
  NgramConfig config_;
  const StepInput& input_;  // the step image's aux words (the hit marks)
  std::int32_t max_batch_ = 0, max_len_ = 0;
  DeviceBuffer<std::int32_t> history_;      // [max_slots][max_len]
  PagedKvView pages_{};                     // the target's full pool (page_table, geometry)
  DeviceBuffer<std::int32_t> page_tokens_;  // [num_pages][page_size]; empty without `pages`
};

}  // namespace graphdecode
