// The metadata of an EAGLE head's phases (engine/spec/eagle_rules.h), derived on the device from
// a block of the step prep's layout: its extend (the step's rows one position earlier, a first
// chunk's position-0 row dropped) with each row's hidden-state source, and its decodes
// 1 .. k - 1 (one row per request at P + j - 1). One single-block kernel, capture-safe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "common/buffers.h"
#include "graphs/step_prep.h"

namespace graphdecode {

class EaglePrep {
 public:
  // Blocks of `prep`'s layout for the extend and decodes 1 .. max_draft_tokens - 1; carry_stride
  // = carry rows per slot (eagle_rules::ShiftShape). `prep` must outlive this object.
  EaglePrep(const StepPrep& prep, std::int32_t max_draft_tokens, std::int32_t carry_stride);
  EaglePrep(const EaglePrep&) = delete;
  EaglePrep& operator=(const EaglePrep&) = delete;

  // Capture-safe: the head's extend from `x` (the step prep's block: a prefill chunk, or a
  // speculative step's draft-extend) whose first carry_rows rows per request read carried
  // states, and its decodes 1 .. k - 1 (k = 0 or 1: none). starts_at_hit (device, request r's
  // word at r * starts_at_hit_stride; nullptr: none): requests whose chunk starts at their
  // prefix hit, whose row 0 the head drops (eagle_rules.h).
  void enqueue(const StepMetaView& x, std::int32_t carry_rows, std::int32_t k, cudaStream_t stream,
               const std::int32_t* starts_at_hit = nullptr,
               std::int32_t starts_at_hit_stride = 0) const;

  const StepMetaView& extend() const noexcept { return views_[0]; }
  const StepMetaView& decode(std::int32_t j) const;  // 1 <= j < max_draft_tokens
  // [max_tokens] the extend rows' hidden-state sources (eagle_rules: >= 0 target row, < 0 carry).
  const std::int32_t* hidden_source() const noexcept { return hid_src_.data(); }
  std::int32_t carry_stride() const noexcept { return carry_stride_; }
  // Synchronous downloads (tests): block j (0 = extend), the hidden sources.
  void download(std::int32_t j, std::span<std::int32_t> host, cudaStream_t stream) const;
  void download_hidden_source(std::span<std::int32_t> host, cudaStream_t stream) const;

 private:
  const StepPrep& prep_;
  std::int32_t max_draft_ = 0, carry_stride_ = 0;
  DeviceBuffer<std::int32_t> blocks_;   // [max(1, max_draft)][layout.total_words]
  DeviceBuffer<std::int32_t> hid_src_;  // [max_tokens]
  std::vector<StepMetaView> views_;     // [0] extend, [j] decode j
};

// CPU twin of EaglePrep::enqueue for tests: host blocks of StepMetaLayout::compute(cap);
// starts_at_hit: one word per request (stride 1), or empty.
void eagle_prep_host(const StepMetaView& x, const StepCapacity& cap, std::int32_t carry_rows,
                     std::int32_t carry_stride, std::int32_t k, const StepMetaView& extend,
                     std::span<std::int32_t> hidden_source, std::span<const StepMetaView> decodes,
                     std::span<const std::int32_t> starts_at_hit = {});

}  // namespace graphdecode
