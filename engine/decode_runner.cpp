#include "engine/decode_runner.h"

#include <span>

#include "common/cuda_check.h"
#include "common/error.h"
#include "common/nvtx.h"
#include "graphs/step_rules.h"

namespace graphdecode {

DecodeRunner::DecodeRunner(const HostWeights& weights, const RuntimeOptions& options,
                           bool use_graphs, cudaStream_t stream)
    : stream_(stream) {
  const AttentionLayout layout = llama_attention_layout(weights.config);
  StepCapacity cap = step_capacity(options, std::span<const AttentionLayout>(&layout, 1));
  cap.aux_words = SamplingWords::kCount;
  cap.token_feedback = true;
  step_ = std::make_unique<StepContext>(cap, ledger_pools(cap, options));
  runtime_ = std::make_unique<ModelRuntime>(layout, options, *step_, 0, stream);
  model_ = std::make_unique<LlamaModel>(weights, options, stream);
  program_ = std::make_unique<SamplingStep>(*runtime_, *model_, stream);
  StepGraphsConfig gc;
  gc.modes = {GraphMode{StepMode::kDecode, 1, LogitRows::kLastPerRequest}};
  gc.use_graphs = use_graphs;
  graphs_ = std::make_unique<StepGraphs>(step_->input(), *program_, gc);
  graphs_->capture(stream);
  const auto b = static_cast<std::size_t>(options.max_batch);
  requests_.reserve(b);
  token_ids_.reserve(static_cast<std::size_t>(cap.max_tokens));
  aux_.reserve(b * SamplingWords::kCount);
  published_ = PinnedBuffer<std::int32_t>(static_cast<std::size_t>(program_->max_rows()) + 1);
}

void DecodeRunner::admit_encoders(const StepPlan& plan, const Scheduler& scheduler) {
  if (!runtime_->has_pool(AttentionKind::kCross)) return;
  KvLedger& ledger = step_->ledger();
  bool any = false;
  for (const RequestId id : plan.admitted) {
    const EncoderStates e = scheduler.encoder(id);
    if (e.length == 0) continue;
    // Cannot fail for want of pages: admission reserved them.
    ledger.set_encoder(scheduler.slot(id), e.length);
    any = true;
  }
  if (!any) return;
  // The cross table changes eagerly (with any release commands queued before the new pages), so
  // the projection below writes through it; these commands then ride in no step image.
  LlamaModel::apply_cross_table(*runtime_, stream_);
  for (const RequestId id : plan.admitted) {
    const EncoderStates e = scheduler.encoder(id);
    if (e.length == 0) continue;
    model_->encode(*runtime_, scheduler.slot(id),
                   EncoderStatesView{e.data, e.length, e.on_device, e.first_position}, stream_);
  }
}

void DecodeRunner::run(const StepPlan& plan, const Scheduler& scheduler, StepResult& out) {
  admit_encoders(plan, scheduler);
  requests_.clear();
  token_ids_.clear();
  aux_.clear();
  const bool decode = plan.kind == StepKind::kDecode;
  const NvtxRange phase(decode ? "graphdecode.decode" : "graphdecode.prefill",
                        decode ? NvtxColor::kDecode : NvtxColor::kPrefill,
                        static_cast<std::int64_t>(plan.requests.size()));
  NvtxRange launch("graphdecode.launch", NvtxColor::kLaunch);  // image, copy, graph launch
  KvLedger& ledger = step_->ledger();
  for (const PlannedRequest& p : plan.requests) {
    // Cannot fail for want of pages: the scheduler admitted the request only with its whole
    // extent reserved.
    ledger.extend(p.slot, p.extend_len);
    requests_.push_back(StepRequest{p.slot, p.prefix_len, p.extend_len, p.encoder_len});
    if (decode) {
      // The input token is the one this slot sampled last step, already on the device.
      token_ids_.push_back(step_rules::kTokenFromDevice);
    } else {
      token_ids_.insert(token_ids_.end(), p.tokens.begin(), p.tokens.end());
    }
    const std::size_t at = aux_.size();
    aux_.resize(at + SamplingWords::kCount);
    SamplingWords::write(scheduler.sampling(p.id), 0,
                         std::span<std::int32_t>(aux_).subspan(at, SamplingWords::kCount));
  }
  StepDesc d;
  d.mode = decode ? StepMode::kDecode : StepMode::kExtend;
  d.tokens_per_request = decode ? 1 : 0;
  d.requests = requests_;
  d.token_ids = token_ids_;
  d.aux = aux_;
  step_->attach_commands(d);
  out.path = graphs_->step(d, stream_);
  ledger.clear_commands();
  launch.next("graphdecode.wait", NvtxColor::kWait);  // the step's one wait, below
  const auto rows = static_cast<std::size_t>(program_->max_rows());
  GD_CUDA(cudaMemcpyAsync(published_.data(), program_->published(),
                          (rows + 1) * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream_));
  copied_.record(stream_);
  copied_.synchronize();  // the step's one wait: the host needs the tokens (stop, callbacks)
  const std::int32_t bad = published_.data()[rows];
  GD_REQUIRE(bad == 0, "bad_token_flag", bad,
             "the embedding saw a token id outside the vocabulary (internal error)");
  out.drafts = 0;
  out.counts.assign(plan.requests.size(), 1);
  out.tokens.assign(published_.data(), published_.data() + plan.requests.size());
}

}  // namespace graphdecode
