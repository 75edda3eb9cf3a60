#include "memory/prefix_cache.h"

#include <string>

#include "common/error.h"

namespace graphdecode {
namespace {

// splitmix64's finalizer: a cheap, well-mixed 64-bit permutation.
std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

PageKey next_page_key(PageKey prev, std::span<const std::int32_t> page_tokens) {
  std::uint64_t h = mix64(prev ^ 0x7f4a7c159e3779b9ull);
  for (const std::int32_t t : page_tokens) h = mix64(h ^ static_cast<std::uint32_t>(t));
  // The page length is part of the name, so pages of different sizes never meet.
  return mix64(h ^ (static_cast<std::uint64_t>(page_tokens.size()) << 32));
}

void chain_page_keys(std::span<const std::int32_t> tokens, std::int32_t page_size,
                     std::uint64_t seed, std::span<PageKey> out) {
  GD_REQUIRE(page_size >= 1, "page_size", page_size, "must be positive");
  GD_REQUIRE(out.size() * static_cast<std::size_t>(page_size) <= tokens.size(), "pages", out.size(),
             "more full pages than " + std::to_string(tokens.size()) + " tokens hold");
  PageKey k = seed;
  for (std::size_t j = 0; j < out.size(); ++j) {
    k = next_page_key(k, tokens.subspan(j * static_cast<std::size_t>(page_size),
                                        static_cast<std::size_t>(page_size)));
    out[j] = k;
  }
}

PrefixCache::PrefixCache(PageAllocator& allocator, std::uint64_t seed)
    : alloc_(allocator), seed_(seed) {
  const auto n = static_cast<std::size_t>(alloc_.capacity());
  refs_.assign(n, 0);
  key_.assign(n, 0);
  cached_.assign(n, 0);
  prev_.assign(n, kNoPage);
  next_.assign(n, kNoPage);
  scratch_.assign(n, 0);
  std::size_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  table_.assign(cap, kNoPage);
  mask_ = cap - 1;
}

void PrefixCache::require_page(std::int32_t page, const char* what) const {
  GD_REQUIRE(page >= 0 && page < alloc_.capacity(), "page", page,
             std::string(what) + ": page id is not from this pool");
}

std::int32_t PrefixCache::refs(std::int32_t page) const {
  require_page(page, "refs");
  return refs_[static_cast<std::size_t>(page)];
}

bool PrefixCache::is_cached(std::int32_t page) const {
  require_page(page, "is_cached");
  return cached_[static_cast<std::size_t>(page)] != 0;
}

PrefixCacheStats PrefixCache::stats() const noexcept {
  return PrefixCacheStats{cached_pages_, lru_size_, evictions_, published_};
}

// ---- LRU ---------------------------------------------------------------------------------------

void PrefixCache::lru_push_back(std::int32_t page) {
  const auto p = static_cast<std::size_t>(page);
  prev_[p] = lru_tail_;
  next_[p] = kNoPage;
  if (lru_tail_ != kNoPage) {
    next_[static_cast<std::size_t>(lru_tail_)] = page;
  } else {
    lru_head_ = page;
  }
  lru_tail_ = page;
  ++lru_size_;
}

void PrefixCache::lru_remove(std::int32_t page) {
  const auto p = static_cast<std::size_t>(page);
  if (prev_[p] != kNoPage) {
    next_[static_cast<std::size_t>(prev_[p])] = next_[p];
  } else {
    lru_head_ = next_[p];
  }
  if (next_[p] != kNoPage) {
    prev_[static_cast<std::size_t>(next_[p])] = prev_[p];
  } else {
    lru_tail_ = prev_[p];
  }
  prev_[p] = next_[p] = kNoPage;
  --lru_size_;
}

std::int32_t PrefixCache::evict_one() {
  const std::int32_t page = lru_head_;
  const auto p = static_cast<std::size_t>(page);
  lru_remove(page);
  table_erase(key_[p]);
  cached_[p] = 0;
  --cached_pages_;
  ++evictions_;
  const std::int32_t one[] = {page};
  alloc_.release(one);
  return page;
}

// ---- key table ---------------------------------------------------------------------------------

std::size_t PrefixCache::slot_of(PageKey key) const noexcept {
  return static_cast<std::size_t>(mix64(key)) & mask_;
}

void PrefixCache::table_insert(PageKey key, std::int32_t page) {
  // At most capacity() pages are cached and the table has >= 2x slots: a free slot exists.
  std::size_t i = slot_of(key);
  while (table_[i] != kNoPage) i = (i + 1) & mask_;
  table_[i] = page;
}

PageKey PrefixCache::pool_key(PageKey chain) const noexcept {
  return mix64(chain ^ mix64(seed_));
}

std::int32_t PrefixCache::find(PageKey key) const {
  return find_pool_key(pool_key(key));
}

std::int32_t PrefixCache::find_pool_key(PageKey key) const {
  for (std::size_t i = slot_of(key);; i = (i + 1) & mask_) {
    const std::int32_t page = table_[i];
    if (page == kNoPage) return kNoPage;
    if (key_[static_cast<std::size_t>(page)] == key) return page;
  }
}

void PrefixCache::table_erase(PageKey key) {
  std::size_t i = slot_of(key);
  while (key_[static_cast<std::size_t>(table_[i])] != key) i = (i + 1) & mask_;
  // Backward-shift deletion: later entries of the probe run move up so lookups need no tombstones.
  for (std::size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
    const std::int32_t page = table_[j];
    if (page == kNoPage) break;
    const std::size_t home = slot_of(key_[static_cast<std::size_t>(page)]);
    // Move the entry at j into the hole at i when its home is not in (i, j] (cyclically).
    const bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (stays) continue;
    table_[i] = page;
    i = j;
  }
  table_[i] = kNoPage;
}

// ---- references --------------------------------------------------------------------------------

void PrefixCache::allocate_into(std::span<std::int32_t> out) {
  const auto n = static_cast<std::int64_t>(out.size());
  GD_REQUIRE(n <= available(), "pages_requested", n,
             "KV pool exhausted: only " + std::to_string(alloc_.free_pages()) + " free and " +
                 std::to_string(lru_size_) + " cached unreferenced pages of " +
                 std::to_string(alloc_.capacity()));
  for (auto& p : out) {
    if (alloc_.free_pages() == 0) evict_one();
    alloc_.allocate_into({&p, 1});
    refs_[static_cast<std::size_t>(p)] = 1;
  }
}

std::int32_t PrefixCache::reclaimable(std::span<const std::int32_t> pages) const {
  std::int32_t n = 0;
  for (const std::int32_t p : pages) {
    require_page(p, "reclaimable");
    n += refs_[static_cast<std::size_t>(p)] == 1;
  }
  return n;
}

void PrefixCache::release(std::span<const std::int32_t> pages) {
  // Count the drops per page first, so a bad list (a page not held, or dropped more often than it
  // is held) changes nothing.
  std::size_t checked = 0;
  auto undo = [&] {
    for (std::size_t i = 0; i < checked; ++i) scratch_[static_cast<std::size_t>(pages[i])] = 0;
  };
  for (; checked < pages.size(); ++checked) {
    const std::int32_t p = pages[checked];
    if (p < 0 || p >= alloc_.capacity()) {
      undo();
      GD_REQUIRE(false, "page", p, "page id is not from this pool");
    }
    const auto i = static_cast<std::size_t>(p);
    if (++scratch_[i] > refs_[i]) {
      ++checked;
      undo();
      GD_REQUIRE(false, "page", p, "page is not held (double release?)");
    }
  }
  undo();
  for (const std::int32_t p : pages) {
    const auto i = static_cast<std::size_t>(p);
    if (refs_[i] == 1 && skip_every_ > 0 && ++last_drops_ % skip_every_ == 0) continue;  // bug
    if (--refs_[i] > 0) continue;
    if (cached_[i]) {
      lru_push_back(p);
    } else {
      const std::int32_t one[] = {p};
      alloc_.release(one);
    }
  }
}

void PrefixCache::retain(std::int32_t page) {
  require_page(page, "retain");
  const auto i = static_cast<std::size_t>(page);
  GD_REQUIRE(cached_[i] != 0, "page", page, "retain: only a cached page can be shared");
  if (refs_[i]++ == 0) lru_remove(page);
}

void PrefixCache::publish(std::int32_t page, PageKey key) {
  require_page(page, "publish");
  const auto i = static_cast<std::size_t>(page);
  GD_REQUIRE(refs_[i] > 0, "page", page, "publish: the page is not held");
  const PageKey k = pool_key(key);
  if (cached_[i] || find_pool_key(k) != kNoPage) return;
  key_[i] = k;
  cached_[i] = 1;
  table_insert(k, page);
  ++cached_pages_;
  ++published_;
}

}  // namespace graphdecode
