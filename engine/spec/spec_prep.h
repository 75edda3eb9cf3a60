// The phases of a speculative step (engine/spec/spec_rules.h), derived on the device from the
// step prep's metadata of its draft-extend: the target's verify (k + 1 rows per request, logits
// for every row) and the draft's decodes 1 .. k - 1 (one row each), each in a metadata block of
// the prep's layout, so the runtime plans and the models run over them like over any step.
// Token ids of the draft rows are placeholders until the draft sampler of the phase before
// writes them (scatter_draft_tokens).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "common/buffers.h"
#include "graphs/step_prep.h"

namespace graphdecode {

// Most draft tokens per request of one speculative step.
inline constexpr std::int32_t kMaxSpecDrafts = 9;

class SpecPrep {
 public:
  // Blocks for the verify and draft decodes 1 .. max_draft_tokens - 1, of `prep`'s layout.
  // `prep` must outlive this object.
  SpecPrep(const StepPrep& prep, std::int32_t max_draft_tokens);
  SpecPrep(const SpecPrep&) = delete;
  SpecPrep& operator=(const SpecPrep&) = delete;

  // Capture-safe: derives the verify and the draft decodes of k drafts (0 <= k <= max) from the
  // prep's block. One single-block kernel.
  void enqueue(std::int32_t k, cudaStream_t stream) const;

  const StepMetaView& verify() const noexcept { return views_[0]; }
  const StepMetaView& draft_decode(std::int32_t j) const;  // 1 <= j < max_draft_tokens
  std::int32_t max_draft_tokens() const noexcept { return max_draft_; }
  const StepPrep& prep() const noexcept { return prep_; }
  // Synchronous download of the verify block (j = 0) or draft decode j's (tests).
  void download(std::int32_t j, std::span<std::int32_t> host, cudaStream_t stream) const;

 private:
  const StepPrep& prep_;
  std::int32_t max_draft_ = 0;
  DeviceBuffer<std::int32_t> blocks_;  // [max(1, max_draft)][layout.total_words]
  std::vector<StepMetaView> views_;    // [0] verify, [j] draft decode j
};

// CPU twin of SpecPrep::enqueue for tests: derives the verify (into `verify`) and the draft
// decodes 1 .. k - 1 (into decodes[j - 1]) from the host block `draft_extend`, all blocks of
// StepMetaLayout::compute(cap).
void spec_prep_host(const StepMetaView& draft_extend, const StepCapacity& cap, std::int32_t k,
                    const StepMetaView& verify, std::span<const StepMetaView> decodes);

// After the draft sampler of phase j (0 = the draft-extend, j >= 1 = draft decode j): tokens[r]
// = d_{j+1} of request r becomes verify row r * (k + 1) + j + 1's token id and draft decode
// j + 1's (when j + 1 < k). Capture-safe; live rows read on the device.
void scatter_draft_tokens(const SpecPrep& prep, std::int32_t k, std::int32_t j,
                          const std::int32_t* tokens, std::int32_t max_rows, cudaStream_t stream);

}  // namespace graphdecode
