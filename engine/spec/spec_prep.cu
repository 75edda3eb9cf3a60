#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/spec/spec_phase.h"
#include "engine/spec/spec_prep.h"

namespace graphdecode {
namespace {

constexpr int kThreads = 256;

struct SpecPrepParams {
  StepMetaView x;                           // the draft-extend (the step prep's block)
  StepMetaView verify;                      // out
  StepMetaView decode[kMaxSpecDrafts - 1];  // out: draft decodes 1 .. k - 1 at [j - 1]
  spec_rules::PhaseShape shape;             // sizes; width/offset/mode set per phase
  std::int32_t k;
};

__global__ void __launch_bounds__(kThreads)
    spec_prep_kernel(const __grid_constant__ SpecPrepParams p) {
  spec_rules::PhaseShape s = p.shape;
  s.width = p.k + 1;
  s.offset = 0;
  s.mode = StepMode::kTargetVerify;
  spec_rules::fill_phase(p.x, p.verify, s, static_cast<std::int32_t>(threadIdx.x), kThreads);
  for (std::int32_t j = 1; j < p.k; ++j) {
    s.width = 1;
    s.offset = j;
    s.mode = StepMode::kDecode;
    spec_rules::fill_phase(p.x, p.decode[j - 1], s, static_cast<std::int32_t>(threadIdx.x),
                           kThreads);
  }
}

struct ScatterParams {
  const std::int32_t* tokens;        // [rows] d_{j+1} per request
  const std::int32_t* num_requests;  // [1]
  std::int32_t* verify_ids;          // verify block's token ids
  std::int32_t* next_ids;            // draft decode j + 1's token ids, or nullptr
  std::int32_t k, j, max_rows;
};

__global__ void scatter_draft_kernel(const __grid_constant__ ScatterParams p) {
  const std::int32_t r = static_cast<std::int32_t>(blockIdx.x * kThreads + threadIdx.x);
  if (r >= p.max_rows || r >= *p.num_requests) return;
  const std::int32_t t = p.tokens[r];
  p.verify_ids[r * (p.k + 1) + p.j + 1] = t;
  if (p.next_ids != nullptr) p.next_ids[r] = t;
}

}  // namespace

SpecPrep::SpecPrep(const StepPrep& prep, std::int32_t max_draft_tokens)
    : prep_(prep), max_draft_(max_draft_tokens) {
  GD_REQUIRE(max_draft_tokens >= 1 && max_draft_tokens <= kMaxSpecDrafts, "max_draft_tokens",
             max_draft_tokens, "speculative steps draft 1 .. " + std::to_string(kMaxSpecDrafts));
  const std::size_t words = prep.layout().total_words;
  const auto blocks = static_cast<std::size_t>(max_draft_tokens);  // verify + decodes 1 .. K - 1
  blocks_ = DeviceBuffer<std::int32_t>(blocks * words);
  blocks_.fill_bytes(0, nullptr);
  GD_CUDA(cudaStreamSynchronize(nullptr));  // start-up only: zeroed before any stream reads it
  for (std::size_t b = 0; b < blocks; ++b)
    views_.push_back(StepMetaView::over(blocks_.data() + b * words, prep.layout()));
}

const StepMetaView& SpecPrep::draft_decode(std::int32_t j) const {
  GD_REQUIRE(j >= 1 && j < max_draft_, "j", j, "draft decodes are 1 .. max_draft_tokens - 1");
  return views_[static_cast<std::size_t>(j)];
}

void SpecPrep::enqueue(std::int32_t k, cudaStream_t stream) const {
  GD_REQUIRE(k >= 0 && k <= max_draft_, "k", k, "outside [0, max_draft_tokens]");
  const StepCapacity& cap = prep_.input().capacity();
  SpecPrepParams p{};
  p.x = prep_.device();
  p.verify = views_[0];
  for (std::int32_t j = 1; j < k; ++j) p.decode[j - 1] = views_[static_cast<std::size_t>(j)];
  p.shape.max_batch = cap.max_batch;
  p.shape.max_tokens = cap.max_tokens;
  p.shape.max_logit_rows = cap.resolved_max_logit_rows();
  p.k = k;
  spec_prep_kernel<<<1, kThreads, 0, stream>>>(p);
  GD_CHECK_LAUNCH();
}

void SpecPrep::download(std::int32_t j, std::span<std::int32_t> host, cudaStream_t stream) const {
  GD_REQUIRE(j >= 0 && j < max_draft_, "j", j, "0 (verify) or a draft decode");
  const std::size_t words = prep_.layout().total_words;
  GD_REQUIRE(host.size() == words, "host", host.size(), "needs one whole metadata block");
  GD_CUDA(cudaMemcpyAsync(host.data(), blocks_.data() + static_cast<std::size_t>(j) * words,
                          words * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream));
  GD_CUDA(cudaStreamSynchronize(stream));
}

void scatter_draft_tokens(const SpecPrep& prep, std::int32_t k, std::int32_t j,
                          const std::int32_t* tokens, std::int32_t max_rows, cudaStream_t stream) {
  GD_REQUIRE(j >= 0 && j < k, "j", j, "a draft phase before the verify (0 .. k - 1)");
  ScatterParams p;
  p.tokens = tokens;
  p.num_requests = prep.verify().scalars + StepMetaLayout::kNumRequests;
  p.verify_ids = prep.verify().token_id;
  p.next_ids = j + 1 < k ? prep.draft_decode(j + 1).token_id : nullptr;
  p.k = k;
  p.j = j;
  p.max_rows = max_rows;
  scatter_draft_kernel<<<static_cast<unsigned>((max_rows + kThreads - 1) / kThreads), kThreads, 0,
                         stream>>>(p);
  GD_CHECK_LAUNCH();
}

}  // namespace graphdecode
