#include <algorithm>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/spec/accept.h"
#include "engine/spec/spec_step.h"

namespace graphdecode {

SpecStep::SpecStep(ModelRuntime& target_runtime, LlamaModel& target, ModelRuntime& draft_runtime,
                   LlamaModel& draft, cudaStream_t stream)
    : target_rt_(target_runtime),
      target_(target),
      draft_rt_(draft_runtime),
      draft_(draft),
      input_(target_runtime.step().input()),
      max_batch_(input_.capacity().max_batch),
      max_draft_(input_.capacity().max_draft_tokens),
      spec_(target_runtime.step().prep(), std::max(1, input_.capacity().max_draft_tokens)),
      draft_sampler_(max_batch_, draft.vocab(), stream),
      target_sampler_(max_batch_ * (max_draft_ + 1), target.vocab(), stream) {
  const StepCapacity& cap = input_.capacity();
  GD_REQUIRE(&draft_runtime.step() == &target_runtime.step(), "draft_runtime", "another step",
             "the draft runs in the target's step (one StepContext)");
  GD_REQUIRE(target_runtime.model() == 0 && draft_runtime.model() == 1, "draft_runtime.model",
             draft_runtime.model(), "the target is model 0 of the step, its draft model 1");
  GD_REQUIRE(draft.vocab() == target.vocab(), "draft.vocab_size", draft.vocab(),
             "a draft model proposes the target's tokens: vocabularies must match (target " +
                 std::to_string(target.vocab()) + ")");
  GD_REQUIRE(cap.max_draft_tokens >= 1, "capacity.max_draft_tokens", cap.max_draft_tokens,
             "a speculative step input needs max_draft_tokens >= 1");
  GD_REQUIRE(cap.aux_words == SamplingWords::kCount, "capacity.aux_words", cap.aux_words,
             "the speculative step samples with SamplingWords");
  GD_REQUIRE(target.max_logit_rows() >= max_batch_ * (max_draft_ + 1), "target.max_logit_rows",
             target.max_logit_rows(), "the verify needs logits for every row");
  GD_REQUIRE(cap.resolved_max_logit_rows() >= max_batch_ * (max_draft_ + 1),
             "capacity.max_logit_rows", cap.resolved_max_logit_rows(),
             "the verify needs logits for every row");
  draft_tokens_ = DeviceBuffer<std::int32_t>(static_cast<std::size_t>(max_batch_));
  picks_ = DeviceBuffer<std::int32_t>(static_cast<std::size_t>(max_batch_) * (max_draft_ + 1));
  published_ = DeviceBuffer<std::int32_t>(static_cast<std::size_t>(max_batch_) * stride() + 1);
  for (auto* b : {&draft_tokens_, &picks_, &published_}) b->fill_bytes(0, stream);
  GD_CUDA(cudaStreamSynchronize(stream));
}

void SpecStep::enqueue(const StepShape& shape, cudaStream_t stream) {
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
  target_rt_.plan(stream);
  draft_rt_.plan(stream);
  target_.forward(target_rt_, m, shape, nullptr, stream);
  draft_.forward(draft_rt_, m, shape, nullptr, stream);
  target_sampler_.enqueue(m, input_.device_view().aux, target_.logits(), rows, picks_.data(),
                          stream);
  publish_last_tokens(m, picks_.data(), max_batch_, published_.data(), stride(),
                      target_.bad_token_flag(), draft_.bad_token_flag(), stream);
}

void SpecStep::speculate(const StepShape& shape, cudaStream_t stream) {
  const std::int32_t k = shape.tokens_per_request;
  GD_REQUIRE(k >= 0 && k <= max_draft_, "tokens_per_request", k, "outside [0, max_draft_tokens]");
  const StepPrep& prep = target_rt_.step().prep();
  const StepMetaView& x = prep.device();
  const std::int32_t b = std::clamp(shape.bucket, 1, max_batch_);
  const std::int32_t* aux = input_.device_view().aux;
  prep.enqueue(stream);
  spec_.enqueue(k, stream);

  // Draft-extend over the committed tokens: its last row gives d_1.
  draft_rt_.plan(x, stream);
  StepShape ds = shape;
  ds.logit_capacity = b;
  draft_.forward(draft_rt_, x, ds, nullptr, stream);
  draft_sampler_.enqueue(x, aux, draft_.logits(), b, draft_tokens_.data(), stream);
  if (k >= 1) scatter_draft_tokens(spec_, k, 0, draft_tokens_.data(), b, stream);
  // Draft decodes 1 .. k - 1.
  for (std::int32_t j = 1; j < k; ++j) {
    const StepMetaView& m = spec_.draft_decode(j);
    draft_rt_.plan(m, stream);
    draft_.forward(draft_rt_, m, StepShape{StepMode::kDecode, b, b, b, 1}, nullptr, stream);
    draft_sampler_.enqueue(m, aux, draft_.logits(), b, draft_tokens_.data(), stream);
    scatter_draft_tokens(spec_, k, j, draft_tokens_.data(), b, stream);
  }
  // Verify: the target over the last committed token and the k drafts, logits for every row.
  const StepMetaView& v = spec_.verify();
  const std::int32_t rows = b * (k + 1);
  target_rt_.plan(v, stream);
  target_.forward(target_rt_, v, StepShape{StepMode::kTargetVerify, b, rows, rows, k + 1}, nullptr,
                  stream);
  target_sampler_.enqueue(v, aux, target_.logits(), rows, picks_.data(), stream);
  AcceptArgs a;
  a.verify = v;
  a.picks = picks_.data();
  a.k = k;
  a.aux = aux;
  a.aux_words = SamplingWords::kCount;
  a.accept_limit_word = SamplingWords::kAcceptLimit;
  a.out = published_.data();
  a.stride = stride();
  a.max_rows = max_batch_;
  a.flag_a = target_.bad_token_flag();
  a.flag_b = draft_.bad_token_flag();
  accept_greedy(a, stream);
}

}  // namespace graphdecode
