#include <algorithm>
#include <span>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "spec_stack.h"
#include "synthetic.h"

namespace graphdecode::fuzz {
namespace {

constexpr int kThreads = 128;

struct DraftTokenParams {
  StepMetaView meta;     // the phase the tokens follow (device block)
  std::int32_t* tokens;  // [max_batch] scatter_draft_tokens' source
  std::int32_t* record;  // [max_batch] this phase's row of the record
  std::int32_t rows;     // the grid covers this many requests
  std::int32_t vocab;
  std::uint32_t seed;
};

// One thread per request: the token after its last row of the phase. Rows past num_requests
// (padding) write nothing.
__global__ void __launch_bounds__(kThreads)
    draft_token_kernel(const __grid_constant__ DraftTokenParams p) {
  const std::int32_t r = static_cast<std::int32_t>(blockIdx.x * kThreads + threadIdx.x);
  if (r >= p.rows || r >= p.meta.scalars[StepMetaLayout::kNumRequests]) return;
  const std::int32_t row = p.meta.q_start[r + 1] - 1;
  const std::int32_t t = synthetic::draft_token(p.seed, p.meta.slot[r], p.meta.token_position[row],
                                                p.meta.token_id[row], p.vocab);
  p.tokens[r] = t;
  p.record[r] = t;
}

bool same_options(const RuntimeOptions& a, const RuntimeOptions& b) {
  return a.max_batch == b.max_batch && a.max_tokens == b.max_tokens &&
         a.max_kv_len == b.max_kv_len && a.max_new_tokens == b.max_new_tokens &&
         a.max_encoder_len == b.max_encoder_len && a.max_logit_rows == b.max_logit_rows &&
         a.page_size == b.page_size && a.max_slots == b.max_slots && a.full_pages == b.full_pages &&
         a.sliding_pages == b.sliding_pages && a.cross_pages == b.cross_pages &&
         a.deterministic == b.deterministic;
}

}  // namespace

void SpecStackConfig::validate() const {
  target.validate();
  draft.validate();
  GD_REQUIRE(same_options(target.options, draft.options), "draft.options", "differ",
             "both stacks run in one step: the draft's options must equal the target's");
  GD_REQUIRE(max_draft_tokens >= 1 && max_draft_tokens <= kMaxSpecDrafts, "max_draft_tokens",
             max_draft_tokens, "in [1, " + std::to_string(kMaxSpecDrafts) + "]");
  GD_REQUIRE(vocab >= 1, "vocab", vocab, "must be positive");
}

StepCapacity spec_step_capacity(const SpecStackConfig& c) {
  c.validate();
  const AttentionLayout models[] = {c.target.layout, c.draft.layout};
  StepCapacity cap = step_capacity(c.target.options, models);
  cap.max_draft_tokens = c.max_draft_tokens;
  cap.validate();
  return cap;
}

SpecStack::SpecStack(const SpecStackConfig& config, StepContext& step, cudaStream_t stream)
    : config_(config),
      step_(step),
      target_(config.target, step, stream, 0),
      draft_(config.draft, step, stream, 1),
      max_batch_(step.capacity().max_batch),
      spec_(step.prep(), config.max_draft_tokens) {
  config_.validate();
  GD_REQUIRE(step.capacity().max_draft_tokens == config_.max_draft_tokens,
             "capacity.max_draft_tokens", step.capacity().max_draft_tokens,
             "the step was not built from spec_step_capacity(config)");
  const auto b = static_cast<std::size_t>(max_batch_);
  const auto k = static_cast<std::size_t>(config_.max_draft_tokens);
  tokens_ = DeviceBuffer<std::int32_t>(b);
  record_ = DeviceBuffer<std::int32_t>(k * b);
  decode_residual_ = DeviceBuffer<float>(std::max<std::size_t>(1, k - 1) * b *
                                         static_cast<std::size_t>(draft_.row_elems()));
  tokens_.fill_bytes(0, stream);
  record_.fill_bytes(0, stream);
  decode_residual_.fill_bytes(0, stream);
  GD_CUDA(cudaStreamSynchronize(stream));
}

const float* SpecStack::draft_decode_residual(std::int32_t j) const {
  return decode_out(j);
}

float* SpecStack::decode_out(std::int32_t j) const {
  GD_REQUIRE(j >= 1 && j < config_.max_draft_tokens, "j", j,
             "draft decodes are 1 .. max_draft_tokens - 1");
  return decode_residual_.data() + static_cast<std::size_t>(j - 1) * max_batch_ *
                                       static_cast<std::size_t>(draft_.row_elems());
}

void SpecStack::enqueue(const StepShape& shape, cudaStream_t stream) {
  GD_REQUIRE(shape.token_capacity >= 1, "token_capacity", shape.token_capacity, "must be positive");
  if (shape.mode == StepMode::kSpeculative) {
    speculate(shape, stream);
  } else {
    plain(shape, stream);
  }
}

void SpecStack::plain(const StepShape& shape, cudaStream_t stream) {
  const StepMetaView& x = step_.prep().device();
  step_.prep().enqueue(stream);
  target_.runtime().plan(x, stream);
  draft_.runtime().plan(x, stream);
  target_.forward(x, shape.token_capacity, target_.residual(), stream);
  draft_.forward(x, shape.token_capacity, draft_.residual(), stream);
}

void SpecStack::sample_drafts(const StepMetaView& meta, std::int32_t j, std::int32_t rows,
                              cudaStream_t stream) {
  DraftTokenParams p;
  p.meta = meta;
  p.tokens = tokens_.data();
  p.record = record_.data() + static_cast<std::size_t>(j) * max_batch_;
  p.rows = rows;
  p.vocab = config_.vocab;
  p.seed = config_.draft_seed;
  draft_token_kernel<<<static_cast<unsigned>((rows + kThreads - 1) / kThreads), kThreads, 0,
                       stream>>>(p);
  GD_CHECK_LAUNCH();
}

void SpecStack::speculate(const StepShape& shape, cudaStream_t stream) {
  const std::int32_t k = shape.tokens_per_request;
  GD_REQUIRE(k >= 0 && k <= config_.max_draft_tokens, "tokens_per_request", k,
             "outside [0, max_draft_tokens]");
  const StepPrep& prep = step_.prep();
  const StepMetaView& x = prep.device();
  const std::int32_t b = std::clamp(shape.bucket, 1, max_batch_);
  const std::int32_t max_tokens = step_.capacity().max_tokens;
  prep.enqueue(stream);
  spec_.enqueue(k, stream);

  // Draft-extend over the committed tokens; its last row per request gives d_1.
  draft_.runtime().plan(x, stream);
  draft_.forward(x, shape.token_capacity, draft_.residual(), stream);
  sample_drafts(x, 0, b, stream);
  if (k >= 1) scatter_draft_tokens(spec_, k, 0, tokens_.data(), b, stream);
  // Draft decodes 1 .. k - 1: d_j at P + j gives d_{j+1}.
  for (std::int32_t j = 1; j < k; ++j) {
    const StepMetaView& m = spec_.draft_decode(j);
    draft_.runtime().plan(m, stream);
    draft_.forward(m, b, decode_out(j), stream);
    sample_drafts(m, j, b, stream);
    scatter_draft_tokens(spec_, k, j, tokens_.data(), b, stream);
  }
  // Verify: the target over the last committed token and d_1 .. d_k.
  const StepMetaView& v = spec_.verify();
  target_.runtime().plan(v, stream);
  target_.forward(v, std::min(b * (k + 1), max_tokens), target_.residual(), stream);
}

}  // namespace graphdecode::fuzz
