// RequestTables on the CPU: one slot across pools, all-or-nothing extends, commands that rebuild
// the host mirror of every page table.
#include <gtest/gtest.h>

#include <vector>

#include "common/error.h"
#include "common/request_rules.h"
#include "engine/request_tables.h"
#include "memory/table_commands.h"

namespace graphdecode {
namespace {

constexpr int kFull = static_cast<int>(AttentionKind::kFull);
constexpr int kSwa = static_cast<int>(AttentionKind::kSliding);

StepPoolCapacity pool(AttentionKind kind, std::int32_t pages, std::int32_t window_left) {
  StepPoolCapacity p;
  p.present = true;
  p.geometry.kind = kind;
  p.geometry.page_size = 16;
  p.geometry.num_pages = pages;
  p.geometry.max_slots = 5;
  p.geometry.max_pages_per_slot = 16;
  p.geometry.window_left = window_left;
  p.max_commands = 32;
  p.max_page_ids = 64;
  return p;
}

StepCapacity capacity(std::int32_t swa_pages) {
  StepCapacity c;
  c.max_batch = 4;
  c.max_tokens = 256;
  c.max_slots = 5;
  c.max_kv_len = 256;
  c.pools[kFull] = pool(AttentionKind::kFull, 64, -1);
  c.pools[kSwa] = pool(AttentionKind::kSliding, swa_pages, 20);
  return c;
}

// Applying every step's commands to a fresh table must give each pool's host mirror.
class Replayer {
 public:
  explicit Replayer(const StepCapacity& c) : cap_(c) {
    for (int k : {kFull, kSwa}) {
      const PoolGeometry& g = c.pools[k].geometry;
      table_[k].resize(static_cast<std::size_t>(g.max_slots) * g.max_pages_per_slot);
      init_page_table_host(g, table_[k]);
    }
  }
  void apply(const StepDesc& d) {
    for (int k : {kFull, kSwa})
      apply_table_commands_host(d.tables[k]->commands(), d.tables[k]->page_ids(),
                                cap_.pools[k].geometry, table_[k]);
  }
  const std::vector<std::int32_t>& table(int k) const { return table_[k]; }

 private:
  StepCapacity cap_;
  std::vector<std::int32_t> table_[kNumPoolKinds];
};

std::vector<std::int32_t> mirror(const RequestTables& t, int k) {
  const auto s = t.pool(k).table();
  return {s.begin(), s.end()};
}

TEST(RequestTables, SameSlotEveryPoolAndCommandsRebuildTheTables) {
  const StepCapacity cap = capacity(32);
  RequestTables t(cap);
  Replayer replay(cap);
  const std::int32_t a = t.acquire(), b = t.acquire();
  EXPECT_NE(a, graphdecode::kPaddingSlot);
  EXPECT_NE(a, b);
  for (int step = 0; step < 12; ++step) {
    t.extend(a, step == 0 ? 40 : 3);
    t.extend(b, step == 0 ? 7 : 5);
    StepDesc d;
    t.attach(d);
    replay.apply(d);
    t.clear_commands();
  }
  EXPECT_EQ(t.tokens(a), 40 + 11 * 3);
  EXPECT_EQ(t.pool(kSwa).tokens(b), t.pool(kFull).tokens(b));
  EXPECT_GT(t.pool(kSwa).first_resident_page(a), 0);  // the window released old pages
  t.release(a);
  StepDesc d;
  t.attach(d);
  replay.apply(d);
  for (int k : {kFull, kSwa}) EXPECT_EQ(replay.table(k), mirror(t, k)) << "pool " << k;
}

TEST(RequestTables, ExhaustedPoolRollsBackTheOthers) {
  const StepCapacity cap = capacity(6);  // 5 usable sliding-window pages
  RequestTables t(cap);
  Replayer replay(cap);
  const std::int32_t a = t.acquire(), b = t.acquire();
  t.extend(a, 40);  // 3 pages in each pool
  const std::int32_t full_free = t.pool(kFull).allocator().free_pages();
  const std::int32_t swa_free = t.pool(kSwa).allocator().free_pages();
  EXPECT_THROW(t.extend(b, 60), Error);  // 4 more sliding-window pages: only 2 left
  EXPECT_EQ(t.tokens(b), 0);
  EXPECT_EQ(t.pool(kFull).tokens(b), 0);
  EXPECT_EQ(t.pool(kFull).allocator().free_pages(), full_free);  // rolled back
  EXPECT_EQ(t.pool(kSwa).allocator().free_pages(), swa_free);    // never changed
  t.extend(b, 20);                                               // what fits still works
  StepDesc d;
  t.attach(d);
  replay.apply(d);
  for (int k : {kFull, kSwa}) EXPECT_EQ(replay.table(k), mirror(t, k)) << "pool " << k;
}

TEST(RequestTables, BadSlotsAreNamed) {
  RequestTables t(capacity(32));
  try {
    t.release(3);
    FAIL() << "releasing a free slot must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "slot");
  }
  EXPECT_THROW(t.set_encoder(1, 10), Error);  // no cross pool
}

}  // namespace
}  // namespace graphdecode
