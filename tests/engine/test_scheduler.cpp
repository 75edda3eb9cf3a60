// Scheduler policy on the CPU: validation, chunked prefill, continuous batching, KV admission.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>
#include <set>

#include "common/error.h"
#include "engine/scheduler.h"

namespace graphdecode {
namespace {

SchedulerConfig config(std::int32_t pages = 64) {
  SchedulerConfig c;
  c.max_batch = 4;
  c.max_step_tokens = 32;
  c.max_context = 256;
  c.vocab_size = 100;
  c.page_size = 16;
  c.kv_pages = pages;
  return c;
}

RequestSpec spec(std::int32_t prompt_len, std::int32_t max_new, std::int32_t first = 1) {
  RequestSpec s;
  for (std::int32_t i = 0; i < prompt_len; ++i) s.prompt.push_back((first + i) % 100);
  s.max_new_tokens = max_new;
  return s;
}

std::string field_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.field();
  }
  return "<no error>";
}

TEST(Scheduler, BadRequestsNameTheFieldAndChangeNothing) {
  Scheduler s(config(8));
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
  EXPECT_EQ(s.free_pages(), 8);
}

TEST(Scheduler, LongPromptIsPrefilledInChunksThenDecoded) {
  Scheduler s(config());
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
  EXPECT_EQ(s.free_pages(), 64);
  EXPECT_THROW(s.tokens(id), Error);  // gone once finished
}

TEST(Scheduler, StopTokenEndsEarlyAndRequestsJoinBetweenSteps) {
  Scheduler s(config());
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

// Random traffic on a small pool: requests wait when the pool is full, none is lost, every one
// gets exactly max_new_tokens (no stop tokens), batches never exceed max_batch, pages balance.
TEST(Scheduler, FullPoolMakesRequestsWaitNeverLost) {
  std::mt19937 rng(12345);
  Scheduler s(config(20));  // 20 pages of 16 tokens
  std::map<RequestId, std::int32_t> expected, got;
  std::int32_t submitted = 0;
  bool blocked_by_pages = false;
  for (int step = 0; step < 5000 && (submitted < 200 || !s.idle()); ++step) {
    if (submitted < 200 && rng() % 2 == 0) {
      const std::int32_t prompt = 1 + static_cast<std::int32_t>(rng() % 120);
      const std::int32_t max_new = 1 + static_cast<std::int32_t>(rng() % 60);
      expected[s.submit(spec(prompt, max_new, static_cast<std::int32_t>(rng() % 100)))] = max_new;
      ++submitted;
    }
    const StepPlan p = s.next_step();
    blocked_by_pages |= s.waiting() > 0 && s.running() < 4;  // a slot was free, pages were not
    ASSERT_LE(p.requests.size(), 4u);
    ASSERT_GE(s.free_pages(), 0);
    std::int32_t step_tokens = 0;
    std::vector<std::int32_t> sampled;
    for (const PlannedRequest& r : p.requests) {
      step_tokens += r.extend_len;
      sampled.push_back(static_cast<std::int32_t>(rng() % 100));
    }
    ASSERT_LE(step_tokens, 32);
    for (const TokenEvent& e : s.on_step_done(p, sampled)) ++got[e.id];
  }
  EXPECT_TRUE(s.idle());
  EXPECT_TRUE(blocked_by_pages);  // the pool really was full at times
  EXPECT_EQ(submitted, 200);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(s.free_pages(), 20);
}

}  // namespace
}  // namespace graphdecode
