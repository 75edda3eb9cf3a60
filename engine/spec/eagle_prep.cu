#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/spec/eagle_prep.h"
#include "engine/spec/eagle_rules.h"
#include "engine/spec/spec_phase.h"
#include "engine/spec/spec_prep.h"

namespace graphdecode {
namespace {

constexpr int kThreads = 256;

struct EaglePrepParams {
  StepMetaView x;                           // the step's block
  StepMetaView extend;                      // out
  StepMetaView decode[kMaxSpecDrafts - 1];  // out: head decodes 1 .. k - 1 at [j - 1]
  std::int32_t* hid_src;                    // out [max_tokens]
  eagle_rules::ShiftShape shift;
  spec_rules::PhaseShape phase;
  std::int32_t k;
};

// z lives in dynamic shared memory ([max_batch + 1]); thread 0 scans it (a few hundred adds at
// most), then every thread fills its share of the extend, then of each decode (which read the
// extend: __syncthreads orders the block's global writes before those reads).
__global__ void __launch_bounds__(kThreads)
    eagle_prep_kernel(const __grid_constant__ EaglePrepParams p) {
  extern __shared__ std::int32_t z[];
  __shared__ std::int32_t max_q;
  if (threadIdx.x == 0) max_q = eagle_rules::skip_scan(p.x, p.shift, z);
  __syncthreads();
  const auto first = static_cast<std::int32_t>(threadIdx.x);
  eagle_rules::fill_shifted(p.x, p.extend, p.hid_src, z, max_q, p.shift, first, kThreads);
  __syncthreads();
  spec_rules::PhaseShape s = p.phase;
  for (std::int32_t j = 1; j < p.k; ++j) {
    s.offset = j;
    spec_rules::fill_phase(p.extend, p.decode[j - 1], s, first, kThreads);
  }
}

}  // namespace

EaglePrep::EaglePrep(const StepPrep& prep, std::int32_t max_draft_tokens, std::int32_t carry_stride)
    : prep_(prep), max_draft_(max_draft_tokens), carry_stride_(carry_stride) {
  GD_REQUIRE(max_draft_tokens >= 1 && max_draft_tokens <= kMaxSpecDrafts, "max_draft_tokens",
             max_draft_tokens, "speculative steps draft 1 .. " + std::to_string(kMaxSpecDrafts));
  GD_REQUIRE(carry_stride >= 1, "carry_stride", carry_stride, "must be positive");
  const std::size_t words = prep.layout().total_words;
  const auto blocks = static_cast<std::size_t>(max_draft_tokens);  // extend + decodes 1 .. K - 1
  blocks_ = DeviceBuffer<std::int32_t>(blocks * words);
  hid_src_ =
      DeviceBuffer<std::int32_t>(static_cast<std::size_t>(prep.input().capacity().max_tokens));
  blocks_.fill_bytes(0, nullptr);
  hid_src_.fill_bytes(0, nullptr);
  GD_CUDA(cudaStreamSynchronize(nullptr));  // start-up only: zeroed before any stream reads it
  for (std::size_t b = 0; b < blocks; ++b)
    views_.push_back(StepMetaView::over(blocks_.data() + b * words, prep.layout()));
}

const StepMetaView& EaglePrep::decode(std::int32_t j) const {
  GD_REQUIRE(j >= 1 && j < max_draft_, "j", j, "head decodes are 1 .. max_draft_tokens - 1");
  return views_[static_cast<std::size_t>(j)];
}

void EaglePrep::enqueue(const StepMetaView& x, std::int32_t carry_rows, std::int32_t k,
                        cudaStream_t stream, const std::int32_t* starts_at_hit,
                        std::int32_t starts_at_hit_stride) const {
  GD_REQUIRE(k >= 0 && k <= max_draft_, "k", k, "outside [0, max_draft_tokens]");
  GD_REQUIRE(carry_rows >= 0 && carry_rows <= carry_stride_, "carry_rows", carry_rows,
             "outside [0, carry_stride]");
  const StepCapacity& cap = prep_.input().capacity();
  EaglePrepParams p{};
  p.x = x;
  p.extend = views_[0];
  for (std::int32_t j = 1; j < k; ++j) p.decode[j - 1] = views_[static_cast<std::size_t>(j)];
  p.hid_src = hid_src_.data();
  p.shift.max_batch = cap.max_batch;
  p.shift.max_tokens = cap.max_tokens;
  p.shift.max_logit_rows = cap.resolved_max_logit_rows();
  p.shift.carry_rows = carry_rows;
  p.shift.carry_stride = carry_stride_;
  p.shift.starts_at_hit = starts_at_hit;
  p.shift.starts_at_hit_stride = starts_at_hit_stride;
  p.phase.max_batch = cap.max_batch;
  p.phase.max_tokens = cap.max_tokens;
  p.phase.max_logit_rows = cap.resolved_max_logit_rows();
  p.phase.width = 1;
  p.phase.mode = StepMode::kDecode;
  p.k = k;
  const auto shared = static_cast<std::size_t>(cap.max_batch + 1) * sizeof(std::int32_t);
  GD_REQUIRE(shared <= 48 * 1024, "capacity.max_batch", cap.max_batch,
             "too large for the EAGLE prep's shared scan");
  eagle_prep_kernel<<<1, kThreads, shared, stream>>>(p);
  GD_CHECK_LAUNCH();
}

void EaglePrep::download(std::int32_t j, std::span<std::int32_t> host, cudaStream_t stream) const {
  GD_REQUIRE(j >= 0 && j < max_draft_, "j", j, "0 (extend) or a head decode");
  const std::size_t words = prep_.layout().total_words;
  GD_REQUIRE(host.size() == words, "host", host.size(), "needs one whole metadata block");
  GD_CUDA(cudaMemcpyAsync(host.data(), blocks_.data() + static_cast<std::size_t>(j) * words,
                          words * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream));
  GD_CUDA(cudaStreamSynchronize(stream));
}

void EaglePrep::download_hidden_source(std::span<std::int32_t> host, cudaStream_t stream) const {
  GD_REQUIRE(host.size() == hid_src_.size(), "host", host.size(), "needs max_tokens words");
  GD_CUDA(cudaMemcpyAsync(host.data(), hid_src_.data(), host.size() * sizeof(std::int32_t),
                          cudaMemcpyDeviceToHost, stream));
  GD_CUDA(cudaStreamSynchronize(stream));
}

}  // namespace graphdecode
