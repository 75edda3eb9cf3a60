// Scheduler policy on the CPU: validation, chunked prefill, continuous batching, KV admission
// by reservation in the page ledger (full-attention and sliding-window-only models).
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>
#include <set>

#include "common/error.h"
#include "common/request_rules.h"
#include "engine/scheduler.h"
#include "memory/kv_ledger.h"
#include "support/field_of.h"

namespace graphdecode {
namespace {

SchedulerConfig config() {
  SchedulerConfig c;
  c.max_batch = 4;
  c.max_step_tokens = 32;
  c.max_context = 256;
  c.vocab_size = 100;
  return c;
}

// One pool of `pages` usable pages of 16 tokens: full attention, or a sliding window of 31 keys.
LedgerPool pool(AttentionKind kind, std::int32_t pages) {
  LedgerPool p;
  p.geometry.kind = kind;
  p.geometry.page_size = 16;
  p.geometry.num_pages = pages + 1;  // + the reserved page
  p.geometry.max_slots = 9;
  p.geometry.max_pages_per_slot = 16;  // max_context 256
  p.geometry.window_left = kind == AttentionKind::kSliding ? 31 : -1;
  p.max_commands = 64;
  p.max_page_ids = 64;
  p.max_step_tokens = 32;
  return p;
}

// A scheduler over a ledger of one pool.
struct LedgerSetup {
  LedgerPool p;
  KvLedger ledger;
  Scheduler s;
  explicit LedgerSetup(std::int32_t pages = 64, AttentionKind kind = AttentionKind::kFull)
      : p(pool(kind, pages)), ledger(std::span<const LedgerPool>(&p, 1)), s(config(), ledger) {}
  std::int32_t unreserved() const { return ledger.usable_pages(0) - ledger.reserved_pages(0); }
};

RequestSpec spec(std::int32_t prompt_len, std::int32_t max_new, std::int32_t first = 1) {
  RequestSpec s;
  for (std::int32_t i = 0; i < prompt_len; ++i) s.prompt.push_back((first + i) % 100);
  s.max_new_tokens = max_new;
  return s;
}

using testing::field_of;

TEST(Scheduler, BadRequestsNameTheFieldAndChangeNothing) {
  LedgerSetup setup(8);
  Scheduler& s = setup.s;
  s.submit(spec(4, 4));
  auto bad_token = spec(4, 4);
  bad_token.prompt[2] = 100;
  auto stop = spec(4, 4);
  stop.stop_tokens = {-1};
  auto top_p = spec(4, 4);
  top_p.sampling.top_p = 0.f;
  EXPECT_EQ(field_of([&] { s.submit(spec(0, 4)); }), "prompt");
  EXPECT_EQ(field_of([&] { s.submit(bad_token); }), "prompt[2]");
  EXPECT_EQ(field_of([&] { s.submit(stop); }), "stop_tokens");
  EXPECT_EQ(field_of([&] { s.submit(spec(4, 0)); }), "max_new_tokens");
  EXPECT_EQ(field_of([&] { s.submit(spec(200, 57)); }), "prompt_len + max_new_tokens");
  EXPECT_EQ(field_of([&] { s.submit(spec(100, 100)); }), "kv_pages_needed");  // 13 > 8 pages
  EXPECT_EQ(field_of([&] { s.submit(top_p); }), "sampling.top_p");
  EXPECT_EQ(s.waiting(), 1);  // only the good request
  EXPECT_EQ(setup.unreserved(), 8);
}

TEST(Scheduler, LongPromptIsPrefilledInChunksThenDecoded) {
  LedgerSetup setup;
  Scheduler& s = setup.s;
  const RequestId id = s.submit(spec(100, 3));
  std::vector<std::int32_t> chunks;
  for (int step = 0; step < 4; ++step) {
    const StepPlan p = s.next_step();
    ASSERT_EQ(p.kind, StepKind::kExtend);
    ASSERT_EQ(p.requests.size(), 1u);
    EXPECT_EQ(p.requests[0].prefix_len, 32 * step);
    EXPECT_EQ(p.requests[0].tokens[0], (1 + 32 * step) % 100);  // the right slice of the prompt
    EXPECT_EQ(p.requests[0].samples, step == 3);
    chunks.push_back(p.requests[0].extend_len);
    const std::vector<std::int32_t> sampled{7};
    const auto ev = s.on_step_done(p, sampled);
    EXPECT_EQ(ev.size(), step == 3 ? 1u : 0u);
  }
  EXPECT_EQ(chunks, (std::vector<std::int32_t>{32, 32, 32, 4}));
  StepPlan d = s.next_step();
  ASSERT_EQ(d.kind, StepKind::kDecode);
  EXPECT_EQ(d.requests[0].prefix_len, 100);
  EXPECT_EQ(d.requests[0].tokens[0], 7);  // feeds the token sampled at the end of prefill
  const std::vector<std::int32_t> t1{8};
  s.on_step_done(d, t1);
  d = s.next_step();
  const auto ev = s.on_step_done(d, std::vector<std::int32_t>{9});
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_TRUE(ev[0].finished);  // 3 new tokens: 7, 8, 9
  EXPECT_TRUE(s.idle());
  EXPECT_EQ(setup.unreserved(), 64);
  EXPECT_EQ(setup.ledger.active_requests(), 0);
  EXPECT_THROW(s.tokens(id), Error);  // gone once finished
}

TEST(Scheduler, StopTokenEndsEarlyAndRequestsJoinBetweenSteps) {
  LedgerSetup setup;
  Scheduler& s = setup.s;
  auto a = spec(3, 10);
  a.stop_tokens = {42};
  const RequestId ida = s.submit(a);
  StepPlan p = s.next_step();  // prefill a
  s.on_step_done(p, std::vector<std::int32_t>{5});
  const RequestId idb = s.submit(spec(2, 10));  // joins while a decodes
  p = s.next_step();                            // prefill b first (a waits one step)
  ASSERT_EQ(p.kind, StepKind::kExtend);
  ASSERT_EQ(p.admitted, std::vector<RequestId>{idb});
  s.on_step_done(p, std::vector<std::int32_t>{6});
  p = s.next_step();
  ASSERT_EQ(p.kind, StepKind::kDecode);
  ASSERT_EQ(p.requests.size(), 2u);
  const auto ev = s.on_step_done(p, std::vector<std::int32_t>{42, 11});
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].id, ida);
  EXPECT_TRUE(ev[0].finished);  // stop token
  EXPECT_FALSE(ev[1].finished);
  EXPECT_EQ(s.running(), 1);
  EXPECT_EQ(s.generated(idb), 2);
}

// Random traffic on a small pool, driven like the engine drives it (each planned request extended
// in the ledger): requests wait when the pool is full, none is lost, every one gets exactly
// max_new_tokens (no stop tokens), batches never exceed max_batch, no extend ever exceeds the
// admitted reservation, and the pages balance at the end.
void random_traffic(LedgerSetup& setup, std::uint32_t seed, std::int32_t max_prompt,
                    std::int32_t max_new) {
  std::mt19937 rng(seed);
  Scheduler& s = setup.s;
  std::map<RequestId, std::int32_t> expected, got;
  std::int32_t submitted = 0;
  bool blocked_by_pages = false;
  std::int32_t most_running = 0;
  for (int step = 0; step < 20000 && (submitted < 200 || !s.idle()); ++step) {
    if (submitted < 200 && rng() % 2 == 0) {
      const std::int32_t prompt = 1 + static_cast<std::int32_t>(rng() % max_prompt);
      const std::int32_t n = 1 + static_cast<std::int32_t>(rng() % max_new);
      expected[s.submit(spec(prompt, n, static_cast<std::int32_t>(rng() % 100)))] = n;
      ++submitted;
    }
    const StepPlan p = s.next_step();
    blocked_by_pages |= s.waiting() > 0 && s.running() < 4;  // a slot was free, pages were not
    most_running = std::max(most_running, s.running());
    ASSERT_LE(p.requests.size(), 4u);
    ASSERT_GE(setup.unreserved(), 0);
    std::int32_t step_tokens = 0;
    std::vector<std::int32_t> sampled;
    for (const PlannedRequest& r : p.requests) {
      step_tokens += r.extend_len;
      // Throws if the request would hold more than it reserved.
      ASSERT_NO_THROW(setup.ledger.extend(r.slot, r.extend_len)) << "step " << step;
      sampled.push_back(static_cast<std::int32_t>(rng() % 100));
    }
    setup.ledger.clear_commands();
    ASSERT_GE(setup.ledger.free_pages(0), setup.unreserved());  // held <= reserved
    ASSERT_LE(step_tokens, 32);
    for (const TokenEvent& e : s.on_step_done(p, sampled)) ++got[e.id];
  }
  EXPECT_TRUE(s.idle());
  EXPECT_TRUE(blocked_by_pages);  // the pool really was full at times
  EXPECT_GE(most_running, 2);
  EXPECT_EQ(submitted, 200);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(setup.unreserved(), setup.ledger.usable_pages(0));
  EXPECT_EQ(setup.ledger.free_pages(0), setup.ledger.usable_pages(0));  // every page returned
}

TEST(Scheduler, FullPoolMakesRequestsWaitNeverLost) {
  LedgerSetup setup(20);  // 20 pages of 16 tokens
  random_traffic(setup, 12345, 120, 60);
}

// A model whose layers all use a sliding window has only a window pool. A request holds at most
// the window plus one step of pages there (31 + 32 keys: 5 pages), however long it grows, and is
// admitted by that count: 11 pages run two such requests at once, never three.
TEST(Scheduler, SlidingWindowOnlyModelIsAdmittedByWindowPages) {
  LedgerSetup setup(11, AttentionKind::kSliding);
  Scheduler& s = setup.s;
  KvReservation r;
  r.max_tokens = 200;
  EXPECT_EQ(setup.ledger.pages_needed(0, r), 5);  // not ceil(200 / 16) = 13
  for (int i = 0; i < 3; ++i) s.submit(spec(150, 50, i));
  StepPlan p = s.next_step();
  EXPECT_EQ(p.admitted.size(), 2u);  // 5 + 5 of 11; the third waits for pages, not for a slot
  EXPECT_EQ(s.waiting(), 1);
  EXPECT_EQ(setup.unreserved(), 1);
  // Requests far longer than the pool's pages would hold in full run to the end.
  LedgerSetup traffic(11, AttentionKind::kSliding);
  random_traffic(traffic, 777, 200, 56);
}

// Cancellation between steps: a waiting request leaves the queue; a running one (in prefill or
// decoding) returns its slot and pages at once; unknown and finished ids are named errors.
TEST(Scheduler, CancelWaitingAndRunningRequestsReturnsTheirPages) {
  LedgerSetup setup(12);  // 12 pages: two requests of 96 + 32 tokens (8 pages) do not fit together
  Scheduler& s = setup.s;
  const RequestId a = s.submit(spec(96, 32));
  const RequestId b = s.submit(spec(96, 32));
  const RequestId c = s.submit(spec(8, 8));
  StepPlan p = s.next_step();  // a admitted (8 pages); b waits at the head, c behind it
  ASSERT_EQ(p.admitted, std::vector<RequestId>{a});
  EXPECT_EQ(s.waiting(), 2);
  const TokenEvent eb = s.cancel(b);  // waiting: leaves the queue, no pages involved
  EXPECT_TRUE(eb.finished && eb.cancelled);
  EXPECT_EQ(eb.token, kNoToken);
  EXPECT_EQ(s.waiting(), 1);
  EXPECT_EQ(setup.ledger.reserved_pages(0), 8);
  // a is in prefill (its first chunk planned, not yet run): cancel it between steps.
  const std::vector<std::int32_t> none;
  std::vector<TokenEvent> events;
  s.on_step_done(p, std::vector<std::int32_t>{0}, none, events);
  EXPECT_TRUE(events.empty());
  const TokenEvent ea = s.cancel(a);
  EXPECT_TRUE(ea.cancelled);
  EXPECT_EQ(s.running(), 0);
  EXPECT_EQ(setup.ledger.reserved_pages(0), 0);
  EXPECT_EQ(setup.ledger.active_requests(), 0);
  // c is admitted now, prefills, decodes once, then is cancelled while decoding.
  p = s.next_step();
  ASSERT_EQ(p.admitted, std::vector<RequestId>{c});
  for (const PlannedRequest& r : p.requests) setup.ledger.extend(r.slot, r.extend_len);
  s.on_step_done(p, std::vector<std::int32_t>{5});
  p = s.next_step();
  ASSERT_EQ(p.kind, StepKind::kDecode);
  for (const PlannedRequest& r : p.requests) setup.ledger.extend(r.slot, r.extend_len);
  s.on_step_done(p, std::vector<std::int32_t>{6});
  EXPECT_GT(setup.ledger.free_pages(0), 0);
  s.cancel(c);
  EXPECT_TRUE(s.idle());
  EXPECT_EQ(setup.ledger.free_pages(0), 12);
  EXPECT_EQ(setup.ledger.reserved_pages(0), 0);
  EXPECT_TRUE(s.next_step().empty());
  EXPECT_EQ(field_of([&] { s.cancel(c); }), "request");    // already cancelled
  EXPECT_EQ(field_of([&] { s.cancel(999); }), "request");  // never submitted
}

TEST(Scheduler, RequestThatNeverFitsTheWindowPoolIsRefused) {
  LedgerSetup setup(4, AttentionKind::kSliding);
  EXPECT_EQ(field_of([&] { setup.s.submit(spec(150, 50)); }), "kv_pages_needed");  // 5 > 4
  EXPECT_NO_THROW(setup.s.submit(spec(40, 8)));  // 48 keys: 3 pages
}

}  // namespace
}  // namespace graphdecode
