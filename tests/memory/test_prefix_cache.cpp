// The prefix cache on the CPU: chained keys, reference counts, LRU eviction, and a model-checked
// ledger (full and sliding pools of a target, a draft's full pool) driven by 100k random
// operations (admit with match, extend, publish, speculative rollback, finish) against an exact,
// simple host model of every page; with a planted bug (a skipped reference drop) the same checker
// must fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <list>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/request_rules.h"
#include "memory/kv_ledger.h"
#include "memory/prefix_cache.h"
#include "memory/table_commands.h"
#include "memory_test_util.h"

namespace graphdecode {
namespace {

TEST(PrefixCacheKeys, ChainedOverTheWholePrefix) {
  const std::vector<std::int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<std::int32_t> b = a;
  b[0] = 9;  // differs in page 0 only
  std::vector<PageKey> ka(2), kb(2), kc(2);
  chain_page_keys(a, 4, 7, ka);
  chain_page_keys(b, 4, 7, kb);
  chain_page_keys(a, 4, 8, kc);
  EXPECT_NE(ka[0], kb[0]);
  EXPECT_NE(ka[1], kb[1]);  // same page-1 tokens, different prefix: different key
  EXPECT_NE(ka[0], kc[0]);  // the seed is part of the name
  EXPECT_EQ(ka[1], next_page_key(ka[0], std::span<const std::int32_t>(a).subspan(4, 4)));
  std::vector<PageKey> three(3);
  EXPECT_THROW(chain_page_keys(a, 4, 7, three), Error);
}

TEST(PrefixCache, ReferencesLruAndEviction) {
  PageAllocator alloc(5);
  std::int32_t reserved = 0;
  alloc.allocate_into({&reserved, 1});  // like a pool's page 0
  PrefixCache c(alloc, 1);
  std::int32_t p[4];
  c.allocate_into(p);
  EXPECT_EQ(c.available(), 0);
  c.publish(p[0], 100);
  c.publish(p[1], 101);
  c.publish(p[2], 100);  // key taken by p[0]: p[2] stays private
  EXPECT_FALSE(c.is_cached(p[2]));
  EXPECT_EQ(c.find(100), p[0]);
  c.retain(p[0]);
  EXPECT_EQ(c.refs(p[0]), 2);
  const std::int32_t order[] = {p[1], p[0], p[2], p[3], p[0]};
  c.release(order);  // p1 -> LRU, p0 2 -> 1 -> LRU, p2 and p3 freed
  EXPECT_EQ(c.stats().lru_pages, 2);
  EXPECT_EQ(alloc.free_pages(), 2);
  EXPECT_EQ(c.available(), 4);
  const std::int32_t twice[] = {p[3]};
  EXPECT_THROW(c.release(twice), Error);  // not held
  std::int32_t q[3];
  c.allocate_into(q);  // 2 free, then the LRU head (p1, released first) is evicted
  EXPECT_EQ(c.stats().evictions, 1);
  EXPECT_EQ(c.find(101), PrefixCache::kNoPage);
  EXPECT_EQ(c.find(100), p[0]);  // still cached, unreferenced
  c.retain(p[0]);                // a hit takes it off the LRU: nothing left to evict
  std::int32_t r[1];
  EXPECT_THROW(c.allocate_into(r), Error);
  EXPECT_EQ(c.refs(p[0]), 1);
}

// ---- the model-checked ledger ------------------------------------------------------------------

constexpr std::int32_t kPage = 4;
constexpr std::int32_t kMaxPages = 16;  // per slot: 64 tokens

LedgerPool pool(AttentionKind kind, std::int32_t pages, std::int32_t group) {
  LedgerPool p;
  p.geometry.kind = kind;
  p.geometry.page_size = kPage;
  p.geometry.num_pages = pages;
  p.geometry.max_slots = 6;
  p.geometry.max_pages_per_slot = kMaxPages;
  p.geometry.window_left = kind == AttentionKind::kSliding ? 6 : -1;
  p.max_commands = 64;
  p.max_page_ids = 256;
  p.group = group;
  p.max_step_tokens = 12;
  p.prefix_cache = true;
  return p;
}

// Exact model of one pool: who holds which page, which pages are cached under which key, the LRU
// order, the free count. It learns the ids the ledger hands out and checks each one on receipt.
struct PoolModel {
  PoolGeometry g;
  std::int32_t shift = 0;                   // LedgerPool::key_shift: page j named by keys[j + 1]
  std::vector<std::int32_t> refs;           // [pages]
  std::vector<std::optional<PageKey>> key;  // [pages] cached under
  std::map<PageKey, std::int32_t> by_key;
  std::list<std::int32_t> lru;
  std::int32_t free = 0;
  std::int64_t evictions = 0;
  std::map<std::int32_t, std::vector<std::int32_t>> rows;  // slot -> logical page -> id (-1)
  std::map<std::int32_t, std::int32_t> first;              // slot -> first resident page
  std::string error;

  void drop(std::int32_t p) {
    if (refs[p] <= 0) error = "model: page " + std::to_string(p) + " dropped while not held";
    if (--refs[p] > 0) return;
    if (key[p]) {
      lru.push_back(p);
    } else {
      ++free;
    }
  }
  // A page the ledger handed out fresh: free, or the LRU head when nothing is free.
  void take(std::int32_t p) {
    if (refs[p] != 0) {
      error = "page " + std::to_string(p) + " handed to a second owner";
      return;
    }
    if (free > 0) {
      if (key[p]) error = "cached page " + std::to_string(p) + " taken while pages were free";
      --free;
    } else {
      if (lru.empty() || lru.front() != p) {
        error = "page " + std::to_string(p) + " taken but it is not the LRU head";
        return;
      }
      lru.pop_front();
      by_key.erase(*key[p]);
      key[p].reset();
      ++evictions;
    }
    refs[p] = 1;
  }
  std::int32_t first_needed(std::int32_t tokens) const {
    return g.kind == AttentionKind::kSliding
               ? swa_first_resident_page(tokens, g.window_left, g.page_size)
               : 0;
  }
  bool serves(std::span<const PageKey> keys, std::int32_t n) const {
    if (n + shift > static_cast<std::int32_t>(keys.size())) return false;
    for (std::int32_t j = first_needed(n * kPage); j < n; ++j)
      if (!by_key.count(keys[j + shift])) return false;
    return true;
  }
};

struct Req {
  std::vector<std::int32_t> tokens;
  std::vector<PageKey> keys;
  std::int32_t slot = 0;
  std::int32_t cached = 0;  // committed tokens in every pool
};

// Runs `ops` random operations; returns the first disagreement between the ledger and the model.
std::optional<std::string> run_ops(std::uint64_t seed, std::int32_t ops,
                                   std::int32_t planted_bug_every, std::int64_t* hits) {
  std::mt19937_64 rng(seed);
  // The draft's pool names its pages by the next page's key, as an EAGLE head's does.
  std::vector<LedgerPool> pools = {pool(AttentionKind::kFull, 61, 0),
                                   pool(AttentionKind::kSliding, 31, 0),
                                   pool(AttentionKind::kFull, 61, 1)};
  pools[2].key_shift = 1;
  KvLedger ledger(pools);
  if (planted_bug_every > 0) ledger.inject_skipped_release_for_test(0, planted_bug_every);
  std::vector<PoolModel> model(pools.size());
  std::vector<std::vector<std::int32_t>> tables(pools.size());
  for (std::size_t i = 0; i < pools.size(); ++i) {
    model[i].g = pools[i].geometry;
    model[i].shift = pools[i].key_shift;
    model[i].refs.assign(pools[i].geometry.num_pages, 0);
    model[i].key.assign(pools[i].geometry.num_pages, std::nullopt);
    model[i].free = pools[i].geometry.num_pages - 1;
    tables[i].resize(static_cast<std::size_t>(6 * kMaxPages));
    init_page_table_host(pools[i].geometry, tables[i]);
  }
  // A few shared prompt stems over a 3-token vocabulary: hits, partial hits and divergences.
  std::vector<std::vector<std::int32_t>> stems(3);
  for (auto& s : stems)
    for (int t = 0; t < 64; ++t) s.push_back(static_cast<std::int32_t>(rng() % 3));
  std::map<std::int32_t, Req> live;  // slot -> request
  auto pick = [&](std::int32_t n) { return static_cast<std::int32_t>(rng() % n); };

  // Every change the ledger made to slot's rows, learned by the model.
  auto learn = [&](std::int32_t slot) {
    for (std::size_t i = 0; i < pools.size(); ++i) {
      PoolModel& m = model[i];
      auto& row = m.rows[slot];
      row.resize(kMaxPages, kInvalidPage);
      const auto now = ledger.slots(static_cast<std::int32_t>(i)).row(slot);
      for (std::int32_t j = 0; j < kMaxPages; ++j) {  // drops first, as the ledger does
        if (row[j] != kInvalidPage && now[j] != row[j]) m.drop(row[j]);
      }
      for (std::int32_t j = 0; j < kMaxPages; ++j) {
        if (now[j] != kInvalidPage && now[j] != row[j]) m.take(now[j]);
        row[j] = now[j];
      }
    }
  };
  auto publish_model = [&](const Req& r, std::int32_t end) {
    for (std::size_t i = 0; i < pools.size(); ++i) {
      PoolModel& m = model[i];
      const auto& row = m.rows[r.slot];
      // A shift pool's page j once its key keys[j + 1] is known and it holds a position past it.
      const std::int32_t held = ledger.tokens(r.slot, pools[i].group) - m.shift;
      const std::int32_t stop = std::min(end - m.shift, held / kPage);
      for (std::int32_t j = 0; j < stop; ++j) {
        const std::int32_t p = row[j];
        const PageKey k = r.keys[static_cast<std::size_t>(j + m.shift)];
        if (p == kInvalidPage || m.key[p] || m.by_key.count(k)) continue;
        m.key[p] = k;
        m.by_key[k] = p;
      }
    }
  };
  auto check = [&](int op) -> std::optional<std::string> {
    for (std::size_t i = 0; i < pools.size(); ++i) {
      const auto at = static_cast<std::int32_t>(i);
      PoolModel& m = model[i];
      std::ostringstream where;
      where << "op " << op << " pool " << i << ": ";
      if (!m.error.empty()) return where.str() + m.error;
      // Every admitted request can still grow to its reservation.
      if (!ledger.admission_guarantee_holds(at))
        return where.str() + "the admission guarantee no longer holds";
      const PrefixCache& c = *ledger.prefix_cache(at);
      const PageAllocator& a = ledger.slots(at).allocator();
      std::vector<std::int32_t> held(m.refs.size(), 0);
      for (const auto& [slot, row] : m.rows) {
        const auto now = ledger.slots(at).row(slot);
        if (!std::equal(row.begin(), row.end(), now.begin()))
          return where.str() + "slot " + std::to_string(slot) + " row differs from the model";
        for (const std::int32_t p : row)
          if (p != kInvalidPage) ++held[p];
      }
      for (std::int32_t p = 1; p < static_cast<std::int32_t>(m.refs.size()); ++p) {
        if (held[p] != m.refs[p])
          return where.str() + "model rows disagree at page " + std::to_string(p);
        if (c.refs(p) != m.refs[p])
          return where.str() + "page " + std::to_string(p) + " refs " + std::to_string(c.refs(p)) +
                 " != " + std::to_string(m.refs[p]);
        if (c.is_cached(p) != m.key[p].has_value())
          return where.str() + "page " + std::to_string(p) + " cached state differs";
        if (a.is_allocated(p) != (m.refs[p] > 0 || m.key[p].has_value()))
          return where.str() + "page " + std::to_string(p) +
                 (a.is_allocated(p) ? " leaked" : " freed while held or cached");
      }
      const PrefixCacheStats s = c.stats();
      if (a.free_pages() != m.free || s.lru_pages != static_cast<std::int64_t>(m.lru.size()) ||
          s.evictions != m.evictions ||
          s.cached_pages != static_cast<std::int64_t>(m.by_key.size()))
        return where.str() + "counts differ: free " + std::to_string(a.free_pages()) + "/" +
               std::to_string(m.free) + " lru " + std::to_string(s.lru_pages) + "/" +
               std::to_string(m.lru.size()) + " evictions " + std::to_string(s.evictions) + "/" +
               std::to_string(m.evictions);
      // The device tables (rebuilt from the commands) equal the host mirror.
      const TableCommandBatch& b = ledger.commands(at);
      apply_table_commands_host(b.commands(), b.page_ids(), pools[i].geometry, tables[i]);
      const auto mirror = ledger.slots(at).table();
      if (!std::equal(mirror.begin(), mirror.end(), tables[i].begin()))
        return where.str() + "commands do not rebuild the table";
    }
    ledger.clear_commands();
    return std::nullopt;
  };

  for (int op = 0; op < ops; ++op) {
    const int kind = pick(100);
    if (kind < 25) {  // admit, matching the prompt page by page
      Req r;
      const auto& stem = stems[static_cast<std::size_t>(pick(3))];
      const std::int32_t len = 1 + pick(60);
      const std::int32_t shared = pick(len + 1);
      r.tokens.assign(stem.begin(), stem.begin() + shared);
      while (static_cast<std::int32_t>(r.tokens.size()) < len) r.tokens.push_back(pick(3));
      r.keys.resize(static_cast<std::size_t>(len / kPage));
      chain_page_keys(r.tokens, kPage, 42, r.keys);
      // At least the last prompt token is computed: the hit stops a page short of a whole prompt.
      const std::span<const PageKey> lookup(r.keys.data(),
                                            static_cast<std::size_t>((len - 1) / kPage));
      const std::int32_t n = ledger.match_prefix(lookup);
      // Half the admissions count the hit (shared pages once), half admit first and adopt after
      // (the plain check).
      const bool with_hit = pick(2) == 0;
      const std::optional<std::int32_t> slot =
          with_hit ? ledger.try_admit(KvReservation{len, 0}, lookup, n)
                   : ledger.try_admit(KvReservation{len, 0});
      if (!slot) continue;
      r.slot = *slot;
      std::int32_t expect = 0;
      for (std::int32_t k = static_cast<std::int32_t>(lookup.size()); k > 0 && expect == 0; --k) {
        bool all = true;
        for (const PoolModel& m : model) all = all && m.serves(lookup, k);
        if (all) expect = k;
      }
      if (n != expect)
        return "op " + std::to_string(op) + ": match " + std::to_string(n) + " != model " +
               std::to_string(expect);
      if (!with_hit) ledger.adopt_prefix(r.slot, lookup, n);
      for (PoolModel& m : model) {
        m.rows[r.slot].assign(kMaxPages, kInvalidPage);
        for (std::int32_t j = m.first_needed(n * kPage); j < n; ++j) {
          const std::int32_t p = m.by_key.at(lookup[static_cast<std::size_t>(j + m.shift)]);
          if (m.refs[p]++ == 0) m.lru.remove(p);
          m.rows[r.slot][j] = p;
        }
      }
      *hits += n * kPage;
      r.cached = n * kPage;
      live[r.slot] = std::move(r);
    } else if (live.empty()) {
      continue;
    } else {
      auto it = live.begin();
      std::advance(it, pick(static_cast<std::int32_t>(live.size())));
      Req& r = it->second;
      const auto len = static_cast<std::int32_t>(r.tokens.size());
      if (kind < 80 && r.cached < len) {  // extend (a prefill chunk or decode), maybe speculative
        const std::int32_t c = 1 + pick(std::min(8, len - r.cached));
        const std::int32_t drafts = kind < 60 ? 0 : std::min(pick(4), len - r.cached - c);
        ledger.extend(r.slot, c + drafts);
        learn(r.slot);
        if (drafts > 0) {  // rejected rows rolled back: never below the committed prefix
          ledger.truncate(r.slot, r.cached + c);
          // A rollback returns only the request's own unpublished pages, never a shared one.
          for (std::size_t i = 0; i < pools.size(); ++i) {
            const auto now = ledger.slots(static_cast<std::int32_t>(i)).row(r.slot);
            for (std::int32_t j = 0; j < kMaxPages; ++j) {
              const std::int32_t p = model[i].rows[r.slot][static_cast<std::size_t>(j)];
              if (p != kInvalidPage && now[j] != p && (model[i].refs[p] != 1 || model[i].key[p]))
                return "op " + std::to_string(op) + ": rollback returned shared page " +
                       std::to_string(p);
            }
          }
          learn(r.slot);
        }
        r.cached += c;
        ledger.publish_prefix(r.slot, r.keys, 0, r.cached / kPage);
        publish_model(r, r.cached / kPage);
      } else if (kind >= 80) {  // finish (or cancel): pages go back, cached ones stay cached
        ledger.release(r.slot);
        for (PoolModel& m : model) {
          for (const std::int32_t p : m.rows[r.slot])
            if (p != kInvalidPage) m.drop(p);
          m.rows.erase(r.slot);
        }
        live.erase(it);
      }
    }
    if (auto bad = check(op)) return bad;
  }
  // No leak: once every request is gone, every page is free or cached and unreferenced.
  for (auto& [slot, r] : live) {
    ledger.release(slot);
    for (PoolModel& m : model) {
      for (const std::int32_t p : m.rows[slot])
        if (p != kInvalidPage) m.drop(p);
      m.rows.erase(slot);
    }
  }
  if (auto bad = check(ops)) return bad;
  hits[1] = model[0].evictions + model[1].evictions + model[2].evictions;
  for (std::int32_t i = 0; i < ledger.num_pools(); ++i) {
    const std::int64_t avail =
        ledger.slots(i).allocator().free_pages() + ledger.prefix_cache(i)->stats().lru_pages;
    if (ledger.free_pages(i) != avail)
      return "pool " + std::to_string(i) +
             ": free_pages() does not count cached unreferenced pages";
    if (avail != ledger.usable_pages(i))
      return "pool " + std::to_string(i) + " leaked: " + std::to_string(avail) + " of " +
             std::to_string(ledger.usable_pages(i)) + " pages available at the end";
  }
  return std::nullopt;
}

TEST(PrefixCacheLedger, RefusedHitsNameTheFieldAndChangeNothing) {
  const std::vector<LedgerPool> pools = {pool(AttentionKind::kFull, 40, 0),
                                         pool(AttentionKind::kSliding, 40, 0)};
  KvLedger l(pools);
  std::vector<std::int32_t> tokens(40);
  for (std::int32_t i = 0; i < 40; ++i) tokens[static_cast<std::size_t>(i)] = i % 5;
  std::vector<PageKey> keys(10);
  chain_page_keys(tokens, kPage, 1, keys);
  const std::int32_t a = *l.try_admit(KvReservation{40, 0});
  for (int i = 0; i < 5; ++i) l.extend(a, 8);  // steps within the sliding pool's step tokens
  l.publish_prefix(a, keys, 0, 10);
  l.release(a);
  l.clear_commands();
  const std::int32_t b = *l.try_admit(KvReservation{40, 0});
  EXPECT_EQ(l.match_prefix(keys), 10);
  const auto field = [&](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return e.field();
    }
    return std::string("<no error>");
  };
  std::vector<PageKey> other = keys;
  other[9] ^= 1;  // page 9 not cached: the full pool cannot serve 10
  EXPECT_EQ(field([&] { l.adopt_prefix(b, other, 10); }), "prefix_pages");
  EXPECT_EQ(field([&] { l.adopt_prefix(b, keys, 11); }), "prefix_pages");
  EXPECT_EQ(l.tokens(b), 0);  // nothing changed in any pool
  EXPECT_EQ(l.slots(1).tokens(b), 0);
  EXPECT_TRUE(l.commands(0).empty() && l.commands(1).empty());
  EXPECT_EQ(l.prefix_cache(0)->stats().lru_pages, 10);
  l.adopt_prefix(b, keys, 10);
  EXPECT_EQ(l.tokens(b), 40);
  // The sliding pool holds only the window's pages at position 40: window 6 -> pages 8 and 9.
  EXPECT_EQ(l.pages_held(1, b), 2);
  EXPECT_EQ(l.pages_held(0, b), 10);
  EXPECT_EQ(field([&] { l.adopt_prefix(b, keys, 10); }), "slot");  // already holds tokens
  l.truncate(b, 40);
  EXPECT_EQ(field([&] { l.publish_prefix(b, keys, 0, 11); }), "end");
}

// A key_shift pool (an EAGLE head's: its position p holds token p + 1) names page j by the key of
// page j + 1, so a prompt equal to the owner's through a page but not through the next one shares
// the target's page and not the head's: the hit stops a page earlier. Pages are published only
// once the pool holds a position past them.
TEST(PrefixCacheLedger, KeyShiftPoolSharesAPageOnlyWithTheNextPageEqual) {
  std::vector<LedgerPool> pools = {pool(AttentionKind::kFull, 40, 0),
                                   pool(AttentionKind::kFull, 40, 1)};
  pools[1].key_shift = 1;
  KvLedger l(pools);
  const auto prompt = [](std::int32_t diverge_at) {
    std::vector<std::int32_t> t(33);
    for (std::int32_t i = 0; i < 33; ++i) t[static_cast<std::size_t>(i)] = (i * 7 + 3) % 11;
    if (diverge_at >= 0) t[static_cast<std::size_t>(diverge_at)] += 1;
    return t;
  };
  const auto keys_of = [](const std::vector<std::int32_t>& t) {
    std::vector<PageKey> k(t.size() / kPage);
    chain_page_keys(t, kPage, 1, k);
    return k;
  };
  const std::vector<PageKey> owner_keys = keys_of(prompt(-1));  // 8 pages of 4
  const std::int32_t owner = *l.try_admit(KvReservation{40, 0});
  l.extend(owner, 16);  // pages 0..3 full; the head pool holds no position past page 3 yet
  l.publish_prefix(owner, owner_keys, 0, 4);
  EXPECT_EQ(l.prefix_cache(0)->stats().cached_pages, 4);
  EXPECT_EQ(l.prefix_cache(1)->stats().cached_pages, 3);  // page 3 needs key 4 and position 16
  l.extend(owner, 17);
  l.publish_prefix(owner, owner_keys, 4, 8);
  EXPECT_EQ(l.prefix_cache(0)->stats().cached_pages, 8);
  EXPECT_EQ(l.prefix_cache(1)->stats().cached_pages, 7);  // page 7 would need key 8
  l.clear_commands();

  const auto lookup = [](const std::vector<PageKey>& k) {
    return std::span<const PageKey>(k.data(), (33 - 1) / kPage);
  };
  // The same prompt: the target serves 8 pages, the head 7 (key 8 is not in the lookup).
  EXPECT_EQ(l.match_prefix(lookup(owner_keys)), 7);
  // Equal through page 3, different at token 16 (page 4): the target could serve 4 pages; the
  // head's page 3 holds token 16 and is not shared, so the hit is 3 pages.
  const std::vector<PageKey> b_keys = keys_of(prompt(16));
  EXPECT_EQ(l.match_prefix(lookup(b_keys)), 3);
  const std::int32_t b = *l.try_admit(KvReservation{40, 0}, lookup(b_keys), 3);
  EXPECT_EQ(l.tokens(b, 0), 12);
  EXPECT_EQ(l.tokens(b, 1), 12);
  EXPECT_EQ(l.slots(1).row(b)[2], l.slots(1).row(owner)[2]);  // shared head page 2
  l.extend(b, 21);
  l.publish_prefix(b, b_keys, 3, 8);  // idempotent on the adopted page 2
  // b's own head pages 3..6 under b's keys; the owner's stay.
  EXPECT_EQ(l.prefix_cache(1)->stats().cached_pages, 11);
  l.clear_commands();
  // One page short of the lookup's keys cannot be adopted in the head pool.
  const std::int32_t c = *l.try_admit(KvReservation{40, 0});
  try {
    l.adopt_prefix(c, std::span<const PageKey>(owner_keys.data(), 3), 3);
    ADD_FAILURE() << "adopted a head page without the key of the page after it";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "prefix_pages") << e.what();
  }
  EXPECT_EQ(l.tokens(c, 0), 0);
  l.release(owner);
  l.release(b);
  l.release(c);
  l.clear_commands();
  EXPECT_EQ(l.free_pages(0), 39);
  EXPECT_EQ(l.free_pages(1), 39);

  // key_shift is 0 or 1, and only for full pools.
  std::vector<LedgerPool> bad = {pool(AttentionKind::kFull, 40, 0),
                                 pool(AttentionKind::kSliding, 40, 1)};
  bad[1].key_shift = 1;
  try {
    KvLedger x(bad);
    ADD_FAILURE() << "a sliding pool with key_shift was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.field().find("key_shift"), std::string::npos) << e.field();
  }
}

// Admission counts a hit's shared pages once: on a 20-page pool, requests of 10 pages that share
// an 8-page prompt run six at once (the plain count, 10 pages each, admits two), and every one of
// them can still grow to its whole reservation.
TEST(PrefixCacheLedger, AdmissionCountsSharedPagesOnce) {
  const auto make_pools = [] {
    LedgerPool p = pool(AttentionKind::kFull, 21, 0);
    p.geometry.max_slots = 10;
    return std::vector<LedgerPool>{p};
  };
  std::vector<std::int32_t> prompt(33);
  for (std::int32_t i = 0; i < 33; ++i) prompt[static_cast<std::size_t>(i)] = (i * 7) % 5;
  std::vector<PageKey> keys(8);  // the prompt's full pages but the last token's: (33 - 1) / 4
  chain_page_keys(prompt, kPage, 1, keys);
  const KvReservation r{40, 0};  // 10 pages

  for (const bool count_hits : {true, false}) {
    SCOPED_TRACE(count_hits ? "hits counted" : "plain admission, adopt after");
    const std::vector<LedgerPool> pools = make_pools();
    KvLedger l(pools);
    const std::int32_t owner = *l.try_admit(r);
    l.extend(owner, 33);  // prefilled: 9 pages, the first 8 published
    l.publish_prefix(owner, keys, 0, 8);
    l.clear_commands();
    std::vector<std::int32_t> sharers;
    for (;;) {
      const std::int32_t n = l.match_prefix(keys);
      ASSERT_EQ(n, 8);
      std::optional<std::int32_t> slot = count_hits ? l.try_admit(r, keys, n) : l.try_admit(r);
      if (!slot) break;
      if (!count_hits) l.adopt_prefix(*slot, keys, n);
      EXPECT_EQ(l.tokens(*slot), 32);
      EXPECT_EQ(l.pages_held(0, *slot), 8);
      sharers.push_back(*slot);
      ASSERT_TRUE(l.admission_guarantee_holds(0));
      l.clear_commands();
    }
    // Held 9 + 1 left for the owner; 2 left for each sharer: 1 + 2k <= 20 - 9.
    EXPECT_EQ(sharers.size(), count_hits ? 5u : 1u);
    // Every request grows to its reservation: no allocation finds the pool exhausted.
    l.extend(owner, 7);
    for (const std::int32_t s : sharers) l.extend(s, 8);
    EXPECT_TRUE(l.admission_guarantee_holds(0));
    EXPECT_EQ(l.free_pages(0), count_hits ? 0 : 20 - 10 - 10 + 8);
    for (const std::int32_t s : sharers) l.release(s);
    l.release(owner);
    l.clear_commands();
    EXPECT_EQ(l.free_pages(0), 20);  // every page free or cached and unreferenced
  }

  // A hit larger than the cache can serve is refused by name, before anything changes.
  const std::vector<LedgerPool> pools = make_pools();
  KvLedger l(pools);
  EXPECT_EQ(l.match_prefix(keys), 0);
  try {
    l.try_admit(r, keys, 3);
    ADD_FAILURE() << "admitted on pages that are not cached";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "prefix_pages") << e.what();
  }
  EXPECT_EQ(l.active_requests(), 0);
  EXPECT_EQ(l.reserved_pages(0), 0);
}

std::optional<std::string> run_model_check(std::uint64_t seed, std::int32_t ops,
                                           std::int32_t planted_bug_every, std::int64_t* hits) {
  try {
    return run_ops(seed, ops, planted_bug_every, hits);
  } catch (const Error& e) {
    return std::string("the ledger threw: ") + e.what();
  }
}

TEST(PrefixCacheModelCheck, HundredThousandRandomOperations) {
  std::int64_t counts[2] = {0, 0};  // hit tokens, evictions
  const std::uint64_t seed = testing::test_seed();
  const auto bad = run_model_check(seed, 100000, 0, counts);
  EXPECT_FALSE(bad.has_value()) << *bad << " (GRAPHDECODE_SEED=" << seed << ")";
  EXPECT_GT(counts[0], 10000) << "the workload must actually hit the cache";
  EXPECT_GT(counts[1], 1000) << "the workload must put the pools under pressure (evictions)";
  std::cout << "[ prefix   ] hit tokens " << counts[0] << ", evictions " << counts[1] << "\n";
}

TEST(PrefixCacheModelCheck, PlantedSkippedReleaseIsCaught) {
  // Control: the same checker against a cache that skips every 50th last-reference drop.
  std::int64_t counts[2] = {0, 0};
  const auto bad = run_model_check(testing::test_seed(), 100000, 50, counts);
  ASSERT_TRUE(bad.has_value()) << "the model checker missed a planted refcount bug";
  std::cout << "[ control  ] caught: " << *bad << "\n";
}

}  // namespace
}  // namespace graphdecode
