// Host bookkeeping of one pool's requests: which slot each request holds, its token count, the
// pages it owns per logical page, and (sliding window) its first resident logical page.
//
// Pure host code (no CUDA call), so every rule is tested on a CPU-only machine. It keeps its own
// host mirror of the request->page table and, for every change, appends compact commands to a
// TableCommandBatch; the device table (DevicePageTable) only ever changes by applying those
// commands, so device table == host mirror after each applied batch.
//
// Error policy: every operation validates everything (slot, lengths, capacity, pool pages, batch
// room) before it changes anything, and throws graphdecode::Error naming the bad field and value.
// A throwing call leaves this object, the allocator and the batch exactly as they were.
// Nothing here allocates host memory after construction.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "memory/page_allocator.h"
#include "memory/pool_config.h"
#include "memory/prefix_cache.h"
#include "memory/table_commands.h"

namespace graphdecode {

class RequestSlots {
 public:
  // Most commands one operation appends to a batch (a sliding-window extend: evict + append).
  static constexpr std::int32_t kMaxCommandsPerOp = 2;

  // `allocator` hands out this pool's pages; it must be fresh (nothing allocated) with capacity
  // geometry.num_pages, and outlive this object. Its first page (kReservedPage) is taken here for
  // good: the padding slot's row points at it.
  RequestSlots(const PoolGeometry& geometry, PageAllocator& allocator);
  RequestSlots(const RequestSlots&) = delete;
  RequestSlots& operator=(const RequestSlots&) = delete;

  // Routes every page this pool takes and returns through `cache` (reference counts, cached pages
  // kept for later requests), which must wrap this pool's allocator and outlive this object.
  // Only before any request holds a page.
  void attach_cache(PrefixCache& cache);
  const PrefixCache* cache() const noexcept { return cache_; }

  // A free request slot (never kPaddingSlot), with 0 tokens. Error "max_slots" when all are used.
  std::int32_t acquire();

  // What extend(slot, extend_len) would do, without doing it: pages returned left of the window,
  // pages taken, and pages held afterwards. Throws like extend() for a bad slot or length (not
  // for want of pages or batch room: compare `add` with free pages + `evict`).
  struct ExtendPlan {
    std::int32_t evict = 0;       // pages returned (sliding window)
    std::int32_t add = 0;         // pages taken
    std::int32_t held_after = 0;  // pages held afterwards
    // Of the evicted pages, those that become available to others (with a prefix cache, a page
    // another request still holds does not).
    std::int32_t reclaim = 0;
  };
  ExtendPlan plan_extend(std::int32_t slot, std::int32_t extend_len) const;

  // Reserves positions [prefix_len, prefix_len + extend_len) for the step that starts at
  // prefix_len = tokens(slot): allocates the pages they need and, for a sliding-window pool,
  // first returns the pages left of swa_first_resident_page(prefix_len, window_left, page_size).
  // Afterwards tokens(slot) = prefix_len + extend_len (the KV extent of the step).
  // A cross pool takes exactly one extend per request: its encoder length.
  void extend(std::int32_t slot, std::int32_t extend_len, TableCommandBatch& out);

  // Prefix-cache hit: a fresh slot (0 tokens) starts with `tokens` (a whole number of pages)
  // already in the cache, holding logical pages [first_page, tokens / page_size) = `pages`, each
  // a published page of the attached cache, which gains one reference. Sliding pools pass
  // first_page = the window's first page at `tokens` (the pages left of it are not needed).
  void adopt(std::int32_t slot, std::int32_t tokens, std::int32_t first_page,
             std::span<const std::int32_t> pages, TableCommandBatch& out);

  // Speculative rollback: keeps the first `tokens` tokens and returns the pages past them. Not for
  // a cross pool; in a sliding-window pool `tokens` may not reach back into evicted pages.
  void truncate(std::int32_t slot, std::int32_t tokens, TableCommandBatch& out);

  // Returns every page of the request and frees the slot. Error when the slot is not in use.
  void release(std::int32_t slot, TableCommandBatch& out);

  // ---- queries -----------------------------------------------------------------------------
  bool is_active(std::int32_t slot) const noexcept;
  std::int32_t tokens(std::int32_t slot) const;               // KV extent held
  std::int32_t first_resident_page(std::int32_t slot) const;  // 0 unless sliding window
  std::int32_t pages_held(std::int32_t slot) const;           // pages owned right now
  // Host mirror of one row: logical page -> page id, kInvalidPage where none.
  std::span<const std::int32_t> row(std::int32_t slot) const;
  // Host mirror of the whole table, [max_slots][max_pages_per_slot].
  std::span<const std::int32_t> table() const noexcept { return rows_; }
  std::int32_t active_slots() const noexcept {
    return geometry_.max_slots - 1 - static_cast<std::int32_t>(free_slots_.size());
  }
  const PoolGeometry& geometry() const noexcept { return geometry_; }
  const PageAllocator& allocator() const noexcept { return alloc_; }
  // Pages an extend may take now: free pages, plus cached unreferenced pages with a cache.
  std::int32_t available_pages() const noexcept {
    return cache_ ? cache_->available() : alloc_.free_pages();
  }

 private:
  struct SlotState {
    bool active = false;
    std::int32_t tokens = 0;          // KV extent reserved so far
    std::int32_t first_resident = 0;  // logical pages [0, first_resident) were evicted (SWA)
  };
  void require_active(std::int32_t slot, const char* what) const;
  // First resident logical page once a step starts at prefix_len (sliding window: later).
  std::int32_t first_resident_after(std::int32_t slot, std::int32_t prefix_len) const;
  std::span<std::int32_t> row_range(std::int32_t slot, std::int32_t first, std::int32_t end);

  // Pages in and out: through the cache when one is attached, else the allocator.
  void take_pages(std::span<std::int32_t> out);
  void drop_pages(std::span<const std::int32_t> pages);

  PoolGeometry geometry_;
  PageAllocator& alloc_;
  PrefixCache* cache_ = nullptr;
  std::vector<SlotState> slots_;          // [max_slots]
  std::vector<std::int32_t> rows_;        // [max_slots][max_pages_per_slot] host mirror
  std::vector<std::int32_t> free_slots_;  // stack of free slot ids, capacity max_slots
};

}  // namespace graphdecode
