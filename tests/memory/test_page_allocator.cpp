// PageAllocator against an exact model: ownership is a set, and every call either does exactly
// what the model says or throws and changes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "memory/page_allocator.h"
#include "memory_test_util.h"

namespace graphdecode {
namespace {

using testing::expect_error_field;

TEST(PageAllocator, HandsOutLowIdsFirstAndCounts) {
  PageAllocator a(5);
  EXPECT_EQ(a.capacity(), 5);
  EXPECT_EQ(a.allocate(2), (std::vector<std::int32_t>{0, 1}));
  EXPECT_EQ(a.free_pages(), 3);
  EXPECT_EQ(a.used_pages(), 2);
  EXPECT_TRUE(a.is_allocated(1));
  EXPECT_FALSE(a.is_allocated(2));
  EXPECT_FALSE(a.is_allocated(-1));
  EXPECT_FALSE(a.is_allocated(5));
  EXPECT_TRUE(a.allocate(0).empty());
  std::int32_t two[2];
  a.allocate_into(two);
  EXPECT_EQ(two[0], 2);
  EXPECT_EQ(two[1], 3);
  EXPECT_EQ(a.free_pages(), 1);
}

// A released run comes back in its order (a request's pages ascending, not reversed), also when
// other pages were released before it and for a released tail (a speculative rollback).
TEST(PageAllocator, ReleasedPagesComeBackInTheirOrder) {
  PageAllocator a(16);
  const auto held = a.allocate(6);   // 0..5
  const auto other = a.allocate(3);  // 6..8
  a.release(other);
  a.release(held);
  EXPECT_EQ(a.allocate(6), held);
  EXPECT_EQ(a.allocate(3), other);
  const auto run = a.allocate(4);                            // 9..12
  a.release(std::span<const std::int32_t>(run).subspan(2));  // rollback of the tail: 11, 12
  EXPECT_EQ(a.allocate(2), (std::vector<std::int32_t>{11, 12}));
}

TEST(PageAllocator, BadConstructionNamesField) {
  expect_error_field([] { PageAllocator a(0); }, "num_pages");
}

TEST(PageAllocator, ExhaustionThrowsAndChangesNothing) {
  PageAllocator a(4);
  auto held = a.allocate(3);
  const std::string msg = expect_error_field([&] { a.allocate(2); }, "pages_requested");
  EXPECT_NE(msg.find("= 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("only 1 of 4"), std::string::npos) << msg;
  std::int32_t out[2] = {-7, -7};
  expect_error_field([&] { a.allocate_into(out); }, "pages_requested");
  EXPECT_EQ(out[0], -7);
  EXPECT_FALSE(a.try_allocate(2).has_value());
  expect_error_field([&] { a.allocate(-1); }, "pages_requested");
  EXPECT_EQ(a.free_pages(), 1);
  for (std::int32_t p : held) EXPECT_TRUE(a.is_allocated(p));
}

TEST(PageAllocator, BadReleaseThrowsAndFreesNothing) {
  PageAllocator a(6);
  auto held = a.allocate(4);  // 0 1 2 3
  const std::vector<std::int32_t> foreign = {1, 9};
  expect_error_field([&] { a.release(foreign); }, "page");
  const std::vector<std::int32_t> negative = {0, -1};
  expect_error_field([&] { a.release(negative); }, "page");
  const std::vector<std::int32_t> not_held = {2, 5};
  expect_error_field([&] { a.release(not_held); }, "page");
  const std::vector<std::int32_t> repeated = {3, 0, 3};
  expect_error_field([&] { a.release(repeated); }, "page");
  EXPECT_EQ(a.free_pages(), 2);
  for (std::int32_t p : held) EXPECT_TRUE(a.is_allocated(p)) << p;
  a.release(held);
  EXPECT_EQ(a.free_pages(), 6);
  expect_error_field([&] { a.release(held); }, "page");  // double free
  EXPECT_EQ(a.free_pages(), 6);
}

// 100k random operations: allocate (also past exhaustion), try_allocate, allocate_into, release of
// a random subset, truncation of a held list (release of its tail), and bad releases (foreign id,
// double free, repeats). After each: counts match the model; periodically the full ownership map.
TEST(PageAllocator, ExactModel100kOps) {
  const std::uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr std::int32_t kPages = 257;
  PageAllocator a(kPages);
  std::vector<std::uint8_t> owned(kPages, 0);       // the model
  std::vector<std::vector<std::int32_t>> lists(8);  // holders of pages
  std::int32_t model_used = 0;
  auto take = [&](const std::vector<std::int32_t>& got, std::int32_t n, std::size_t into) {
    ASSERT_EQ(static_cast<std::int32_t>(got.size()), n);
    for (std::int32_t p : got) {
      ASSERT_TRUE(p >= 0 && p < kPages) << p;
      ASSERT_EQ(owned[p], 0) << "page " << p << " handed out twice";
      owned[p] = 1;
      ++model_used;
      lists[into].push_back(p);
    }
  };
  auto drop = [&](std::size_t from, std::size_t keep) {
    std::vector<std::int32_t> tail(lists[from].begin() + keep, lists[from].end());
    a.release(tail);
    for (std::int32_t p : tail) owned[p] = 0;
    model_used -= static_cast<std::int32_t>(tail.size());
    lists[from].resize(keep);
  };
  for (int op = 0; op < 100000; ++op) {
    const std::size_t li = rng() % lists.size();
    const int kind = static_cast<int>(rng() % 7);
    const std::int32_t free_now = kPages - model_used;
    if (kind == 0 || kind == 1 || kind == 2) {
      const auto n = static_cast<std::int32_t>(rng() % 12);
      if (n > free_now) {
        if (kind == 0) {
          EXPECT_THROW(a.allocate(n), Error);
        } else if (kind == 1) {
          EXPECT_FALSE(a.try_allocate(n).has_value());
        } else {
          std::vector<std::int32_t> out(static_cast<std::size_t>(n));
          EXPECT_THROW(a.allocate_into(out), Error);
        }
      } else if (kind == 0) {
        take(a.allocate(n), n, li);
      } else if (kind == 1) {
        take(*a.try_allocate(n), n, li);
      } else {
        std::vector<std::int32_t> out(static_cast<std::size_t>(n));
        a.allocate_into(out);
        take(out, n, li);
      }
    } else if (kind == 3) {  // release a random subset, shuffled
      auto& l = lists[li];
      std::shuffle(l.begin(), l.end(), rng);
      drop(li, l.empty() ? 0 : rng() % (l.size() + 1));
    } else if (kind == 4) {  // truncate: release the tail of a list, in list order
      auto& l = lists[li];
      drop(li, l.empty() ? 0 : rng() % (l.size() + 1));
    } else {  // a bad release: must throw and free nothing
      std::vector<std::int32_t> bad = lists[li];
      const int how = static_cast<int>(rng() % 3);
      if (how == 0) bad.push_back(kPages + static_cast<std::int32_t>(rng() % 5));
      if (how == 1) {
        std::int32_t p = static_cast<std::int32_t>(rng() % kPages);
        if (owned[p]) continue;  // need a free page for a double free
        bad.push_back(p);
      }
      if (how == 2) {
        if (bad.empty()) continue;
        bad.push_back(bad[rng() % bad.size()]);
      }
      std::shuffle(bad.begin(), bad.end(), rng);
      EXPECT_THROW(a.release(bad), Error);
    }
    ASSERT_EQ(a.used_pages(), model_used) << "op " << op;
    ASSERT_EQ(a.free_pages(), kPages - model_used) << "op " << op;
    if (op % 101 == 0) {
      for (std::int32_t p = 0; p < kPages; ++p)
        ASSERT_EQ(a.is_allocated(p), owned[p] != 0) << "page " << p << " op " << op;
    }
  }
  for (std::size_t i = 0; i < lists.size(); ++i) drop(i, 0);
  EXPECT_EQ(a.free_pages(), kPages);  // no leak
}

}  // namespace
}  // namespace graphdecode
