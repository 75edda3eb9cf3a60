#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <span>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "common/request_rules.h"
#include "graphs/step_rules.h"

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
  return c;
}

std::int32_t default_kv_pages(const EngineConfig& c) {
  return c.max_batch * pages_for_tokens(c.max_context, c.page_size);
}

RuntimeOptions runtime_options(const EngineConfig& c) {
  RuntimeOptions o;
  o.max_batch = c.max_batch;
  o.max_tokens = std::max(c.max_step_tokens, c.max_batch);
  o.max_kv_len = c.max_context;
  o.page_size = c.page_size;
  o.deterministic = c.deterministic;
  // +1: page 0 of every pool is the reserved padding page.
  o.full_pages = (c.kv_pages > 0 ? c.kv_pages : default_kv_pages(c)) + 1;
  o.sliding_pages = c.sliding_pages > 0 ? c.sliding_pages + 1 : 0;
  return o;
}

StepCapacity engine_capacity(const AttentionLayout& layout, const RuntimeOptions& o) {
  const AttentionLayout models[] = {layout};
  StepCapacity cap = step_capacity(o, models);
  cap.aux_words = SamplingWords::kCount;
  cap.token_feedback = true;
  return cap;
}

SchedulerConfig scheduler_config(const ModelConfig& model, const EngineConfig& c) {
  SchedulerConfig s;
  s.max_batch = c.max_batch;
  s.max_step_tokens = std::max(c.max_step_tokens, c.max_batch);
  s.max_context = c.max_context;
  s.vocab_size = model.vocab_size;
  return s;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  const auto k = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

}  // namespace

Engine::Engine(const HostWeights& weights, const EngineConfig& config)
    : config_(validated(config)) {
  const RuntimeOptions ro = runtime_options(config_);
  const AttentionLayout layout = llama_attention_layout(weights.config);
  const StepCapacity cap = engine_capacity(layout, ro);
  const std::vector<LedgerPool> pools = ledger_pools(cap, ro);
  step_ = std::make_unique<StepContext>(cap, pools);
  runtime_ = std::make_unique<ModelRuntime>(layout, ro, *step_, 0, stream_);
  model_ = std::make_unique<LlamaModel>(weights, ro, stream_);
  program_ = std::make_unique<SamplingStep>(*runtime_, *model_, stream_);
  StepGraphsConfig gc;
  gc.modes = {GraphMode{StepMode::kDecode, 1, LogitRows::kLastPerRequest}};
  gc.use_graphs = config_.use_graphs;
  graphs_ = std::make_unique<StepGraphs>(step_->input(), *program_, gc);
  graphs_->capture(stream_);
  scheduler_ =
      std::make_unique<Scheduler>(scheduler_config(weights.config, config_), step_->ledger());

  const auto b = static_cast<std::size_t>(config_.max_batch);
  plan_.requests.reserve(b);
  plan_.admitted.reserve(b);
  requests_.reserve(b);
  token_ids_.reserve(static_cast<std::size_t>(cap.max_tokens));
  aux_.reserve(b * SamplingWords::kCount);
  sampled_.reserve(b);
  events_.reserve(b);
  callbacks_.reserve(4 * b);
  published_ = PinnedBuffer<std::int32_t>(static_cast<std::size_t>(program_->max_rows()) + 1);
  decode_us_.assign(kLatencyWindow, 0.0);
  stream_.synchronize();  // start-up: weights, pools and graphs are in place
}

Engine::~Engine() {
  if (stream_.get()) GD_CUDA_NOTHROW(cudaStreamSynchronize(stream_));
}

RequestId Engine::submit(RequestSpec spec, TokenCallback on_token) {
  const RequestId id = scheduler_->submit(std::move(spec));  // throws, changing nothing
  if (on_token) callbacks_.emplace(id, std::move(on_token));
  return id;
}

void Engine::build_step() {
  requests_.clear();
  token_ids_.clear();
  aux_.clear();
  const bool decode = plan_.kind == StepKind::kDecode;
  KvLedger& ledger = step_->ledger();
  for (const PlannedRequest& p : plan_.requests) {
    // Cannot fail for want of pages: the scheduler admitted the request only with its whole
    // extent reserved.
    ledger.extend(p.slot, p.extend_len);
    requests_.push_back(StepRequest{p.slot, p.prefix_len, p.extend_len, 0});
    if (decode) {
      // The input token is the one this slot sampled last step, already on the device.
      token_ids_.push_back(step_rules::kTokenFromDevice);
    } else {
      token_ids_.insert(token_ids_.end(), p.tokens.begin(), p.tokens.end());
    }
    const std::size_t at = aux_.size();
    aux_.resize(at + SamplingWords::kCount);
    SamplingWords::write(scheduler_->sampling(p.id),
                         std::span<std::int32_t>(aux_).subspan(at, SamplingWords::kCount));
  }
}

bool Engine::step() {
  const auto t0 = std::chrono::steady_clock::now();
  scheduler_->next_step(plan_);
  if (plan_.empty()) return false;
  build_step();

  StepDesc d;
  d.mode = plan_.kind == StepKind::kDecode ? StepMode::kDecode : StepMode::kExtend;
  d.tokens_per_request = plan_.kind == StepKind::kDecode ? 1 : 0;
  d.requests = requests_;
  d.token_ids = token_ids_;
  d.aux = aux_;
  step_->attach_commands(d);
  const StepPath path = graphs_->step(d, stream_);
  step_->ledger().clear_commands();
  const std::size_t rows = static_cast<std::size_t>(program_->max_rows());
  GD_CUDA(cudaMemcpyAsync(published_.data(), program_->published(),
                          (rows + 1) * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream_));
  copied_.record(stream_);
  copied_.synchronize();  // the step's one wait: the host needs the tokens (stop, callbacks)
  const std::int32_t bad = published_.data()[rows];
  GD_REQUIRE(bad == 0, "bad_token_flag", bad,
             "the embedding saw a token id outside the vocabulary (internal error)");

  sampled_.assign(published_.data(), published_.data() + plan_.requests.size());
  // Releases finished requests in the ledger before any callback runs, so a throwing callback
  // leaves the books consistent.
  scheduler_->on_step_done(plan_, sampled_, events_);
  for (const TokenEvent& e : events_) {
    const auto it = callbacks_.find(e.id);
    if (it == callbacks_.end()) continue;
    if (e.finished) {
      const TokenCallback cb = std::move(it->second);
      callbacks_.erase(it);
      cb(e);
    } else {
      it->second(e);
    }
  }

  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  ++stats_.steps;
  (path == StepPath::kGraph ? stats_.graph_steps : stats_.eager_steps) += 1;
  if (plan_.kind == StepKind::kDecode) {
    ++stats_.decode_steps;
    decode_us_[decode_next_++ % kLatencyWindow] = us;
  } else {
    ++stats_.prefill_steps;
    for (const PlannedRequest& p : plan_.requests) stats_.prompt_tokens += p.extend_len;
  }
  stats_.generated_tokens += static_cast<std::int64_t>(events_.size());
  for (const TokenEvent& e : events_) stats_.finished += e.finished ? 1 : 0;
  stats_.busy_s += us * 1e-6;
  return true;
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
  return s;
}

}  // namespace graphdecode
