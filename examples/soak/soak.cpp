#include "soak.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <span>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "common/error.h"
#include "common/request_rules.h"
#include "engine/engine.h"
#include "engine/model_config.h"
#include "engine/spec/eagle_weights.h"
#include "engine/weights.h"
#include "memory/kv_ledger.h"

namespace graphdecode::soak {
namespace {

constexpr std::size_t kErrorsKept = 20;
constexpr int kBadKinds = 8;

// One submitted request as the user sees it: what it asked for and what was delivered.
struct Live {
  std::int32_t prompt_len = 0, max_new = 0;
  std::vector<std::int32_t> stops;
  std::int32_t delivered = 0;
  bool admitted = false;
  std::int32_t slot = -1;       // known once the request appears in a step's plan
  bool cancel_called = false;   // cancel() succeeded: only the cancel event may follow
  bool cancel_refused = false;  // cancel() from a callback raced its finish in this step
  bool cancel_in_callback = false;
};

class Soak {
 public:
  explicit Soak(const SoakConfig& c) : c_(c), rng_(c.seed) {}

  SoakReport run();

 private:
  void fail(const std::string& what);
  void submit_one();
  void submit_bad();
  void cancel_outside();
  void on_event(RequestId id, const TokenEvent& e);
  void maybe_cancel_from_callback(RequestId self);
  void end(RequestId id);
  void after_step();
  void check_ledger();
  void final_checks();
  std::int32_t draw_len(std::int32_t hi);
  RequestId random_live();

  SoakConfig c_;
  std::mt19937_64 rng_;
  std::unique_ptr<Engine> engine_;
  ModelConfig model_;
  std::int32_t slack_ = 0;
  SoakReport rep_;
  std::unordered_map<RequestId, Live> live_;
  std::vector<RequestId> live_ids_;  // for random picks; index in live_pos_
  std::unordered_map<RequestId, std::size_t> live_pos_;
  std::vector<RequestId> ended_ring_;        // recently ended ids: cancelling them must be refused
  std::vector<std::int32_t> recent_tokens_;  // stop tokens drawn from what the model says
  std::vector<RequestId> raced_;             // cancel refused in a callback this step
  // Shared system prompts (lengths around page boundaries) that prefix-cache hits come from.
  std::vector<std::vector<std::int32_t>> system_prompts_;
  std::vector<std::vector<char>> seen_;    // [pool][page] scratch of the distinct-page count
  std::unordered_set<RequestId> pending_;  // live requests with a row in the step in flight
  int bad_next_ = 0;
  bool in_step_ = false;
};

void Soak::fail(const std::string& what) {
  ++rep_.errors;
  if (rep_.first_errors.size() < kErrorsKept)
    rep_.first_errors.push_back("step " + std::to_string(rep_.steps) + ": " + what);
}

std::int32_t Soak::draw_len(std::int32_t hi) {
  // Mostly short, sometimes anything up to the limit, now and then exactly the limit.
  const double u = std::uniform_real_distribution<double>(0, 1)(rng_);
  if (hi <= 1) return 1;
  if (u < 0.05) return hi;
  if (u < 0.70) return std::uniform_int_distribution<std::int32_t>(1, std::min(hi, 24))(rng_);
  return std::uniform_int_distribution<std::int32_t>(1, hi)(rng_);
}

RequestId Soak::random_live() {
  return live_ids_[std::uniform_int_distribution<std::size_t>(0, live_ids_.size() - 1)(rng_)];
}

void Soak::submit_one() {
  const std::int32_t max_prompt = c_.max_prompt > 0 ? c_.max_prompt : c_.max_context - 1;
  RequestSpec s;
  const std::int32_t plen = draw_len(max_prompt);
  s.prompt.resize(static_cast<std::size_t>(plen));
  for (auto& t : s.prompt)
    t = std::uniform_int_distribution<std::int32_t>(0, model_.vocab_size - 1)(rng_);
  if (rng_() % 3 == 0) {  // a shared system prompt, then the request's own tokens
    const auto& sys = system_prompts_[rng_() % system_prompts_.size()];
    std::copy_n(sys.begin(), std::min(sys.size(), s.prompt.size()), s.prompt.begin());
  }
  const std::int32_t room = c_.max_context - plen;
  s.max_new_tokens = draw_len(c_.max_new > 0 ? std::min(c_.max_new, room) : room);
  const int mix = static_cast<int>(rng_() % 4);
  if (mix == 1) s.sampling = {0.9f, 0, 1.f, rng_()};
  if (mix == 2) s.sampling = {0.7f, 40, 0.95f, rng_()};
  if (mix == 3) s.sampling = {1.2f, 0, 0.8f, rng_()};
  if (rng_() % 3 == 0 && !recent_tokens_.empty()) {
    for (int i = 0; i < 1 + static_cast<int>(rng_() % 3); ++i)
      s.stop_tokens.push_back(recent_tokens_[rng_() % recent_tokens_.size()]);
  }
  if (c_.max_draft_tokens > 0) s.speculate = rng_() % 5 != 0;
  Live l;
  l.prompt_len = plen;
  l.max_new = s.max_new_tokens;
  l.stops = s.stop_tokens;
  ++rep_.submitted;
  RequestId id = 0;
  try {
    // The callback reaches the soak through `this`; the id is known once submit returns, and no
    // event can arrive before the next step.
    auto slot_for_id = std::make_shared<RequestId>(0);
    id = engine_->submit(std::move(s),
                         [this, slot_for_id](const TokenEvent& e) { on_event(*slot_for_id, e); });
    *slot_for_id = id;
  } catch (const Error& e) {
    fail(std::string("a valid request was refused: ") + e.what());
    return;
  }
  live_pos_[id] = live_ids_.size();
  live_ids_.push_back(id);
  live_.emplace(id, std::move(l));
}

void Soak::submit_bad() {
  RequestSpec s;
  s.prompt = {1, 2, 3};
  s.max_new_tokens = 4;
  std::string field;
  std::vector<std::uint16_t> enc(8 * static_cast<std::size_t>(model_.hidden_size), 0x3f80);
  switch (bad_next_++ % kBadKinds) {
    case 0:
      s.prompt.clear();
      field = "prompt";
      break;
    case 1:
      s.prompt[1] = model_.vocab_size + 3;
      field = "prompt[1]";
      break;
    case 2:
      s.max_new_tokens = c_.max_context;
      field = "prompt_len + max_new_tokens";
      break;
    case 3:
      s.max_new_tokens = 0;
      field = "max_new_tokens";
      break;
    case 4:
      s.sampling.temperature = -1.f;
      field = "sampling.temperature";
      break;
    case 5:
      s.sampling.top_p = 0.f;
      field = "sampling.top_p";
      break;
    case 6:
      s.stop_tokens = {-2};
      field = "stop_tokens";
      break;
    default:
      s.encoder = EncoderStates{enc.data(), 8, model_.hidden_size, false};
      field = "encoder";
      break;
  }
  const std::int32_t waiting = engine_->waiting(), running = engine_->running();
  const std::int32_t reserved = engine_->ledger().reserved_pages(0);
  ++rep_.submitted;
  try {
    engine_->submit(std::move(s), [this](const TokenEvent& e) {
      fail("an event for a refused request " + std::to_string(e.id));
    });
    fail("a bad request (" + field + ") was accepted");
  } catch (const Error& e) {
    ++rep_.refused;
    if (e.field() != field) fail("bad request: field '" + e.field() + "', want '" + field + "'");
  }
  if (engine_->waiting() != waiting || engine_->running() != running ||
      engine_->ledger().reserved_pages(0) != reserved)
    fail("a refused request changed the engine's state");
}

void Soak::cancel_outside() {
  if (!ended_ring_.empty() && rng_() % 4 == 0) {
    const RequestId gone = ended_ring_[rng_() % ended_ring_.size()];
    try {
      engine_->cancel(gone);
      fail("cancelling ended request " + std::to_string(gone) + " was accepted");
    } catch (const Error& e) {
      ++rep_.cancel_refusals;
      if (e.field() != "request") fail("cancel of an ended id: field '" + e.field() + "'");
    }
    return;
  }
  if (live_ids_.empty()) return;
  const RequestId id = random_live();
  live_.at(id).cancel_called = true;
  try {
    engine_->cancel(id);  // outside step(): the cancel event arrives before this returns
  } catch (const Error& e) {
    fail("cancel of live request " + std::to_string(id) + " refused: " + e.what());
    return;
  }
  if (live_.count(id) != 0) fail("request " + std::to_string(id) + " has no cancel event");
}

void Soak::maybe_cancel_from_callback(RequestId self) {
  if (live_ids_.empty() || std::uniform_real_distribution<double>(0, 1)(rng_) >= 0.01) return;
  const RequestId id = rng_() % 3 == 0 ? self : random_live();
  Live& l = live_.at(id);
  if (l.cancel_called || l.cancel_refused) return;
  try {
    engine_->cancel(id);
    l.cancel_called = true;
    l.cancel_in_callback = true;
  } catch (const Error& e) {
    // The request's last token came out of this very step (its final event is still to be
    // delivered): the finish wins, and the final event must still arrive in this step.
    if (e.field() != "request") fail(std::string("cancel from a callback: ") + e.what());
    l.cancel_refused = true;
    raced_.push_back(id);
  }
}

void Soak::on_event(RequestId id, const TokenEvent& e) {
  const auto it = live_.find(id);
  if (it == live_.end() || e.id != id) {
    fail("event for request " + std::to_string(e.id) + " after it ended (or unknown)");
    return;
  }
  Live& l = it->second;
  if (e.cancelled) {
    if (!l.cancel_called) fail("request " + std::to_string(id) + " cancelled unasked");
    if (!e.finished || e.token != kNoToken) fail("a cancel event must be final, without token");
    ++rep_.cancelled;
    rep_.cancelled_from_callbacks += l.cancel_in_callback ? 1 : 0;
    end(id);
    return;
  }
  if (l.cancel_called) {
    fail("token delivered to request " + std::to_string(id) + " after cancel()");
    return;
  }
  if (!in_step_) fail("a token event outside step()");
  if (e.token < 0 || e.token >= model_.vocab_size) fail("token outside the vocabulary");
  ++l.delivered;
  ++rep_.tokens;
  if (recent_tokens_.size() < 64) {
    recent_tokens_.push_back(e.token);
  } else {
    recent_tokens_[rng_() % recent_tokens_.size()] = e.token;
  }
  const bool stop = std::find(l.stops.begin(), l.stops.end(), e.token) != l.stops.end();
  const bool want_finish = stop || l.delivered >= l.max_new;
  if (l.delivered > l.max_new) fail("more tokens than max_new_tokens");
  if (e.finished != want_finish) {
    fail("request " + std::to_string(id) + " finished=" + std::to_string(e.finished) +
         " at token " + std::to_string(l.delivered) + "/" + std::to_string(l.max_new) +
         (stop ? " (a stop token)" : ""));
  }
  if (e.finished) {
    ++(stop ? rep_.finished_by_stop : rep_.finished_by_length);
    end(id);
    return;
  }
  maybe_cancel_from_callback(id);
}

void Soak::end(RequestId id) {
  live_.erase(id);
  const std::size_t at = live_pos_.at(id);
  live_pos_[live_ids_.back()] = at;
  live_ids_[at] = live_ids_.back();
  live_ids_.pop_back();
  live_pos_.erase(id);
  if (ended_ring_.size() < 256) {
    ended_ring_.push_back(id);
  } else {
    ended_ring_[rng_() % ended_ring_.size()] = id;
  }
}

void Soak::check_ledger() {
  const KvLedger& ledger = engine_->ledger();
  const std::int32_t page = engine_->config().page_size;
  std::int32_t admitted = 0;
  std::int64_t reserve_full = 0;
  std::vector<std::int64_t> reserve(static_cast<std::size_t>(ledger.num_pools()), 0);
  std::vector<std::int64_t> held(static_cast<std::size_t>(ledger.num_pools()), 0);
  // Pipelining: the step in flight holds one more KV row of each of its live requests. Its rows
  // must follow what was delivered exactly and never run past a request's length.
  pending_.clear();
  if (const StepPlan* pend = engine_->pending_plan()) {
    if (!c_.pipeline) fail("a step in flight without pipelining");
    if (!pend->ahead || pend->kind != StepKind::kDecode || !pend->admitted.empty())
      fail("the step in flight is not a decode step planned ahead");
    for (const PlannedRequest& p : pend->requests) {
      const auto it = live_.find(p.id);
      if (it == live_.end()) continue;  // ended in the step delivered: its row is discarded
      const Live& l = it->second;
      ++rep_.pending_rows_checked;
      if (p.extend_len != 1 || p.prefix_len != l.prompt_len + l.delivered - 1 || l.delivered < 1 ||
          l.delivered >= l.max_new || p.slot != l.slot)
        fail("request " + std::to_string(p.id) + ": the row in flight (prefix " +
             std::to_string(p.prefix_len) + ", slot " + std::to_string(p.slot) +
             ") does not follow its " + std::to_string(l.delivered) + " of " +
             std::to_string(l.max_new) + " delivered tokens");
      pending_.insert(p.id);
    }
  }
  for (const auto& [id, l] : live_) {
    if (!l.admitted) continue;
    ++admitted;
    KvReservation r;
    r.max_tokens = l.prompt_len + l.max_new + slack_;
    reserve_full += pages_for_tokens(r.max_tokens, page);
    for (std::int32_t p = 0; p < ledger.num_pools(); ++p)
      reserve[static_cast<std::size_t>(p)] += ledger.pages_needed(p, r);
    if (l.slot < 0) continue;  // admitted, not planned yet: holds nothing
    for (std::int32_t p = 0; p < ledger.num_pools(); ++p)
      held[static_cast<std::size_t>(p)] += ledger.pages_held(p, l.slot);
    if (l.delivered == 0) continue;  // in prefill: its extent is the plan's, not the user's
    const std::int32_t extent = l.prompt_len + l.delivered - 1 + (pending_.count(id) ? 1 : 0);
    ++rep_.page_checks;
    if (ledger.tokens(l.slot, 0) != extent) {
      fail("request " + std::to_string(id) + ": the target's KV extent " +
           std::to_string(ledger.tokens(l.slot, 0)) +
           " != prompt + delivered - 1 (+ 1 in flight) = " + std::to_string(extent));
    }
    if (ledger.pages_held(0, l.slot) != pages_for_tokens(extent, page)) {
      fail("request " + std::to_string(id) + ": " + std::to_string(ledger.pages_held(0, l.slot)) +
           " full-pool pages for an extent of " + std::to_string(extent));
    }
  }
  if (ledger.active_requests() != admitted || engine_->running() != admitted) {
    fail("active slots " + std::to_string(ledger.active_requests()) + ", engine running " +
         std::to_string(engine_->running()) + ", host model " + std::to_string(admitted));
  }
  if (engine_->waiting() != static_cast<std::int32_t>(live_.size()) - admitted)
    fail("engine waiting " + std::to_string(engine_->waiting()) + " != host model");
  if (ledger.reserved_pages(0) != reserve_full)
    fail("full pool reserved " + std::to_string(ledger.reserved_pages(0)) +
         " != " + std::to_string(reserve_full));
  for (std::int32_t p = 0; p < ledger.num_pools(); ++p) {
    ++rep_.page_checks;
    const auto i = static_cast<std::size_t>(p);
    // Distinct pages the admitted requests hold (a prefix-cache hit shares pages) plus the free
    // ones (cached pages no request holds count as free) must be every usable page.
    const RequestSlots& slots = ledger.slots(p);
    std::vector<char>& seen = seen_[i];
    std::fill(seen.begin(), seen.end(), 0);
    std::int64_t distinct = 0;
    // Every active slot, not only the planned requests': a request admitted on a prefix-cache hit
    // holds its shared pages from admission on, before any step plans it.
    for (std::int32_t slot = 1; slot < slots.geometry().max_slots; ++slot) {
      if (!slots.is_active(slot)) continue;
      const std::span<const std::int32_t> row = slots.row(slot);
      const std::int32_t first = slots.first_resident_page(slot);
      for (std::int32_t j = first; j < first + slots.pages_held(slot); ++j) {
        const std::int32_t page = row[static_cast<std::size_t>(j)];
        if (page <= 0 || page >= static_cast<std::int32_t>(seen.size())) {
          fail("pool " + std::to_string(p) + ": slot " + std::to_string(slot) + " holds page " +
               std::to_string(page));
          continue;
        }
        distinct += seen[static_cast<std::size_t>(page)] == 0;
        seen[static_cast<std::size_t>(page)] = 1;
      }
    }
    if (ledger.free_pages(p) + distinct != ledger.usable_pages(p))
      fail("pool " + std::to_string(p) + ": free " + std::to_string(ledger.free_pages(p)) +
           " + held " + std::to_string(distinct) + " (" + std::to_string(held[i]) +
           " with shares) != usable " + std::to_string(ledger.usable_pages(p)));
    if (ledger.reserved_pages(p) != reserve[i])
      fail("pool " + std::to_string(p) + ": reserved " + std::to_string(ledger.reserved_pages(p)) +
           " != " + std::to_string(reserve[i]));
  }
}

void Soak::after_step() {
  const StepPlan& plan = engine_->last_plan();
  for (const RequestId id : plan.admitted) {
    const auto it = live_.find(id);
    if (it != live_.end()) it->second.admitted = true;
  }
  for (const PlannedRequest& p : plan.requests) {
    const auto it = live_.find(p.id);
    if (it == live_.end()) continue;  // ended in this step
    if (!it->second.admitted) fail("planned request " + std::to_string(p.id) + " never admitted");
    it->second.slot = p.slot;
  }
  for (const RequestId id : raced_)
    if (live_.count(id) != 0) fail("cancel refused for " + std::to_string(id) + ", not finished");
  raced_.clear();
  if (engine_->waiting() > 0) ++rep_.waiting_steps;
  check_ledger();
}

void Soak::final_checks() {
  const KvLedger& ledger = engine_->ledger();
  if (!live_.empty()) fail(std::to_string(live_.size()) + " requests never ended");
  if (!engine_->idle()) fail("the engine is not idle at the end");
  for (std::int32_t p = 0; p < ledger.num_pools(); ++p) {
    if (ledger.free_pages(p) != ledger.usable_pages(p) || ledger.reserved_pages(p) != 0)
      fail("pool " + std::to_string(p) + " at the end: free " +
           std::to_string(ledger.free_pages(p)) + " of " + std::to_string(ledger.usable_pages(p)) +
           ", reserved " + std::to_string(ledger.reserved_pages(p)));
  }
  const EngineStats s = engine_->stats();
  const std::int64_t ended = rep_.finished_by_length + rep_.finished_by_stop + rep_.cancelled;
  if (s.finished != ended || s.cancelled != rep_.cancelled || s.generated_tokens != rep_.tokens)
    fail("stats: finished " + std::to_string(s.finished) + " cancelled " +
         std::to_string(s.cancelled) + " tokens " + std::to_string(s.generated_tokens) +
         " != host counts");
  if (ended + rep_.refused != rep_.submitted) fail("requests neither ended nor refused");
  rep_.prefix_hit_tokens = s.prefix_hit_tokens;
  rep_.pipelined_steps = s.pipelined_steps;
  rep_.discarded_rows = s.discarded_rows;
  if (engine_->pending_plan() != nullptr) fail("a step still in flight at the end");
  if (!c_.pipeline && (s.pipelined_steps != 0 || s.discarded_rows != 0))
    fail("pipelined steps without pipelining");
  if (s.pipelined_steps + s.sync_steps != s.steps)
    fail("stats: pipelined " + std::to_string(s.pipelined_steps) + " + synchronous " +
         std::to_string(s.sync_steps) + " != steps " + std::to_string(s.steps));
}

SoakReport Soak::run() {
  const auto t0 = std::chrono::steady_clock::now();
  model_ = small_test_config();
  const HostWeights w = synthetic_weights(model_, c_.seed * 7919 + 1);
  EngineConfig ec;
  ec.max_batch = c_.max_batch;
  ec.max_context = c_.max_context;
  ec.max_step_tokens = c_.max_step_tokens;
  ec.use_graphs = c_.use_graphs;
  ec.pipeline = c_.pipeline;
  ec.kv_pages = c_.kv_pages > 0
                    ? c_.kv_pages
                    : std::max(1, c_.max_batch / 3) *
                          pages_for_tokens(c_.max_context + c_.max_draft_tokens, ec.page_size);
  if (c_.max_draft_tokens > 0) {
    ec.speculative.max_draft_tokens = c_.max_draft_tokens;
    if (c_.ngram) ec.speculative.proposer = SpecProposer::kNgram;
    if (c_.eagle) ec.speculative.proposer = SpecProposer::kEagle;
    slack_ = c_.max_draft_tokens;
  }
  const bool draft_model = c_.max_draft_tokens > 0 && !c_.ngram && !c_.eagle;
  EagleWeights head;
  if (c_.max_draft_tokens > 0 && c_.eagle)
    head = c_.eagle3 ? synthetic_eagle3_weights(model_, c_.seed + 5)
                     : synthetic_eagle_weights(model_, c_.seed + 5);
  engine_ = std::make_unique<Engine>(w, ec, draft_model ? &w : nullptr,
                                     c_.max_draft_tokens > 0 && c_.eagle ? &head : nullptr);
  for (const std::int32_t n : {15, 16, 37, 70}) {  // page - 1, page, 2 pages + 5, 4 pages + 6
    std::vector<std::int32_t> sys(static_cast<std::size_t>(n));
    for (auto& t : sys) t = static_cast<std::int32_t>(rng_() % model_.vocab_size);
    system_prompts_.push_back(std::move(sys));
  }
  for (std::int32_t p = 0; p < engine_->ledger().num_pools(); ++p)
    seen_.emplace_back(static_cast<std::size_t>(engine_->ledger().usable_pages(p)) + 1, 0);

  std::int32_t target = c_.max_batch;
  while (rep_.submitted < c_.requests || !live_.empty()) {
    if (rep_.steps % 64 == 0)
      target = std::uniform_int_distribution<std::int32_t>(1, 3 * c_.max_batch)(rng_);
    while (rep_.submitted < c_.requests && static_cast<std::int32_t>(live_.size()) < target) {
      if (std::uniform_real_distribution<double>(0, 1)(rng_) < c_.bad_fraction) {
        submit_bad();
      } else {
        submit_one();
      }
    }
    // Cancellations from outside step(), about cancel_fraction of requests over their lives.
    if (!live_ids_.empty() &&
        std::uniform_real_distribution<double>(0, 1)(rng_) < c_.cancel_fraction * 0.25)
      cancel_outside();
    bool progressed = false;
    in_step_ = true;
    try {
      progressed = engine_->step();
    } catch (const std::exception& e) {
      in_step_ = false;
      fail(std::string("step threw: ") + e.what());
      break;
    }
    in_step_ = false;
    if (!progressed) {
      if (!live_.empty()) fail(std::to_string(live_.size()) + " live requests, the engine idle");
      if (rep_.submitted >= c_.requests) break;
      continue;
    }
    ++rep_.steps;
    after_step();
    if (rep_.errors > 1000) break;  // the first errors are kept; the rest would be noise
  }
  final_checks();
  rep_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  engine_.reset();
  return rep_;
}

}  // namespace

std::string SoakReport::summary() const {
  std::ostringstream s;
  s << "requests " << submitted << ": finished " << finished_by_length << " by length + "
    << finished_by_stop << " by stop token, cancelled " << cancelled << " ("
    << cancelled_from_callbacks << " from callbacks), refused " << refused
    << "; cancel of ended ids refused " << cancel_refusals << "; steps " << steps << " ("
    << waiting_steps << " with requests waiting), tokens " << tokens << ", page checks "
    << page_checks << ", prefix-cache hit tokens " << prefix_hit_tokens << ", pipelined steps "
    << pipelined_steps << " (rows discarded " << discarded_rows << ", rows in flight checked "
    << pending_rows_checked << "); errors " << errors << "; " << seconds << " s";
  return s.str();
}

SoakReport run_soak(const SoakConfig& config) {
  GD_REQUIRE(config.requests >= 1, "requests", config.requests, "must be positive");
  GD_REQUIRE(config.max_context >= 8, "max_context", config.max_context, "must be at least 8");
  Soak soak(config);
  return soak.run();
}

}  // namespace graphdecode::soak
