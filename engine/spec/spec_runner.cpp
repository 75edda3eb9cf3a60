#include "engine/spec/spec_runner.h"

#include <algorithm>
#include <set>
#include <span>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "common/nvtx.h"
#include "engine/kernels/model_kernels.h"
#include "engine/spec/eagle_proposer.h"

namespace graphdecode {

std::vector<SpecKRule> default_k_rules(std::int32_t k) {
  return {{8, k}, {32, std::min(k, 3)}, {64, std::min(k, 1)}};
}

std::int32_t k_for_batch(const std::vector<SpecKRule>& rules, std::int32_t batch) {
  for (const SpecKRule& r : rules)
    if (batch <= r.max_batch) return r.k;
  return 0;
}

SpecRunner::SpecRunner(const HostWeights& target, const HostWeights* draft,
                       const RuntimeOptions& options, const SpecRunnerConfig& config,
                       cudaStream_t stream, const EagleWeights* eagle)
    : config_(config), stream_(stream) {
  const std::int32_t kmax = config_.max_draft_tokens;
  GD_REQUIRE(kmax >= 1 && kmax <= kMaxSpecDrafts, "speculative.max_draft_tokens", kmax,
             "in [1, " + std::to_string(kMaxSpecDrafts) + "]");
  const bool model = config_.proposer == SpecProposer::kDraftModel;
  GD_REQUIRE(model == (draft != nullptr), "draft", draft ? "given" : "none",
             model ? "the draft-model proposer needs a draft model"
                   : "prompt lookup proposes without a draft model");
  GD_REQUIRE(!model || draft->config.vocab_size == target.config.vocab_size, "draft.vocab_size",
             model ? draft->config.vocab_size : 0,
             "a draft model proposes the target's tokens: its vocabulary must be the target's (" +
                 std::to_string(target.config.vocab_size) + ")");
  const bool head = config_.proposer == SpecProposer::kEagle;
  GD_REQUIRE(head == (eagle != nullptr), "eagle", eagle ? "given" : "none",
             head ? "the EAGLE proposer needs an EAGLE head"
                  : "an EAGLE head was given to another proposer");
  if (head) check_eagle_fits(eagle->config, target.config);
  if (config_.k_by_batch.empty()) config_.k_by_batch = default_k_rules(kmax);
  for (std::size_t i = 0; i < config_.k_by_batch.size(); ++i) {
    const SpecKRule& r = config_.k_by_batch[i];
    GD_REQUIRE(r.k >= 0 && r.k <= kmax, "speculative.k_by_batch[" + std::to_string(i) + "].k", r.k,
               "in [0, max_draft_tokens]");
  }
  std::vector<AttentionLayout> layouts = {llama_attention_layout(target.config)};
  if (model) layouts.push_back(llama_attention_layout(draft->config));
  if (head) layouts.push_back(llama_attention_layout(eagle->config.layer));
  StepCapacity cap = step_capacity(options, layouts);
  cap.aux_words = SamplingWords::kCount;
  cap.max_draft_tokens = kmax;
  std::vector<LedgerPool> pools = ledger_pools(cap, options);
  // An EAGLE head's position p holds token p + 1: its pages are shared under the next page's key
  // (LedgerPool::key_shift), so a hit never makes it write a page it shares.
  if (head)
    for (LedgerPool& p : pools)
      if (p.group == 1) p.key_shift = 1;
  step_ = std::make_unique<StepContext>(cap, pools);
  target_rt_ = std::make_unique<ModelRuntime>(layouts[0], options, *step_, 0, stream);
  target_ = std::make_unique<LlamaModel>(target, options, stream);
  if (head) enable_eagle_states(*target_, eagle->config, stream);  // before any capture
  program_ = std::make_unique<SpecStep>(*target_rt_, *target_, stream);
  if (head) {
    draft_rt_ = std::make_unique<ModelRuntime>(layouts[1], options, *step_, 1, stream);
    proposer_ = std::make_unique<EagleProposer>(*draft_rt_, *eagle, *target_, options, stream);
  } else if (model) {
    draft_rt_ = std::make_unique<ModelRuntime>(layouts[1], options, *step_, 1, stream);
    draft_ = std::make_unique<LlamaModel>(*draft, options, stream);
    proposer_ = std::make_unique<DraftModelProposer>(*draft_rt_, *draft_, stream);
  } else {
    // With the prefix cache, the target's full pool keeps each page's tokens for hit requests.
    const bool pages = options.prefix_cache && target_rt_->has_pool(AttentionKind::kFull);
    proposer_ =
        std::make_unique<NgramProposer>(step_->prep(), config_.ngram, stream,
                                        pages ? &target_rt_->pool(AttentionKind::kFull) : nullptr);
  }
  program_->set_proposer(*proposer_);
  StepGraphsConfig gc;
  gc.use_graphs = config_.use_graphs;
  std::set<std::int32_t> ks = {0};  // a batch past every rule drafts nothing
  for (const SpecKRule& r : config_.k_by_batch) ks.insert(r.k);
  for (std::int32_t k : ks) gc.modes.push_back({StepMode::kSpeculative, k});
  graphs_ = std::make_unique<StepGraphs>(step_->input(), *program_, gc);
  graphs_->capture(stream);
  const auto b = static_cast<std::size_t>(options.max_batch);
  requests_.reserve(b);
  token_ids_.reserve(static_cast<std::size_t>(cap.max_tokens));
  aux_.reserve(b * SamplingWords::kCount);
  state_.reserve(4 * b);
  published_ = PinnedBuffer<std::int32_t>(b * static_cast<std::size_t>(program_->stride()) + 1);
}

void SpecRunner::write_aux(const Scheduler& scheduler, const PlannedRequest& p, bool prefill) {
  const SamplingParams& sp = scheduler.sampling(p.id);
  // Acceptance is exact for greedy and sampled requests; a request that does not speculate
  // commits the target's own token of its first verify row.
  const std::int32_t limit = scheduler.speculates(p.id) ? -1 : 0;
  const std::size_t at = aux_.size();
  aux_.resize(at + SamplingWords::kCount);
  SamplingWords::write(sp, limit, std::span<std::int32_t>(aux_).subspan(at, SamplingWords::kCount));
  // A prefill chunk at the request's prefix hit: the pools hold [0, hit) already (an EAGLE head
  // one position more; eagle_rules.h).
  aux_[at + SamplingWords::kStartsAtHit] =
      prefill && p.prefix_len > 0 && p.prefix_len == scheduler.prefix_hit(p.id) ? 1 : 0;
}

void SpecRunner::run(const StepPlan& plan, const Scheduler& scheduler, StepResult& out) {
  requests_.clear();
  token_ids_.clear();
  aux_.clear();
  KvLedger& ledger = step_->ledger();
  const bool decode = plan.kind == StepKind::kDecode;
  const std::int32_t k =
      decode ? k_for_batch(config_.k_by_batch, static_cast<std::int32_t>(plan.requests.size())) : 0;
  // Draft, verify and accept run inside one graph: the host sees one launch (payload k).
  const NvtxRange phase(decode ? "graphdecode.speculative" : "graphdecode.prefill",
                        decode ? NvtxColor::kSpec : NvtxColor::kPrefill,
                        static_cast<std::int64_t>(plan.requests.size()));
  NvtxRange launch("graphdecode.launch", NvtxColor::kLaunch, k);
  for (const PlannedRequest& p : plan.requests) {
    if (decode) {
      const SpecRequestState& s = state_.at(p.id);
      reserve_spec_step(ledger, p.slot, s, k);  // within the request's reservation
      requests_.push_back(
          StepRequest{p.slot, s.draft_cached, static_cast<std::int32_t>(s.pending.size()), 0});
      token_ids_.insert(token_ids_.end(), s.pending.begin(), s.pending.end());
    } else {
      ledger.extend(p.slot, p.extend_len);  // both models follow the prompt
      requests_.push_back(StepRequest{p.slot, p.prefix_len, p.extend_len, 0});
      token_ids_.insert(token_ids_.end(), p.tokens.begin(), p.tokens.end());
    }
    write_aux(scheduler, p, !decode);
  }
  StepDesc d;
  d.mode = decode ? StepMode::kSpeculative : StepMode::kExtend;
  d.tokens_per_request = k;
  d.requests = requests_;
  d.token_ids = token_ids_;
  d.aux = aux_;
  step_->attach_commands(d);
  out.path = graphs_->step(d, stream_);
  ledger.clear_commands();
  launch.next("graphdecode.wait", NvtxColor::kWait);  // the step's one wait, below
  const std::int32_t stride = program_->stride();
  const std::size_t words = published_.size();
  GD_CUDA(cudaMemcpyAsync(published_.data(), program_->published(), words * sizeof(std::int32_t),
                          cudaMemcpyDeviceToHost, stream_));
  copied_.record(stream_);
  copied_.synchronize();  // the step's one wait: the host needs the tokens (stop, callbacks)
  const std::int32_t bad = published_.data()[words - 1];
  GD_REQUIRE(bad == 0, "bad_token_flag", bad, kModelErrorFlagBits);

  out.drafts = k;
  out.phase_us = {};
  if (decode) out.phase_us = program_->phase_us();  // the step is done: its events are too
  out.counts.clear();
  out.tokens.clear();
  for (std::size_t i = 0; i < plan.requests.size(); ++i) {
    const PlannedRequest& p = plan.requests[i];
    const std::int32_t* row = published_.data() + i * static_cast<std::size_t>(stride);
    const std::span<const std::int32_t> committed(row + 1, static_cast<std::size_t>(row[0]));
    if (decode) {
      commit_spec_step(ledger, p.slot, state_.at(p.id), committed);
    } else if (p.samples) {  // the prompt is cached in both models; the sampled token is pending
      const std::int32_t cached = p.prefix_len + p.extend_len;
      state_[p.id] = SpecRequestState{cached, cached, {committed.begin(), committed.end()}};
    }
    const std::int32_t n = decode || p.samples ? static_cast<std::int32_t>(committed.size()) : 0;
    out.counts.push_back(n);
    out.tokens.insert(out.tokens.end(), committed.begin(), committed.begin() + n);
  }
}

void SpecRunner::retire(std::span<const TokenEvent> events) {
  for (const TokenEvent& e : events)
    if (e.finished) state_.erase(e.id);
}

}  // namespace graphdecode
