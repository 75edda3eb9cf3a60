#include "engine/runtime/runtime_config.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "common/request_rules.h"

namespace graphdecode {

bool AttentionLayout::has(AttentionKind k) const {
  return std::find(layers.begin(), layers.end(), k) != layers.end();
}

std::int32_t AttentionLayout::count(AttentionKind k) const {
  return static_cast<std::int32_t>(std::count(layers.begin(), layers.end(), k));
}

void AttentionLayout::validate() const {
  GD_REQUIRE(!layers.empty(), "layers", 0, "a model needs at least one attention layer");
  GD_REQUIRE(num_q_heads >= 1, "num_q_heads", num_q_heads, "must be positive");
  GD_REQUIRE(num_kv_heads >= 1 && num_q_heads % num_kv_heads == 0, "num_kv_heads", num_kv_heads,
             "must divide num_q_heads");
  GD_REQUIRE(head_dim == 64 || head_dim == 128 || head_dim == 256, "head_dim", head_dim,
             "the attention kernels take 64, 128 or 256");
  GD_REQUIRE(!has(AttentionKind::kSliding) || window_left >= 0, "window_left", window_left,
             "sliding layers need window_left >= 0");
}

void RuntimeOptions::validate() const {
  GD_REQUIRE(max_batch >= 1, "max_batch", max_batch, "must be positive");
  GD_REQUIRE(max_tokens >= max_batch, "max_tokens", max_tokens, "must be >= max_batch");
  GD_REQUIRE(max_kv_len >= 1, "max_kv_len", max_kv_len, "must be positive");
  GD_REQUIRE(max_new_tokens >= 0 && max_new_tokens <= max_tokens, "max_new_tokens", max_new_tokens,
             "in [0, max_tokens] (0 = max_tokens)");
  GD_REQUIRE(max_encoder_len >= 0, "max_encoder_len", max_encoder_len, "cannot be negative");
  GD_REQUIRE(max_logit_rows == 0 || (max_logit_rows >= max_batch && max_logit_rows <= max_tokens),
             "max_logit_rows", max_logit_rows, "0 (= max_batch) or in [max_batch, max_tokens]");
  GD_REQUIRE(page_size >= 1, "page_size", page_size, "must be positive");
  GD_REQUIRE(max_slots == 0 || max_slots >= 2, "max_slots", max_slots,
             "0 (= 2 * max_batch + 1) or at least 2");
  GD_REQUIRE(full_pages >= 0 && sliding_pages >= 0 && cross_pages >= 0, "pages",
             std::min({full_pages, sliding_pages, cross_pages}),
             "cannot be negative (0 = default)");
}

KvPoolConfig pool_config(const AttentionLayout& layout, const RuntimeOptions& o,
                         AttentionKind kind) {
  layout.validate();
  o.validate();
  KvPoolConfig pc;
  PoolGeometry& g = pc.geometry;
  g.kind = kind;
  g.page_size = o.page_size;
  g.max_slots = o.resolved_max_slots();
  const std::int32_t requests = g.max_slots - 1;
  switch (kind) {
    case AttentionKind::kFull:
      g.max_pages_per_slot = pages_for_tokens(o.max_kv_len, o.page_size);
      g.num_pages = o.full_pages > 0 ? o.full_pages : requests * g.max_pages_per_slot + 1;
      break;
    case AttentionKind::kSliding:
      g.max_pages_per_slot = pages_for_tokens(o.max_kv_len, o.page_size);
      g.window_left = layout.window_left;
      g.num_pages = o.sliding_pages > 0 ? o.sliding_pages
                                        : swa_pool_pages(requests, layout.window_left,
                                                         o.resolved_max_new_tokens(), o.page_size);
      break;
    case AttentionKind::kCross:
      GD_REQUIRE(o.max_encoder_len >= 1, "max_encoder_len", o.max_encoder_len,
                 "cross layers need encoder keys");
      g.max_pages_per_slot = pages_for_tokens(o.max_encoder_len, o.page_size);
      g.num_pages = o.cross_pages > 0 ? o.cross_pages : requests * g.max_pages_per_slot + 1;
      break;
  }
  pc.shape.num_layers = layout.count(kind);
  pc.shape.num_kv_heads = layout.num_kv_heads;
  pc.shape.head_dim = layout.head_dim;
  pc.shape.dtype = layout.dtype;
  // Eager table updates (cross keys at admission, apply_table) keep the pool's default capacities.
  return pc;
}

namespace {

// Prefix cache: page ids a step may spend on hits in a self pool, on top of its extends: four
// hits of a whole context per step (more hits wait a step), so that the image, copied whole every
// step, grows by a few hundred ids rather than by max_batch contexts.
std::int32_t prefix_adopt_page_ids(const PoolGeometry& g, const RuntimeOptions& o) {
  if (!o.prefix_cache || g.kind == AttentionKind::kCross) return 0;
  return 4 * pages_for_tokens(o.max_kv_len, o.page_size);
}

// Per step: releases, truncates and extends of every slot (<= 2 commands each); page ids for the
// step's new tokens (each request may start a page mid-way) or, for a cross pool, for a batch
// of arrivals. Smaller than the pool's eager capacities so the one copy per step stays small.
StepPoolCapacity step_pool_capacity(const KvPoolConfig& pc, const RuntimeOptions& o,
                                    std::int32_t model) {
  const PoolGeometry& g = pc.geometry;
  StepPoolCapacity p;
  p.present = true;
  p.geometry = g;
  p.model = model;
  p.max_commands = 4 * g.max_slots;
  const std::int64_t ids = g.kind == AttentionKind::kCross
                               ? static_cast<std::int64_t>(o.max_batch) * g.max_pages_per_slot
                               : o.max_tokens / o.page_size + 2 * o.max_batch + 2 * g.max_slots;
  p.max_page_ids = static_cast<std::int32_t>(std::min<std::int64_t>(g.num_pages, ids)) +
                   prefix_adopt_page_ids(pc.geometry, o);
  return p;
}

}  // namespace

StepCapacity step_capacity(const RuntimeOptions& o, std::span<const AttentionLayout> models) {
  o.validate();
  GD_REQUIRE(!models.empty(), "models", 0, "a step runs at least one model");
  StepCapacity cap;
  cap.max_batch = o.max_batch;
  cap.max_tokens = o.max_tokens;
  cap.max_slots = o.resolved_max_slots();
  cap.max_kv_len = o.max_kv_len;
  cap.max_logit_rows = o.max_logit_rows;
  std::int32_t next = 0;
  for (std::size_t m = 0; m < models.size(); ++m) {
    models[m].validate();
    for (AttentionKind k : {AttentionKind::kFull, AttentionKind::kSliding, AttentionKind::kCross}) {
      if (!models[m].has(k)) continue;
      GD_REQUIRE(next < kMaxStepPools, "models", models.size(),
                 "more than " + std::to_string(kMaxStepPools) + " KV pools in one step");
      cap.pools[next++] =
          step_pool_capacity(pool_config(models[m], o, k), o, static_cast<std::int32_t>(m));
      if (k == AttentionKind::kCross) cap.max_encoder_len = o.max_encoder_len;
    }
  }
  cap.validate();
  return cap;
}

std::vector<LedgerPool> ledger_pools(const StepCapacity& cap, const RuntimeOptions& o) {
  std::vector<LedgerPool> pools;
  for (std::int32_t i = 0; i < cap.num_pools(); ++i) {
    const StepPoolCapacity& p = cap.pools[i];
    LedgerPool l;
    l.geometry = p.geometry;
    l.max_commands = p.max_commands;
    l.max_page_ids = p.max_page_ids;
    l.group = p.model;
    l.max_step_tokens = o.resolved_max_new_tokens();
    l.prefix_cache = o.prefix_cache;
    l.adopt_page_ids = prefix_adopt_page_ids(p.geometry, o);
    pools.push_back(l);
  }
  return pools;
}

}  // namespace graphdecode
