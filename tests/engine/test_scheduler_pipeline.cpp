// Pipelined decode on the CPU (engine.h EngineConfig::pipeline, docs/serving_loop.md): the
// scheduler plans decode step t + 1 before step t's tokens are known (next_step_ahead), and a
// row whose request ended at step t is discarded when t + 1 is delivered. Driven like the Engine
// drives it, with a fake device whose token depends only on (request, position), as the device's
// does: the event stream of every request equals the synchronous loop's, with stop tokens,
// length limits and cancels (from callbacks and from outside) at every position; no token after
// a finish; every KV row planned ahead lies inside the request's reservation (the ledger refuses
// an extend past it); the ledger's books equal a host model after every step; every page comes
// back at the end.
#include <gtest/gtest.h>

#include <array>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "common/error.h"
#include "common/request_rules.h"
#include "engine/scheduler.h"
#include "memory/kv_ledger.h"

namespace graphdecode {
namespace {

constexpr std::int32_t kVocab = 50;
constexpr std::int32_t kPage = 8;

LedgerPool full_pool(std::int32_t pages) {
  LedgerPool p;
  p.geometry.kind = AttentionKind::kFull;
  p.geometry.page_size = kPage;
  p.geometry.num_pages = pages + 1;
  p.geometry.max_slots = 9;
  p.geometry.max_pages_per_slot = 16;  // max_context 128
  p.geometry.window_left = -1;
  p.max_commands = 256;
  p.max_page_ids = 256;
  p.max_step_tokens = 32;
  return p;
}

SchedulerConfig sched_config() {
  SchedulerConfig c;
  c.max_batch = 4;
  c.max_step_tokens = 32;
  c.max_context = 128;
  c.vocab_size = kVocab;
  return c;
}

// The fake device's token at KV position `pos` of a request: a function of the request and the
// position only (the real sampler's counter is the position too).
std::int32_t device_token(RequestId id, std::int32_t pos) {
  const std::uint64_t h = (static_cast<std::uint64_t>(id) * 0x9E3779B97F4A7C15ull) ^
                          (static_cast<std::uint64_t>(pos) * 0xC2B2AE3D27D4EB4Full);
  return static_cast<std::int32_t>((h >> 29) % kVocab);
}

struct Outcome {
  std::vector<std::int32_t> tokens;
  int finishes = 0;  // final events (a finish or a cancel)
  bool cancelled = false;
  bool operator==(const Outcome&) const = default;
};

struct Traffic {
  struct Req {
    RequestSpec spec;
    std::int32_t submit_at_step = 0;
    std::int32_t cancel_after = -1;  // cancel once this many tokens were delivered (-1: never)
    bool cancel_in_callback = true;  // else from outside, before the next step
  };
  std::vector<Req> reqs;
};

// The Engine's step loop over a scheduler and a ledger, with a fake device.
class Loop {
 public:
  Loop(bool pipeline, std::int32_t pages)
      : pipeline_(pipeline),
        pool_(full_pool(pages)),
        ledger_(std::span(&pool_, 1)),
        s_(sched_config(), ledger_) {}

  std::map<RequestId, Outcome> run(const Traffic& t) {
    std::int32_t step = 0;
    std::size_t next = 0;
    while (next < t.reqs.size() || !idle()) {
      while (next < t.reqs.size() && t.reqs[next].submit_at_step <= step) {
        const RequestId id = s_.submit(t.reqs[next].spec);
        meta_[id] = {t.reqs[next].cancel_after, t.reqs[next].cancel_in_callback,
                     static_cast<std::int32_t>(t.reqs[next].spec.prompt.size())};
        ++next;
      }
      // Cancels from outside step(): those due after the last step's deliveries.
      for (const RequestId id : outside_) cancel(id);
      outside_.clear();
      if (!this->step()) ++step;  // nothing to do: time passes
      ++step;
      check_books();
      if (::testing::Test::HasFatalFailure()) break;
    }
    EXPECT_TRUE(s_.idle());
    EXPECT_EQ(ledger_.free_pages(0), ledger_.usable_pages(0));
    EXPECT_EQ(ledger_.reserved_pages(0), 0);
    EXPECT_EQ(ledger_.active_requests(), 0);
    return out_;
  }

  std::int64_t pipelined = 0, discarded = 0, synchronous = 0;

 private:
  struct Meta {
    std::int32_t cancel_after = -1;
    bool in_callback = true;
    std::int32_t prompt_len = 0;
  };
  bool idle() const { return s_.idle() && !inflight_; }

  void launch(const StepPlan& p) {
    std::vector<std::int32_t> tokens;
    for (const PlannedRequest& r : p.requests) {
      // Throws when the row would pass the request's reservation.
      ASSERT_NO_THROW(ledger_.extend(r.slot, r.extend_len)) << "request " << r.id;
      ASSERT_EQ(ledger_.tokens(r.slot), r.prefix_len + r.extend_len);
      tokens.push_back(device_token(r.id, r.prefix_len + r.extend_len));
    }
    ledger_.clear_commands();
    device_.push_back(std::move(tokens));
  }
  std::vector<std::int32_t> collect() {
    std::vector<std::int32_t> t = std::move(device_.front());
    device_.pop_front();
    return t;
  }

  bool step() {
    const int cur = done_ ^ 1;
    StepPlan& plan = plans_[cur];
    StepPlan& next = plans_[done_];
    if (!inflight_) {
      s_.next_step(plan);
      if (plan.empty()) {
        done_ = cur;
        return false;
      }
      launch(plan);
    }
    bool ahead = false;
    if (pipeline_ && plan.kind == StepKind::kDecode) {
      ahead = s_.next_step_ahead(plan, next);
      if (!ahead) EXPECT_TRUE(next.requests.empty());
      if (ahead) {
        EXPECT_TRUE(next.ahead);
        EXPECT_TRUE(next.admitted.empty());
        launch(next);
      }
    }
    const std::vector<std::int32_t> sampled = collect();
    inflight_ = ahead;
    done_ = cur;
    (plan.ahead ? pipelined : synchronous) += 1;
    std::vector<TokenEvent> events;
    s_.on_step_done(plan, std::vector<std::int32_t>(plan.requests.size(), 1), sampled, events);
    if (plan.ahead) discarded += static_cast<std::int64_t>(plan.requests.size() - events.size());
    std::vector<RequestId> cancels;  // from callbacks: delivered after the step's other events
    for (const TokenEvent& e : events) {
      if (std::find(cancels.begin(), cancels.end(), e.id) != cancels.end()) continue;
      deliver(e);
      const Meta& m = meta_.at(e.id);
      if (!e.finished && static_cast<std::int32_t>(out_[e.id].tokens.size()) == m.cancel_after) {
        if (m.in_callback) {
          s_.cancel(e.id);
          cancels.push_back(e.id);
        } else {
          outside_.push_back(e.id);
        }
      }
    }
    for (const RequestId id : cancels) deliver(TokenEvent{id, kNoToken, true, true});
    if (inflight_ && s_.running() == 0) {  // the Engine's drain
      const StepPlan& p = plans_[done_ ^ 1];
      const std::vector<std::int32_t> lost = collect();
      s_.on_step_done(p, std::vector<std::int32_t>(p.requests.size(), 1), lost, events);
      EXPECT_TRUE(events.empty());
      discarded += static_cast<std::int64_t>(p.requests.size());
      inflight_ = false;
    }
    return true;
  }

  void cancel(RequestId id) {
    const TokenEvent e = s_.cancel(id);
    deliver(e);
  }

  void deliver(const TokenEvent& e) {
    Outcome& o = out_[e.id];
    EXPECT_EQ(o.finishes, 0) << "an event for request " << e.id << " after its final one";
    if (e.finished) ++o.finishes;
    if (e.cancelled) {
      o.cancelled = true;
      EXPECT_EQ(e.token, kNoToken);
      return;
    }
    o.tokens.push_back(e.token);
  }

  // Between steps: per running request that has delivered tokens, the KV extent is prompt +
  // delivered - 1, plus the row of the step in flight; its pages are exactly that extent's.
  void check_books() {
    std::set<RequestId> pending;
    if (inflight_)
      for (const PlannedRequest& p : plans_[done_ ^ 1].requests) pending.insert(p.id);
    for (const auto& [id, m] : meta_) {
      const auto o = out_.find(id);
      const bool ended = o != out_.end() && o->second.finishes > 0;
      if (ended || o == out_.end() || o->second.tokens.empty()) continue;
      const std::int32_t slot = s_.slot(id);
      const std::int32_t extent = m.prompt_len +
                                  static_cast<std::int32_t>(o->second.tokens.size()) - 1 +
                                  (pending.count(id) ? 1 : 0);
      ASSERT_EQ(ledger_.tokens(slot), extent) << "request " << id;
      ASSERT_EQ(ledger_.pages_held(0, slot), pages_for_tokens(extent, kPage)) << "request " << id;
    }
    ASSERT_EQ(ledger_.active_requests(), s_.running());
  }

  bool pipeline_;
  LedgerPool pool_;
  KvLedger ledger_;
  Scheduler s_;
  std::array<StepPlan, 2> plans_;
  int done_ = 0;
  bool inflight_ = false;
  std::deque<std::vector<std::int32_t>> device_;
  std::map<RequestId, Meta> meta_;
  std::map<RequestId, Outcome> out_;
  std::vector<RequestId> outside_;
};

RequestSpec request(std::int32_t prompt_len, std::int32_t max_new, std::uint32_t salt) {
  RequestSpec s;
  for (std::int32_t i = 0; i < prompt_len; ++i)
    s.prompt.push_back(static_cast<std::int32_t>((salt * 31 + i * 7) % kVocab));
  s.max_new_tokens = max_new;
  return s;
}

void expect_same(const Traffic& t, std::int32_t pages, std::int64_t* pipelined = nullptr,
                 std::int64_t* discarded = nullptr) {
  Loop sync(false, pages), piped(true, pages);
  const std::map<RequestId, Outcome> a = sync.run(t);
  const std::map<RequestId, Outcome> b = piped.run(t);
  EXPECT_EQ(a.size(), t.reqs.size());
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [id, o] : a) {
    const Outcome& p = b.at(id);
    EXPECT_EQ(o.tokens, p.tokens) << "request " << id;
    EXPECT_EQ(o.cancelled, p.cancelled) << "request " << id;
    EXPECT_EQ(o.finishes, 1) << "request " << id;
    EXPECT_EQ(p.finishes, 1) << "request " << id;
  }
  EXPECT_EQ(sync.pipelined, 0);
  if (pipelined) *pipelined += piped.pipelined;
  if (discarded) *discarded += piped.discarded;
}

// Where the stop token falls: request r's stop token is its own k-th token, for every k up to its
// length limit (the last step included); lengths 1..6 at every cancel position too.
TEST(SchedulerPipeline, StopsLengthsAndCancelsAtEveryPositionMatchTheSynchronousLoop) {
  std::int64_t pipelined = 0, discarded = 0;
  for (std::int32_t max_new = 1; max_new <= 6; ++max_new) {
    for (std::int32_t k = 0; k <= max_new; ++k) {  // k = 0: no stop token, else stop at token k
      for (int mode = 0; mode < 3; ++mode) {       // no cancel, cancel in callback / outside
        SCOPED_TRACE("max_new " + std::to_string(max_new) + " stop at " + std::to_string(k) +
                     " mode " + std::to_string(mode));
        Traffic t;
        // Three companions of other lengths keep the batch going around the request under test.
        for (std::uint32_t r = 0; r < 4; ++r) {
          Traffic::Req q;
          q.spec = request(3 + static_cast<std::int32_t>(r), r == 0 ? max_new : 4 + 3 * r, r);
          t.reqs.push_back(q);
        }
        // Request 1 (id 1): its token at its k-th output is device_token(1, prompt + k - 1).
        if (k > 0) t.reqs[0].spec.stop_tokens = {device_token(1, 3 + k - 1)};
        if (mode > 0) {
          t.reqs[1].cancel_after = std::min(k > 0 ? k : 2, 6);
          t.reqs[1].cancel_in_callback = mode == 1;
          t.reqs[2].cancel_after = 1;
          t.reqs[2].cancel_in_callback = mode != 1;
        }
        expect_same(t, 64, &pipelined, &discarded);
        if (HasFailure()) return;
      }
    }
  }
  EXPECT_GT(pipelined, 0);
  EXPECT_GT(discarded, 0);  // stop tokens and cancels seen one step late
}

// Random traffic on a pool small enough that requests wait: stop tokens, lengths, cancels,
// requests joining between steps; the pipelined loop's events equal the synchronous loop's.
TEST(SchedulerPipeline, RandomTrafficMatchesTheSynchronousLoop) {
  std::int64_t pipelined = 0, discarded = 0;
  for (std::uint32_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    Traffic t;
    std::int32_t at = 0;
    for (int r = 0; r < 24; ++r) {
      Traffic::Req q;
      const auto plen = static_cast<std::int32_t>(1 + rng() % 40);
      const auto n = static_cast<std::int32_t>(1 + rng() % 30);
      q.spec = request(plen, n, rng());
      if (rng() % 2) q.spec.stop_tokens = {static_cast<std::int32_t>(rng() % kVocab)};
      if (rng() % 4 == 0) {
        q.cancel_after = static_cast<std::int32_t>(1 + rng() % n);
        q.cancel_in_callback = rng() % 2;
      }
      at += static_cast<std::int32_t>(rng() % 4);
      q.submit_at_step = at;
      t.reqs.push_back(q);
    }
    expect_same(t, 24, &pipelined, &discarded);  // 24 pages of 8 tokens: requests wait
    if (HasFailure()) return;
  }
  EXPECT_GT(pipelined, 0);
  EXPECT_GT(discarded, 0);
}

// When the next plan cannot be made ahead: the step in flight is a prefill, a waiting request
// could be admitted now, every row finishes by length in flight. Rows that finish by length are
// never planned ahead; rows planned ahead carry no host tokens and start one past the row in
// flight.
TEST(SchedulerPipeline, PlansAheadOnlyWhenTheNextStepDoesNotDependOnThisOne) {
  LedgerPool pool = full_pool(64);
  KvLedger ledger(std::span(&pool, 1));
  Scheduler s(sched_config(), ledger);
  const RequestId a = s.submit(request(5, 10, 1));
  const RequestId b = s.submit(request(4, 2, 2));
  StepPlan p, ahead;
  s.next_step(p);
  ASSERT_EQ(p.kind, StepKind::kExtend);
  EXPECT_FALSE(s.next_step_ahead(p, ahead)) << "a prefill in flight";
  EXPECT_TRUE(ahead.requests.empty());
  for (const PlannedRequest& r : p.requests) ledger.extend(r.slot, r.extend_len);
  s.on_step_done(p, std::vector<std::int32_t>{1, 2});  // b has 1 of 2 tokens
  s.next_step(p);
  ASSERT_EQ(p.kind, StepKind::kDecode);
  ASSERT_EQ(p.requests.size(), 2u);
  for (const PlannedRequest& r : p.requests) ledger.extend(r.slot, r.extend_len);
  ASSERT_TRUE(s.next_step_ahead(p, ahead));
  ASSERT_EQ(ahead.requests.size(), 1u) << "b ends in flight by its length";
  EXPECT_EQ(ahead.requests[0].id, a);
  EXPECT_EQ(ahead.requests[0].prefix_len, p.requests[0].prefix_len + 1);
  EXPECT_EQ(ahead.requests[0].extend_len, 1);
  EXPECT_TRUE(ahead.requests[0].tokens.empty());
  EXPECT_TRUE(ahead.ahead);
  // A waiting request that fits now: the next plan admits it, synchronously.
  s.submit(request(3, 3, 3));
  EXPECT_FALSE(s.next_step_ahead(p, ahead));
  EXPECT_TRUE(ahead.requests.empty());
  static_cast<void>(b);
}

// A waiting request that does not fit does not stop pipelining: it waits for pages either way.
TEST(SchedulerPipeline, AWaitingRequestThatCannotBeAdmittedDoesNotStopPipelining) {
  LedgerPool pool = full_pool(4);  // 32 tokens
  KvLedger ledger(std::span(&pool, 1));
  Scheduler s(sched_config(), ledger);
  s.submit(request(8, 16, 1));  // reserves 3 pages
  StepPlan p, ahead;
  s.next_step(p);
  for (const PlannedRequest& r : p.requests) ledger.extend(r.slot, r.extend_len);
  s.on_step_done(p, std::vector<std::int32_t>{1});
  s.submit(request(8, 8, 2));  // needs 2 pages: waits
  s.next_step(p);
  ASSERT_EQ(p.kind, StepKind::kDecode);
  EXPECT_EQ(s.waiting(), 1);
  for (const PlannedRequest& r : p.requests) ledger.extend(r.slot, r.extend_len);
  EXPECT_TRUE(s.next_step_ahead(p, ahead));
  EXPECT_FALSE(ledger.can_admit(KvReservation{16, 0}));
  EXPECT_TRUE(ledger.can_admit(KvReservation{8, 0}));
}

}  // namespace
}  // namespace graphdecode
