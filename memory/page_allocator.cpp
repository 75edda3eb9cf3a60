#include "memory/page_allocator.h"

#include <string>

#include "common/error.h"

namespace graphdecode {

PageAllocator::PageAllocator(std::int32_t num_pages) {
  GD_REQUIRE(num_pages > 0, "num_pages", num_pages, "a page allocator needs at least one page");
  owned_.assign(static_cast<std::size_t>(num_pages), 0);
  free_.reserve(static_cast<std::size_t>(num_pages));
  // Stack order hands out low ids first, which keeps small tests readable.
  for (std::int32_t p = num_pages - 1; p >= 0; --p) free_.push_back(p);
}

std::optional<std::vector<std::int32_t>> PageAllocator::try_allocate(std::int32_t n) {
  if (n < 0 || n > free_pages()) return std::nullopt;
  std::vector<std::int32_t> out(static_cast<std::size_t>(n));
  for (auto& p : out) {
    p = free_.back();
    free_.pop_back();
    owned_[static_cast<std::size_t>(p)] = 1;
  }
  return out;
}

std::vector<std::int32_t> PageAllocator::allocate(std::int32_t n) {
  GD_REQUIRE(n >= 0, "pages_requested", n, "cannot allocate a negative number of pages");
  auto pages = try_allocate(n);
  GD_REQUIRE(pages.has_value(), "pages_requested", n,
             "KV pool exhausted: only " + std::to_string(free_pages()) + " of " +
                 std::to_string(capacity()) + " pages free");
  return std::move(*pages);
}

void PageAllocator::allocate_into(std::span<std::int32_t> out) {
  const auto n = static_cast<std::int64_t>(out.size());
  GD_REQUIRE(n <= free_pages(), "pages_requested", n,
             "KV pool exhausted: only " + std::to_string(free_pages()) + " of " +
                 std::to_string(capacity()) + " pages free");
  for (auto& p : out) {
    p = free_.back();
    free_.pop_back();
    owned_[static_cast<std::size_t>(p)] = 1;
  }
}

void PageAllocator::release(std::span<const std::int32_t> pages) {
  // Validate everything before changing anything; mark as we go to catch repeats in the list.
  std::size_t checked = 0;
  auto undo = [&] {
    for (std::size_t i = 0; i < checked; ++i) owned_[static_cast<std::size_t>(pages[i])] = 1;
  };
  for (; checked < pages.size(); ++checked) {
    const std::int32_t p = pages[checked];
    if (p < 0 || p >= capacity()) {
      undo();
      GD_REQUIRE(false, "page", p, "page id is not from this pool");
    }
    if (owned_[static_cast<std::size_t>(p)] == 0) {
      undo();
      GD_REQUIRE(false, "page", p, "page is not allocated (double free?)");
    }
    owned_[static_cast<std::size_t>(p)] = 0;
  }
  // Last page first, so the next allocation of as many pages hands them out in the order they
  // were held (a request's pages ascending rather than descending: ~0.5% faster attention at B=8,
  // bench/NOTES.md 71).
  for (auto it = pages.rbegin(); it != pages.rend(); ++it) free_.push_back(*it);
}

}  // namespace graphdecode
