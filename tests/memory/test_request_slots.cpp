// RequestSlots (host bookkeeping, no GPU): commands, errors that change nothing, and 100k random
// operations per pool kind against an exact model of ownership and of the table.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <random>
#include <vector>

#include "common/request_rules.h"
#include "memory/request_slots.h"
#include "memory/table_commands.h"
#include "memory_test_util.h"

namespace graphdecode {
namespace {

using testing::expect_error_field;
using testing::SlotsSnapshot;

PoolGeometry geom(AttentionKind kind, std::int32_t page, std::int32_t pages, std::int32_t slots,
                  std::int32_t row, std::int32_t window_left = -1) {
  PoolGeometry g;
  g.kind = kind;
  g.page_size = page;
  g.num_pages = pages;
  g.max_slots = slots;
  g.max_pages_per_slot = row;
  g.window_left = window_left;
  return g;
}

TEST(RequestSlots, ReservesPadding) {
  PageAllocator alloc(10);
  RequestSlots s(geom(AttentionKind::kFull, 16, 10, 4, 5), alloc);
  EXPECT_TRUE(alloc.is_allocated(kReservedPage));
  EXPECT_EQ(alloc.free_pages(), 9);
  for (std::int32_t e : s.row(kPaddingSlot)) EXPECT_EQ(e, kReservedPage);
  for (std::int32_t slot = 1; slot < 4; ++slot)
    for (std::int32_t e : s.row(slot)) EXPECT_EQ(e, kInvalidPage);
  EXPECT_EQ(s.acquire(), 1);
  EXPECT_EQ(s.acquire(), 2);
  EXPECT_EQ(s.acquire(), 3);
  EXPECT_FALSE(s.is_active(kPaddingSlot));
  expect_error_field([&] { s.acquire(); }, "max_slots");
}

TEST(RequestSlots, NeedsAFreshMatchingAllocator) {
  PageAllocator small(8);
  expect_error_field([&] { RequestSlots s(geom(AttentionKind::kFull, 16, 10, 4, 5), small); },
                     "num_pages");
  PageAllocator used(10);
  used.allocate(1);
  expect_error_field([&] { RequestSlots s(geom(AttentionKind::kFull, 16, 10, 4, 5), used); },
                     "allocator");
}

TEST(RequestSlots, FullPoolCommands) {
  PageAllocator alloc(20);
  RequestSlots s(geom(AttentionKind::kFull, 4, 20, 4, 8), alloc);
  TableCommandBatch b(16, 64);
  const std::int32_t r = s.acquire();
  s.extend(r, 9, b);  // 3 pages: 1 2 3
  ASSERT_EQ(b.size(), 1);
  EXPECT_EQ(b.commands()[0].op, kTableSetPages);
  EXPECT_EQ(b.commands()[0].first_index, 0);
  EXPECT_EQ(b.commands()[0].count, 3);
  EXPECT_EQ(std::vector<std::int32_t>(b.page_ids().begin(), b.page_ids().end()),
            (std::vector<std::int32_t>{1, 2, 3}));
  s.extend(r, 3, b);  // 12 tokens: still 3 pages, no command
  EXPECT_EQ(b.size(), 1);
  s.extend(r, 1, b);  // 13 tokens: page 4
  ASSERT_EQ(b.size(), 2);
  EXPECT_EQ(b.commands()[1].first_index, 3);
  EXPECT_EQ(b.commands()[1].count, 1);
  EXPECT_EQ(b.commands()[1].page_offset, 3);
  s.truncate(r, 5, b);  // keeps 2 pages, returns 2
  ASSERT_EQ(b.size(), 3);
  EXPECT_EQ(b.commands()[2].op, kTableClearPages);
  EXPECT_EQ(b.commands()[2].first_index, 2);
  EXPECT_EQ(b.commands()[2].count, 2);
  EXPECT_EQ(s.tokens(r), 5);
  EXPECT_EQ(s.pages_held(r), 2);
  EXPECT_EQ(alloc.used_pages(), 3);
  s.truncate(r, 5, b);  // no-op
  EXPECT_EQ(b.size(), 3);
  s.release(r, b);
  ASSERT_EQ(b.size(), 4);
  EXPECT_EQ(b.commands()[3].count, 2);
  EXPECT_EQ(alloc.used_pages(), 1);
  EXPECT_FALSE(s.is_active(r));

  std::vector<std::int32_t> table(s.table().size());
  init_page_table_host(s.geometry(), table);
  apply_table_commands_host(b.commands(), b.page_ids(), s.geometry(), table);
  EXPECT_TRUE(std::equal(table.begin(), table.end(), s.table().begin()));
}

TEST(RequestSlots, CrossPoolWritesOnce) {
  PageAllocator alloc(20);
  RequestSlots s(geom(AttentionKind::kCross, 16, 20, 4, 8), alloc);
  TableCommandBatch b(16, 64);
  const std::int32_t a = s.acquire(), c = s.acquire();
  s.extend(a, 40, b);  // encoder lengths differ per request
  s.extend(c, 100, b);
  EXPECT_EQ(s.pages_held(a), 3);
  EXPECT_EQ(s.pages_held(c), 7);
  const auto before = SlotsSnapshot::take(s, b);
  expect_error_field([&] { s.extend(a, 1, b); }, "slot");
  expect_error_field([&] { s.truncate(c, 10, b); }, "kind");
  EXPECT_EQ(SlotsSnapshot::take(s, b), before);
  s.release(a, b);
  s.release(c, b);
  EXPECT_EQ(alloc.used_pages(), 1);
}

// Every bad input throws naming its field, and leaves slots, allocator and batch as they were.
TEST(RequestSlots, BadInputsNameFieldAndChangeNothing) {
  PageAllocator alloc(10);  // 9 usable pages of 4 tokens; rows of 8 pages = 32 tokens
  RequestSlots s(geom(AttentionKind::kFull, 4, 10, 4, 8), alloc);
  TableCommandBatch b(8, 32);
  const std::int32_t r = s.acquire(), q = s.acquire();
  s.extend(r, 10, b);  // 3 pages
  s.extend(q, 4, b);   // 1 page; 5 pages free
  const auto before = SlotsSnapshot::take(s, b);
  auto unchanged = [&] { EXPECT_EQ(SlotsSnapshot::take(s, b), before); };

  expect_error_field([&] { s.extend(q, 24, b); }, "pages_requested");  // 7 pages: 6 more > 5
  unchanged();
  expect_error_field([&] { s.extend(q, 29, b); }, "kv_extent");  // 33 tokens > 8 pages * 4
  unchanged();
  expect_error_field([&] { s.extend(r, -1, b); }, "extend_len");
  expect_error_field([&] { s.extend(kPaddingSlot, 1, b); }, "slot");
  expect_error_field([&] { s.extend(4, 1, b); }, "slot");       // unknown slot id
  expect_error_field([&] { s.extend(-3, 1, b); }, "slot");      // unknown slot id
  expect_error_field([&] { s.extend(3, 1, b); }, "slot");       // never acquired
  expect_error_field([&] { s.truncate(r, 11, b); }, "tokens");  // more than held
  expect_error_field([&] { s.truncate(r, -1, b); }, "tokens");
  expect_error_field([&] { s.release(3, b); }, "slot");  // free slot
  expect_error_field([&] { s.release(kPaddingSlot, b); }, "slot");
  unchanged();

  TableCommandBatch tiny(1, 1);
  tiny.push_clear(r, 0, 0);  // full now
  const auto before_tiny = SlotsSnapshot::take(s, tiny);
  expect_error_field([&] { s.extend(r, 3, tiny); }, "commands");  // needs a 4th page
  expect_error_field([&] { s.release(r, tiny); }, "commands");
  expect_error_field([&] { s.truncate(r, 1, tiny); }, "commands");
  EXPECT_EQ(SlotsSnapshot::take(s, tiny), before_tiny);
  TableCommandBatch no_ids(4, 1);
  const auto before_ids = SlotsSnapshot::take(s, no_ids);
  expect_error_field([&] { s.extend(q, 8, no_ids); }, "page_ids");  // needs 2 page ids
  EXPECT_EQ(SlotsSnapshot::take(s, no_ids), before_ids);
  unchanged();

  s.release(q, b);
  expect_error_field([&] { s.release(q, b); }, "slot");  // released twice
  expect_error_field([&] { s.tokens(q); }, "slot");
}

TEST(RequestSlots, WindowLeftOutOfRange) {
  PageAllocator a1(10), a2(10), a3(10), a4(10);
  expect_error_field([&] { RequestSlots s(geom(AttentionKind::kSliding, 4, 10, 4, 6, -1), a1); },
                     "window_left");
  expect_error_field([&] { RequestSlots s(geom(AttentionKind::kSliding, 4, 10, 4, 6, 24), a2); },
                     "window_left");  // >= 6 pages * 4 tokens
  expect_error_field([&] { RequestSlots s(geom(AttentionKind::kFull, 4, 10, 4, 6, 3), a3); },
                     "window_left");
  EXPECT_EQ(a1.used_pages() + a2.used_pages() + a3.used_pages(), 0);
  RequestSlots ok(geom(AttentionKind::kSliding, 4, 10, 4, 6, 23), a4);
}

// ---- exact model ---------------------------------------------------------------------------

struct ModelSlot {
  bool active = false;
  std::int32_t tokens = 0;
  std::int32_t first = 0;           // first resident logical page
  std::vector<std::int32_t> pages;  // logical page -> page id (kInvalidPage when none)
};

void run_model(const PoolGeometry& g, std::uint64_t seed, int ops) {
  SCOPED_TRACE("kind " + std::string(attention_kind_name(g.kind)) + " page " +
               std::to_string(g.page_size) + " window_left " + std::to_string(g.window_left) +
               " seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  PageAllocator alloc(g.num_pages);
  RequestSlots s(g, alloc);
  testing::scramble_free_pages(alloc, rng);
  const std::int32_t P = g.page_size;
  const std::int32_t max_new = 3 * P + 2;
  std::vector<ModelSlot> m(static_cast<std::size_t>(g.max_slots));
  for (auto& x : m) x.pages.assign(static_cast<std::size_t>(g.max_pages_per_slot), kInvalidPage);
  std::vector<std::int32_t> owner(static_cast<std::size_t>(g.num_pages), -1);  // page -> slot
  owner[kReservedPage] = kPaddingSlot;
  std::int32_t model_used = 1;
  std::vector<std::int32_t> dev_table(s.table().size());  // commands applied on the host
  init_page_table_host(g, dev_table);
  TableCommandBatch batch(8 * RequestSlots::kMaxCommandsPerOp, 8 * g.max_pages_per_slot);

  auto free_model_range = [&](ModelSlot& x, std::int32_t from, std::int32_t to) {
    for (std::int32_t i = from; i < to; ++i) {
      owner[x.pages[i]] = -1;
      x.pages[i] = kInvalidPage;
      --model_used;
    }
  };
  int ops_in_batch = 0;
  int ok_extend = 0, ok_truncate = 0, ok_release = 0, failed = 0, evictions = 0;
  for (int op = 0; op < ops; ++op) {
    const auto before = SlotsSnapshot::take(s, batch);
    const int kind = static_cast<int>(rng() % 10);
    auto slot = static_cast<std::int32_t>(rng() % (g.max_slots + 1)) - (rng() % 16 == 0 ? 1 : 0);
    bool expect_fail = slot <= 0 || slot >= g.max_slots || !m[slot].active;
    if (kind == 0) {  // acquire
      const bool none = s.active_slots() == g.max_slots - 1;
      expect_fail = none;
      if (none) {
        EXPECT_THROW(s.acquire(), Error);
      } else {
        const std::int32_t got = s.acquire();
        ASSERT_TRUE(got > 0 && got < g.max_slots && !m[got].active) << got;
        m[got].active = true;
        m[got].tokens = 0;
        m[got].first = 0;
      }
    } else if (kind <= 5) {  // extend: decode, verify, or a long prefill
      const auto len =
          static_cast<std::int32_t>(rng() % 4 == 0 ? rng() % (3 * P * 4) : rng() % max_new);
      if (!expect_fail) {
        ModelSlot& x = m[slot];
        const std::int64_t extent = static_cast<std::int64_t>(x.tokens) + len;
        std::int32_t first = x.first;
        if (g.kind == AttentionKind::kSliding) {
          const std::int32_t key = std::max(0, x.tokens - g.window_left);  // model of the rule
          first = std::max(first, key / P);
        }
        const std::int32_t held = (x.tokens + P - 1) / P;
        const std::int64_t need = (extent + P - 1) / P;
        expect_fail = (g.kind == AttentionKind::kCross && x.tokens > 0) ||
                      extent > g.max_tokens_per_slot() ||
                      need - held > (g.num_pages - model_used) + (first - x.first);
        if (!expect_fail) {
          s.extend(slot, len, batch);
          ++ok_extend;
          evictions += first > x.first;
          free_model_range(x, x.first, first);
          for (std::int32_t i = held; i < need; ++i) {
            const std::int32_t p = s.row(slot)[i];
            ASSERT_TRUE(p > kReservedPage && p < g.num_pages) << p;
            ASSERT_EQ(owner[p], -1) << "page " << p << " owned twice";
            owner[p] = slot;
            x.pages[i] = p;
            ++model_used;
          }
          x.tokens = static_cast<std::int32_t>(extent);
          x.first = first;
          if (g.kind == AttentionKind::kSliding && len <= max_new) {
            ASSERT_LE(s.pages_held(slot), swa_pages_per_request(g.window_left, max_new, P));
          }
        }
      }
      if (expect_fail) EXPECT_THROW(s.extend(slot, len, batch), Error);
    } else if (kind <= 7) {  // truncate (speculative rollback), sometimes past what is held
      const std::int32_t held_tokens = expect_fail ? 3 : m[slot].tokens;
      const auto to = static_cast<std::int32_t>(rng() % (held_tokens + 3));
      if (!expect_fail) {
        ModelSlot& x = m[slot];
        const std::int32_t key = g.window_left < 0 ? 0 : std::max(0, to - g.window_left);
        expect_fail = g.kind == AttentionKind::kCross || to > x.tokens ||
                      (g.kind == AttentionKind::kSliding && key / P < x.first);
        if (!expect_fail) {
          s.truncate(slot, to, batch);
          ++ok_truncate;
          free_model_range(x, (to + P - 1) / P, (x.tokens + P - 1) / P);
          x.tokens = to;
        }
      }
      if (expect_fail) EXPECT_THROW(s.truncate(slot, to, batch), Error);
    } else {  // release
      if (!expect_fail) {
        ModelSlot& x = m[slot];
        s.release(slot, batch);
        ++ok_release;
        free_model_range(x, x.first, (x.tokens + P - 1) / P);
        x = ModelSlot{false, 0, 0, x.pages};
      } else {
        EXPECT_THROW(s.release(slot, batch), Error);
      }
    }
    failed += expect_fail;
    if (expect_fail) ASSERT_EQ(SlotsSnapshot::take(s, batch), before) << "op " << op;
    ASSERT_EQ(alloc.used_pages(), model_used) << "op " << op;
    for (std::int32_t i = 1; i < g.max_slots; ++i) {
      ASSERT_EQ(s.is_active(i), m[i].active) << "op " << op;
      if (m[i].active) ASSERT_EQ(s.tokens(i), m[i].tokens) << "op " << op;
      ASSERT_TRUE(std::equal(m[i].pages.begin(), m[i].pages.end(), s.row(i).begin()))
          << "slot " << i << " op " << op;
    }
    // Batches of 1..8 operations: applying the commands reproduces the host mirror.
    if (++ops_in_batch == 8 || rng() % 4 == 0) {
      apply_table_commands_host(batch.commands(), batch.page_ids(), g, dev_table);
      ASSERT_TRUE(std::equal(dev_table.begin(), dev_table.end(), s.table().begin())) << op;
      batch.clear();
      ops_in_batch = 0;
    }
    if (op % 97 == 0) {
      for (std::int32_t p = 0; p < g.num_pages; ++p)
        ASSERT_EQ(alloc.is_allocated(p), owner[p] != -1) << "page " << p << " op " << op;
    }
  }
  std::cout << "[ model    ] " << attention_kind_name(g.kind) << " page " << P << " wl "
            << g.window_left << ": extend " << ok_extend << " (evicting " << evictions
            << "), truncate " << ok_truncate << ", release " << ok_release << ", refused " << failed
            << "\n";
  EXPECT_GT(ok_extend, ops / 20);
  EXPECT_GT(ok_release, ops / 50);
  EXPECT_GT(failed, ops / 50);
  if (g.kind != AttentionKind::kCross) EXPECT_GT(ok_truncate, ops / 50);
  if (g.kind == AttentionKind::kSliding) EXPECT_GT(evictions, ops / 100);
  for (std::int32_t i = 1; i < g.max_slots; ++i)
    if (s.is_active(i)) {
      batch.clear();
      s.release(i, batch);
    }
  EXPECT_EQ(alloc.used_pages(), 1);  // no leak: only the reserved page remains
}

TEST(RequestSlots, ExactModelFull100k) {
  run_model(geom(AttentionKind::kFull, 16, 60, 7, 12), testing::test_seed(), 100000);
}
TEST(RequestSlots, ExactModelFullPage1) {
  run_model(geom(AttentionKind::kFull, 1, 300, 5, 160), testing::test_seed() + 1, 30000);
}
TEST(RequestSlots, ExactModelSlidingWindow100k) {
  for (std::int32_t wl : {0, 15, 16, 53})
    run_model(geom(AttentionKind::kSliding, 16, 40, 7, 40, wl), testing::test_seed() + 2 + wl,
              100000);
}
TEST(RequestSlots, ExactModelSlidingWindowPage1) {
  run_model(geom(AttentionKind::kSliding, 1, 120, 5, 300, 7), testing::test_seed() + 3, 30000);
}
TEST(RequestSlots, ExactModelCross) {
  run_model(geom(AttentionKind::kCross, 16, 60, 7, 12), testing::test_seed() + 4, 50000);
}

}  // namespace
}  // namespace graphdecode
