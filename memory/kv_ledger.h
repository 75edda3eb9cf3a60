// The page ledger of a step's KV pools: one host book for every pool of every model in the step
// (a target's full / sliding / cross pools, and a draft's beside them), one slot id per request
// shared by all of them, and the page-table commands of the step being built.
//
// Pure host code (no CUDA), tested on the CPU. Every operation is all-or-nothing across pools:
// every pool's checks (slot, capacity, free pages, reservation, command room) pass before any
// pool changes, and a refusal's Error names the pool and the value.
//
// Admission by reservation: try_admit() reserves, in every pool, the most pages the request can
// ever hold (pages_needed) and admits it only when every pool has that many unreserved pages (in a
// full pool with a prefix cache, counting shared pages once: below).
// Afterwards the request's extends can never meet an exhausted pool; a request that cannot be
// admitted waits. This is the scheduler's one count of free memory: a model whose layers all use
// a sliding window is admitted by what its window pool really holds. Slots taken by acquire()
// reserve nothing and take pages first come, first served (tests and the replay fuzzer drive the
// pools directly); mixing both gives up the admission guarantee.
//
// Prefix cache (pools with LedgerPool::prefix_cache; memory/prefix_cache.h): every page of a
// caching pool is reference counted; match_prefix / adopt_prefix start an admitted request on
// pages earlier requests published (all pools or none), publish_prefix names a request's full,
// final pages. Cached pages no request holds count as free and are evicted on demand.
//
// Admission in a full pool with a prefix cache counts shared pages once: the request fits when
//   sum over admitted requests (reservation - pages held) + (its need - its hit)
//     <= free pages - the hit's pages no request holds yet.
// Every allocation then still finds a page: an extend moves one page from the right side to the
// left's held count, a release or a rollback gives back at least what it takes off the left (a
// rollback never returns a shared page: it drops only rows past the committed, published prefix),
// and a shared page stays held until its last holder leaves. The plain rule (sum of reservations
// <= usable pages) would count a page that k requests share k times: 64 requests on a 2k-token
// system prompt would reserve the prompt's pages 64 times. Sliding and cross pools keep the plain
// rule (a sliding request returns shared pages as its window moves, which the count above would
// take as memory given back).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "memory/page_allocator.h"
#include "memory/pool_config.h"
#include "memory/prefix_cache.h"
#include "memory/request_slots.h"
#include "memory/table_commands.h"

namespace graphdecode {

struct LedgerPool {
  PoolGeometry geometry;
  std::int32_t max_commands = 0;  // table commands of one step (the step image's capacity)
  std::int32_t max_page_ids = 0;  // page ids of one step
  std::int32_t group = 0;         // the model that owns the pool; extend/truncate take a group
  // Sliding pools: most tokens one request adds in one step (bounds the pages it holds at once).
  std::int32_t max_step_tokens = 0;
  // Self-attention pools: share full pages of equal token prefixes across requests
  // (memory/prefix_cache.h). Every caching pool has the same page size. Ignored by cross pools.
  bool prefix_cache = false;
  // Page ids one step's image may spend on prefix hits (adopt_prefix) in this pool, on top of
  // what its extends need; 0: no budget of its own (only the command batch's room limits).
  std::int32_t adopt_page_ids = 0;
  // 1: a page's K/V depend on the first token after it, so page j is named by keys[j + 1] (the
  // chain key through the next page) instead of keys[j]. An EAGLE head's cache position p holds
  // the pair (token p + 1, target state p) (engine/spec/eagle_rules.h): two prompts equal through
  // a page but not at the token after it have different head pages, and a hit request must never
  // write the last position of a page it shares. Such a page is matched and adopted under
  // keys[j + 1] and published once the pool holds a position past it. Full pools only; 0 or 1.
  std::int32_t key_shift = 0;
};

// The largest a request can grow: its reservation.
struct KvReservation {
  std::int32_t max_tokens = 0;   // longest KV extent in the self-attention pools
  std::int32_t encoder_len = 0;  // encoder keys in the cross pools
};

class KvLedger {
 public:
  static constexpr std::int32_t kAllGroups = -1;

  // Pools in step order (index i is the step image's pool i). All share max_slots.
  explicit KvLedger(std::span<const LedgerPool> pools);
  KvLedger(const KvLedger&) = delete;
  KvLedger& operator=(const KvLedger&) = delete;

  // Most pages `r` holds at once in pool `pool`: full ceil(max_tokens / page), sliding the same
  // capped by the window plus one step, cross ceil(encoder_len / page).
  std::int32_t pages_needed(std::int32_t pool, const KvReservation& r) const;
  // Error (naming the pool, the pages and the capacity) when `r` could never be admitted even
  // with every other request gone.
  void require_fits(const KvReservation& r) const;
  // A slot with `r` reserved in every pool, or nothing when a pool lacks unreserved pages or no
  // slot is free. Changes nothing when it returns nothing.
  std::optional<std::int32_t> try_admit(const KvReservation& r);
  // try_admit that also starts the request on the cached pages of keys[0..n) (adopt_prefix), so
  // that the admission check can count the hit; n <= match_prefix(keys) (Error "prefix_pages"
  // otherwise, before anything changes). Nothing changes when it returns nothing.
  std::optional<std::int32_t> try_admit(const KvReservation& r, std::span<const PageKey> keys,
                                        std::int32_t n);
  // Would try_admit(r, keys, n) admit now? (A slot free and room in every pool.)
  bool can_admit(const KvReservation& r, std::span<const PageKey> keys = {},
                 std::int32_t n = 0) const;
  // The admission guarantee of pool `pool` right now (see the top of this file): tests check it
  // after every operation.
  bool admission_guarantee_holds(std::int32_t pool) const;
  // A slot with no reservation. Error "max_slots" when none is free.
  std::int32_t acquire();

  // Positions [tokens(slot), tokens(slot) + tokens) in every self-attention (full and sliding)
  // pool of `group` (kAllGroups: every model): pages allocated, pages left of a window returned.
  void extend(std::int32_t slot, std::int32_t tokens, std::int32_t group = kAllGroups);
  // Per model: tokens[g] more positions in the self pools of group g (a speculative step's target
  // and draft grow by different counts), all-or-nothing across every pool.
  void extend_groups(std::int32_t slot, std::span<const std::int32_t> tokens);
  // ---- prefix cache (pools with LedgerPool::prefix_cache) ----------------------------------
  // Does every self-attention pool cache prefixes (so that a hit is possible at all)?
  bool caches_prefixes() const noexcept { return caches_all_; }
  // The longest n <= keys.size() such that every self pool can serve a request whose first n
  // pages have chain keys keys[0..n): a full pool holds pages [0, n) (a key_shift pool finds them
  // under keys[1..n + 1), so n < keys.size() there), a sliding pool the pages covering the window
  // at position n * page_size. 0 when the ledger caches no prefixes.
  // within_budget: also no more pages to adopt in any pool than its adopt_page_ids left this step.
  std::int32_t match_prefix(std::span<const PageKey> keys, bool within_budget = true) const;
  // Has a prefix hit spent adoption budget since the last clear_commands()?
  bool adopted_this_step() const noexcept { return adopted_this_step_; }
  // Starts a freshly admitted slot (0 tokens) at n * page_size tokens on the cached pages of
  // keys[0..n) (match_prefix(keys) >= n), one more reference each, in every self pool; all or
  // nothing.
  void adopt_prefix(std::int32_t slot, std::span<const PageKey> keys, std::int32_t n);
  // Names the slot's full pages [first, end) by keys[first..end) in every caching pool (pages a
  // sliding pool already returned are skipped). Only for pages whose K/V are written and final.
  // A key_shift pool names pages [first - 1, end - 1) by keys[first..end), each only once the
  // pool holds a position past it (its last position is written after the token after it).
  void publish_prefix(std::int32_t slot, std::span<const PageKey> keys, std::int32_t first,
                      std::int32_t end);
  // Sum over the caching pools.
  PrefixCacheStats prefix_stats() const;
  // Pool i's cache, or nullptr.
  const PrefixCache* prefix_cache(std::int32_t pool) const;
  // Test only (the model checker's planted-bug control): see PrefixCache.
  void inject_skipped_release_for_test(std::int32_t pool, std::int32_t every_n);

  // Speculative rollback: keeps the first `tokens` positions in the self pools of `group`.
  void truncate(std::int32_t slot, std::int32_t tokens, std::int32_t group = kAllGroups);
  // The request's encoder keys in every cross pool (once per request).
  void set_encoder(std::int32_t slot, std::int32_t encoder_len);
  // Returns every page of the request in every pool, its reservation, and the slot.
  void release(std::int32_t slot);

  // Reorders pool i's free pages by `seed` (tests: pages then come out in shuffled order).
  void shuffle_free_pages(std::int32_t pool, std::uint64_t seed);

  // The step's table commands of pool i (what the step image carries); clear once submitted.
  const TableCommandBatch& commands(std::int32_t pool) const;
  void clear_commands();
  // One pool's commands only, e.g. a cross pool's after an eager update at admission.
  void clear_commands(std::int32_t pool);

  std::int32_t num_pools() const noexcept { return static_cast<std::int32_t>(pools_.size()); }
  const LedgerPool& config(std::int32_t pool) const;
  const RequestSlots& slots(std::int32_t pool) const;
  bool is_active(std::int32_t slot) const noexcept { return slots_[0]->is_active(slot); }
  // Does model `group` own a self-attention (full or sliding) pool here?
  bool has_group(std::int32_t group) const noexcept;
  // KV extent held in the self pools of `group` (the first such pool's count).
  std::int32_t tokens(std::int32_t slot, std::int32_t group = 0) const;
  std::int32_t active_requests() const noexcept { return slots_[0]->active_slots(); }
  // Pages of pool i: usable (all but the reserved page), free (an allocation may take them now:
  // free in the allocator, plus cached pages no request holds, which the prefix cache evicts on
  // demand), reserved by admitted requests, and held now by slot.
  std::int32_t usable_pages(std::int32_t pool) const;
  std::int32_t free_pages(std::int32_t pool) const;
  std::int32_t reserved_pages(std::int32_t pool) const;
  std::int32_t pages_held(std::int32_t pool, std::int32_t slot) const;

 private:
  bool self_pool_of(std::int32_t pool, std::int32_t group) const;
  // A full pool with a prefix cache: admission counts shared pages once.
  bool counts_shared_once(std::int32_t pool) const;
  // try_admit's room check (need_ filled for every pool); n validated by the caller.
  bool fits(const KvReservation& r, std::span<const PageKey> keys, std::int32_t n) const;
  // The keys pool `pool` names its pages by: page j under result[j] (keys, or keys from the second
  // on for a key_shift pool; empty when there are none).
  std::span<const PageKey> pool_keys(std::int32_t pool, std::span<const PageKey> keys) const;
  // Sum over the slots with a reservation of (reservation - pages held) in pool `pool`.
  std::int32_t unallocated_reservations(std::int32_t pool) const;
  // The extend of every self pool i by grow_[i] (-1: untouched), checked in full first.
  void extend_pools(std::int32_t slot);
  std::int32_t require_slot(std::int32_t slot, const char* what) const;

  std::vector<LedgerPool> pools_;
  std::vector<std::unique_ptr<PageAllocator>> alloc_;
  std::vector<std::unique_ptr<RequestSlots>> slots_;
  std::vector<std::unique_ptr<TableCommandBatch>> cmds_;
  std::vector<std::unique_ptr<PrefixCache>> caches_;  // [pool] nullptr where none
  bool caches_all_ = false;                           // every self pool has a cache
  std::vector<std::int32_t> adopt_left_;              // [pool] adoption page ids left this step
  bool adopted_this_step_ = false;
  mutable std::vector<std::int32_t> served_;  // [max pages + 1] match scratch, sized once
  std::vector<std::int32_t> found_;           // [max pages] adopt scratch, sized once
  std::vector<std::int32_t> reserved_;        // [pool] pages reserved by admitted requests
  std::vector<std::int32_t> reservation_;     // [slot][pool] pages reserved (-1: none)
  mutable std::vector<std::int32_t> need_;    // [pool] admission scratch, sized once
  std::vector<std::int32_t> grow_;            // [pool] extend scratch (-1: untouched), sized once
};

}  // namespace graphdecode
