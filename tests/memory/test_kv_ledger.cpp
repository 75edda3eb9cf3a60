// KvLedger on the CPU: one slot across pools (and models), all-or-nothing operations, admission
// by reservation, and commands that rebuild the host mirror of every page table; a random
// operation sequence checked against exact page accounting after every operation.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

#include "common/error.h"
#include "common/request_rules.h"
#include "memory/kv_ledger.h"
#include "memory/table_commands.h"

namespace graphdecode {
namespace {

LedgerPool pool(AttentionKind kind, std::int32_t pages, std::int32_t group = 0) {
  LedgerPool p;
  p.geometry.kind = kind;
  p.geometry.page_size = 16;
  p.geometry.num_pages = pages;
  p.geometry.max_slots = 5;
  p.geometry.max_pages_per_slot = 16;
  p.geometry.window_left = kind == AttentionKind::kSliding ? 20 : -1;
  p.max_commands = 32;
  p.max_page_ids = 64;
  p.group = group;
  p.max_step_tokens = 64;
  return p;
}

// Full + sliding pools of a target (group 0).
std::vector<LedgerPool> target(std::int32_t swa_pages) {
  return {pool(AttentionKind::kFull, 64), pool(AttentionKind::kSliding, swa_pages)};
}

// Applying every step's commands to fresh tables must give each pool's host mirror.
class Replayer {
 public:
  explicit Replayer(const KvLedger& l) : ledger_(l) {
    for (std::int32_t i = 0; i < l.num_pools(); ++i) {
      const PoolGeometry& g = l.config(i).geometry;
      table_.emplace_back(static_cast<std::size_t>(g.max_slots) * g.max_pages_per_slot);
      init_page_table_host(g, table_.back());
    }
  }
  void apply() {
    for (std::int32_t i = 0; i < ledger_.num_pools(); ++i) {
      const TableCommandBatch& b = ledger_.commands(i);
      apply_table_commands_host(b.commands(), b.page_ids(), ledger_.config(i).geometry, table_[i]);
    }
  }
  void expect_mirrors() const {
    for (std::int32_t i = 0; i < ledger_.num_pools(); ++i) {
      const auto m = ledger_.slots(i).table();
      EXPECT_EQ(table_[i], std::vector<std::int32_t>(m.begin(), m.end())) << "pool " << i;
    }
  }

 private:
  const KvLedger& ledger_;
  std::vector<std::vector<std::int32_t>> table_;
};

TEST(KvLedger, SameSlotEveryPoolAndCommandsRebuildTheTables) {
  const auto pools = target(32);
  KvLedger t(pools);
  Replayer replay(t);
  const std::int32_t a = t.acquire(), b = t.acquire();
  EXPECT_NE(a, kPaddingSlot);
  EXPECT_NE(a, b);
  for (int step = 0; step < 12; ++step) {
    t.extend(a, step == 0 ? 40 : 3);
    t.extend(b, step == 0 ? 7 : 5);
    replay.apply();
    t.clear_commands();
  }
  EXPECT_EQ(t.tokens(a), 40 + 11 * 3);
  EXPECT_EQ(t.slots(1).tokens(b), t.slots(0).tokens(b));
  EXPECT_GT(t.slots(1).first_resident_page(a), 0);  // the window released old pages
  t.release(a);
  replay.apply();
  replay.expect_mirrors();
}

TEST(KvLedger, ExhaustedPoolRollsBackTheOthers) {
  const auto pools = target(6);  // 5 usable sliding-window pages
  KvLedger t(pools);
  Replayer replay(t);
  const std::int32_t a = t.acquire(), b = t.acquire();
  t.extend(a, 40);  // 3 pages in each pool
  const std::int32_t full_free = t.free_pages(0), swa_free = t.free_pages(1);
  EXPECT_THROW(t.extend(b, 60), Error);  // 4 more sliding-window pages: only 2 left
  EXPECT_EQ(t.tokens(b), 0);
  EXPECT_EQ(t.slots(0).tokens(b), 0);
  EXPECT_EQ(t.free_pages(0), full_free);  // rolled back
  EXPECT_EQ(t.free_pages(1), swa_free);   // never changed
  t.extend(b, 20);                        // what fits still works
  replay.apply();
  replay.expect_mirrors();
}

TEST(KvLedger, BadSlotsAndMissingPoolsAreNamed) {
  const auto pools = target(32);
  KvLedger t(pools);
  try {
    t.release(3);
    FAIL() << "releasing a free slot must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "slot");
  }
  const std::int32_t a = t.acquire();
  try {
    t.set_encoder(a, 10);
    FAIL() << "no cross pool";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "pools");
  }
  EXPECT_THROW(t.extend(a, -1), Error);
  EXPECT_THROW(KvLedger(std::vector<LedgerPool>{}), Error);
  auto mismatched = target(32);
  mismatched[1].geometry.max_slots = 7;
  EXPECT_THROW(KvLedger{mismatched}, Error);
}

// A target and its draft in one step: one slot, each model's pools extended by its group.
TEST(KvLedger, GroupsExtendAndTruncateTheirModelsPoolsOnly) {
  const std::vector<LedgerPool> pools = {pool(AttentionKind::kFull, 64, 0),
                                         pool(AttentionKind::kSliding, 32, 0),
                                         pool(AttentionKind::kFull, 64, 1)};
  KvLedger t(pools);
  const std::int32_t s = t.acquire();
  t.extend(s, 30, 0);
  EXPECT_EQ(t.tokens(s, 0), 30);
  EXPECT_EQ(t.tokens(s, 1), 0);
  EXPECT_EQ(t.slots(1).tokens(s), 30);
  t.extend(s, 27);  // every model
  EXPECT_EQ(t.tokens(s, 0), 57);
  EXPECT_EQ(t.tokens(s, 1), 27);
  t.truncate(s, 20, 1);
  EXPECT_EQ(t.tokens(s, 0), 57);
  EXPECT_EQ(t.tokens(s, 1), 20);
  EXPECT_EQ(t.pages_held(2, s), 2);
}

TEST(KvLedger, ReservationAdmitsOnlyWhatEveryPoolCanHoldAndIsEnforced) {
  // 6 usable full pages, 10 usable sliding pages (window 20 + 64 per step: at most 7 pages).
  const std::vector<LedgerPool> pools = {pool(AttentionKind::kFull, 7),
                                         pool(AttentionKind::kSliding, 11)};
  KvLedger t(pools);
  KvReservation r;
  r.max_tokens = 50;  // full 4 pages, sliding min(4, 7) = 4
  EXPECT_EQ(t.pages_needed(0, r), 4);
  EXPECT_EQ(t.pages_needed(1, r), 4);
  const auto a = t.try_admit(r);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(t.reserved_pages(0), 4);
  EXPECT_FALSE(t.try_admit(r).has_value());  // 4 more full pages: only 2 unreserved
  EXPECT_EQ(t.active_requests(), 1);
  t.extend(*a, 50);
  // Past its reservation: refused, naming the count, and no pool changed.
  const std::int32_t free0 = t.free_pages(0), free1 = t.free_pages(1);
  try {
    t.extend(*a, 20);
    FAIL() << "an extend past the reservation must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "pages_held");
  }
  EXPECT_EQ(t.tokens(*a), 50);
  EXPECT_EQ(t.free_pages(0), free0);
  EXPECT_EQ(t.free_pages(1), free1);
  KvReservation huge;
  huge.max_tokens = 200;
  try {
    t.require_fits(huge);
    FAIL() << "13 full pages can never fit 6";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "kv_pages_needed");
  }
  t.release(*a);
  EXPECT_EQ(t.reserved_pages(0), 0);
  EXPECT_EQ(t.free_pages(0), 6);
  EXPECT_TRUE(t.try_admit(r).has_value());
}

TEST(KvLedger, TruncateChecksEveryPoolBeforeChangingAny) {
  const auto pools = target(32);
  KvLedger t(pools);
  const std::int32_t s = t.acquire();
  t.extend(s, 100);
  t.extend(s, 1);  // the step at 100 released the pages left of key 80
  const std::int32_t free0 = t.free_pages(0);
  EXPECT_THROW(t.truncate(s, 40), Error);  // the window pool returned the pages 40 needs
  EXPECT_EQ(t.free_pages(0), free0);
  EXPECT_EQ(t.slots(0).tokens(s), 101);
  t.truncate(s, 100);  // the next step starts at 100 again: its window is still resident
  EXPECT_EQ(t.tokens(s), 100);
}

// Random admits, extends, truncates and releases against exact accounting: after every
// operation each pool's free pages plus the pages its requests hold equal its usable pages, the
// reserved count equals the sum of live reservations, every refused operation changed nothing,
// and the commands rebuild every table.
TEST(KvLedger, RandomOperationsKeepExactAccounting) {
  const std::vector<LedgerPool> pools = {
      pool(AttentionKind::kFull, 40, 0), pool(AttentionKind::kSliding, 30, 0),
      pool(AttentionKind::kCross, 30, 0), pool(AttentionKind::kFull, 40, 1)};
  KvLedger t(pools);
  Replayer replay(t);
  std::mt19937 rng(2026);
  std::map<std::int32_t, std::vector<std::int32_t>> reserved;  // slot -> pages per pool
  std::int32_t refused = 0, done = 0;
  const auto snapshot = [&] {
    std::vector<std::int32_t> s;
    for (std::int32_t i = 0; i < t.num_pools(); ++i) {
      s.push_back(t.free_pages(i));
      s.push_back(t.reserved_pages(i));
    }
    return s;
  };
  for (int op = 0; op < 20000; ++op) {
    const auto before = snapshot();
    std::vector<std::int32_t> live;
    for (std::int32_t s = 1; s < 5; ++s)
      if (t.is_active(s)) live.push_back(s);
    const std::int32_t pick = live.empty() ? 0 : live[rng() % live.size()];
    try {
      switch (rng() % 6) {
        case 0: {
          KvReservation r;
          r.max_tokens = 1 + static_cast<std::int32_t>(rng() % 256);
          r.encoder_len = static_cast<std::int32_t>(rng() % 100);
          const auto slot = t.try_admit(r);
          if (!slot) {
            ++refused;
            EXPECT_EQ(snapshot(), before);
            break;
          }
          for (std::int32_t i = 0; i < t.num_pools(); ++i)
            reserved[*slot].push_back(t.pages_needed(i, r));
          if (r.encoder_len > 0) t.set_encoder(*slot, r.encoder_len);
          break;
        }
        case 1:
        case 2:
          if (pick) {
            const auto group =
                static_cast<std::int32_t>(rng() % 3) - 1;  // -1 every model, or one of them
            t.extend(pick, 1 + static_cast<std::int32_t>(rng() % 40), group);
          }
          break;
        case 3:
          if (pick) {
            const std::int32_t held = t.tokens(pick, 1);
            t.truncate(pick, held - static_cast<std::int32_t>(rng() % (held + 1)), 1);
          }
          break;
        case 4:
          if (pick) {
            t.release(pick);
            reserved.erase(pick);
          }
          break;
        default:
          if (pick) {
            const std::int32_t held = t.tokens(pick, 0);
            t.truncate(pick, std::max(0, held - static_cast<std::int32_t>(rng() % 8)), 0);
          }
      }
      ++done;
    } catch (const Error&) {
      ++refused;
      ASSERT_EQ(snapshot(), before) << "a refused operation changed the ledger (op " << op << ")";
    }
    for (std::int32_t i = 0; i < t.num_pools(); ++i) {
      std::int32_t held = 0, want_reserved = 0;
      for (std::int32_t s = 1; s < 5; ++s) {
        if (!t.is_active(s)) continue;
        held += t.pages_held(i, s);
        if (reserved.count(s)) {
          want_reserved += reserved[s][i];
          ASSERT_LE(t.pages_held(i, s), reserved[s][i]) << "slot " << s << " pool " << i;
        }
      }
      ASSERT_EQ(t.free_pages(i) + held, t.usable_pages(i)) << "pool " << i << " op " << op;
      ASSERT_EQ(t.reserved_pages(i), want_reserved) << "pool " << i << " op " << op;
    }
    replay.apply();
    t.clear_commands();
  }
  replay.expect_mirrors();
  EXPECT_GT(done, 10000);
  EXPECT_GT(refused, 100);  // pools ran full and reservations were refused
}

}  // namespace
}  // namespace graphdecode
