#include "memory/kv_ledger.h"

#include <algorithm>
#include <random>
#include <string>

#include "common/error.h"
#include "common/request_rules.h"

namespace graphdecode {
namespace {

// First logical page a step starting at `tokens` reads in pool `g` (0 for a full pool).
std::int32_t first_needed_page(const PoolGeometry& g, std::int32_t tokens) {
  return g.kind == AttentionKind::kSliding
             ? swa_first_resident_page(tokens, g.window_left, g.page_size)
             : 0;
}

std::string pool_name(std::int32_t i, const PoolGeometry& g) {
  return "pools[" + std::to_string(i) + "] (" + std::string(attention_kind_name(g.kind)) + ")";
}

}  // namespace

KvLedger::KvLedger(std::span<const LedgerPool> pools) : pools_(pools.begin(), pools.end()) {
  GD_REQUIRE(!pools_.empty(), "pools", 0, "a ledger needs at least one pool");
  const std::int32_t max_slots = pools_[0].geometry.max_slots;
  for (std::size_t i = 0; i < pools_.size(); ++i) {
    const LedgerPool& p = pools_[i];
    const auto at = static_cast<std::int32_t>(i);
    p.geometry.validate();
    GD_REQUIRE(p.geometry.max_slots == max_slots, pool_name(at, p.geometry) + ".max_slots",
               p.geometry.max_slots, "every pool of a ledger has the same slots");
    GD_REQUIRE(p.max_commands >= RequestSlots::kMaxCommandsPerOp,
               pool_name(at, p.geometry) + ".max_commands", p.max_commands,
               "a step must fit at least one extend");
    GD_REQUIRE(p.key_shift == 0 || (p.key_shift == 1 && p.geometry.kind == AttentionKind::kFull),
               pool_name(at, p.geometry) + ".key_shift", p.key_shift,
               "0, or 1 for a full pool (pages named by the next page's key)");
    GD_REQUIRE(p.geometry.kind != AttentionKind::kSliding || p.max_step_tokens >= 1,
               pool_name(at, p.geometry) + ".max_step_tokens", p.max_step_tokens,
               "a sliding pool needs the most tokens a request adds in one step");
    alloc_.push_back(std::make_unique<PageAllocator>(p.geometry.num_pages));
    slots_.push_back(std::make_unique<RequestSlots>(p.geometry, *alloc_.back()));
    cmds_.push_back(std::make_unique<TableCommandBatch>(p.max_commands, p.max_page_ids));
  }
  // Prefix caches: one per caching self pool, seeded by the pool's identity so that keys of
  // different pools (a target's and a draft's, full and sliding) never meet.
  caches_all_ = true;
  bool any_self = false;
  std::int32_t cache_page = 0, most_pages = 0;
  for (std::size_t i = 0; i < pools_.size(); ++i) {
    const LedgerPool& p = pools_[i];
    const bool self = p.geometry.kind != AttentionKind::kCross;
    any_self = any_self || self;
    most_pages = std::max(most_pages, p.geometry.max_pages_per_slot);
    if (!self || !p.prefix_cache) {
      caches_.push_back(nullptr);
      caches_all_ = caches_all_ && !self;
      continue;
    }
    GD_REQUIRE(cache_page == 0 || p.geometry.page_size == cache_page,
               pool_name(static_cast<std::int32_t>(i), p.geometry) + ".page_size",
               p.geometry.page_size, "every prefix-caching pool has the same page size");
    cache_page = p.geometry.page_size;
    const std::uint64_t seed =
        (static_cast<std::uint64_t>(i) << 56) ^ (static_cast<std::uint64_t>(p.group) << 48) ^
        (static_cast<std::uint64_t>(p.geometry.kind) << 40) ^
        (static_cast<std::uint64_t>(static_cast<std::uint32_t>(p.geometry.window_left)) << 8) ^
        static_cast<std::uint64_t>(p.geometry.page_size);
    caches_.push_back(std::make_unique<PrefixCache>(*alloc_[i], seed));
    slots_[i]->attach_cache(*caches_.back());
  }
  caches_all_ = caches_all_ && any_self;
  served_.assign(static_cast<std::size_t>(most_pages) + 1, 0);
  found_.assign(static_cast<std::size_t>(most_pages), 0);
  adopt_left_.resize(pools_.size());
  for (std::size_t i = 0; i < pools_.size(); ++i) adopt_left_[i] = pools_[i].adopt_page_ids;
  reserved_.assign(pools_.size(), 0);
  reservation_.assign(static_cast<std::size_t>(max_slots) * pools_.size(), -1);
  need_.assign(pools_.size(), 0);
  grow_.assign(pools_.size(), -1);
}

const LedgerPool& KvLedger::config(std::int32_t pool) const {
  GD_REQUIRE(pool >= 0 && pool < num_pools(), "pool", pool, "not a pool of this ledger");
  return pools_[static_cast<std::size_t>(pool)];
}

const RequestSlots& KvLedger::slots(std::int32_t pool) const {
  config(pool);
  return *slots_[static_cast<std::size_t>(pool)];
}

const TableCommandBatch& KvLedger::commands(std::int32_t pool) const {
  config(pool);
  return *cmds_[static_cast<std::size_t>(pool)];
}

void KvLedger::shuffle_free_pages(std::int32_t pool, std::uint64_t seed) {
  config(pool);
  PageAllocator& a = *alloc_[static_cast<std::size_t>(pool)];
  std::vector<std::int32_t> pages = a.allocate(a.free_pages());
  std::shuffle(pages.begin(), pages.end(), std::mt19937_64(seed));
  a.release(pages);
}

void KvLedger::clear_commands() {
  for (auto& c : cmds_) c->clear();
  for (std::size_t i = 0; i < pools_.size(); ++i) adopt_left_[i] = pools_[i].adopt_page_ids;
  adopted_this_step_ = false;
}

void KvLedger::clear_commands(std::int32_t pool) {
  config(pool);
  cmds_[static_cast<std::size_t>(pool)]->clear();
  adopt_left_[static_cast<std::size_t>(pool)] =
      pools_[static_cast<std::size_t>(pool)].adopt_page_ids;
}

bool KvLedger::self_pool_of(std::int32_t pool, std::int32_t group) const {
  const LedgerPool& p = pools_[static_cast<std::size_t>(pool)];
  return p.geometry.kind != AttentionKind::kCross && (group == kAllGroups || p.group == group);
}

std::int32_t KvLedger::require_slot(std::int32_t slot, const char* what) const {
  GD_REQUIRE(slots_[0]->is_active(slot), "slot", slot,
             std::string(what) + ": not an active request slot");
  return slot;
}

std::int32_t KvLedger::pages_needed(std::int32_t pool, const KvReservation& r) const {
  const PoolGeometry& g = config(pool).geometry;
  GD_REQUIRE(r.max_tokens >= 0, "max_tokens", r.max_tokens, "cannot be negative");
  GD_REQUIRE(r.encoder_len >= 0, "encoder_len", r.encoder_len, "cannot be negative");
  switch (g.kind) {
    case AttentionKind::kFull:
      return pages_for_tokens(r.max_tokens, g.page_size);
    case AttentionKind::kSliding:
      return std::min(
          pages_for_tokens(r.max_tokens, g.page_size),
          swa_pages_per_request(
              g.window_left, pools_[static_cast<std::size_t>(pool)].max_step_tokens, g.page_size));
    case AttentionKind::kCross:
      return pages_for_tokens(r.encoder_len, g.page_size);
  }
  return 0;
}

std::int32_t KvLedger::usable_pages(std::int32_t pool) const {
  return config(pool).geometry.num_pages - 1;
}
std::int32_t KvLedger::free_pages(std::int32_t pool) const {
  config(pool);
  return slots_[static_cast<std::size_t>(pool)]->available_pages();
}
std::int32_t KvLedger::reserved_pages(std::int32_t pool) const {
  config(pool);
  return reserved_[static_cast<std::size_t>(pool)];
}
std::int32_t KvLedger::pages_held(std::int32_t pool, std::int32_t slot) const {
  return slots(pool).pages_held(slot);
}

void KvLedger::require_fits(const KvReservation& r) const {
  for (std::int32_t i = 0; i < num_pools(); ++i) {
    const std::int32_t need = pages_needed(i, r);
    GD_REQUIRE(need <= usable_pages(i), "kv_pages_needed", need,
               "the request can never fit " + pool_name(i, pools_[i].geometry) + " of " +
                   std::to_string(usable_pages(i)) + " pages");
  }
}

std::optional<std::int32_t> KvLedger::try_admit(const KvReservation& r) {
  return try_admit(r, {}, 0);
}

std::optional<std::int32_t> KvLedger::try_admit(const KvReservation& r,
                                                std::span<const PageKey> keys, std::int32_t n) {
  GD_REQUIRE(n >= 0 && (n == 0 || n <= match_prefix(keys)), "prefix_pages", n,
             "more than the " + std::to_string(match_prefix(keys)) +
                 " pages every pool can serve from the cache this step");
  for (std::int32_t i = 0; i < num_pools(); ++i) {
    const PrefixCache* c = caches_[static_cast<std::size_t>(i)].get();
    const PoolGeometry& g = pools_[i].geometry;
    const std::int32_t need = pages_needed(i, r);
    const std::int32_t adopted = c ? n - first_needed_page(g, n * g.page_size) : 0;
    GD_REQUIRE(adopted <= need, "prefix_pages", n,
               "more pages than the request's reservation of " + std::to_string(need) + " in " +
                   pool_name(i, g));
    if (adopted > 0) cmds_[i]->require_room(1, adopted);  // what adopt_prefix will append
  }
  if (!fits(r, keys, n)) return std::nullopt;
  const std::int32_t slot = acquire();
  for (std::int32_t i = 0; i < num_pools(); ++i) {
    reserved_[i] += need_[i];
    reservation_[static_cast<std::size_t>(slot) * pools_.size() + i] = need_[i];
  }
  adopt_prefix(slot, keys, n);  // checked above: matched, within the reservation, room
  return slot;
}

bool KvLedger::can_admit(const KvReservation& r, std::span<const PageKey> keys,
                         std::int32_t n) const {
  if (n < 0 || (n > 0 && n > match_prefix(keys))) return false;
  return fits(r, keys, n);
}

bool KvLedger::fits(const KvReservation& r, std::span<const PageKey> keys, std::int32_t n) const {
  if (slots_[0]->active_slots() >= pools_[0].geometry.max_slots - 1) return false;
  for (std::int32_t i = 0; i < num_pools(); ++i) {
    need_[i] = pages_needed(i, r);
    if (!counts_shared_once(i)) {
      if (need_[i] > usable_pages(i) - reserved_[i]) return false;
      continue;
    }
    const PrefixCache& c = *caches_[static_cast<std::size_t>(i)];
    std::int32_t unheld = 0;  // hit pages only the cache holds: adopting takes them off the free
    const std::span<const PageKey> pk = pool_keys(i, keys);
    for (std::int32_t j = 0; j < n; ++j)
      unheld += c.refs(c.find(pk[static_cast<std::size_t>(j)])) == 0;
    if (unallocated_reservations(i) + (need_[i] - n) > slots_[i]->available_pages() - unheld)
      return false;
  }
  return true;
}

std::span<const PageKey> KvLedger::pool_keys(std::int32_t pool,
                                             std::span<const PageKey> keys) const {
  const auto shift = static_cast<std::size_t>(pools_[static_cast<std::size_t>(pool)].key_shift);
  return shift < keys.size() ? keys.subspan(shift) : std::span<const PageKey>();
}

bool KvLedger::counts_shared_once(std::int32_t pool) const {
  return caches_[static_cast<std::size_t>(pool)] != nullptr &&
         pools_[static_cast<std::size_t>(pool)].geometry.kind == AttentionKind::kFull;
}

std::int32_t KvLedger::unallocated_reservations(std::int32_t pool) const {
  std::int32_t sum = 0;
  const RequestSlots& s = *slots_[static_cast<std::size_t>(pool)];
  for (std::int32_t slot = 0; slot < s.geometry().max_slots; ++slot) {
    const std::int32_t r = reservation_[static_cast<std::size_t>(slot) * pools_.size() +
                                        static_cast<std::size_t>(pool)];
    if (r >= 0) sum += r - s.pages_held(slot);
  }
  return sum;
}

bool KvLedger::admission_guarantee_holds(std::int32_t pool) const {
  config(pool);
  if (!counts_shared_once(pool))
    return reserved_[static_cast<std::size_t>(pool)] <= usable_pages(pool);
  return unallocated_reservations(pool) <=
         slots_[static_cast<std::size_t>(pool)]->available_pages();
}

std::int32_t KvLedger::acquire() {
  // The pools' slot books are created together and always acquired and released together, so
  // they hand out the same id; checked anyway.
  std::int32_t slot = -1;
  for (auto& s : slots_) {
    const std::int32_t got = s->acquire();
    GD_REQUIRE(slot < 0 || got == slot, "slot", got, "pools handed out different slots");
    slot = got;
  }
  return slot;
}

void KvLedger::extend(std::int32_t slot, std::int32_t tokens, std::int32_t group) {
  require_slot(slot, "extend");
  GD_REQUIRE(tokens >= 0, "tokens", tokens, "an extend cannot be negative");
  for (std::int32_t i = 0; i < num_pools(); ++i) grow_[i] = self_pool_of(i, group) ? tokens : -1;
  extend_pools(slot);
}

void KvLedger::extend_groups(std::int32_t slot, std::span<const std::int32_t> tokens) {
  require_slot(slot, "extend");
  for (std::size_t g = 0; g < tokens.size(); ++g)
    GD_REQUIRE(tokens[g] >= 0, "tokens[" + std::to_string(g) + "]", tokens[g],
               "an extend cannot be negative");
  for (std::int32_t i = 0; i < num_pools(); ++i) {
    const auto g = static_cast<std::size_t>(pools_[i].group);
    grow_[i] = self_pool_of(i, kAllGroups) && g < tokens.size() ? tokens[g] : -1;
  }
  extend_pools(slot);
}

void KvLedger::extend_pools(std::int32_t slot) {
  // Every check of every pool first (slot capacity, pages, reservation, batch room), so that
  // nothing changes unless every pool takes its extend.
  for (std::int32_t i = 0; i < num_pools(); ++i) {
    if (grow_[i] < 0) continue;
    const PoolGeometry& g = pools_[i].geometry;
    const RequestSlots::ExtendPlan plan = slots_[i]->plan_extend(slot, grow_[i]);
    // Evicted pages another request still holds (prefix cache) free nothing.
    const std::int32_t available = slots_[i]->available_pages() + plan.reclaim;
    GD_REQUIRE(plan.add <= available, "pages_requested", plan.add,
               "KV pool exhausted: " + pool_name(i, g) + " has " + std::to_string(available) +
                   " of " + std::to_string(usable_pages(i)) + " pages free");
    const std::int32_t reserved =
        reservation_[static_cast<std::size_t>(slot) * pools_.size() + static_cast<std::size_t>(i)];
    GD_REQUIRE(reserved < 0 || plan.held_after <= reserved, "pages_held", plan.held_after,
               "slot " + std::to_string(slot) + " would exceed its reservation of " +
                   std::to_string(reserved) + " pages in " + pool_name(i, g));
    cmds_[i]->require_room((plan.evict > 0) + (plan.add > 0), plan.add);
  }
  for (std::int32_t i = 0; i < num_pools(); ++i) {
    if (grow_[i] >= 0) slots_[i]->extend(slot, grow_[i], *cmds_[i]);
  }
}

void KvLedger::truncate(std::int32_t slot, std::int32_t tokens, std::int32_t group) {
  require_slot(slot, "truncate");
  // Every check of every pool first: a truncate frees pages, which cannot be undone.
  for (std::int32_t i = 0; i < num_pools(); ++i) {
    if (!self_pool_of(i, group)) continue;
    const RequestSlots& s = *slots_[i];
    const PoolGeometry& g = pools_[i].geometry;
    GD_REQUIRE(tokens >= 0 && tokens <= s.tokens(slot), "tokens", tokens,
               "truncate needs 0 <= tokens <= tokens held (" + std::to_string(s.tokens(slot)) +
                   ") in " + pool_name(i, g));
    GD_REQUIRE(g.kind != AttentionKind::kSliding ||
                   swa_first_resident_page(tokens, g.window_left, g.page_size) >=
                       s.first_resident_page(slot),
               "tokens", tokens,
               "truncating this far would need pages " + pool_name(i, g) + " already returned");
    cmds_[i]->require_room(1, 0);
  }
  for (std::int32_t i = 0; i < num_pools(); ++i) {
    if (self_pool_of(i, group)) slots_[i]->truncate(slot, tokens, *cmds_[i]);
  }
}

void KvLedger::set_encoder(std::int32_t slot, std::int32_t encoder_len) {
  require_slot(slot, "set_encoder");
  GD_REQUIRE(encoder_len >= 0, "encoder_len", encoder_len, "cannot be negative");
  bool any = false;
  for (std::int32_t i = 0; i < num_pools(); ++i) {
    const PoolGeometry& g = pools_[i].geometry;
    if (g.kind != AttentionKind::kCross) continue;
    any = true;
    const std::int32_t need = pages_for_tokens(encoder_len, g.page_size);
    const std::int32_t reserved =
        reservation_[static_cast<std::size_t>(slot) * pools_.size() + static_cast<std::size_t>(i)];
    GD_REQUIRE(slots_[i]->tokens(slot) == 0, "slot", slot,
               "the request already holds its encoder keys in " + pool_name(i, g));
    GD_REQUIRE(encoder_len <= g.max_tokens_per_slot(), "encoder_len", encoder_len,
               "exceeds the " + std::to_string(g.max_tokens_per_slot()) + " keys a slot of " +
                   pool_name(i, g) + " holds");
    GD_REQUIRE(reserved < 0 || need <= reserved, "encoder_len", encoder_len,
               "exceeds the request's reservation in " + pool_name(i, g));
    GD_REQUIRE(need <= alloc_[i]->free_pages(), "pages_requested", need,
               "KV pool exhausted: " + pool_name(i, g) + " has " +
                   std::to_string(alloc_[i]->free_pages()) + " free pages");
    cmds_[i]->require_room(1, need);
  }
  GD_REQUIRE(any, "pools", "no cross pool", "the model has no cross-attention pool");
  for (std::int32_t i = 0; i < num_pools(); ++i) {
    if (pools_[i].geometry.kind == AttentionKind::kCross)
      slots_[i]->extend(slot, encoder_len, *cmds_[i]);
  }
}

void KvLedger::release(std::int32_t slot) {
  require_slot(slot, "release");
  for (std::int32_t i = 0; i < num_pools(); ++i) {
    GD_REQUIRE(slots_[i]->is_active(slot), "slot", slot,
               "is not active in " + pool_name(i, pools_[i].geometry));
    cmds_[i]->require_room(RequestSlots::kMaxCommandsPerOp, 0);
  }
  for (std::int32_t i = 0; i < num_pools(); ++i) {
    slots_[i]->release(slot, *cmds_[i]);
    std::int32_t& r =
        reservation_[static_cast<std::size_t>(slot) * pools_.size() + static_cast<std::size_t>(i)];
    if (r > 0) reserved_[i] -= r;
    r = -1;
  }
}

// ---- prefix cache ----------------------------------------------------------------------------

std::int32_t KvLedger::match_prefix(std::span<const PageKey> keys, bool within_budget) const {
  if (!caches_all_ || keys.empty()) return 0;
  // Page ids pool i may still spend on adoption this step (no limit without a budget of its own).
  const auto budget = [&](std::int32_t i) {
    return within_budget && pools_[i].adopt_page_ids > 0 ? adopt_left_[static_cast<std::size_t>(i)]
                                                         : pools_[i].geometry.max_pages_per_slot;
  };
  // Full pools serve a prefix of pages, so the hit is at most their common run from page 0.
  auto most = static_cast<std::int32_t>(std::min(keys.size(), served_.size() - 1));
  for (std::int32_t i = 0; i < num_pools(); ++i) {
    const PrefixCache* c = caches_[static_cast<std::size_t>(i)].get();
    if (!c || pools_[i].geometry.kind != AttentionKind::kFull) continue;
    const std::span<const PageKey> pk = pool_keys(i, keys);
    most = std::min({most, pools_[i].geometry.max_pages_per_slot, budget(i),
                     static_cast<std::int32_t>(pk.size())});
    std::int32_t j = 0;
    while (j < most && c->find(pk[static_cast<std::size_t>(j)]) != PrefixCache::kNoPage) ++j;
    most = j;
  }
  // A sliding pool serves n when the pages [first needed at n, n) are all present: a run of
  // present pages ending at page n - 1 at least that long. Its servable points are not a prefix
  // (pages out of the window may be gone while later ones remain), so count, per n, the sliding
  // pools that serve it, and take the largest n every one does.
  std::int32_t sliding = 0;
  std::fill(served_.begin(), served_.begin() + most + 1, 0);
  for (std::int32_t i = 0; i < num_pools(); ++i) {
    const PrefixCache* c = caches_[static_cast<std::size_t>(i)].get();
    const PoolGeometry& g = pools_[i].geometry;
    if (!c || g.kind != AttentionKind::kSliding) continue;
    ++sliding;
    ++served_[0];
    std::int32_t run = 0;
    for (std::int32_t n = 1; n <= most; ++n) {
      run = c->find(keys[static_cast<std::size_t>(n - 1)]) != PrefixCache::kNoPage ? run + 1 : 0;
      const std::int32_t need = n - first_needed_page(g, n * g.page_size);
      if (run >= need && n <= g.max_pages_per_slot && need <= budget(i))
        ++served_[static_cast<std::size_t>(n)];
    }
  }
  for (std::int32_t n = most; n > 0; --n)
    if (served_[static_cast<std::size_t>(n)] == sliding) return n;
  return 0;
}

void KvLedger::adopt_prefix(std::int32_t slot, std::span<const PageKey> keys, std::int32_t n) {
  require_slot(slot, "adopt_prefix");
  GD_REQUIRE(caches_all_ || n == 0, "prefix_pages", n, "the ledger caches no prefixes");
  GD_REQUIRE(n >= 0 && static_cast<std::size_t>(n) <= keys.size(), "prefix_pages", n,
             "outside [0, keys = " + std::to_string(keys.size()) + "]");
  if (n == 0) return;
  // Every check of every pool first: pages found, reservation, command room.
  for (std::int32_t i = 0; i < num_pools(); ++i) {
    const PrefixCache* c = caches_[static_cast<std::size_t>(i)].get();
    if (!c) continue;
    const PoolGeometry& g = pools_[i].geometry;
    GD_REQUIRE(slots_[i]->tokens(slot) == 0, "slot", slot,
               "adopt_prefix: the request already holds tokens in " + pool_name(i, g));
    GD_REQUIRE(n <= g.max_pages_per_slot, "prefix_pages", n,
               "exceeds the slot capacity of " + pool_name(i, g));
    const std::int32_t first = first_needed_page(g, n * g.page_size);
    const std::span<const PageKey> pk = pool_keys(i, keys);
    GD_REQUIRE(static_cast<std::size_t>(n) <= pk.size(), "prefix_pages", n,
               "needs the key of the page after it in " + pool_name(i, g));
    for (std::int32_t j = first; j < n; ++j)
      GD_REQUIRE(c->find(pk[static_cast<std::size_t>(j)]) != PrefixCache::kNoPage, "prefix_pages",
                 n, "page " + std::to_string(j) + " is not cached in " + pool_name(i, g));
    const std::int32_t reserved =
        reservation_[static_cast<std::size_t>(slot) * pools_.size() + static_cast<std::size_t>(i)];
    GD_REQUIRE(reserved < 0 || n - first <= reserved, "prefix_pages", n,
               "exceeds the request's reservation in " + pool_name(i, g));
    GD_REQUIRE(
        pools_[i].adopt_page_ids == 0 || n - first <= adopt_left_[static_cast<std::size_t>(i)],
        "prefix_pages", n,
        "exceeds the page ids left this step for prefix hits in " + pool_name(i, g));
    cmds_[i]->require_room(1, n - first);
  }
  for (std::int32_t i = 0; i < num_pools(); ++i) {
    const PrefixCache* c = caches_[static_cast<std::size_t>(i)].get();
    if (!c) continue;
    const PoolGeometry& g = pools_[i].geometry;
    const std::int32_t first = first_needed_page(g, n * g.page_size);
    const std::span<const PageKey> pk = pool_keys(i, keys);
    for (std::int32_t j = first; j < n; ++j)
      found_[static_cast<std::size_t>(j - first)] = c->find(pk[static_cast<std::size_t>(j)]);
    adopt_left_[static_cast<std::size_t>(i)] -= n - first;
    slots_[i]->adopt(
        slot, n * g.page_size, first,
        std::span<const std::int32_t>(found_.data(), static_cast<std::size_t>(n - first)),
        *cmds_[i]);
  }
  adopted_this_step_ = true;
}

void KvLedger::publish_prefix(std::int32_t slot, std::span<const PageKey> keys, std::int32_t first,
                              std::int32_t end) {
  require_slot(slot, "publish_prefix");
  GD_REQUIRE(first >= 0 && first <= end && static_cast<std::size_t>(end) <= keys.size(), "end", end,
             "publish needs 0 <= first <= end <= keys (" + std::to_string(keys.size()) + ")");
  for (std::int32_t i = 0; i < num_pools(); ++i) {
    PrefixCache* c = caches_[static_cast<std::size_t>(i)].get();
    if (!c) continue;
    const RequestSlots& s = *slots_[i];
    // Only the full pages this pool holds (a draft may hold fewer positions than its target;
    // a sliding pool has returned the pages left of its window); a key_shift pool's page j under
    // keys[j + 1], once it holds position (j + 1) * page_size (publish is idempotent: the page
    // first - 1 may have been named by the previous call or adopted).
    const std::int32_t shift = pools_[i].key_shift;
    const std::span<const PageKey> pk = pool_keys(i, keys.first(static_cast<std::size_t>(end)));
    const std::int32_t held = s.tokens(slot) - shift;
    const std::int32_t stop =
        std::min(static_cast<std::int32_t>(pk.size()), held / pools_[i].geometry.page_size);
    const auto row = s.row(slot);
    for (std::int32_t j = std::max(first - shift, s.first_resident_page(slot)); j < stop; ++j)
      c->publish(row[static_cast<std::size_t>(j)], pk[static_cast<std::size_t>(j)]);
  }
}

PrefixCacheStats KvLedger::prefix_stats() const {
  PrefixCacheStats t;
  for (const auto& c : caches_) {
    if (!c) continue;
    const PrefixCacheStats s = c->stats();
    t.cached_pages += s.cached_pages;
    t.lru_pages += s.lru_pages;
    t.evictions += s.evictions;
    t.published += s.published;
  }
  return t;
}

const PrefixCache* KvLedger::prefix_cache(std::int32_t pool) const {
  config(pool);
  return caches_[static_cast<std::size_t>(pool)].get();
}

void KvLedger::inject_skipped_release_for_test(std::int32_t pool, std::int32_t every_n) {
  config(pool);
  PrefixCache* c = caches_[static_cast<std::size_t>(pool)].get();
  GD_REQUIRE(c != nullptr, "pool", pool, "has no prefix cache");
  c->inject_skipped_release_for_test(every_n);
}

bool KvLedger::has_group(std::int32_t group) const noexcept {
  for (std::int32_t i = 0; i < num_pools(); ++i)
    if (self_pool_of(i, group)) return true;
  return false;
}

std::int32_t KvLedger::tokens(std::int32_t slot, std::int32_t group) const {
  for (std::int32_t i = 0; i < num_pools(); ++i) {
    if (self_pool_of(i, group)) return slots_[i]->tokens(slot);
  }
  return slots_[0]->tokens(slot);  // only cross pools: the encoder length
}

}  // namespace graphdecode
