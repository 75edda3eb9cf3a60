#include "memory/request_slots.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "common/request_rules.h"

namespace graphdecode {

RequestSlots::RequestSlots(const PoolGeometry& geometry, PageAllocator& allocator)
    : geometry_(geometry), alloc_(allocator) {
  geometry_.validate();
  GD_REQUIRE(alloc_.capacity() == geometry_.num_pages, "num_pages", alloc_.capacity(),
             "allocator capacity differs from the pool's num_pages (" +
                 std::to_string(geometry_.num_pages) + ")");
  GD_REQUIRE(alloc_.used_pages() == 0, "allocator", alloc_.used_pages(),
             "allocator must be fresh: its first page becomes the reserved dummy page");
  std::int32_t reserved = kInvalidPage;
  alloc_.allocate_into({&reserved, 1});
  if (reserved != kReservedPage) {  // a fresh allocator hands out page 0 first; be sure of it
    const std::int32_t back[] = {reserved};
    alloc_.release(back);
    GD_REQUIRE(false, "allocator", reserved, "fresh allocator did not hand out page 0 first");
  }
  slots_.resize(static_cast<std::size_t>(geometry_.max_slots));
  std::vector<std::int32_t> table(static_cast<std::size_t>(geometry_.max_slots) *
                                  static_cast<std::size_t>(geometry_.max_pages_per_slot));
  init_page_table_host(geometry_, table);
  rows_ = std::move(table);
  free_slots_.reserve(static_cast<std::size_t>(geometry_.max_slots));
  // Stack: hands out slot 1 first.
  for (std::int32_t s = geometry_.max_slots - 1; s > kPaddingSlot; --s) free_slots_.push_back(s);
}

void RequestSlots::require_active(std::int32_t slot, const char* what) const {
  GD_REQUIRE(slot != kPaddingSlot, "slot", slot,
             std::string(what) + ": slot 0 is reserved for padding rows");
  GD_REQUIRE(slot > 0 && slot < geometry_.max_slots, "slot", slot,
             std::string(what) +
                 ": unknown slot id (max_slots = " + std::to_string(geometry_.max_slots) + ")");
  GD_REQUIRE(slots_[static_cast<std::size_t>(slot)].active, "slot", slot,
             std::string(what) + ": slot is not in use (never acquired or already released)");
}

std::span<std::int32_t> RequestSlots::row_range(std::int32_t slot, std::int32_t first,
                                                std::int32_t end) {
  const std::size_t base = static_cast<std::size_t>(slot) * geometry_.max_pages_per_slot;
  return {rows_.data() + base + first, static_cast<std::size_t>(end - first)};
}

void RequestSlots::attach_cache(PrefixCache& cache) {
  GD_REQUIRE(alloc_.used_pages() == 1 && active_slots() == 0, "allocator", alloc_.used_pages(),
             "a prefix cache is attached before any request holds a page");
  cache_ = &cache;
}

void RequestSlots::take_pages(std::span<std::int32_t> out) {
  if (cache_) {
    cache_->allocate_into(out);
  } else {
    alloc_.allocate_into(out);
  }
}

void RequestSlots::drop_pages(std::span<const std::int32_t> pages) {
  if (cache_) {
    cache_->release(pages);
  } else {
    alloc_.release(pages);
  }
}

std::int32_t RequestSlots::acquire() {
  GD_REQUIRE(!free_slots_.empty(), "max_slots", geometry_.max_slots,
             "all request slots are in use");
  const std::int32_t slot = free_slots_.back();
  free_slots_.pop_back();
  slots_[static_cast<std::size_t>(slot)] = SlotState{true, 0, 0};
  return slot;
}

RequestSlots::ExtendPlan RequestSlots::plan_extend(std::int32_t slot,
                                                   std::int32_t extend_len) const {
  require_active(slot, "extend");
  const SlotState& s = slots_[static_cast<std::size_t>(slot)];
  GD_REQUIRE(extend_len >= 0, "extend_len", extend_len, "a step cannot add a negative count");
  GD_REQUIRE(geometry_.kind != AttentionKind::kCross || s.tokens == 0, "slot", slot,
             "cross pool: this request already holds its encoder K/V (written once)");
  const std::int32_t P = geometry_.page_size;
  const std::int32_t prefix_len = s.tokens;
  const std::int64_t extent = static_cast<std::int64_t>(prefix_len) + extend_len;
  GD_REQUIRE(extent <= geometry_.max_tokens_per_slot(), "kv_extent", extent,
             "prefix_len + extend_len exceeds the slot capacity max_pages_per_slot * page_size = " +
                 std::to_string(geometry_.max_tokens_per_slot()) + " tokens");
  const std::int32_t held = pages_for_tokens(prefix_len, P);
  const std::int32_t need = pages_for_tokens(static_cast<std::int32_t>(extent), P);
  ExtendPlan plan;
  plan.evict = first_resident_after(slot, prefix_len) - s.first_resident;
  plan.add = need - held;
  plan.held_after = need - (s.first_resident + plan.evict);
  plan.reclaim = plan.evict;
  if (cache_ && plan.evict > 0) {
    const std::size_t base = static_cast<std::size_t>(slot) * geometry_.max_pages_per_slot;
    plan.reclaim = cache_->reclaimable(std::span<const std::int32_t>(
        rows_.data() + base + s.first_resident, static_cast<std::size_t>(plan.evict)));
  }
  return plan;
}

std::int32_t RequestSlots::first_resident_after(std::int32_t slot, std::int32_t prefix_len) const {
  const SlotState& s = slots_[static_cast<std::size_t>(slot)];
  // Sliding window: the step's first query (at prefix_len) is the most restrictive, so pages left
  // of its first visible key are never read again. The result is <= the pages held always (the
  // first visible key is <= prefix_len), so every evicted entry is a page we hold.
  return geometry_.kind == AttentionKind::kSliding
             ? std::max(s.first_resident, swa_first_resident_page(prefix_len, geometry_.window_left,
                                                                  geometry_.page_size))
             : s.first_resident;
}

void RequestSlots::extend(std::int32_t slot, std::int32_t extend_len, TableCommandBatch& out) {
  const ExtendPlan plan = plan_extend(slot, extend_len);
  SlotState& s = slots_[static_cast<std::size_t>(slot)];
  const std::int32_t evict = plan.evict, add = plan.add;
  out.require_room((evict > 0) + (add > 0), add);
  // Evicted pages go back before the new ones are taken, so they count as free here (those no
  // other request holds).
  GD_REQUIRE(add <= available_pages() + plan.reclaim, "pages_requested", add,
             "KV pool exhausted: only " + std::to_string(available_pages() + plan.reclaim) +
                 " of " + std::to_string(alloc_.capacity()) + " pages free");

  // All checks passed: mutate. Page reuse is safe by stream order: the previous step's reads of
  // an evicted page finish before this step's writes to the same page id.
  const std::int32_t held = pages_for_tokens(s.tokens, geometry_.page_size);
  const std::int32_t new_first = s.first_resident + evict;
  if (evict > 0) {
    auto gone = row_range(slot, s.first_resident, new_first);
    drop_pages(gone);
    std::fill(gone.begin(), gone.end(), kInvalidPage);
    out.push_clear(slot, s.first_resident, evict);
  }
  if (add > 0) {
    auto fresh = row_range(slot, held, held + add);
    take_pages(fresh);
    out.push_set(slot, held, fresh);
  }
  s.tokens += extend_len;
  s.first_resident = new_first;
}

void RequestSlots::adopt(std::int32_t slot, std::int32_t tokens, std::int32_t first_page,
                         std::span<const std::int32_t> pages, TableCommandBatch& out) {
  require_active(slot, "adopt");
  SlotState& s = slots_[static_cast<std::size_t>(slot)];
  const std::int32_t P = geometry_.page_size;
  GD_REQUIRE(cache_ != nullptr, "slot", slot, "adopt: the pool has no prefix cache");
  GD_REQUIRE(geometry_.kind != AttentionKind::kCross, "kind", attention_kind_name(geometry_.kind),
             "adopt: a cross pool shares no prefix");
  GD_REQUIRE(s.tokens == 0, "slot", slot, "adopt: the request already holds tokens");
  GD_REQUIRE(tokens >= 0 && tokens % P == 0 && tokens <= geometry_.max_tokens_per_slot(), "tokens",
             tokens, "adopt: a whole number of pages within the slot capacity");
  const std::int32_t n = tokens / P;
  GD_REQUIRE(first_page >= 0 && first_page <= n, "first_page", first_page, "outside [0, pages]");
  GD_REQUIRE(pages.size() == static_cast<std::size_t>(n - first_page), "pages", pages.size(),
             "adopt: one page per logical page [first_page, tokens / page_size)");
  for (const std::int32_t p : pages)
    GD_REQUIRE(p > kReservedPage && p < alloc_.capacity() && cache_->is_cached(p), "page", p,
               "adopt: not a cached page of this pool");
  out.require_room(pages.empty() ? 0 : 1, static_cast<std::int32_t>(pages.size()));
  for (const std::int32_t p : pages) cache_->retain(p);
  if (!pages.empty()) {
    auto dst = row_range(slot, first_page, n);
    std::copy(pages.begin(), pages.end(), dst.begin());
    out.push_set(slot, first_page, pages);
  }
  s.tokens = tokens;
  s.first_resident = first_page;
}

void RequestSlots::truncate(std::int32_t slot, std::int32_t tokens, TableCommandBatch& out) {
  require_active(slot, "truncate");
  SlotState& s = slots_[static_cast<std::size_t>(slot)];
  GD_REQUIRE(geometry_.kind != AttentionKind::kCross, "kind", attention_kind_name(geometry_.kind),
             "a cross (encoder) pool is written once and cannot be truncated");
  GD_REQUIRE(tokens >= 0 && tokens <= s.tokens, "tokens", tokens,
             "truncate needs 0 <= tokens <= tokens held (" + std::to_string(s.tokens) + ")");
  const std::int32_t P = geometry_.page_size;
  if (geometry_.kind == AttentionKind::kSliding) {
    // The next step starts at prefix_len = tokens and reads from its first visible key on; that
    // page must still be resident.
    GD_REQUIRE(swa_first_resident_page(tokens, geometry_.window_left, P) >= s.first_resident,
               "tokens", tokens,
               "sliding window: truncating this far would need pages already returned (first "
               "resident logical page " +
                   std::to_string(s.first_resident) + ")");
  }
  const std::int32_t keep = pages_for_tokens(tokens, P);
  const std::int32_t held = pages_for_tokens(s.tokens, P);
  const std::int32_t drop = held - keep;
  out.require_room(drop > 0, 0);

  if (drop > 0) {
    auto gone = row_range(slot, keep, held);
    drop_pages(gone);
    std::fill(gone.begin(), gone.end(), kInvalidPage);
    out.push_clear(slot, keep, drop);
  }
  s.tokens = tokens;
}

void RequestSlots::release(std::int32_t slot, TableCommandBatch& out) {
  require_active(slot, "release");
  SlotState& s = slots_[static_cast<std::size_t>(slot)];
  const std::int32_t held = pages_for_tokens(s.tokens, geometry_.page_size);
  const std::int32_t n = held - s.first_resident;
  out.require_room(n > 0, 0);

  if (n > 0) {
    auto gone = row_range(slot, s.first_resident, held);
    drop_pages(gone);
    std::fill(gone.begin(), gone.end(), kInvalidPage);
    out.push_clear(slot, s.first_resident, n);
  }
  s = SlotState{};
  free_slots_.push_back(slot);
}

bool RequestSlots::is_active(std::int32_t slot) const noexcept {
  return slot > kPaddingSlot && slot < geometry_.max_slots &&
         slots_[static_cast<std::size_t>(slot)].active;
}

std::int32_t RequestSlots::tokens(std::int32_t slot) const {
  require_active(slot, "tokens");
  return slots_[static_cast<std::size_t>(slot)].tokens;
}

std::int32_t RequestSlots::first_resident_page(std::int32_t slot) const {
  require_active(slot, "first_resident_page");
  return slots_[static_cast<std::size_t>(slot)].first_resident;
}

std::int32_t RequestSlots::pages_held(std::int32_t slot) const {
  require_active(slot, "pages_held");
  const SlotState& s = slots_[static_cast<std::size_t>(slot)];
  return pages_for_tokens(s.tokens, geometry_.page_size) - s.first_resident;
}

std::span<const std::int32_t> RequestSlots::row(std::int32_t slot) const {
  GD_REQUIRE(slot >= 0 && slot < geometry_.max_slots, "slot", slot, "unknown slot id");
  const std::size_t base = static_cast<std::size_t>(slot) * geometry_.max_pages_per_slot;
  return {rows_.data() + base, static_cast<std::size_t>(geometry_.max_pages_per_slot)};
}

}  // namespace graphdecode
