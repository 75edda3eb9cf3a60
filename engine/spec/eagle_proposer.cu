#include <algorithm>
#include <array>
#include <vector>

#include "common/cuda_check.h"
#include "common/error.h"
#include "engine/spec/eagle_proposer.h"

namespace graphdecode {
namespace {

constexpr int kThreads = 256;

// Grid (request, carry row): copies one target state into the slot's carry, 16-byte vectors.
struct CarryParams {
  StepMetaView meta;
  const uint4* target;  // [max_tokens][hidden]
  uint4* carry;         // [max_slots][stride][hidden]
  std::int32_t stride, row_vecs;
  bool last_only;
};

__global__ void __launch_bounds__(kThreads)
    save_carry_kernel(const __grid_constant__ CarryParams p) {
  const auto r = static_cast<std::int32_t>(blockIdx.x);
  const auto i = static_cast<std::int32_t>(blockIdx.y);
  if (r >= p.meta.scalars[StepMetaLayout::kNumRequests]) return;
  const std::int32_t first = p.meta.q_start[r], end = p.meta.q_start[r + 1];
  std::int32_t row;
  if (p.last_only) {
    if (i != 0) return;
    row = end - 1;
  } else {
    if (first + i >= end) return;
    row = first + i;
  }
  const std::int64_t dst = (static_cast<std::int64_t>(p.meta.slot[r]) * p.stride + i) * p.row_vecs;
  const std::int64_t src = static_cast<std::int64_t>(row) * p.row_vecs;
  for (std::int32_t e = static_cast<std::int32_t>(threadIdx.x); e < p.row_vecs; e += kThreads)
    p.carry[dst + e] = p.target[src + e];
}

}  // namespace

void enable_eagle_states(LlamaModel& target, const EagleConfig& head, cudaStream_t stream) {
  if (!head.eagle3()) {
    target.enable_hidden_states(stream);
    return;
  }
  const std::array<std::int32_t, 3> points = eagle3_capture_layers(head, target.config());
  target.enable_aux_hidden_states(points, stream);
}

EagleProposer::EagleProposer(ModelRuntime& runtime, const EagleWeights& head,
                             const LlamaModel& target, const RuntimeOptions& options,
                             cudaStream_t stream)
    : runtime_(runtime),
      target_(target),
      max_batch_(runtime.step().capacity().max_batch),
      // A verify has at most max_draft_tokens + 1 rows per request; a prefill carries one.
      carry_stride_(std::max(1, runtime.step().capacity().max_draft_tokens) + 1),
      head_(head, target, options, stream),
      prep_(runtime.step().prep(), std::max(1, runtime.step().capacity().max_draft_tokens),
            carry_stride_),
      sampler_(max_batch_, target.vocab(), stream) {
  GD_REQUIRE(runtime.model() == 1, "eagle_runtime.model", runtime.model(),
             "the EAGLE head is model 1 of the target's step");
  if (head.config.eagle3()) {
    const std::array<std::int32_t, 3> points = eagle3_capture_layers(head.config, target.config());
    GD_REQUIRE(target.aux_hidden_states() != nullptr &&
                   target.aux_points() == std::vector<std::int32_t>(points.begin(), points.end()),
               "target.aux_hidden_states", target.aux_points().size(),
               "the target must capture the head's layers (LlamaModel::enable_aux_hidden_states "
               "with eagle3_capture_layers)");
  } else {
    GD_REQUIRE(target.hidden_states() != nullptr, "target.hidden_states", "off",
               "the target must write its hidden states (LlamaModel::enable_hidden_states)");
  }
  GD_REQUIRE(runtime.layout().layers.size() == 1, "eagle_runtime.layers",
             runtime.layout().layers.size(), "the head's runtime has its one layer");
  const StepCapacity& cap = runtime.step().capacity();
  const auto w = static_cast<std::size_t>(head_.state_width());
  carry_ = DeviceBuffer<std::uint16_t>(static_cast<std::size_t>(cap.max_slots) *
                                       static_cast<std::size_t>(carry_stride_) * w);
  carry_.fill_bytes(0, stream);
  tokens_ = DeviceBuffer<std::int32_t>(static_cast<std::size_t>(max_batch_));
  tokens_.fill_bytes(0, stream);
  const auto phases = static_cast<std::size_t>(std::max(1, cap.max_draft_tokens));
  const auto rows = phases * static_cast<std::size_t>(max_batch_);
  logits_ = DeviceBuffer<float>(rows * static_cast<std::size_t>(target.vocab()));
  stats_ = DeviceBuffer<SamplingRowStats>(rows);
  logits_.fill_bytes(0, stream);
  stats_.fill_bytes(0, stream);
  GD_CUDA(cudaStreamSynchronize(stream));
}

void EagleProposer::save_carry(const StepMetaView& meta, bool last_only, cudaStream_t stream) {
  CarryParams p{meta,
                reinterpret_cast<const uint4*>(target_states()),
                reinterpret_cast<uint4*>(carry_.data()),
                carry_stride_,
                head_.state_width() / 8,
                last_only};
  const dim3 grid(static_cast<unsigned>(max_batch_),
                  static_cast<unsigned>(last_only ? 1 : carry_stride_));
  save_carry_kernel<<<grid, kThreads, 0, stream>>>(p);
  GD_CHECK_LAUNCH();
}

void EagleProposer::prefill(const StepMetaView& meta, const StepShape& shape, cudaStream_t stream) {
  // Row 0 of a request reads the state carried from its previous chunk, the others the state of
  // the chunk's row before them (the target's forward of this step has written them); a chunk at
  // the request's prefix hit has no row 0 (the head holds that position in a shared page).
  const std::int32_t* aux = runtime_.step().input().device_view().aux;
  prep_.enqueue(meta, 1, 0, stream, aux + SamplingWords::kStartsAtHit, SamplingWords::kCount);
  const StepMetaView& x = prep_.extend();
  runtime_.plan(x, stream, prompt_tokens_hint(shape));
  const HiddenInput in{nullptr, prep_.hidden_source(), target_states(), carry_.data()};
  head_.forward(runtime_, x, x.token_id, in, std::max(1, shape.token_capacity), 0, nullptr, stream);
  save_carry(meta, true, stream);  // after the head read the previous chunk's
}

void EagleProposer::propose(const SpecPrep& spec, const StepShape& shape, std::int32_t k,
                            cudaStream_t stream) {
  const StepMetaView& x = spec.prep().device();  // the pending tokens, the draft-extend's rows
  const std::int32_t b = std::clamp(shape.bucket, 1, max_batch_);
  const std::int32_t* aux = runtime_.step().input().device_view().aux;
  const auto phase_rows = static_cast<std::size_t>(max_batch_);
  const auto vocab = static_cast<std::size_t>(target_.vocab());
  // Every extend row's state was carried from the previous step's verify (or last chunk).
  prep_.enqueue(x, carry_stride_, k, stream);
  const StepMetaView& e = prep_.extend();
  runtime_.plan(e, stream);
  const HiddenInput carried{nullptr, prep_.hidden_source(), target_states(), carry_.data()};
  head_.forward(runtime_, e, e.token_id, carried, std::max(1, shape.token_capacity), k >= 1 ? b : 0,
                logits_.data(), stream);
  if (k == 0) return;  // the head's cache is current; nothing to draft
  // The sampler reads the step's own block: its rows sit at the tokens' positions, so a draft's
  // RNG counter is the position it proposes for, as the draft model's is.
  sampler_.enqueue(x, aux, logits_.data(), b, tokens_.data(), stream, stats_.data());
  scatter_draft_tokens(spec, k, 0, tokens_.data(), b, stream);
  const HiddenInput own{head_.out(), nullptr, nullptr, nullptr};
  for (std::int32_t j = 1; j < k; ++j) {
    const StepMetaView& d = prep_.decode(j);
    float* logits = logits_.data() + static_cast<std::size_t>(j) * phase_rows * vocab;
    runtime_.plan(d, stream, 0, runtime_.requests_hint(StepShape{StepMode::kDecode, b, b, b, 1}));
    head_.forward(runtime_, d, spec.draft_decode(j).token_id, own, b, b, logits, stream);
    sampler_.enqueue(spec.draft_decode(j), aux, logits, b, tokens_.data(), stream,
                     stats_.data() + static_cast<std::size_t>(j) * phase_rows);
    scatter_draft_tokens(spec, k, j, tokens_.data(), b, stream);
  }
}

void EagleProposer::verified(const SpecPrep& spec, const StepShape& shape, std::int32_t k,
                             cudaStream_t stream) {
  static_cast<void>(shape), static_cast<void>(k);
  save_carry(spec.verify(), false, stream);
}

}  // namespace graphdecode
