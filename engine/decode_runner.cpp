#include "engine/decode_runner.h"

#include <span>

#include "common/cuda_check.h"
#include "common/error.h"
#include "common/nvtx.h"
#include "engine/kernels/model_kernels.h"
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
  for (auto& buf : published_)
    buf = PinnedBuffer<std::int32_t>(static_cast<std::size_t>(program_->max_rows()) + 1);
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
  launch(plan, scheduler);
  collect(plan, out);
}

void DecodeRunner::launch(const StepPlan& plan, const Scheduler& scheduler) {
  GD_REQUIRE(launched_ - collected_ < 2, "steps in flight", launched_ - collected_,
             "at most two steps are launched and not collected");
  admit_encoders(plan, scheduler);
  requests_.clear();
  token_ids_.clear();
  aux_.clear();
  const bool decode = plan.kind == StepKind::kDecode;
  const NvtxRange phase(decode ? "graphdecode.decode" : "graphdecode.prefill",
                        decode ? NvtxColor::kDecode : NvtxColor::kPrefill,
                        static_cast<std::int64_t>(plan.requests.size()));
  const NvtxRange launch("graphdecode.launch", NvtxColor::kLaunch);  // image, copy, graph launch
  KvLedger& ledger = step_->ledger();
  for (const PlannedRequest& p : plan.requests) {
    // Cannot fail for want of pages: the scheduler admitted the request only with its whole
    // extent reserved (a row planned ahead stays inside it: it is never past max_new_tokens).
    ledger.extend(p.slot, p.extend_len);
    requests_.push_back(StepRequest{p.slot, p.prefix_len, p.extend_len, p.encoder_len});
    if (decode) {
      // The input token is the one this slot sampled last step, already on the device (written
      // by the step before, even one still running: the stream orders them).
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
  const auto b = static_cast<std::size_t>(launched_ % 2);
  started_[b].record(stream_);
  path_[b] = graphs_->step(d, stream_);
  ledger.clear_commands();
  // The read-back of this step's tokens, ordered after it on the stream (a later step rewrites
  // the device buffer only after this copy).
  const auto rows = static_cast<std::size_t>(program_->max_rows());
  GD_CUDA(cudaMemcpyAsync(published_[b].data(), program_->published(),
                          (rows + 1) * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream_));
  copied_[b].record(stream_);
  ++launched_;
}

void DecodeRunner::collect(const StepPlan& plan, StepResult& out) {
  GD_REQUIRE(collected_ < launched_, "steps in flight", 0, "collect() without a launched step");
  const auto b = static_cast<std::size_t>(collected_ % 2);
  ++collected_;
  {
    const NvtxRange wait("graphdecode.wait", NvtxColor::kWait);
    copied_[b].synchronize();  // the step's one wait: the host needs the tokens (stop, callbacks)
  }
  const auto rows = static_cast<std::size_t>(program_->max_rows());
  const std::int32_t* published = published_[b].data();
  const std::int32_t bad = published[rows];
  GD_REQUIRE(bad == 0, "bad_token_flag", bad, kModelErrorFlagBits);
  out.path = path_[b];
  GD_CUDA(cudaEventElapsedTime(&out.device_us, started_[b].get(), copied_[b].get()));
  out.device_us *= 1000.f;
  out.drafts = 0;
  out.counts.assign(plan.requests.size(), 1);
  out.tokens.assign(published, published + plan.requests.size());
}

}  // namespace graphdecode
