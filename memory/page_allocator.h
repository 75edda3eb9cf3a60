// Host-side page allocator: hands out page ids of one KV pool. O(1) per page, exact accounting.
//
// Every failing call (exhaustion, double free, foreign id) throws graphdecode::Error naming the
// field and value, or returns nothing for the try_ form, and leaves the allocator as it was.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace graphdecode {

class PageAllocator {
 public:
  explicit PageAllocator(std::int32_t num_pages);

  // n pages, or Error("KV pool exhausted") naming the request and what is free.
  std::vector<std::int32_t> allocate(std::int32_t n);
  // n pages, or nothing when fewer than n are free.
  std::optional<std::vector<std::int32_t>> try_allocate(std::int32_t n);
  // Fills `out` with out.size() pages without allocating host memory (the step path uses this),
  // or throws like allocate() and changes nothing.
  void allocate_into(std::span<std::int32_t> out);
  // Returns pages. All ids are checked first (range, owned, no repeats), so a bad list frees none.
  // The next allocation of as many pages returns them in the same order.
  void release(std::span<const std::int32_t> pages);

  std::int32_t capacity() const noexcept { return static_cast<std::int32_t>(owned_.size()); }
  std::int32_t free_pages() const noexcept { return static_cast<std::int32_t>(free_.size()); }
  std::int32_t used_pages() const noexcept { return capacity() - free_pages(); }
  bool is_allocated(std::int32_t page) const noexcept {
    return page >= 0 && page < capacity() && owned_[page] != 0;
  }

 private:
  std::vector<std::int32_t> free_;   // stack of free ids
  std::vector<std::uint8_t> owned_;  // [capacity] 1 = handed out
};

}  // namespace graphdecode
