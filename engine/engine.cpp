#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <span>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "common/nvtx.h"
#include "common/request_rules.h"
#include "engine/decode_runner.h"

namespace graphdecode {
namespace {

const EngineConfig& validated(const EngineConfig& c) {
  GD_REQUIRE(c.max_batch >= 1, "max_batch", c.max_batch, "must be positive");
  GD_REQUIRE(c.max_step_tokens >= 1, "max_step_tokens", c.max_step_tokens, "must be positive");
  GD_REQUIRE(c.max_context >= 2, "max_context", c.max_context, "must be at least 2");
  GD_REQUIRE(c.kv_pages >= 0, "kv_pages", c.kv_pages, "cannot be negative (0 = default)");
  GD_REQUIRE(c.sliding_pages >= 0, "sliding_pages", c.sliding_pages,
             "cannot be negative (0 = default)");
  GD_REQUIRE(c.page_size >= 1, "page_size", c.page_size, "must be positive");
  GD_REQUIRE(c.max_encoder_len >= 0, "max_encoder_len", c.max_encoder_len,
             "cannot be negative (0 = no encoder input)");
  GD_REQUIRE(c.cross_pages >= 0, "cross_pages", c.cross_pages, "cannot be negative (0 = default)");
  GD_REQUIRE(
      c.speculative.max_draft_tokens >= 0 && c.speculative.max_draft_tokens <= kMaxSpecDrafts,
      "speculative.max_draft_tokens", c.speculative.max_draft_tokens,
      "in [0, " + std::to_string(kMaxSpecDrafts) + "] (0 = off)");
  return c;
}

// Room for every slot at max_context, plus the k draft rows a speculative step writes past the
// last committed token (the scheduler reserves them: reserve_slack), so that a request of
// max_context tokens is admitted with speculation on as it is without.
std::int32_t default_kv_pages(const EngineConfig& c) {
  return c.max_batch *
         pages_for_tokens(c.max_context + c.speculative.max_draft_tokens, c.page_size);
}

RuntimeOptions runtime_options(const EngineConfig& c, const ModelConfig& target) {
  const std::int32_t k = c.speculative.max_draft_tokens;
  RuntimeOptions o;
  o.max_batch = c.max_batch;
  // A speculative step verifies k + 1 rows per request, k positions past the last committed token.
  o.max_tokens = std::max({c.max_step_tokens, c.max_batch, c.max_batch * (k + 1)});
  o.max_logit_rows = k > 0 ? c.max_batch * (k + 1) : 0;
  o.max_kv_len = c.max_context + k;
  o.page_size = c.page_size;
  o.deterministic = c.deterministic;
  // Prompt lookup proposes from a device history of each slot's tokens written from the step's
  // token rows; a hit's positions are filled from a token array kept beside the target's full
  // pool (engine/spec/proposer.h, NgramProposer). A target with no full-attention layer has no
  // such pool (its sliding pages leave the window): it serves prompt lookup without the cache. A
  // draft model keeps no such state: its pools are matched with the target's (a hit covers both).
  const bool any_full = std::any_of(target.layers.begin(), target.layers.end(),
                                    [](const auto& l) { return l.kind == AttentionKind::kFull; });
  o.prefix_cache =
      c.prefix_cache && !(k > 0 && c.speculative.proposer == SpecProposer::kNgram && !any_full);
  // +1: page 0 of every pool is the reserved padding page.
  o.full_pages = (c.kv_pages > 0 ? c.kv_pages : default_kv_pages(c)) + 1;
  o.sliding_pages = c.sliding_pages > 0 ? c.sliding_pages + 1 : 0;
  o.max_encoder_len = c.max_encoder_len;
  o.cross_pages = c.cross_pages > 0 ? c.cross_pages + 1 : 0;
  return o;
}

SchedulerConfig scheduler_config(const ModelConfig& model, const EngineConfig& c,
                                 std::int32_t slack, bool draft_model) {
  SchedulerConfig s;
  s.max_batch = c.max_batch;
  s.max_step_tokens = std::max(c.max_step_tokens, c.max_batch);
  s.max_context = c.max_context;
  s.vocab_size = model.vocab_size;
  s.input_vocab_size = model.input_vocab_size();
  s.reserve_slack = slack;
  s.max_encoder_len = model.any_cross() ? c.max_encoder_len : 0;
  s.encoder_width = model.hidden_size;
  // A draft model's K/V at generated positions follow the speculative schedule: share prompts only.
  s.share_generated = !draft_model;
  return s;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  const auto k = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

}  // namespace

Engine::Engine(const HostWeights& weights, const EngineConfig& config, const HostWeights* draft,
               const EagleWeights* eagle)
    : config_(validated(config)) {
  const RuntimeOptions ro = runtime_options(config_, weights.config);
  GD_REQUIRE(!weights.config.any_cross() || config_.max_encoder_len >= 1, "max_encoder_len",
             config_.max_encoder_len,
             "the model has cross-attention layers: set the longest encoder input (>= 1)");
  GD_REQUIRE(
      !speculative() || (!weights.config.any_cross() && !(draft && draft->config.any_cross())),
      "speculative.max_draft_tokens", config_.speculative.max_draft_tokens,
      "speculative decoding of a cross-attention model is not supported");
  if (speculative()) {
    SpecRunnerConfig sc;
    sc.proposer = config_.speculative.proposer;
    sc.max_draft_tokens = config_.speculative.max_draft_tokens;
    sc.k_by_batch = config_.speculative.k_by_batch;
    sc.ngram = config_.speculative.ngram;
    sc.use_graphs = config_.use_graphs;
    runner_ = std::make_unique<SpecRunner>(weights, draft, ro, sc, stream_, eagle);
  } else {
    GD_REQUIRE(draft == nullptr, "speculative.max_draft_tokens", 0,
               "a draft model was given: set max_draft_tokens >= 1 to use it");
    GD_REQUIRE(eagle == nullptr, "speculative.max_draft_tokens", 0,
               "an EAGLE head was given: set max_draft_tokens >= 1 to use it");
    runner_ = std::make_unique<DecodeRunner>(weights, ro, config_.use_graphs, stream_);
  }
  scheduler_ = std::make_unique<Scheduler>(
      scheduler_config(weights.config, config_, runner_->reserve_slack(),
                       runner_->ledger().has_group(1)),
      runner_->ledger());

  const auto b = static_cast<std::size_t>(config_.max_batch);
  const auto k = static_cast<std::size_t>(config_.speculative.max_draft_tokens);
  for (StepPlan& p : plans_) {
    p.requests.reserve(b);
    p.admitted.reserve(b);
  }
  result_.counts.reserve(b);
  result_.tokens.reserve(b * (k + 1));
  events_.reserve(b * (k + 1));
  callbacks_.reserve(4 * b);
  cancel_events_.reserve(b);
  stats_.drafted_at.assign(k, 0);
  stats_.accepted_at.assign(k, 0);
  decode_us_.assign(kLatencyWindow, 0.0);
  device_us_.assign(kLatencyWindow, 0.0);
  stream_.synchronize();  // start-up: weights, pools and graphs are in place
}

Engine::~Engine() {
  if (stream_.get()) GD_CUDA_NOTHROW(cudaStreamSynchronize(stream_));
}

RequestId Engine::submit(RequestSpec spec, TokenCallback on_token) {
  require_healthy();
  const EncoderStates& enc = spec.encoder;
  if (enc.on_device && enc.length > 0 && enc.data != nullptr) {
    // Read at admission by the device: a host pointer here would fault there, not here.
    cudaPointerAttributes attr{};
    const cudaError_t st = cudaPointerGetAttributes(&attr, enc.data);
    if (st != cudaSuccess) static_cast<void>(cudaGetLastError());  // not sticky: clear it
    GD_REQUIRE(st == cudaSuccess &&
                   (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged),
               "encoder.data", "host or unknown memory",
               "encoder.on_device is set but the pointer is not CUDA device memory");
  }
  const RequestId id = scheduler_->submit(std::move(spec));  // throws, changing nothing
  if (on_token) callbacks_.emplace(id, std::move(on_token));
  return id;
}

void Engine::require_healthy() const {
  GD_REQUIRE(failure_.empty(), "engine", failure_,
             "an earlier step failed: the engine serves no further steps (destroy it)");
}

Error Engine::step_failure(const StepPlan& plan, const std::exception& e) {
  // A failure past validation (a CUDA error, a device-side flag) leaves the step half done:
  // pages extended, the device's tables and tokens unknown. Serving on would serve garbage.
  const std::string step = std::to_string(stats_.steps + 1) + " (" +
                           (plan.kind == StepKind::kDecode ? "decode" : "prefill") + ", " +
                           std::to_string(plan.requests.size()) + " requests)";
  failure_ = "step " + step + ": " + e.what();
  return Error(
      "the step failed; the engine serves no further steps (destroy it): " + std::string(e.what()),
      "Engine::step", "step", step);
}

bool Engine::step() {
  require_healthy();
  const auto t0 = std::chrono::steady_clock::now();
  const NvtxRange step_range("graphdecode.step", NvtxColor::kStep);
  const bool pipelines = config_.pipeline && runner_->pipelines();
  // The plan delivered by this call: the one in flight, or a new one planned now.
  const int cur = done_ ^ 1;
  StepPlan& plan = plans_[cur];
  StepPlan& next = plans_[done_];  // the plan delivered last time: free for the step after
  if (!inflight_) {
    {
      const NvtxRange r("graphdecode.schedule");
      scheduler_->next_step(plan);
    }
    if (plan.empty()) {
      done_ = cur;
      return false;
    }
    if (pipelines) {
      try {
        runner_->launch(plan, *scheduler_);  // ranges: .prefill / .decode
      } catch (const std::exception& e) {
        throw step_failure(plan, e);
      }
    }
  }
  bool ahead = false;
  try {
    if (pipelines) {
      // The next decode step goes to the device before this one's tokens are waited for. Its
      // rows read their input token from the device; its plan assumes every row here commits one
      // token (rows that end here by a stop token or a cancel are discarded when it is
      // delivered).
      if (plan.kind == StepKind::kDecode) {
        const NvtxRange r("graphdecode.schedule_ahead");
        ahead = scheduler_->next_step_ahead(plan, next);
      }
      if (ahead) runner_->launch(next, *scheduler_);
      runner_->collect(plan, result_);  // the step's one wait
    } else {
      runner_->run(plan, *scheduler_, result_);  // ranges: .prefill / .decode / .speculative
    }
  } catch (const std::exception& e) {
    throw step_failure(plan, e);
  }
  inflight_ = ahead;
  done_ = cur;
  // The runner projected the admitted requests' encoder states: their host copies can go.
  for (const RequestId id : plan.admitted) scheduler_->drop_encoder_states(id);
  const NvtxRange deliver_range("graphdecode.deliver", NvtxColor::kHost,
                                static_cast<std::int64_t>(result_.tokens.size()));
  // Releases finished requests in the ledger before any callback runs, so a throwing callback
  // leaves the books consistent. In a plan made ahead, rows of requests that ended in the step
  // before are skipped (their tokens discarded, never delivered).
  scheduler_->on_step_done(plan, result_.counts, result_.tokens, events_);
  if (plan.ahead)
    stats_.discarded_rows += static_cast<std::int64_t>(plan.requests.size() - events_.size());
  runner_->retire(events_);
  in_callbacks_ = true;
  std::int64_t delivered = 0;  // token events delivered (a callback's cancel() drops later ones)
  // A callback that throws stops neither the step's other events nor the cancellations: the
  // first exception is rethrown once every event was delivered and the step recorded.
  std::exception_ptr first_error;
  const auto deliver_safely = [&](const TokenEvent& e) {
    try {
      deliver(e);
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  };
  for (const TokenEvent& e : events_) {
    // A request cancelled by an earlier callback of this step gets no more tokens.
    const auto cancelled = [&e](const TokenEvent& c) { return c.id == e.id; };
    if (std::none_of(cancel_events_.begin(), cancel_events_.end(), cancelled)) {
      ++delivered;
      deliver_safely(e);
    }
  }
  // Then the cancellations those callbacks made (more may be added while delivering).
  for (std::size_t i = 0; i < cancel_events_.size(); ++i) deliver_safely(cancel_events_[i]);
  in_callbacks_ = false;
  cancel_events_.clear();
  record(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count(),
         plan, result_, delivered);
  // The step in flight serves nobody when every request ended here: collect it now, so that an
  // idle engine has nothing in flight (a second wait, only when the batch emptied).
  if (inflight_ && scheduler_->running() == 0) drain();
  if (first_error) std::rethrow_exception(first_error);
  return true;
}

void Engine::drain() {
  const StepPlan& p = plans_[done_ ^ 1];
  StepResult& r = result_;
  try {
    runner_->collect(p, r);
  } catch (const std::exception& e) {
    throw step_failure(p, e);
  }
  inflight_ = false;
  // Rows of ended requests only: on_step_done skips them all, nothing to deliver.
  scheduler_->on_step_done(p, r.counts, r.tokens, events_);
  stats_.discarded_rows += static_cast<std::int64_t>(p.requests.size());
  count_step(p, r);
}

void Engine::deliver(const TokenEvent& e) {
  const auto it = callbacks_.find(e.id);
  if (it == callbacks_.end()) return;
  if (e.finished) {
    const TokenCallback cb = std::move(it->second);
    callbacks_.erase(it);
    cb(e);
  } else {
    it->second(e);
  }
}

void Engine::cancel(RequestId id) {
  const TokenEvent e = scheduler_->cancel(id);  // throws, changing nothing
  runner_->retire(std::span<const TokenEvent>(&e, 1));
  ++stats_.cancelled;
  ++stats_.finished;
  if (in_callbacks_) {
    cancel_events_.push_back(e);
  } else {
    deliver(e);
  }
}

void Engine::count_step(const StepPlan& plan, const StepResult& r) {
  ++stats_.steps;
  (r.path == StepPath::kGraph ? stats_.graph_steps : stats_.eager_steps) += 1;
  (plan.ahead ? stats_.pipelined_steps : stats_.sync_steps) += 1;
  if (plan.kind == StepKind::kDecode) ++stats_.decode_steps;
}

void Engine::record(double us, const StepPlan& plan, const StepResult& r, std::int64_t delivered) {
  count_step(plan, r);
  if (plan.kind == StepKind::kDecode) {
    device_us_[decode_next_ % kLatencyWindow] = r.device_us;
    decode_us_[decode_next_++ % kLatencyWindow] = us;
    if (speculative()) {
      ++stats_.spec_steps;
      for (std::size_t p = 0; p < r.phase_us.size(); ++p) stats_.spec_phase_us[p] += r.phase_us[p];
      for (const std::int32_t n : r.counts) {
        ++stats_.spec_rows;
        stats_.drafted_tokens += r.drafts;
        stats_.accepted_tokens += n - 1;
        for (std::int32_t j = 0; j < r.drafts; ++j) {
          ++stats_.drafted_at[static_cast<std::size_t>(j)];
          stats_.accepted_at[static_cast<std::size_t>(j)] += j < n - 1;
        }
      }
    }
  } else {
    ++stats_.prefill_steps;
    stats_.prefill_wall_us += us;
    stats_.prefill_device_us += r.device_us;
    for (const PlannedRequest& p : plan.requests) stats_.prompt_tokens += p.extend_len;
  }
  stats_.generated_tokens += delivered;
  for (const TokenEvent& e : events_) stats_.finished += e.finished ? 1 : 0;
  stats_.busy_s += us * 1e-6;
}

void Engine::run_until_idle() {
  while (step()) {
  }
}

EngineStats Engine::stats() const {
  EngineStats s = stats_;
  const std::size_t n = std::min<std::size_t>(decode_next_, kLatencyWindow);
  const std::vector<double> window(decode_us_.begin(),
                                   decode_us_.begin() + static_cast<std::ptrdiff_t>(n));
  s.decode_p50_us = percentile(window, 0.50);
  s.decode_p90_us = percentile(window, 0.90);
  s.decode_p99_us = percentile(window, 0.99);
  const std::vector<double> device(device_us_.begin(),
                                   device_us_.begin() + static_cast<std::ptrdiff_t>(n));
  s.device_p50_us = percentile(device, 0.50);
  s.device_p90_us = percentile(device, 0.90);
  s.device_p99_us = percentile(device, 0.99);
  const PrefixCacheCounters& pc = scheduler_->prefix_counters();
  s.prefix_lookup_tokens = pc.lookup_tokens;
  s.prefix_hit_tokens = pc.hit_tokens;
  const PrefixCacheStats ps = runner_->ledger().prefix_stats();
  s.prefix_cached_pages = ps.cached_pages;
  s.prefix_unreferenced_pages = ps.lru_pages;
  s.prefix_evictions = ps.evictions;
  return s;
}

}  // namespace graphdecode
