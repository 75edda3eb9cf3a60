// The scheduler with a prefix cache, on the CPU: hits start prefill at the hit length, never the
// whole prompt, owners running or finished, sliding windows, encoder identities, the off switch,
// a pool under pressure (requests wait, never fail), and a random workload over a fake device
// that writes each position's token into its page and checks that every key a query reads (by
// the window rule) holds the request's own token there.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

#include "common/error.h"
#include "common/request_rules.h"
#include "engine/scheduler.h"
#include "memory/kv_ledger.h"

namespace graphdecode {
namespace {

constexpr std::int32_t kPage = 4;

LedgerPool pool(AttentionKind kind, std::int32_t pages, bool cache, std::int32_t window = 6) {
  LedgerPool p;
  p.geometry.kind = kind;
  p.geometry.page_size = kPage;
  p.geometry.num_pages = pages + 1;
  p.geometry.max_slots = 9;
  p.geometry.max_pages_per_slot = 32;  // 128 tokens
  p.geometry.window_left = kind == AttentionKind::kSliding ? window : -1;
  p.max_commands = 64;
  p.max_page_ids = 256;
  p.max_step_tokens = 16;
  p.prefix_cache = cache;
  return p;
}

SchedulerConfig config() {
  SchedulerConfig c;
  c.max_batch = 4;
  c.max_step_tokens = 16;
  c.max_context = 128;
  c.vocab_size = 8;
  return c;
}

// A scheduler over a ledger, and a fake device: content[pool][page * P + i] is the token whose
// K/V the page holds at offset i (-1: never written).
struct Rig {
  std::vector<LedgerPool> pools;
  KvLedger ledger;
  Scheduler s;
  std::vector<std::vector<std::int32_t>> content;
  std::int64_t bad_reads = 0, reads = 0;

  explicit Rig(std::vector<LedgerPool> p, SchedulerConfig c = config())
      : pools(std::move(p)), ledger(pools), s(c, ledger) {
    for (const LedgerPool& l : pools)
      content.emplace_back(static_cast<std::size_t>(l.geometry.num_pages * kPage), -1);
  }

  // One step: the runner's extends, the writes, every read checked; sampled token = f(prefix).
  std::vector<TokenEvent> step(const StepPlan& plan) {
    std::vector<std::int32_t> sampled;
    for (const PlannedRequest& p : plan.requests) {
      ledger.extend(p.slot, p.extend_len);
      const auto toks = s.tokens(p.id);
      for (std::int32_t i = 0; i < ledger.num_pools(); ++i) {
        const PoolGeometry& g = pools[i].geometry;
        if (g.kind == AttentionKind::kCross) continue;
        const auto row = ledger.slots(i).row(p.slot);
        for (std::int32_t q = p.prefix_len; q < p.prefix_len + p.extend_len; ++q)
          content[i][row[q / kPage] * kPage + q % kPage] = toks[q];
        for (std::int32_t q = p.prefix_len; q < p.prefix_len + p.extend_len; ++q) {
          for (std::int32_t k = first_visible_key(q, g.window_left); k <= q; ++k) {
            ++reads;
            const std::int32_t page = row[k / kPage];
            bad_reads += page <= 0 || content[i][page * kPage + k % kPage] != toks[k];
          }
        }
      }
      std::uint32_t h = 17;
      const std::int32_t end = p.prefix_len + p.extend_len;
      for (std::int32_t k = 0; k < end; ++k) h = h * 31 + static_cast<std::uint32_t>(toks[k]);
      sampled.push_back(static_cast<std::int32_t>(h % 8));
    }
    ledger.clear_commands();
    return s.on_step_done(plan, sampled);
  }
  void run() {
    for (StepPlan p = s.next_step(); !p.empty(); p = s.next_step()) step(p);
  }
};

std::vector<LedgerPool> full(std::int32_t pages = 200, bool cache = true) {
  return {pool(AttentionKind::kFull, pages, cache)};
}
std::vector<LedgerPool> mixed(bool cache = true, std::int32_t window = 6) {
  return {pool(AttentionKind::kFull, 200, cache),
          pool(AttentionKind::kSliding, 100, cache, window)};
}

RequestSpec spec(std::vector<std::int32_t> prompt, std::int32_t max_new = 4) {
  RequestSpec s;
  s.prompt = std::move(prompt);
  s.max_new_tokens = max_new;
  return s;
}
std::vector<std::int32_t> seq(std::int32_t n, std::int32_t salt = 0) {
  std::vector<std::int32_t> v;
  for (std::int32_t i = 0; i < n; ++i) v.push_back((i * 7 + salt + i / 5) % 8);
  return v;
}
std::vector<std::int32_t> cat(std::vector<std::int32_t> a, const std::vector<std::int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(SchedulerPrefix, HitStartsPrefillAtTheHitAndNeverCoversTheWholePrompt) {
  Rig t(full());
  t.s.submit(spec(seq(50)));
  t.run();
  EXPECT_EQ(t.s.prefix_counters().hit_tokens, 0);
  // Shares 41 tokens: 10 full pages.
  const RequestId b = t.s.submit(spec(cat(seq(41), seq(9, 3))));
  StepPlan p = t.s.next_step();
  ASSERT_EQ(p.requests.size(), 1u);
  EXPECT_EQ(t.s.prefix_hit(b), 40);
  EXPECT_EQ(p.requests[0].prefix_len, 40);
  t.step(p);
  t.run();
  // The very same prompt of 48 tokens (12 full pages): the last page is computed.
  const RequestId c = t.s.submit(spec(seq(48)));
  p = t.s.next_step();
  EXPECT_EQ(t.s.prefix_hit(c), 44);
  EXPECT_EQ(p.requests[0].prefix_len, 44);
  EXPECT_EQ(p.requests[0].extend_len, 4);
  t.step(p);
  t.run();
  EXPECT_EQ(t.s.prefix_counters().hit_tokens, 84);
  EXPECT_EQ(t.s.prefix_counters().lookup_tokens, 50 + 50 + 48);
  EXPECT_EQ(t.bad_reads, 0);
  EXPECT_GT(t.reads, 0);
}

TEST(SchedulerPrefix, HitWhileTheOwnerStillRunsAndAfterItFinished) {
  Rig t(mixed());
  const RequestId a = t.s.submit(spec(seq(30), 40));
  for (int i = 0; i < 4; ++i) t.step(t.s.next_step());  // prefill (2 chunks) + decodes
  ASSERT_GT(t.s.generated(a), 0);
  const RequestId b = t.s.submit(spec(cat(seq(30), seq(6, 5))));
  t.step(t.s.next_step());
  EXPECT_EQ(t.s.prefix_hit(b), 28);  // a still runs
  t.run();
  const RequestId c = t.s.submit(spec(cat(seq(30), seq(10, 1))));
  t.step(t.s.next_step());
  EXPECT_EQ(t.s.prefix_hit(c), 28);  // a and b finished; their pages stayed cached
  t.run();
  EXPECT_EQ(t.bad_reads, 0);
  EXPECT_EQ(t.ledger.active_requests(), 0);
  EXPECT_EQ(t.ledger.reserved_pages(0), 0);
}

TEST(SchedulerPrefix, GeneratedTokensAreSharedToo) {
  Rig t(full());
  const RequestId a = t.s.submit(spec(seq(10), 20));
  t.run();
  static_cast<void>(a);
  // Replays a's whole sequence (prompt + generated), known from a fresh identical run.
  Rig u(full(200, false));
  const RequestId a2 = u.s.submit(spec(seq(10), 20));
  std::vector<std::int32_t> all;
  for (StepPlan p = u.s.next_step(); !p.empty(); p = u.s.next_step()) {
    const auto before = u.s.tokens(a2);
    all.assign(before.begin(), before.end());
    u.step(p);
  }
  ASSERT_GE(all.size(), 29u);
  const RequestId b = t.s.submit(spec(all, 2));
  t.step(t.s.next_step());
  EXPECT_EQ(t.s.prefix_hit(b), 28);  // pages of generated tokens hit
  EXPECT_EQ(t.bad_reads, 0);
}

TEST(SchedulerPrefix, SlidingPoolNeedsOnlyTheWindowPages) {
  // window_left 0 (a query sees itself only), page - 1, page, 3 page + 5.
  for (const std::int32_t w : {0, kPage - 1, kPage, 3 * kPage + 5}) {
    Rig t({pool(AttentionKind::kSliding, 60, true, w)});
    t.s.submit(spec(seq(60)));
    t.run();
    const RequestId b = t.s.submit(spec(cat(seq(60), seq(3, 2))));
    t.step(t.s.next_step());
    EXPECT_EQ(t.s.prefix_hit(b), 60) << "window_left " << w;
    t.run();
    EXPECT_EQ(t.bad_reads, 0) << "window_left " << w;
  }
}

TEST(SchedulerPrefix, OffSwitchAndEncoderIdentity) {
  Rig off(full(200, false));
  off.s.submit(spec(seq(40)));
  off.run();
  const RequestId b = off.s.submit(spec(seq(40)));
  off.run();
  EXPECT_EQ(off.s.prefix_counters().hit_tokens, 0);
  EXPECT_EQ(off.s.prefix_counters().lookup_tokens, 0);
  static_cast<void>(b);

  // Encoder states: shared only between requests naming the same encoder identity.
  SchedulerConfig c = config();
  c.max_encoder_len = 4;
  c.encoder_width = 2;
  LedgerPool cross = pool(AttentionKind::kCross, 40, false);
  Rig t({pool(AttentionKind::kFull, 200, true), cross}, c);
  const std::vector<std::uint16_t> states(8, 1);
  auto with_encoder = [&](std::uint64_t id) {
    RequestSpec s = spec(seq(40));
    s.encoder = EncoderStates{states.data(), 4, 2, false};
    s.encoder_id = id;
    return s;
  };
  auto admit = [&](RequestSpec s) {
    const RequestId id = t.s.submit(std::move(s));
    StepPlan p = t.s.next_step();
    for (const RequestId a : p.admitted) t.ledger.set_encoder(t.s.slot(a), t.s.encoder(a).length);
    const std::int32_t hit = t.s.prefix_hit(id);
    t.step(p);
    t.run();
    return hit;
  };
  EXPECT_EQ(admit(with_encoder(0)), 0);
  EXPECT_EQ(admit(with_encoder(0)), 0);  // no identity: no sharing
  EXPECT_EQ(admit(with_encoder(7)), 0);
  EXPECT_EQ(admit(with_encoder(7)), 36);  // same identity
  EXPECT_EQ(admit(with_encoder(8)), 0);   // another image
  EXPECT_EQ(admit(spec(seq(40))), 0);     // text only: not the image's prefix
  EXPECT_EQ(admit(spec(seq(40))), 36);
  EXPECT_EQ(t.bad_reads, 0);
}

TEST(SchedulerPrefix, HitsBeyondTheStepsAdoptionBudgetWaitForTheNextStep) {
  std::vector<LedgerPool> pools = full();
  pools[0].adopt_page_ids = 15;  // one hit of 10 pages per step
  Rig t(pools);
  t.s.submit(spec(seq(44)));
  t.run();
  std::vector<RequestId> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(t.s.submit(spec(cat(seq(42), seq(5, i)))));
  for (int step = 0; step < 3; ++step) {
    const StepPlan p = t.s.next_step();
    ASSERT_EQ(p.admitted.size(), 1u) << "step " << step;
    EXPECT_EQ(p.admitted[0], ids[static_cast<std::size_t>(step)]);
    EXPECT_EQ(t.s.prefix_hit(p.admitted[0]), 40);  // the whole hit, a step later
    t.step(p);
  }
  t.run();
  EXPECT_EQ(t.bad_reads, 0);
}

TEST(SchedulerPrefix, PoolUnderPressureEvictsOnlyUnreferencedPagesAndRequestsWait) {
  // 40 usable pages: two requests of 64 + 8 tokens (18 pages each) at a time.
  Rig t(full(40));
  std::map<RequestId, bool> done;
  for (int i = 0; i < 24; ++i) done[t.s.submit(spec(cat(seq(48, i % 3), seq(16, i)), 8))] = false;
  std::int32_t most_waiting = 0;
  for (StepPlan p = t.s.next_step(); !p.empty(); p = t.s.next_step()) {
    most_waiting = std::max(most_waiting, t.s.waiting());
    for (const TokenEvent& e : t.step(p))
      if (e.finished) done[e.id] = true;
  }
  for (const auto& [id, d] : done) EXPECT_TRUE(d) << "request " << id;
  EXPECT_GT(most_waiting, 10);  // they waited
  const PrefixCacheStats st = t.ledger.prefix_stats();
  EXPECT_GT(st.evictions, 0);
  EXPECT_GT(t.s.prefix_counters().hit_tokens, 0);
  EXPECT_EQ(t.ledger.free_pages(0), t.ledger.usable_pages(0));  // nothing leaked
  EXPECT_EQ(t.ledger.slots(0).allocator().free_pages() + st.lru_pages, t.ledger.usable_pages(0));
  EXPECT_EQ(t.bad_reads, 0);
}

TEST(SchedulerPrefix, RandomWorkloadReadsOnlyItsOwnTokens) {
  std::mt19937_64 rng(1234);
  // Cache on and off; and a draft model's pools beside the target's (group 1), which share only
  // prompt pages (SchedulerConfig::share_generated off, as the engine sets it for a draft).
  for (const int variant : {0, 1, 2}) {
    const bool cache = variant != 1;
    std::vector<LedgerPool> pools = mixed(cache, 5);
    SchedulerConfig sc = config();
    if (variant == 2) {
      pools.push_back(pool(AttentionKind::kFull, 200, true));
      pools.back().group = 1;
      pools.push_back(pool(AttentionKind::kSliding, 100, true, 9));
      pools.back().group = 1;
      sc.share_generated = false;
    }
    Rig t(pools, sc);
    std::vector<std::vector<std::int32_t>> stems;
    for (int s = 0; s < 3; ++s) stems.push_back(seq(90, s));
    std::map<RequestId, std::vector<std::int32_t>> outputs;
    for (int step = 0; step < 3000; ++step) {
      if (rng() % 3 == 0 && t.s.waiting() < 6) {
        const auto& stem = stems[rng() % 3];
        const std::int32_t len = 1 + static_cast<std::int32_t>(rng() % 90);
        std::vector<std::int32_t> prompt(stem.begin(), stem.begin() + len);
        for (auto& x : prompt)
          if (rng() % 50 == 0) x = static_cast<std::int32_t>(rng() % 8);
        t.s.submit(spec(prompt, 1 + static_cast<std::int32_t>(rng() % 20)));
      }
      if (rng() % 40 == 0 && t.s.running() > 0) {
        // Cancel a running request: its pages go back (named ones stay cached).
        const StepPlan p = t.s.next_step();
        for (const TokenEvent& e : t.step(p)) outputs[e.id].push_back(e.token);
        for (const PlannedRequest& r : p.requests) {
          try {
            t.s.cancel(r.id);  // the first one still running
            break;
          } catch (const Error&) {  // finished this step
          }
        }
        continue;
      }
      const StepPlan p = t.s.next_step();
      if (p.empty()) continue;
      for (const TokenEvent& e : t.step(p)) outputs[e.id].push_back(e.token);
    }
    t.run();
    EXPECT_EQ(t.bad_reads, 0) << "variant " << variant;
    EXPECT_GT(t.reads, 100000);
    if (cache) EXPECT_GT(t.s.prefix_counters().hit_tokens, 1000) << "variant " << variant;
  }
}

}  // namespace
}  // namespace graphdecode
