#include "engine/scheduler.h"

#include <algorithm>
#include <optional>
#include <string>

#include "common/error.h"
#include "common/request_rules.h"

namespace graphdecode {
namespace {

// The chain's seed: a constant for text-only requests, the encoder's identity otherwise (the text
// K/V of a cross-attention model depend on the encoder states). Pool identity (model, kind,
// window) is mixed in by each pool's cache.
PageKey chain_seed(const RequestSpec& s) {
  constexpr PageKey kText = 0x6772617068646563ull;
  return s.encoder.length > 0 ? next_page_key(kText ^ s.encoder_id,
                                              std::span<const std::int32_t>(&s.encoder.length, 1))
                              : kText;
}

}  // namespace

void SchedulerConfig::validate() const {
  GD_REQUIRE(max_batch > 0, "max_batch", max_batch, "must be positive");
  GD_REQUIRE(max_step_tokens > 0, "max_step_tokens", max_step_tokens, "must be positive");
  GD_REQUIRE(max_context > 1, "max_context", max_context, "must be at least 2");
  GD_REQUIRE(vocab_size > 0, "vocab_size", vocab_size, "must be positive");
  GD_REQUIRE(reserve_slack >= 0, "reserve_slack", reserve_slack, "cannot be negative");
  GD_REQUIRE(input_vocab_size == 0 || input_vocab_size >= vocab_size, "input_vocab_size",
             input_vocab_size, "0 (= vocab_size) or at least vocab_size");
  GD_REQUIRE(max_encoder_len >= 0, "max_encoder_len", max_encoder_len, "cannot be negative");
  GD_REQUIRE(max_encoder_len == 0 || encoder_width > 0, "encoder_width", encoder_width,
             "a cross-attention model needs the encoder states' width (its hidden size)");
}

Scheduler::Scheduler(const SchedulerConfig& config, KvLedger& ledger)
    : config_(config), ledger_(ledger) {
  config_.validate();
  ones_.reserve(static_cast<std::size_t>(config_.max_batch));
}

KvReservation Scheduler::reservation(const RequestSpec& s) const {
  KvReservation r;
  r.max_tokens =
      static_cast<std::int32_t>(s.prompt.size()) + s.max_new_tokens + config_.reserve_slack;
  r.encoder_len = s.encoder.length;
  return r;
}

RequestId Scheduler::submit(RequestSpec spec) {
  const auto prompt_len = static_cast<std::int64_t>(spec.prompt.size());
  GD_REQUIRE(prompt_len > 0, "prompt", "empty", "a request needs at least one prompt token");
  const std::int32_t input_vocab =
      config_.input_vocab_size > 0 ? config_.input_vocab_size : config_.vocab_size;
  for (std::size_t i = 0; i < spec.prompt.size(); ++i) {
    const std::int32_t t = spec.prompt[i];
    GD_REQUIRE(t >= 0 && t < input_vocab, "prompt[" + std::to_string(i) + "]", t,
               "token id outside the vocabulary of " + std::to_string(input_vocab));
  }
  for (std::int32_t t : spec.stop_tokens)
    GD_REQUIRE(t >= 0 && t < config_.vocab_size, "stop_tokens", t,
               "token id outside the vocabulary");
  GD_REQUIRE(spec.max_new_tokens >= 1, "max_new_tokens", spec.max_new_tokens, "must be >= 1");
  GD_REQUIRE(prompt_len + spec.max_new_tokens <= config_.max_context, "prompt_len + max_new_tokens",
             prompt_len + spec.max_new_tokens,
             "exceeds the max context of " + std::to_string(config_.max_context));
  const SamplingParams& sp = spec.sampling;
  GD_REQUIRE(sp.temperature >= 0.f, "sampling.temperature", sp.temperature, "must be >= 0");
  GD_REQUIRE(sp.top_k >= 0, "sampling.top_k", sp.top_k, "must be >= 0");
  GD_REQUIRE(sp.top_p > 0.f && sp.top_p <= 1.f, "sampling.top_p", sp.top_p, "must be in (0, 1]");
  const EncoderStates& enc = spec.encoder;
  GD_REQUIRE(config_.max_encoder_len > 0 || (enc.length == 0 && enc.data == nullptr), "encoder",
             enc.length, "the model has no cross-attention layers: it takes no encoder states");
  GD_REQUIRE(enc.length >= 0 && enc.length <= config_.max_encoder_len, "encoder.length", enc.length,
             "outside [0, max_encoder_len = " + std::to_string(config_.max_encoder_len) + "]");
  if (enc.length > 0) {
    GD_REQUIRE(enc.width == config_.encoder_width, "encoder.width", enc.width,
               "encoder states must have the model's hidden size (" +
                   std::to_string(config_.encoder_width) + ") columns");
    GD_REQUIRE(enc.data != nullptr, "encoder.data", "nullptr", "encoder states of length > 0");
    GD_REQUIRE(
        enc.first_position >= 0 && enc.first_position < prompt_len, "encoder.first_position",
        enc.first_position,
        "must be a prompt position, in [0, prompt length " + std::to_string(prompt_len) + ")");
  }
  ledger_.require_fits(reservation(spec));

  const RequestId id = next_id_++;
  Request r;
  r.tokens.reserve(spec.prompt.size() + static_cast<std::size_t>(spec.max_new_tokens));
  r.tokens = spec.prompt;                  // capacity reserved above: spans into it never move
  if (enc.length > 0 && !enc.on_device) {  // host states: the caller may free them on return
    const std::size_t n = static_cast<std::size_t>(enc.length) * enc.width;
    r.encoder_copy.assign(enc.data, enc.data + n);
  } else if (enc.length == 0) {
    spec.encoder = EncoderStates{};
  }
  // Prefix cache: requests with encoder states share only under a caller-given encoder identity.
  r.shares = ledger_.caches_prefixes() && (enc.length == 0 || spec.encoder_id != 0);
  if (r.shares) {
    const std::int32_t P = ledger_.config(0).geometry.page_size;
    const auto full = static_cast<std::size_t>(prompt_len / P);
    r.keys.reserve(static_cast<std::size_t>(
        pages_for_tokens(static_cast<std::int32_t>(prompt_len) + spec.max_new_tokens, P)));
    r.keys.resize(full);
    chain_page_keys(spec.prompt, P, chain_seed(spec), r.keys);
  }
  r.spec = std::move(spec);
  requests_.emplace(id, std::move(r));
  queue_.push_back(id);
  return id;
}

StepPlan Scheduler::next_step() {
  StepPlan plan;
  next_step(plan);
  return plan;
}

void Scheduler::next_step(StepPlan& plan) {
  plan.kind = StepKind::kDecode;
  plan.requests.clear();
  plan.admitted.clear();
  plan.ahead = false;
  // Admission: FIFO, so a large request at the head is not starved by small ones behind it.
  while (!queue_.empty() && running() < config_.max_batch) {
    Request& r = requests_.at(queue_.front());
    // A hit larger than the step's adoption budget left waits for the next step's budget.
    if (r.shares && ledger_.adopted_this_step() &&
        ledger_.match_prefix(prefix_lookup(r), true) <
            ledger_.match_prefix(prefix_lookup(r), false))
      break;
    // The hit is part of the admission check: pages it shares are counted once.
    const std::span<const PageKey> lookup =
        r.shares ? prefix_lookup(r) : std::span<const PageKey>();
    const std::int32_t hit = r.shares ? ledger_.match_prefix(lookup) : 0;
    const std::optional<std::int32_t> slot = ledger_.try_admit(reservation(r.spec), lookup, hit);
    if (!slot) break;
    r.slot = *slot;
    r.admitted = true;
    if (r.shares) count_prefix_hit(r, hit);
    running_.push_back(queue_.front());
    plan.admitted.push_back(queue_.front());
    queue_.pop_front();
  }

  const bool prefill_pending = std::any_of(running_.begin(), running_.end(), [&](RequestId id) {
    const Request& r = requests_.at(id);
    return r.cached < static_cast<std::int32_t>(r.spec.prompt.size());
  });
  if (prefill_pending) {
    // Chunked prefill: prompts in admission order until the step's token budget is spent.
    plan.kind = StepKind::kExtend;
    std::int32_t budget = config_.max_step_tokens;
    for (RequestId id : running_) {
      const Request& r = requests_.at(id);
      const auto prompt_len = static_cast<std::int32_t>(r.spec.prompt.size());
      if (r.cached >= prompt_len) continue;  // decoding requests wait for the next decode step
      const std::int32_t chunk = std::min(prompt_len - r.cached, budget);
      if (chunk == 0) break;
      plan.requests.push_back(
          PlannedRequest{id, r.slot, r.cached, chunk,
                         std::span<const std::int32_t>(r.tokens).subspan(
                             static_cast<std::size_t>(r.cached), static_cast<std::size_t>(chunk)),
                         r.cached + chunk == prompt_len, r.spec.encoder.length});
      budget -= chunk;
    }
    return;
  }
  plan.kind = StepKind::kDecode;
  for (RequestId id : running_) {
    const Request& r = requests_.at(id);
    // Feed the newest token (generated by the previous step, not yet in the cache).
    plan.requests.push_back(PlannedRequest{
        id, r.slot, r.cached, 1,
        std::span<const std::int32_t>(r.tokens).subspan(static_cast<std::size_t>(r.cached), 1),
        true, r.spec.encoder.length});
  }
}

bool Scheduler::next_step_ahead(const StepPlan& inflight, StepPlan& plan) {
  plan.kind = StepKind::kDecode;
  plan.requests.clear();
  plan.admitted.clear();
  plan.ahead = true;
  if (inflight.kind != StepKind::kDecode || running_.empty()) return false;
  // A waiting request that could be admitted now: the plan after the in-flight step admits it
  // (and prefills), synchronously. One that cannot be admitted waits either way.
  if (!queue_.empty() && running() < config_.max_batch) {
    const Request& head = requests_.at(queue_.front());
    const std::span<const PageKey> lookup =
        head.shares ? prefix_lookup(head) : std::span<const PageKey>();
    if (ledger_.can_admit(reservation(head.spec), lookup,
                          head.shares ? ledger_.match_prefix(lookup) : 0))
      return false;
  }
  // The in-flight plan lists its requests in running_ order (rows of requests ended since are
  // left over in it): walk both at once.
  std::size_t at = 0;
  for (const RequestId id : running_) {
    while (at < inflight.requests.size() && inflight.requests[at].id != id) ++at;
    if (at == inflight.requests.size()) {  // running but not in flight: cannot plan ahead
      plan.requests.clear();
      return false;
    }
    const PlannedRequest& p = inflight.requests[at++];
    const Request& r = requests_.at(id);
    GD_REQUIRE(p.prefix_len == r.cached && p.extend_len == 1 && p.samples, "inflight request", id,
               "the in-flight decode row does not match the request's state");
    // The in-flight step's token is this request's last when it reaches max_new_tokens.
    if (r.generated + 1 >= r.spec.max_new_tokens) continue;
    plan.requests.push_back(
        PlannedRequest{id, r.slot, r.cached + 1, 1, {}, true, r.spec.encoder.length});
  }
  return !plan.requests.empty();
}

std::span<const PageKey> Scheduler::prefix_lookup(const Request& r) const {
  const auto prompt_len = static_cast<std::int32_t>(r.spec.prompt.size());
  const std::int32_t P = ledger_.config(0).geometry.page_size;
  // Never the whole prompt: the page of the last prompt token is computed (its logits sample).
  return {r.keys.data(), static_cast<std::size_t>((prompt_len - 1) / P)};
}

void Scheduler::count_prefix_hit(Request& r, std::int32_t pages) {
  const std::int32_t P = ledger_.config(0).geometry.page_size;
  r.cached = r.hit = pages * P;
  r.published = pages;  // the adopted pages are already cached
  prefix_.lookup_tokens += static_cast<std::int64_t>(r.spec.prompt.size());
  prefix_.hit_tokens += r.hit;
}

void Scheduler::publish_pages(Request& r) {
  if (!r.shares) return;
  const auto prompt_len = static_cast<std::int32_t>(r.spec.prompt.size());
  const std::int32_t P = ledger_.config(0).geometry.page_size;
  // Committed tokens whose ids are known here (a speculative step's committed tokens are appended
  // after this call: their pages are published by the next one).
  const std::int32_t known = std::min(r.cached, static_cast<std::int32_t>(r.tokens.size()));
  const std::int32_t limit = config_.share_generated ? known : std::min(known, prompt_len);
  const std::int32_t end = limit / P;
  if (end <= r.published) return;
  // Keys of pages past the prompt's (generated tokens): one more link each, in reserved capacity.
  while (static_cast<std::int32_t>(r.keys.size()) < end) {
    const std::size_t j = r.keys.size();
    r.keys.push_back(
        next_page_key(j == 0 ? chain_seed(r.spec) : r.keys.back(),
                      std::span<const std::int32_t>(r.tokens).subspan(
                          j * static_cast<std::size_t>(P), static_cast<std::size_t>(P))));
  }
  ledger_.publish_prefix(r.slot, r.keys, r.published, end);
  r.published = end;
}

std::vector<TokenEvent> Scheduler::on_step_done(const StepPlan& plan,
                                                std::span<const std::int32_t> sampled) {
  std::vector<TokenEvent> events;
  on_step_done(plan, sampled, events);
  return events;
}

void Scheduler::on_step_done(const StepPlan& plan, std::span<const std::int32_t> sampled,
                             std::vector<TokenEvent>& events) {
  GD_REQUIRE(sampled.size() == plan.requests.size(), "sampled.size()", sampled.size(),
             "needs one entry per planned request");
  ones_.assign(plan.requests.size(), 1);
  on_step_done(plan, ones_, sampled, events);
}

void Scheduler::on_step_done(const StepPlan& plan, std::span<const std::int32_t> counts,
                             std::span<const std::int32_t> tokens,
                             std::vector<TokenEvent>& events) {
  events.clear();
  GD_REQUIRE(counts.size() == plan.requests.size(), "counts.size()", counts.size(),
             "needs one entry per planned request");
  std::size_t total = 0;
  for (std::size_t i = 0; i < plan.requests.size(); ++i) {
    const PlannedRequest& p = plan.requests[i];
    // A plan made ahead may hold rows of requests that ended in the step before it.
    GD_REQUIRE(plan.ahead || requests_.count(p.id) == 1, "request", p.id, "is not running");
    GD_REQUIRE(!p.samples || counts[i] >= 1, "counts[" + std::to_string(i) + "]", counts[i],
               "a sampling row commits at least one token");
    GD_REQUIRE(p.samples || counts[i] >= 0, "counts[" + std::to_string(i) + "]", counts[i],
               "cannot be negative");
    for (std::int32_t j = 0; p.samples && j < counts[i]; ++j) {
      const std::int32_t t = tokens[total + static_cast<std::size_t>(j)];
      GD_REQUIRE(t >= 0 && t < config_.vocab_size, "sampled token", t, "outside the vocabulary");
    }
    total += static_cast<std::size_t>(counts[i]);
  }
  GD_REQUIRE(tokens.size() >= total, "tokens.size()", tokens.size(), "fewer than the counts say");
  std::size_t at = 0;
  for (std::size_t i = 0; i < plan.requests.size(); ++i) {
    const PlannedRequest& p = plan.requests[i];
    const auto n = static_cast<std::size_t>(counts[i]);
    const std::span<const std::int32_t> mine = tokens.subspan(at, n);
    at += n;
    const auto it = requests_.find(p.id);
    if (it == requests_.end()) continue;  // ended since an ahead plan: its tokens are discarded
    Request& r = it->second;
    GD_REQUIRE(!plan.ahead || p.prefix_len == r.cached, "request", p.id,
               "a row planned ahead does not follow the request's cached tokens");
    if (!p.samples) {
      r.cached += p.extend_len;
      publish_pages(r);
      continue;
    }
    // Prefill: the chunk is cached now; decode and speculative rows: every committed token but the
    // last is cached now (the last is the next step's input).
    r.cached += plan.kind == StepKind::kExtend ? p.extend_len : static_cast<std::int32_t>(n);
    // Before any release below: a finishing request's pages go back to the cache named.
    publish_pages(r);
    for (const std::int32_t token : mine) {
      r.tokens.push_back(token);
      ++r.generated;
      const auto& stop = r.spec.stop_tokens;
      const bool finished = r.generated >= r.spec.max_new_tokens ||
                            std::find(stop.begin(), stop.end(), token) != stop.end();
      events.push_back(TokenEvent{p.id, token, finished});
      if (!finished) continue;
      ledger_.release(r.slot);
      running_.erase(std::find(running_.begin(), running_.end(), p.id));
      requests_.erase(p.id);
      break;  // tokens past a stop or the limit are never delivered
    }
  }
}

TokenEvent Scheduler::cancel(RequestId id) {
  const auto it = requests_.find(id);
  GD_REQUIRE(it != requests_.end(), "request", id,
             "unknown or already finished: nothing to cancel");
  if (it->second.admitted) {
    ledger_.release(it->second.slot);
    running_.erase(std::find(running_.begin(), running_.end(), id));
  } else {
    queue_.erase(std::find(queue_.begin(), queue_.end(), id));
  }
  requests_.erase(it);
  return TokenEvent{id, kNoToken, true, true};
}

const Scheduler::Request& Scheduler::find(RequestId id) const {
  const auto it = requests_.find(id);
  GD_REQUIRE(it != requests_.end(), "request", id, "unknown or finished request");
  return it->second;
}

std::span<const std::int32_t> Scheduler::tokens(RequestId id) const {
  return find(id).tokens;
}
std::int32_t Scheduler::generated(RequestId id) const {
  return find(id).generated;
}
const SamplingParams& Scheduler::sampling(RequestId id) const {
  return find(id).spec.sampling;
}
bool Scheduler::speculates(RequestId id) const {
  return find(id).spec.speculate;
}
std::int32_t Scheduler::prefix_hit(RequestId id) const {
  return find(id).hit;
}
std::int32_t Scheduler::slot(RequestId id) const {
  const Request& r = find(id);
  GD_REQUIRE(r.admitted, "request", id, "is waiting: it has no slot yet");
  return r.slot;
}
EncoderStates Scheduler::encoder(RequestId id) const {
  const Request& r = find(id);
  EncoderStates e = r.spec.encoder;
  if (e.length > 0 && !e.on_device)
    e.data = r.encoder_copy.empty() ? nullptr : r.encoder_copy.data();
  return e;
}
void Scheduler::drop_encoder_states(RequestId id) {
  const auto it = requests_.find(id);
  GD_REQUIRE(it != requests_.end(), "request", id, "unknown or finished request");
  it->second.encoder_copy = {};  // frees the host copy
}

}  // namespace graphdecode
