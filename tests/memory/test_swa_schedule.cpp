// The sliding-window release schedule against hand-computed tables around page boundaries, and
// against a brute-force definition of which keys a step can still see.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "common/request_rules.h"
#include "memory/pool_config.h"
#include "memory/request_slots.h"
#include "memory_test_util.h"

namespace graphdecode {
namespace {

using testing::expect_error_field;

PoolGeometry swa(std::int32_t page, std::int32_t window_left, std::int32_t pages = 64,
                 std::int32_t row = 64) {
  PoolGeometry g;
  g.kind = AttentionKind::kSliding;
  g.page_size = page;
  g.num_pages = pages;
  g.max_slots = 3;
  g.max_pages_per_slot = row;
  g.window_left = window_left;
  return g;
}

// A decode step starting at prefix_len (it adds 1 token): the first resident logical page after
// the step's extend, and how many pages the request then holds. Hand-computed for page size 16:
// first key = max(0, prefix_len - window_left), first page = first key / 16,
// pages held = ceil((prefix_len + 1) / 16) - first page.
struct Row {
  std::int32_t prefix_len, first_page, pages_held;
};

void check_schedule(std::int32_t window_left, const std::vector<Row>& rows) {
  SCOPED_TRACE("window_left " + std::to_string(window_left));
  constexpr std::int32_t P = 16;
  PageAllocator alloc(64);
  RequestSlots s(swa(P, window_left), alloc);
  TableCommandBatch b(4, 64);
  const std::int32_t r = s.acquire();
  std::size_t next = 0;
  for (std::int32_t prefix = 0; prefix <= rows.back().prefix_len; ++prefix) {
    const std::int32_t first_before = prefix == 0 ? 0 : s.first_resident_page(r);
    b.clear();
    s.extend(r, 1, b);
    const std::int32_t first = s.first_resident_page(r);
    // Released entries hold kInvalidPage; resident ones a live page; nothing past the extent.
    const auto row = s.row(r);
    const std::int32_t end = pages_for_tokens(prefix + 1, P);
    for (std::int32_t i = 0; i < s.geometry().max_pages_per_slot; ++i) {
      if (i >= first && i < end) {
        ASSERT_NE(row[i], kInvalidPage) << "prefix " << prefix << " page " << i;
      } else {
        ASSERT_EQ(row[i], kInvalidPage) << "prefix " << prefix << " page " << i;
      }
    }
    ASSERT_EQ(alloc.used_pages(), 1 + s.pages_held(r)) << "released pages went back";
    // The step's commands: a clear of exactly [first_before, first) when something is released.
    if (first > first_before) {
      ASSERT_GE(b.size(), 1);
      EXPECT_EQ(b.commands()[0].op, kTableClearPages);
      EXPECT_EQ(b.commands()[0].first_index, first_before);
      EXPECT_EQ(b.commands()[0].count, first - first_before);
    }
    if (next < rows.size() && rows[next].prefix_len == prefix) {
      EXPECT_EQ(first, rows[next].first_page) << "prefix " << prefix;
      EXPECT_EQ(s.pages_held(r), rows[next].pages_held) << "prefix " << prefix;
      ++next;
    }
  }
  EXPECT_EQ(next, rows.size());
}

TEST(SwaSchedule, WindowLeft0) {  // a query sees only itself
  check_schedule(
      0, {{0, 0, 1}, {15, 0, 1}, {16, 1, 1}, {17, 1, 1}, {31, 1, 1}, {32, 2, 1}, {48, 3, 1}});
}

TEST(SwaSchedule, WindowLeftPageMinus1) {
  check_schedule(15, {{15, 0, 1},
                      {16, 0, 2},
                      {30, 0, 2},
                      {31, 1, 1},
                      {32, 1, 2},
                      {46, 1, 2},
                      {47, 2, 1},
                      {48, 2, 2}});
}

TEST(SwaSchedule, WindowLeftPage) {
  check_schedule(16, {{15, 0, 1},
                      {16, 0, 2},
                      {31, 0, 2},
                      {32, 1, 2},
                      {47, 1, 2},
                      {48, 2, 2},
                      {63, 2, 2},
                      {64, 3, 2}});
}

TEST(SwaSchedule, WindowLeft3PagesPlus5) {
  check_schedule(53, {{52, 0, 4},
                      {53, 0, 4},
                      {63, 0, 4},
                      {64, 0, 5},
                      {68, 0, 5},
                      {69, 1, 4},
                      {84, 1, 5},
                      {85, 2, 4},
                      {100, 2, 5},
                      {101, 3, 4}});
}

// Speculative verify (4 tokens) and rollback around a page boundary, by hand (page 16, wl 15).
TEST(SwaSchedule, VerifyAndRollbackByHand) {
  PageAllocator alloc(64);
  RequestSlots s(swa(16, 15), alloc);
  TableCommandBatch b(16, 64);
  const std::int32_t r = s.acquire();
  s.extend(r, 30, b);  // prefill: tokens 0..29, pages 0 1
  EXPECT_EQ(s.first_resident_page(r), 0);
  EXPECT_EQ(s.pages_held(r), 2);
  s.extend(r, 4, b);  // verify at prefix 30: first key 15 -> page 0 stays; extent 34 -> 3 pages
  EXPECT_EQ(s.first_resident_page(r), 0);
  EXPECT_EQ(s.pages_held(r), 3);
  s.truncate(r, 32, b);  // 2 accepted: extent 32 -> page 2 returned
  EXPECT_EQ(s.pages_held(r), 2);
  EXPECT_EQ(s.row(r)[2], kInvalidPage);
  s.extend(r, 4, b);  // verify at prefix 32: first key 17 -> page 0 released; extent 36
  EXPECT_EQ(s.first_resident_page(r), 1);
  EXPECT_EQ(s.row(r)[0], kInvalidPage);
  EXPECT_EQ(s.pages_held(r), 2);
  s.truncate(r, 31, b);  // a next step at 31 sees from key 16 (page 1): allowed
  EXPECT_EQ(s.tokens(r), 31);
  EXPECT_EQ(s.pages_held(r), 1);
  // A next step at 30 would see key 15 in the released page 0: refused, nothing changes.
  const auto before = testing::SlotsSnapshot::take(s, b);
  expect_error_field([&] { s.truncate(r, 30, b); }, "tokens");
  EXPECT_EQ(testing::SlotsSnapshot::take(s, b), before);
  s.release(r, b);
  EXPECT_EQ(alloc.used_pages(), 1);
}

// Brute force over keys: after the extend of a step [prefix, prefix + n), the resident logical
// pages are exactly from the page of the first key any query of the step can see (key_visible)
// to the last new token's page.
TEST(SwaSchedule, MatchesBruteForceVisibility) {
  for (std::int32_t P : {1, 16, 64}) {
    for (std::int32_t wl : {0, P - 1, P, 3 * P + 5}) {
      if (wl < 0) continue;
      SCOPED_TRACE("page " + std::to_string(P) + " window_left " + std::to_string(wl));
      const std::int32_t row = pages_for_tokens(6 * P + 4 * wl + 64, P) + 2;
      PageAllocator alloc(row + 1);
      RequestSlots s(swa(P, wl, row + 1, row), alloc);
      TableCommandBatch b(4, row);
      const std::int32_t r = s.acquire();
      std::int32_t prefix = 0;
      int steps = 0;
      for (int step = 0; prefix + 5 < s.geometry().max_tokens_per_slot() - 5 && step < 400;
           ++step) {
        const std::int32_t n = 1 + (step * 7) % 5;  // 1..5 new tokens
        b.clear();
        s.extend(r, n, b);
        std::int32_t first_key = prefix + n;
        for (std::int32_t q = prefix; q < prefix + n; ++q)
          for (std::int32_t k = 0; k <= q; ++k)
            if (key_visible(q, k, wl)) first_key = std::min(first_key, k);
        ASSERT_EQ(s.first_resident_page(r), first_key / P) << "prefix " << prefix;
        ASSERT_EQ(s.pages_held(r), pages_for_tokens(prefix + n, P) - first_key / P);
        ASSERT_LE(s.pages_held(r), swa_pages_per_request(wl, 5, P));
        prefix += n;
        ++steps;
      }
      EXPECT_GT(steps, 20);
    }
  }
}

}  // namespace
}  // namespace graphdecode
