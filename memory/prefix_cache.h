// Prefix cache of one KV pool: pages shared by content across requests, with reference counts and
// a least-recently-used list of pages no request holds.
//
// A full page of tokens is named by a 64-bit key chained over every token up to its end
// (chain_page_keys, seeded by the pool's identity), so equal keys mean equal prefixes, not just an
// equal page. Every page the pool's requests hold goes through this object once it is attached
// to the pool's RequestSlots:
//   * allocate_into() hands out pages with one reference, taking free pages first and then
//     evicting the least recently released cached page (only unreferenced pages are in the LRU);
//   * release() drops one reference; a page nobody holds goes back to the allocator, or, when it
//     is published (it has a key), to the LRU tail where a later request may find it again;
//   * retain() adds a reference to a found page (taking it off the LRU);
//   * publish() names a full page by its key once its K/V are written.
// So a page is freed only when nobody holds it, and handed out only when nobody holds it: two
// requests hold one page only by retain() of a published page, which they only ever read.
//
// Pages the cache holds unreferenced count as available (free + lru), so admission by reservation
// (memory/kv_ledger.h) is unchanged: a reserved request can always take its pages, evicting cached
// ones. O(1) per page; nothing allocates after construction (the key table is open addressing
// sized at twice the pool). Pure host code, tested on the CPU.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "memory/page_allocator.h"

namespace graphdecode {

using PageKey = std::uint64_t;

// Keys of the first out.size() full pages of `tokens` (page j covers tokens [j*P, (j+1)*P)):
// key_j = mix(key_{j-1}, tokens of page j), key_{-1} = seed. Throws when tokens hold fewer pages.
void chain_page_keys(std::span<const std::int32_t> tokens, std::int32_t page_size,
                     std::uint64_t seed, std::span<PageKey> out);
// One more link: the key of the page after the page named `prev` (seed for page 0).
PageKey next_page_key(PageKey prev, std::span<const std::int32_t> page_tokens);

struct PrefixCacheStats {
  std::int64_t cached_pages = 0;  // pages with a key now (held or in the LRU)
  std::int64_t lru_pages = 0;     // cached pages no request holds (evictable)
  std::int64_t evictions = 0;     // cached pages evicted to make room, ever
  std::int64_t published = 0;     // pages named by a key, ever
};

class PrefixCache {
 public:
  static constexpr std::int32_t kNoPage = -1;

  // `allocator` is the pool's; pages it handed out before (the reserved page) are never touched.
  // `seed` names the pool (model, kind, window): keys of different pools never meet.
  PrefixCache(PageAllocator& allocator, std::uint64_t seed);
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  std::uint64_t seed() const noexcept { return seed_; }
  // Pages an allocation may take now: free pages plus unreferenced cached pages.
  std::int32_t available() const noexcept { return alloc_.free_pages() + lru_size_; }

  // Fills `out` with pages of one reference each, evicting LRU pages as needed; Error (changing
  // nothing) when fewer than out.size() are available.
  void allocate_into(std::span<std::int32_t> out);
  // Drops one reference of each page; all checked first (held, no more drops than references).
  void release(std::span<const std::int32_t> pages);
  // How many of `pages` a release() would make available (their last reference).
  std::int32_t reclaimable(std::span<const std::int32_t> pages) const;
  // One more reference to a page found by find().
  void retain(std::int32_t page);
  // The page published under chain key `key` (this pool's seed is mixed in here), or kNoPage.
  std::int32_t find(PageKey key) const;
  // Names a held page by chain key `key`. No-op when the page already has a key or another page has
  // this key (then this page stays private and is freed when its holders release it).
  void publish(std::int32_t page, PageKey key);

  std::int32_t refs(std::int32_t page) const;
  bool is_cached(std::int32_t page) const;
  PrefixCacheStats stats() const noexcept;

  // Test only: the model checker's planted-bug control. When set, every n-th release() of a
  // page's last reference is skipped (the page leaks, its reference count stays 1).
  void inject_skipped_release_for_test(std::int32_t every_n) noexcept { skip_every_ = every_n; }

 private:
  void require_page(std::int32_t page, const char* what) const;
  void lru_push_back(std::int32_t page);
  void lru_remove(std::int32_t page);
  std::int32_t evict_one();  // the LRU head, taken off the key table and freed; returns it
  // Open-addressing table of key -> page (linear probing, backward-shift delete).
  PageKey pool_key(PageKey chain) const noexcept;
  std::int32_t find_pool_key(PageKey key) const;
  std::size_t slot_of(PageKey key) const noexcept;
  void table_insert(PageKey key, std::int32_t page);
  void table_erase(PageKey key);

  PageAllocator& alloc_;
  std::uint64_t seed_;
  std::vector<std::int32_t> refs_;    // [pages] holders
  std::vector<PageKey> key_;          // [pages] the page's key where cached_
  std::vector<std::uint8_t> cached_;  // [pages] 1 = published (in the table)
  std::vector<std::int32_t> prev_;    // [pages] LRU links (kNoPage = none)
  std::vector<std::int32_t> next_;    // [pages]
  std::int32_t lru_head_ = kNoPage;   // least recently released
  std::int32_t lru_tail_ = kNoPage;
  std::int32_t lru_size_ = 0;
  std::vector<std::int32_t> table_;    // [2^k >= 2 * pages] page id or kNoPage
  std::vector<std::int32_t> scratch_;  // [pages] one release()'s count per page, sized once
  std::size_t mask_ = 0;
  std::int64_t cached_pages_ = 0, evictions_ = 0, published_ = 0;
  std::int32_t skip_every_ = 0, last_drops_ = 0;
};

}  // namespace graphdecode
