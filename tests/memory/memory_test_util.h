// Shared helpers of the memory/ tests: a fresh-per-run seed, allocator scrambling, state snapshots.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "memory/page_allocator.h"
#include "memory/request_slots.h"

namespace graphdecode::testing {

// One seed per process: GRAPHDECODE_SEED when set (to replay a failure), otherwise fresh. Printed
// once so any failure can be reproduced.
inline std::uint64_t test_seed() {
  static const std::uint64_t seed = [] {
    const char* env = std::getenv("GRAPHDECODE_SEED");
    std::uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::cout << "[ seed     ] GRAPHDECODE_SEED=" << s << "\n";
    return s;
  }();
  return seed;
}

// Leaves the allocator's free list in a random order, so pages come out shuffled and
// non-monotonic. Pages already handed out stay handed out.
inline void scramble_free_pages(PageAllocator& alloc, std::mt19937_64& rng) {
  std::vector<std::int32_t> all = alloc.allocate(alloc.free_pages());
  std::shuffle(all.begin(), all.end(), rng);
  alloc.release(all);
}

// Everything observable about a RequestSlots + its allocator + a batch, for "unchanged" checks.
struct SlotsSnapshot {
  std::vector<std::int32_t> table;
  std::vector<std::int32_t> tokens;  // -1 for an inactive slot
  std::vector<std::uint8_t> allocated;
  std::int32_t free_pages = 0;
  std::int32_t active = 0;
  std::int32_t batch_commands = 0;
  std::int32_t batch_page_ids = 0;

  static SlotsSnapshot take(const RequestSlots& s, const TableCommandBatch& b) {
    SlotsSnapshot snap;
    snap.table.assign(s.table().begin(), s.table().end());
    for (std::int32_t i = 0; i < s.geometry().max_slots; ++i)
      snap.tokens.push_back(s.is_active(i) ? s.tokens(i) : -1);
    for (std::int32_t p = 0; p < s.allocator().capacity(); ++p)
      snap.allocated.push_back(s.allocator().is_allocated(p) ? 1 : 0);
    snap.free_pages = s.allocator().free_pages();
    snap.active = s.active_slots();
    snap.batch_commands = b.size();
    snap.batch_page_ids = b.page_id_count();
    return snap;
  }
  bool operator==(const SlotsSnapshot&) const = default;
};

// Runs `fn`, expects graphdecode::Error whose field is `field`, and returns its message.
template <typename Fn>
std::string expect_error_field(Fn&& fn, const std::string& field) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), field) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected graphdecode::Error naming field '" << field << "'";
  return {};
}

}  // namespace graphdecode::testing
