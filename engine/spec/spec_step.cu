#include <algorithm>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/spec/accept_sampled.h"
#include "engine/spec/spec_step.h"

namespace graphdecode {

SpecStep::SpecStep(ModelRuntime& target_runtime, LlamaModel& target, cudaStream_t stream)
    : target_rt_(target_runtime),
      target_(target),
      input_(target_runtime.step().input()),
      max_batch_(input_.capacity().max_batch),
      max_draft_(input_.capacity().max_draft_tokens),
      spec_(target_runtime.step().prep(), std::max(1, input_.capacity().max_draft_tokens)),
      target_sampler_(max_batch_ * (max_draft_ + 1), target.vocab(), stream) {
  const StepCapacity& cap = input_.capacity();
  GD_REQUIRE(target_runtime.model() == 0, "target_runtime.model", target_runtime.model(),
             "the target is model 0 of the step");
  GD_REQUIRE(cap.max_draft_tokens >= 1, "capacity.max_draft_tokens", cap.max_draft_tokens,
             "a speculative step input needs max_draft_tokens >= 1");
  GD_REQUIRE(cap.aux_words == SamplingWords::kCount, "capacity.aux_words", cap.aux_words,
             "the speculative step samples with SamplingWords");
  GD_REQUIRE(target.max_logit_rows() >= max_batch_ * (max_draft_ + 1), "target.max_logit_rows",
             target.max_logit_rows(), "the verify needs logits for every row");
  GD_REQUIRE(cap.resolved_max_logit_rows() >= max_batch_ * (max_draft_ + 1),
             "capacity.max_logit_rows", cap.resolved_max_logit_rows(),
             "the verify needs logits for every row");
  picks_ = DeviceBuffer<std::int32_t>(static_cast<std::size_t>(max_batch_) * (max_draft_ + 1));
  stats_ = DeviceBuffer<SamplingRowStats>(static_cast<std::size_t>(max_batch_) * (max_draft_ + 1));
  published_ = DeviceBuffer<std::int32_t>(static_cast<std::size_t>(max_batch_) * stride() + 1);
  for (auto* b : {&picks_, &published_}) b->fill_bytes(0, stream);
  stats_.fill_bytes(0, stream);
  GD_CUDA(cudaStreamSynchronize(stream));
}

void SpecStep::enqueue(const StepShape& shape, cudaStream_t stream) {
  GD_REQUIRE(proposer_ != nullptr, "proposer", "none", "set_proposer before the first step");
  switch (shape.mode) {
    case StepMode::kExtend:
      prefill(shape, stream);
      return;
    case StepMode::kSpeculative:
      speculate(shape, stream);
      return;
    default:
      GD_REQUIRE(false, "mode", step_mode_name(shape.mode),
                 "a speculative engine runs extend (prefill) and speculative steps");
  }
}

void SpecStep::prefill(const StepShape& shape, cudaStream_t stream) {
  const StepPrep& prep = target_rt_.step().prep();
  const StepMetaView& m = prep.device();
  const std::int32_t rows = std::clamp(shape.bucket, 1, max_batch_);
  prep.enqueue(stream);
  target_rt_.plan(stream, prompt_tokens_hint(shape));
  target_.forward(target_rt_, m, shape, nullptr, stream);
  proposer_->prefill(m, shape, stream);
  target_sampler_.enqueue(m, input_.device_view().aux, target_.logits(), rows, picks_.data(),
                          stream);
  publish_last_tokens(m, picks_.data(), max_batch_, published_.data(), stride(),
                      target_.bad_token_flag(), proposer_->error_flag(), stream);
}

void SpecStep::speculate(const StepShape& shape, cudaStream_t stream) {
  const std::int32_t k = shape.tokens_per_request;
  GD_REQUIRE(k >= 0 && k <= max_draft_, "tokens_per_request", k, "outside [0, max_draft_tokens]");
  const StepPrep& prep = target_rt_.step().prep();
  const std::int32_t b = std::clamp(shape.bucket, 1, max_batch_);
  const std::int32_t* aux = input_.device_view().aux;
  marks_[kSpecPrep].record_external(stream);
  prep.enqueue(stream);
  spec_.enqueue(k, stream);
  marks_[kSpecPropose].record_external(stream);
  proposer_->propose(spec_, shape, k, stream);
  marks_[kSpecVerify].record_external(stream);
  // Verify: the target over the last committed token and the k drafts, logits for every row.
  const StepMetaView& v = spec_.verify();
  const std::int32_t rows = b * (k + 1);
  const StepShape vs{StepMode::kTargetVerify, b, rows, rows, k + 1};
  target_rt_.plan(v, stream, 0, target_rt_.requests_hint(vs));
  target_.forward(target_rt_, v, vs, nullptr, stream);
  proposer_->verified(spec_, vs, k, stream);  // EAGLE keeps the verify rows' hidden states
  marks_[kSpecAccept].record_external(stream);
  target_sampler_.enqueue(v, aux, target_.logits(), rows, picks_.data(), stream, stats_.data());
  AcceptSampledArgs a;
  a.verify = v;
  a.k = k;
  a.vocab = target_.vocab();
  a.logits_type = LogitsType::kFloat32;
  a.target_logits = target_.logits();
  a.target_stats = stats_.data();
  a.target_tokens = picks_.data();
  a.draft_kind = proposer_->draft_kind();
  a.draft_logits = proposer_->draft_logits();
  a.draft_stats = proposer_->draft_stats();
  a.draft_rows = proposer_->draft_rows();
  a.aux = aux;
  a.aux_words = SamplingWords::kCount;
  a.seed_lo_word = SamplingWords::kSeedLo;
  a.seed_hi_word = SamplingWords::kSeedHi;
  a.accept_limit_word = SamplingWords::kAcceptLimit;
  a.out = published_.data();
  a.stride = stride();
  a.max_rows = max_batch_;
  a.flag_a = target_.bad_token_flag();
  a.flag_b = proposer_->error_flag();
  accept_sampled(a, stream);
  marks_[kNumSpecPhases].record_external(stream);
}

std::array<float, kNumSpecPhases> SpecStep::phase_us() const {
  std::array<float, kNumSpecPhases> us{};
  for (int p = 0; p < kNumSpecPhases; ++p) us[p] = 1e3f * marks_[p + 1].elapsed_ms_since(marks_[p]);
  return us;
}

}  // namespace graphdecode
