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
  // Each draft phase keeps its logits and distributions until the step's acceptance reads them.
  const auto phases =
      static_cast<std::size_t>(std::max(1, runtime.step().capacity().max_draft_tokens));
  const auto rows = phases * static_cast<std::size_t>(max_batch_);
  logits_ = DeviceBuffer<float>(rows * static_cast<std::size_t>(model.vocab()));
  stats_ = DeviceBuffer<SamplingRowStats>(rows);
  logits_.fill_bytes(0, stream);
  stats_.fill_bytes(0, stream);
}

void DraftModelProposer::prefill(const StepMetaView& meta, const StepShape& shape,
                                 cudaStream_t stream) {
  runtime_.plan(meta, stream, prompt_tokens_hint(shape));
  model_.forward(runtime_, meta, shape, nullptr, stream);  // its cache follows the prompt
}

void DraftModelProposer::propose(const SpecPrep& spec, const StepShape& shape, std::int32_t k,
                                 cudaStream_t stream) {
  const StepMetaView& x = runtime_.meta();  // the draft-extend: the committed tokens
  const std::int32_t b = std::clamp(shape.bucket, 1, max_batch_);
  const std::int32_t* aux = runtime_.step().input().device_view().aux;
  // Draft-extend over the committed tokens: its last row gives d_1.
  const auto phase_rows = static_cast<std::size_t>(max_batch_);
  const auto vocab = static_cast<std::size_t>(model_.vocab());
  runtime_.plan(x, stream);
  StepShape ds = shape;
  ds.logit_capacity = b;
  model_.forward(runtime_, x, ds, logits_.data(), stream);
  sampler_.enqueue(x, aux, logits_.data(), b, tokens_.data(), stream, stats_.data());
  if (k >= 1) scatter_draft_tokens(spec, k, 0, tokens_.data(), b, stream);
  // Draft decodes 1 .. k - 1, each sampling the next draft; phase j's rows are kept at j.
  for (std::int32_t j = 1; j < k; ++j) {
    const StepMetaView& m = spec.draft_decode(j);
    float* logits = logits_.data() + static_cast<std::size_t>(j) * phase_rows * vocab;
    const StepShape decode{StepMode::kDecode, b, b, b, 1};
    runtime_.plan(m, stream, 0, runtime_.requests_hint(decode));
    model_.forward(runtime_, m, decode, logits, stream);
    sampler_.enqueue(m, aux, logits, b, tokens_.data(), stream,
                     stats_.data() + static_cast<std::size_t>(j) * phase_rows);
    scatter_draft_tokens(spec, k, j, tokens_.data(), b, stream);
  }
}

}  // namespace graphdecode
