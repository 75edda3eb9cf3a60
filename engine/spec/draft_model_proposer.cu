#include <algorithm>

#include "common/error.h"
#include "engine/spec/proposer.h"

namespace graphdecode {

DraftModelProposer::DraftModelProposer(ModelRuntime& runtime, LlamaModel& model,
                                       cudaStream_t stream)
    : runtime_(runtime),
      model_(model),
      max_batch_(runtime.step().capacity().max_batch),
      sampler_(max_batch_, model.vocab(), stream) {
  GD_REQUIRE(runtime.model() == 1, "draft_runtime.model", runtime.model(),
             "the draft is model 1 of the target's step");
  tokens_ = DeviceBuffer<std::int32_t>(static_cast<std::size_t>(max_batch_));
  tokens_.fill_bytes(0, stream);
}

void DraftModelProposer::prefill(const StepMetaView& meta, const StepShape& shape,
                                 cudaStream_t stream) {
  runtime_.plan(meta, stream);
  model_.forward(runtime_, meta, shape, nullptr, stream);  // its cache follows the prompt
}

void DraftModelProposer::propose(const SpecPrep& spec, const StepShape& shape, std::int32_t k,
                                 cudaStream_t stream) {
  const StepMetaView& x = runtime_.meta();  // the draft-extend: the committed tokens
  const std::int32_t b = std::clamp(shape.bucket, 1, max_batch_);
  const std::int32_t* aux = runtime_.step().input().device_view().aux;
  // Draft-extend over the committed tokens: its last row gives d_1.
  runtime_.plan(x, stream);
  StepShape ds = shape;
  ds.logit_capacity = b;
  model_.forward(runtime_, x, ds, nullptr, stream);
  sampler_.enqueue(x, aux, model_.logits(), b, tokens_.data(), stream);
  if (k >= 1) scatter_draft_tokens(spec, k, 0, tokens_.data(), b, stream);
  // Draft decodes 1 .. k - 1, each sampling the next draft.
  for (std::int32_t j = 1; j < k; ++j) {
    const StepMetaView& m = spec.draft_decode(j);
    runtime_.plan(m, stream);
    model_.forward(runtime_, m, StepShape{StepMode::kDecode, b, b, b, 1}, nullptr, stream);
    sampler_.enqueue(m, aux, model_.logits(), b, tokens_.data(), stream);
    scatter_draft_tokens(spec, k, j, tokens_.data(), b, stream);
  }
}

}  // namespace graphdecode
